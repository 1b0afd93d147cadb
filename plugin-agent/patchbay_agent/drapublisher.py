"""DRA mode: keeping this node's ResourceSlices true, written only when their content changed.

Like the DeviceReport (`reporter.py`): `notify()` after every discovery/health round; the
publisher waits `coalesce` seconds, builds the pool's slice documents (`draslices.py`) and
compares them, without `pool.generation`, with the last ones written. Equal: nothing is written.
Different: every slice of the pool is applied (server-side apply, field manager patchbay-agent)
with a new generation, milliseconds since the epoch at the time of the change (at least the last
one + 1), so it grows across agent restarts too, and slices the pool no longer has (fewer chunks)
are deleted. Writes run off the event loop (pykube is synchronous); a failed write is retried
with the agent's backoff rhythm, and changes that arrive meanwhile go into that retry.

Which slices of the driver exist on the node is LISTed (field selectors spec.driver and
spec.nodeName) before the first write, so chunks an earlier agent left are deleted when the pool
shrank while no agent ran; afterwards the publisher knows what it wrote.

The kubelet DELETES a driver's slices on its node when it starts and when the driver's plugin was
unusable for a while (docs/dra.md#kubelet-registration). So `force()` (called when the kubelet says the
plugin is registered) writes the slices again on the next sync, and every `resync` seconds the
publisher LISTs the node's slices of the driver and writes again when one of its slices is missing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from patchbay_agent.draslices import SliceDevice, slice_documents, with_generation
from patchbay_agent.memory import settle_memory
from patchbay_agent.metrics import Metrics
from patchbay_agent.registration import Backoff
from patchbay_agent.wakeup import wait_any

log = logging.getLogger(__name__)

COALESCE_SECONDS = 0.5
BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 120.0
#: How often the publisher checks that its slices still exist (one LIST).
RESYNC_SECONDS = 60.0


class SliceClient(Protocol):
    """What publishing needs of the API (synchronous; `kubeclient.KubeClient` in the agent)."""

    def apply_slice(self, doc: Mapping[str, Any]) -> None:
        """Create or update one ResourceSlice; raise on failure."""

    def slice_names(self, driver: str, node_name: str) -> list[str]:
        """Names of the driver's slices on the node; raise on failure."""

    def delete_slice(self, name: str) -> None:
        """Delete one ResourceSlice (gone already is fine); raise on failure."""

    def node_uid(self, node_name: str) -> str:
        """The Node's UID; raise when it cannot be found."""


def _millis() -> int:
    return int(time.time() * 1000)


