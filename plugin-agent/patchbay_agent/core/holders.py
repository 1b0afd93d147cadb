"""Who holds which device: the kubelet's PodResources API, read when it may have changed.

The kubelet records an allocation when it admits the container, right after our Allocate answers;
so the list is read again about a second after every successful Allocate (a burst of Allocates
costs one read) and every `period` seconds as a backstop for containers that went away. The call
is local (a Unix socket, about a millisecond) and writes nothing: the DeviceReport is written
only when what it read changed (`report/reporter.py`).

A kubelet that does not answer is logged once per streak, and the last known holders are kept:
a kubelet restart must not make every device look free for a moment.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from patchbay_agent.constants import REPLICA_SEPARATOR
from patchbay_agent.metrics import Metrics
from patchbay_agent.wakeup import wait_any

if TYPE_CHECKING:
    # The PodResources client (gRPC) is imported when the first holders object is made: an idle
    # node agent, serving no profile, never loads gRPC.
    from patchbay_agent.kubelet import podresources

log = logging.getLogger(__name__)

#: How long after a successful Allocate the list is read again.
AFTER_ALLOCATE_SECONDS = 1.0
#: The local call's deadline.
RPC_TIMEOUT = 5.0


@dataclass(frozen=True, order=True)
class PodRef:
    """One container that holds devices (a report's `pods` entry)."""

    namespace: str
    name: str
    container: str

    def as_dict(self) -> dict[str, str]:
        return {"namespace": self.namespace, "name": self.name, "container": self.container}


ListPods = Callable[..., Awaitable[list["podresources.Pod"]]]


class PodHolders:
    """The containers holding this resource's device IDs (advertised IDs, as the kubelet gave them)."""

    def __init__(
        self,
        socket: Path | str,
        resource_name: str,
        metrics: Metrics,
        *,
        period: float = 10.0,
        after_allocate: float = AFTER_ALLOCATE_SECONDS,
        rpc_timeout: float = RPC_TIMEOUT,
        list_pods: ListPods | None = None,
        held: Callable[[podresources.Container], Sequence[str]] | None = None,
    ) -> None:
        """`held`: the device IDs a container holds; default the device plugin's (the kubelet's
        device IDs of `resource_name`); a DRA agent passes its claimed devices instead."""
        self.socket = socket
        self._resource = resource_name
        self._metrics = metrics
        self._period = period
        self._after_allocate = after_allocate
        self.rpc_timeout = rpc_timeout
        if list_pods is None:
            from patchbay_agent.kubelet.podresources import list_pods as read_pods

            list_pods = read_pods
        self._list_pods = list_pods
        self._held = held or (lambda c: c.device_ids(resource_name))
        #: container -> the device IDs of our resource it holds; only containers holding any
        self.containers: dict[PodRef, tuple[str, ...]] = {}
        #: physical device IDs that containers hold through the DEVICE PLUGIN of our resource; for a
        #: DRA agent on a node being migrated, the devices DRA must not hand out again
        self.plugin_held: frozenset[str] = frozenset()
        self._subscribers: list[Callable[[], None]] = []
        #: set once the first read was tried (answered or not)
        self.attempted = asyncio.Event()
        self.reads = 0
        self.failures = 0
        self._failing = False
        self._kick = asyncio.Event()
        self._soon: float | None = None

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call `callback` whenever `containers` or `plugin_held` changed (it must not block)."""
        self._subscribers.append(callback)

    def allocated(self) -> None:
        """An Allocate succeeded: read again shortly (never blocks the caller)."""
        if self._soon is None:
            self._soon = time.monotonic() + self._after_allocate
            self._kick.set()

    async def read(self) -> bool:
        """One List call; True when the holders changed. Never raises for an absent kubelet."""
        try:
            pods = await self._list_pods(self.socket, rpc_timeout=self.rpc_timeout)
        except Exception as e:
            self.failures += 1
            self._metrics.pod_resources_reads.labels("error").inc()
            if not self._failing:
                log.warning(
                    "The kubelet's PodResources API at %s does not answer (%s); keeping the last "
                    "known pods until it does",
                    self.socket,
                    _describe(e),
                )
            self._failing = True
            return False
        finally:
            self.attempted.set()
        if self._failing:
            log.info("The kubelet's PodResources API at %s answers again", self.socket)
        self._failing = False
        self.reads += 1
        self._metrics.pod_resources_reads.labels("ok").inc()
        containers = {
            PodRef(p.namespace, p.name, c.name): tuple(ids)
            for p in pods
            for c in p.containers
            if (ids := self._held(c))
        }
        plugin_held = frozenset(
            i.split(REPLICA_SEPARATOR, 1)[0]
            for p in pods
            for c in p.containers
            for i in c.device_ids(self._resource)
        )
        if containers == self.containers and plugin_held == self.plugin_held:
            return False
        self.containers, self.plugin_held = containers, plugin_held
        self._metrics.set_allocations(
            {(r.namespace, r.name, r.container): len(ids) for r, ids in containers.items()}
        )
        for callback in self._subscribers:
            try:
                callback()
            except Exception:
                log.exception("A subscriber of the device holders failed")
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Read now, then after Allocates and every period, until `stop` is set."""
        next_periodic = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            due = now >= next_periodic or (self._soon is not None and now >= self._soon)
            if due:
                self._soon = None
                next_periodic = now + self._period
                await self.read()
                continue
            wake = next_periodic if self._soon is None else min(next_periodic, self._soon)
            self._kick.clear()
            await wait_any((self._kick, stop), wake - now)


def _describe(e: Exception) -> str:
    """An RPC error as "UNAVAILABLE: details", anything else as its text."""
    code, details = getattr(e, "code", None), getattr(e, "details", None)
    if callable(code) and callable(details):
        return f"{code().name}: {details()}"
    return str(e) or type(e).__name__
