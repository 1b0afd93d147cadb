"""Writing the DeviceReport: only when it changed (or someone else changed it), coalesced, never in
the way.

The loop is the one change-writer (`changewriter.ChangeWriter`): it is notified of every new device
snapshot and every change of the holders, waits `coalesce` seconds, and `sync()` builds the
report (`devicereport.build_report`) and compares it, without `observedAt`, with the last one
written: an equal one is not written (`patchbay_agent_report_unchanged_total`). So a health flip
costs exactly one write and a quiet node costs none, however often it is looked at.

A write is one server-side apply (`kubeclient.KubeClient.apply`), run off the event loop: the
client is synchronous (http.client), and Allocate and ListAndWatch share the loop. A failed write
(the admission policy's 403, a 404 while the CRD is not installed, an API server that does not
answer) is logged with the API server's message and retried with the agent's one backoff rhythm
(`registration.Backoff`); changes that arrive meanwhile go into that retry. Nothing here raises
into the agent.

What was written must stay there (docs/agent.md#what-the-agent-writes-again). The reporter follows
its report with a watch (`ownwatch.OwnWatch`, a field selector on its name: one watch per profile
and node) and knows the resourceVersions its own writes returned, so the events of its own writes
cost nothing. Any other event is looked at between writes (`verify`, one GET): a report that is
gone (someone deleted it) is written again at once, whether or not a device changed. A report
another field manager edited (`kubectl edit`, `kubectl patch`: its managedFields name a manager
other than patchbay-agent), or one the agent did not write (another `agent`), is deleted (only if
still at that version) and written afresh: applying over it would not do, since server-side apply
keeps the fields another field manager set (a forged device entry would stay). Only this agent
writes its report, so any other writer is a mistake or an attack (docs/security.md#reports). Two
other writers are expected and left alone: the same pod's other reporter (the node agent writes a
profile's failure report while that profile's agent is down), and a newer pod of the agent's own
DaemonSet (a rollout, while both run), whose name differs from the agent's only in the 5
characters the API server appended. Nothing is written, and nothing but the watch is asked, while
nothing changes.

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
from patchbay_agent.changewriter import BACKOFF_INITIAL, BACKOFF_MAX, COALESCE_SECONDS, ChangeWriter
from patchbay_agent.constants import REPORT_GROUP, REPORT_PLURAL, REPORT_VERSION
from patchbay_agent.memory import settle_memory
from patchbay_agent.metrics import Metrics
from patchbay_agent.ownwatch import OwnWatch, Repairs, Selection, WatchClient, edited_by, version_of
from patchbay_agent.report.devicereport import ReportTarget, with_observed_at

log = logging.getLogger(__name__)

__all__ = ["BACKOFF_INITIAL", "BACKOFF_MAX", "COALESCE_SECONDS", "ReportClient", "Reporter", "report_watch"]

KIND = "DeviceReport"


class ReportClient(Protocol):
    """What the reporter needs of the API (synchronous; `kubeclient.KubeClient` in the agent)."""

    def apply(self, report: Mapping[str, Any]) -> str | None:
        """Create or update the report; its resourceVersion as stored (None: not known); raise on
        failure."""

    def read_report(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored report, None when there is none; raise on failure."""

    def delete_report(self, namespace: str, name: str, resource_version: str) -> None:
        """Delete the report if it is still at ``resource_version``; raise on failure."""

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
        watch: OwnWatch | None = None,
    ) -> None:
        """`watch`: the report followed on the API server (`report_watch`); without one, a
        report someone else deleted or edited stays so until the next change."""
        super().__init__(coalesce=coalesce, backoff=backoff, watch=watch)
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
        #: the resourceVersion the last write stored; None when not known
        self.version: str | None = None
        self._repairs = Repairs(KIND, metrics, keep=8)
        self.unchanged = 0
        self.what = f"DeviceReport {target.namespace}/{target.name}"

    @property
    def restored(self) -> int:
        """How often the report was found deleted or written by someone else, and written again."""
        return self._repairs.done

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
            version = await asyncio.to_thread(self._client.apply, with_observed_at(report, self._clock()))
        except Exception as e:
            self._metrics.report_writes.labels("error").inc()
            delay = self.failed()
            self._write_failing = True
            log.warning("Writing DeviceReport %s failed (%s); retrying in %.1fs", self._where, e, delay)
            return False
        self.written = report
        self.version = version or None
        self._repairs.wrote(version or "")
        self.writes += 1
        self._restored()
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

    def _restored(self) -> None:
        """The report is written as the agent wants it: a repair due for it is done."""
        before = self._repairs.done
        self._repairs.written((self.target.name,))
        if self._repairs.done > before:
            self._metrics.report_restores.inc()

    def seen(self, kind: str, obj: dict[str, Any]) -> bool:
        """A watch event: may someone else have deleted or edited the report since this agent
        wrote it? Not when the event is one of its own writes (its resourceVersion); nothing to
        guard before the first write."""
        if self.written is None:
            return False
        return self._repairs.suspect(kind, obj, (self.target.name,))

    async def verify(self) -> None:
        """Is the stored report still the one this agent wrote (one GET)? If it is gone, write it
        again now; if someone else edited or wrote it since, delete theirs and write it again. A
        failed read or delete is logged: the next event, or a later change, looks again."""
        if self.written is None or self.version is None:
            return
        ns, name = self.target.namespace, self.target.name
        try:
            report = await asyncio.to_thread(self._client.read_report, ns, name)
            stored = None if report is None else version_of(report)
            if stored == self.version:
                # A deletion the ordinary write already undid (it came first): counted now.
                self._restored()
                return
            if report is None:
                self._repairs.due(name, "deleted", "deleted")
                # Its owner may be a Node replaced meanwhile (the garbage collector's deletion):
                # the next write looks the UID up again.
                self.node_uid = None
            else:
                happened = self._foreign(report)
                if happened is None:
                    return
                with self._repairs.deleting(name):
                    await asyncio.to_thread(self._client.delete_report, ns, name, str(stored))
                self._repairs.due(name, "edited", f"{happened} (deleted it)")
        except Exception as e:
            log.warning("Checking %s %s failed (%s)", KIND, self._where, e)
            return
        self.written = self.version = None
        self.notify()
        self.hold(self._repairs.pace())

    def _foreign(self, report: dict[str, Any]) -> str | None:
        """What another writer did to the stored report ("edited by kubectl-edit"), or None when
        the writer is expected (this pod's other reporter, a rollout's successor)."""
        edited = edited_by(report)
        if edited is not None:
            return edited
        writer = str(report.get("agent") or "")
        if writer and writer == self.target.agent:
            # This pod's other reporter (the node agent's failure report and the profile's
            # agent hand over to each other): not someone else.
            return None
        if same_daemonset(writer, self.target.agent):
            log.info("%s %s is written by %s now (a rollout)", KIND, self._where, writer)
            return None
        return f"written by {writer or 'someone else'}"

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


#: How many random characters the API server appends to a DaemonSet's `<name>-` for its pods
#: (after cutting the base to 58 characters): pods of one DaemonSet differ only in those.
POD_NAME_SUFFIX = 5


def same_daemonset(pod: str, other: str | None) -> bool:
    """Whether ``pod`` is another pod of ``other``'s DaemonSet, by name (the same up to the random
    suffix). Only used to leave a successor's report alone: what the operator believes is decided
    by the pods' labels, not by names."""
    if not other or pod == other or len(pod) != len(other) or len(pod) <= POD_NAME_SUFFIX:
        return False
    return pod[:-POD_NAME_SUFFIX] == other[:-POD_NAME_SUFFIX]


def report_watch(client: object, target: ReportTarget) -> OwnWatch | None:
    """The watch of the report `target` names (a field selector on its name), for a client that
    can watch (`kubeclient.KubeClient`); None for one that cannot (a test's recorder)."""
    if not isinstance(client, WatchClient):
        return None
    selection = Selection(
        f"{REPORT_GROUP}/{REPORT_VERSION}", REPORT_PLURAL, target.namespace, f"metadata.name={target.name}"
    )
    return OwnWatch(client, selection)
