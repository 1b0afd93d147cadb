"""Writing the DeviceReport: only when it changed, coalesced, never on a timer, never in the way.

The loop is the one change-writer (`writer.ChangeWriter`): it is notified of every new device
snapshot and every change of the holders, waits `coalesce` seconds, and `sync()` builds the
report (`devicereport.build_report`) and compares it, without `observedAt`, with the last one
written: an equal one is not written (`patchbay_agent_report_unchanged_total`). So a health flip
costs exactly one write and a quiet node costs none, however often it is looked at.

A write is one server-side apply (`kubeclient.KubeClient.apply`), run off the event loop: pykube
is synchronous, and Allocate and ListAndWatch share the loop. A failed write (the admission
policy's 403, a 404 while the CRD is not installed, an API server that does not answer) is logged
with the API server's message and retried with the agent's one backoff rhythm
(`registration.Backoff`); changes that arrive meanwhile go into that retry. Nothing here raises
into the agent.

The owner reference needs the Node's UID (`ReportClient.node_uid`): looked up just before the
first write, and again before later writes while it is unknown, so the lookup costs no request of
its own on a quiet node. Without it the report is written without an owner.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from patchbay_agent.backoff import Backoff
from patchbay_agent.memory import settle_memory
from patchbay_agent.metrics import Metrics
from patchbay_agent.report.devicereport import ReportTarget, with_observed_at
from patchbay_agent.report.writer import BACKOFF_INITIAL, BACKOFF_MAX, COALESCE_SECONDS, ChangeWriter

log = logging.getLogger(__name__)

__all__ = ["BACKOFF_INITIAL", "BACKOFF_MAX", "COALESCE_SECONDS", "ReportClient", "Reporter"]


class ReportClient(Protocol):
    """What the reporter needs of the API (synchronous; `kubeclient.KubeClient` in the agent)."""

    def apply(self, report: Mapping[str, Any]) -> None:
        """Create or update the report; raise on failure."""

    def node_uid(self, node_name: str) -> str:
        """The Node's UID; raise when it cannot be found."""


class Reporter(ChangeWriter):
    """Keeps one DeviceReport true: see the module doc. `build(node_uid)` gives the current report."""

    def __init__(
        self,
        target: ReportTarget,
        client: ReportClient,
        build: Callable[[str | None], dict[str, Any]],
        metrics: Metrics,
        *,
        coalesce: float = COALESCE_SECONDS,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(coalesce=coalesce, backoff=backoff)
        self.target = target
        self._client = client
        self._build = build
        self._metrics = metrics
        self._clock = clock
        self.node_uid: str | None = None
        self._owner_failing = False
        self._write_failing = False
        #: the last report written (without observedAt); None before the first write
        self.written: dict[str, Any] | None = None
        self.unchanged = 0
        self.what = f"DeviceReport {target.namespace}/{target.name}"

    @property
    def _where(self) -> str:
        return f"{self.target.namespace}/{self.target.name}"

    async def sync(self) -> bool:
        """Build the report, write it if it differs from the last one written; True when written."""
        report = self._build(self.node_uid)
        if report == self.written:
            self.succeeded()
            self.unchanged += 1
            self._metrics.report_unchanged.inc()
            return False
        if self.node_uid is None:
            await self._find_owner()
            if self.node_uid is not None:
                report = self._build(self.node_uid)
        try:
            await asyncio.to_thread(self._client.apply, with_observed_at(report, self._clock()))
        except Exception as e:
            self._metrics.report_writes.labels("error").inc()
            delay = self.failed()
            self._write_failing = True
            log.warning("Writing DeviceReport %s failed (%s); retrying in %.1fs", self._where, e, delay)
            return False
        self.written = report
        self.writes += 1
        if self.writes == 1:
            # The first write was start-up's last one-off work (TLS setup, the client's first
            # request): hand its garbage back too (memory.py).
            settle_memory()
        self._metrics.report_writes.labels("ok").inc()
        self.succeeded()
        summary = report.get("summary", {})
        log.log(
            logging.INFO if self._write_failing or self.writes == 1 else logging.DEBUG,
            "Wrote DeviceReport %s: %s healthy, %s unhealthy, %s allocated",
            self._where,
            summary.get("healthy"),
            summary.get("unhealthy"),
            summary.get("allocated"),
        )
        self._write_failing = False
        return True

    async def _find_owner(self) -> None:
        node = self.target.node_name
        try:
            self.node_uid = await asyncio.to_thread(self._client.node_uid, node)
        except Exception as e:
            if not self._owner_failing:
                log.warning(
                    "Cannot find node %s's UID (%s): writing the DeviceReport without an owner "
                    "reference (it will not go with the node); trying again with the next write",
                    node,
                    e,
                )
            self._owner_failing = True
            return
        if self._owner_failing:
            log.info("Found node %s's UID: the DeviceReport is owned by the node now", node)
        self._owner_failing = False