class SlicePublisher:
    """Keeps one node's pool of one driver true: see the module doc."""

    def __init__(
        self,
        driver: str,
        node_name: str,
        client: SliceClient,
        devices: Callable[[], Sequence[SliceDevice]],
        metrics: Metrics,
        *,
        coalesce: float = COALESCE_SECONDS,
        resync: float = RESYNC_SECONDS,
        backoff: Backoff | None = None,
        clock_ms: Callable[[], int] = _millis,
    ) -> None:
        self.driver = driver
        self.node_name = node_name
        self._client = client
        self._devices = devices
        self._metrics = metrics
        self._coalesce = coalesce
        self._resync = resync
        self._backoff = backoff or Backoff(BACKOFF_INITIAL, BACKOFF_MAX)
        self._clock_ms = clock_ms
        self._kick = asyncio.Event()
        self._retry_at: float | None = None
        self.node_uid: str | None = None
        #: the documents last written (generation 0); None before the first write or after force()
        self.written: list[dict[str, Any]] | None = None
        self.generation = 0
        #: names of the slices the pool has on the API server as far as we know; None: unknown
        self._names: set[str] | None = None
        self._failing = False
        self.writes = 0
        self.failures = 0

    def notify(self) -> None:
        """The devices may have changed: compare (and write) soon."""
        self._kick.set()

    def force(self) -> None:
        """Write the slices on the next sync even when nothing changed (someone may have deleted
        them: the kubelet does, see the module doc)."""
        self.written = None
        self._names = None
        self._kick.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Write the first slices, then every change, until `stop` is set."""
        self._kick.set()
        next_resync = time.monotonic() + self._resync
        while not stop.is_set():
            until = next_resync if self._retry_at is None else min(self._retry_at, next_resync)
            if self._retry_at is None:
                await wait_any((self._kick, stop), until - time.monotonic())
            else:
                await wait_any((stop,), until - time.monotonic())
            if stop.is_set():
                break
            if time.monotonic() >= next_resync:
                next_resync = time.monotonic() + self._resync
                await self._check_present()
            if not self._kick.is_set() and (self._retry_at is None or time.monotonic() < self._retry_at):
                continue
            await wait_any((stop,), self._coalesce)
            if stop.is_set():
                break
            self._kick.clear()
            try:
                await self.sync()
            except Exception:
                log.exception("Building the ResourceSlices of %s failed", self.driver)
                self._retry_at = time.monotonic() + self._backoff.next()

    async def _check_present(self) -> None:
        """Write again when a slice we wrote is gone (one LIST)."""
        if self.written is None:
            return
        try:
            names = set(await asyncio.to_thread(self._client.slice_names, self.driver, self.node_name))
        except Exception as e:
            log.warning("Listing the ResourceSlices of %s failed (%s)", self.driver, e)
            return
        ours = {d["metadata"]["name"] for d in self.written}
        if not ours <= names:
            log.warning(
                "ResourceSlice(s) %s of %s were deleted (by the kubelet?): writing them again",
                ", ".join(sorted(ours - names)),
                self.driver,
            )
            self.force()

    async def sync(self) -> bool:
        """Build the slices, write them if they differ from the last written; True when written."""
        docs = slice_documents(self.driver, self.node_name, self._devices(), node_uid=self.node_uid)
        if docs == self.written:
            self._retry_at = None
            return False
        if self.node_uid is None:
            await self._find_owner()
            if self.node_uid is not None:
                docs = slice_documents(self.driver, self.node_name, self._devices(), node_uid=self.node_uid)
        generation = max(self._clock_ms(), self.generation + 1)
        full = with_generation(docs, generation)
        wanted = {d["metadata"]["name"] for d in full}
        try:
            if self._names is None:
                self._names = set(
                    await asyncio.to_thread(self._client.slice_names, self.driver, self.node_name)
                )
            for doc in full:
                await asyncio.to_thread(self._client.apply_slice, doc)
            for extra in sorted(self._names - wanted):
                await asyncio.to_thread(self._client.delete_slice, extra)
                log.info("Deleted ResourceSlice %s (the pool has fewer slices now)", extra)
        except Exception as e:
            self.failures += 1
            self._metrics.slice_writes.labels("error").inc()
            delay = self._backoff.next()
            self._retry_at = time.monotonic() + delay
            self._failing = True
            # What was applied may be partial: know nothing, write everything next time.
            self._names = None
            log.warning(
                "Writing the ResourceSlices of %s failed (%s); retrying in %.1fs", self.driver, e, delay
            )
            return False
        self._names = wanted
        self.written = docs
        self.generation = generation
        self.writes += 1
        if self.writes == 1:
            settle_memory()
        self._metrics.slice_writes.labels("ok").inc()
        self._backoff.reset()
        self._retry_at = None
        devices = [d for doc in docs for d in doc["spec"]["devices"]]
        log.log(
            logging.INFO if self._failing or self.writes == 1 else logging.DEBUG,
            "Wrote %d ResourceSlice(s) of %s, generation %d: %d device(s), %d tainted",
            len(docs),
            self.driver,
            generation,
            len(devices),
            sum(1 for d in devices if d.get("taints")),
        )
        self._failing = False
        return True

    async def _find_owner(self) -> None:
        try:
            self.node_uid = await asyncio.to_thread(self._client.node_uid, self.node_name)
        except Exception as e:
            log.warning(
                "Cannot find node %s's UID (%s): writing ResourceSlices without an owner for now",
                self.node_name,
                e,
            )
