"""DRA mode: keeping this node's ResourceSlices true, written only when their content changed.

The loop is the one change-writer (`changewriter.ChangeWriter`), as for the DeviceReport: notified
of every new device snapshot and change of the holders, the publisher waits `coalesce` seconds,
builds the pool's slice documents (`dra.slices`) and compares them, without `pool.generation`,
with the last ones written. Equal: nothing is written.
Different: every slice of the pool is applied (server-side apply, field manager patchbay-agent)
with a new generation, milliseconds since the epoch at the time of the change (at least the last
one + 1), so it grows across agent restarts too, and slices the pool no longer has (fewer chunks)
are deleted. Writes run off the event loop (the client is synchronous); a failed write is retried
with the agent's backoff rhythm, and changes that arrive meanwhile go into that retry.

Which slices of the driver exist on the node is LISTed (field selectors spec.driver and
spec.nodeName) before the first write, so chunks an earlier agent left are deleted when the pool
shrank while no agent ran; afterwards the publisher knows what it wrote.

The kubelet DELETES a driver's slices on its node when it starts and when the driver's plugin was
unusable for a while (docs/dra.md#kubelet-registration); an administrator or a script may delete
or edit them too. So `force()` (called when the kubelet says the plugin is registered) writes the
slices again on the next sync, and the publisher follows its node's slices of its driver with a
watch (`slice_watch`: field selectors spec.nodeName and spec.driver, one watch per node and
driver; docs/agent.md#what-the-agent-writes-again). An event of its own write (a resourceVersion
a write returned) costs nothing; any other one is looked at between writes (`verify`, one LIST):
a slice of the pool that is gone, or that another field manager edited, is written again at once
(`ownwatch.Repairs` counts and logs it). A slice another agent of the driver wrote on this node (a
rollout's successor, the same field manager) is left alone.

Device taints (an unhealthy device, one the device plugin still hands out) are dropped by API
servers whose DRADeviceTaints gate is off (before 1.36; docs/facts.md#dra-dropped-fields), which
would leave such a device allocatable. So before the first write the publisher creates a slice
with one tainted device with `dryRun=All` and reads the answer (`taints`: Kept or Dropped; Unknown
until an answer came, and after a failed try, which is tried again `PROBE_RETRY_SECONDS` later).
Unless the taints are Kept, every device that would carry one is left out of the slices
(`withheld`) and comes back when it would not. Every real write's answer is checked too: a taint
the API server did not store (an API server of another release behind the same address) turns
`taints` to Dropped and the slices are written again at once without those devices. Where taints
are Dropped the dry run is repeated every `PROBE_AGAIN_SECONDS`, so an upgraded control plane is
noticed. `on_state` hears every change of `taints` or `withheld` (the DeviceReport says both).

The same dry run carries a shared device's fields (`allowMultipleAllocations` and the
`patchbay.dev/shares` capacity: `plugin.sharing.replicas` > 1), dropped where
DRAConsumableCapacity is off (before 1.36): `sharing` is Kept, Dropped or Unknown alike, and
unless Kept the devices are published unshared (one claim each, which is what the scheduler
would do with them anyway) and the DeviceReport says `consumableCapacity: Dropped`.

And a partition's counter consumption (`plugin.partitions`), dropped where DRAPartitionableDevices
is off (before 1.36): `partitions` is Kept, Dropped or Unknown alike, and unless Kept each device
is published whole (no counter sets, no partitions) and the DeviceReport says
`partitionableDevices: Dropped`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from patchbay_agent.backoff import Backoff
from patchbay_agent.changewriter import BACKOFF_INITIAL, BACKOFF_MAX, COALESCE_SECONDS, ChangeWriter
from patchbay_agent.config import Partitions
from patchbay_agent.constants import DRA_GROUP_VERSION, DeviceTaints
from patchbay_agent.dra.slices import (
    SliceClient,
    SliceDevice,
    lost_taints,
    partitioned,
    partitions_kept,
    published,
    sharing_kept,
    slice_documents,
    taint_probe_document,
    taints_kept,
    with_generation,
)
from patchbay_agent.memory import settle_memory
from patchbay_agent.metrics import Metrics
from patchbay_agent.ownwatch import OwnWatch, Repairs, Selection, WatchClient

log = logging.getLogger(__name__)

__all__ = [
    "BACKOFF_INITIAL",
    "BACKOFF_MAX",
    "COALESCE_SECONDS",
    "RESYNC_SECONDS",
    "SliceClient",
    "SlicePublisher",
    "slice_watch",
]

#: While the API server is not known to keep taints, shared devices' and partitions' fields: how
#: often the publisher looks whether a dry run is due (`PROBE_RETRY_SECONDS`, `PROBE_AGAIN_SECONDS`).
RESYNC_SECONDS = 60.0
#: After a dry run that failed, when to try again (meanwhile taints count as dropped).
PROBE_RETRY_SECONDS = 30.0
#: Where taints are dropped, how often to ask again (a control plane upgraded meanwhile).
PROBE_AGAIN_SECONDS = 600.0


def _millis() -> int:
    return int(time.time() * 1000)


class SlicePublisher(ChangeWriter):
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
        on_state: Callable[[], None] | None = None,
        partitions: Partitions | None = None,
        watch: OwnWatch | None = None,
    ) -> None:
        """`devices`: the devices to publish now, whole; `on_state`: called when `taints`,
        `sharing`, `partitions` or `withheld` changed (the DeviceReport says them); `partitions`:
        how each device is cut (`plugin.partitions`), None: published whole; `watch`: the node's
        slices of the driver followed on the API server (`slice_watch`)."""
        super().__init__(coalesce=coalesce, backoff=backoff, resync=resync, watch=watch)
        self._repairs = Repairs("ResourceSlice", metrics)
        self.driver = driver
        self.node_name = node_name
        self._client = client
        self._devices = devices
        self._metrics = metrics
        self._clock_ms = clock_ms
        self.node_uid: str | None = None
        #: the documents last written (generation 0); None before the first write or after force()
        self.written: list[dict[str, Any]] | None = None
        self.generation = 0
        #: names of the slices the pool has on the API server as far as we know; None: unknown
        self._names: set[str] | None = None
        self._failing = False
        #: whether the API server keeps device taints (see the module doc)
        self.taints = DeviceTaints.UNKNOWN
        #: whether it keeps a shared device's fields (consumable capacity; same values)
        self.sharing = DeviceTaints.UNKNOWN
        #: whether it keeps a partition's counter consumption (same values)
        self.partitions = DeviceTaints.UNKNOWN
        self._cut = partitions
        #: physical IDs left out of the slices because the taint they need would be dropped
        self.withheld: tuple[str, ...] = ()
        self._on_state = on_state
        self.probes = 0
        self._probe_at = 0.0  # monotonic: when the next dry run is due (while not Kept)
        self.what = f"ResourceSlices of {driver}"

    def force(self) -> None:
        """Write the slices on the next sync even when nothing changed (someone may have deleted
        them: the kubelet does, see the module doc)."""
        self.written = None
        self._names = None
        self._kick.set()

    async def check(self) -> None:
        """Every `resync`, while taints are not known to be kept: the API server asked again (a
        control plane upgraded meanwhile)."""
        known = {self.taints, self.sharing, self.partitions} == {DeviceTaints.KEPT}
        if not known and time.monotonic() >= self._probe_at:
            before = (self.taints, self.sharing, self.partitions)
            await self.probe_taints()
            if (self.taints, self.sharing, self.partitions) != before:
                self.notify()

    def _ours(self) -> set[str]:
        return {d["metadata"]["name"] for d in self.written or ()}

    def seen(self, kind: str, obj: dict[str, Any]) -> bool:
        """A watch event: may someone else have deleted or edited a slice of the pool?"""
        return self.written is not None and self._repairs.suspect(kind, obj, self._ours())

    async def verify(self) -> None:
        """Are the pool's slices as an agent of the driver on this node wrote them (one LIST)? A
        slice that is gone or that someone else edited: write the pool again now. A failed LIST
        is logged: the next event, or a later change, looks again."""
        if self.written is None or self._watch is None:
            return
        try:
            items = await asyncio.to_thread(self._watch.list_now)
        except Exception as e:
            log.warning("Listing the ResourceSlices of %s failed (%s)", self.driver, e)
            return
        if self._repairs.look(self._ours(), items):
            self.force()
            self.hold(self._repairs.pace())

    async def probe_taints(self) -> DeviceTaints:
        """Ask the API server whether it keeps device taints (a dry-run create; see the module
        doc) and set `taints`; a failure leaves it as it was and tries again later."""
        self.probes += 1
        try:
            stored = await asyncio.to_thread(
                self._client.dry_run_slice, taint_probe_document(self.driver, self.node_name)
            )
        except Exception as e:
            self._probe_at = time.monotonic() + PROBE_RETRY_SECONDS
            log.warning(
                "Cannot find out whether the API server keeps ResourceSlice device taints (%s): "
                "leaving devices that need a taint out of the slices; asking again in %.0fs",
                e,
                PROBE_RETRY_SECONDS,
            )
            return self.taints
        found = DeviceTaints.KEPT if taints_kept(stored) else DeviceTaints.DROPPED
        self._probe_at = time.monotonic() + PROBE_AGAIN_SECONDS
        self._set_taints(found, "a dry-run create")
        sharing = DeviceTaints.KEPT if sharing_kept(stored) else DeviceTaints.DROPPED
        if sharing is not self.sharing:
            self.sharing = sharing
            log.log(
                logging.INFO if sharing is DeviceTaints.KEPT else logging.WARNING,
                "The API server %s a shared device's fields (allowMultipleAllocations, consumable "
                "capacity; seen in a dry-run create)%s",
                "keeps" if sharing is DeviceTaints.KEPT else "drops",
                ""
                if sharing is DeviceTaints.KEPT
                else f": devices of {self.driver} are published unshared (DRAConsumableCapacity is off)",
            )
            if self._on_state is not None:
                self._on_state()
        kept = DeviceTaints.KEPT if partitions_kept(stored) else DeviceTaints.DROPPED
        if kept is not self.partitions:
            self.partitions = kept
            if self._cut is not None:
                log.log(
                    logging.INFO if kept is DeviceTaints.KEPT else logging.WARNING,
                    "The API server %s a device's counter consumption (seen in a dry-run create)%s",
                    "keeps" if kept is DeviceTaints.KEPT else "drops",
                    f": devices of {self.driver} are published in {len(self._cut.places())} partitions"
                    if kept is DeviceTaints.KEPT
                    else f": devices of {self.driver} are published whole (DRAPartitionableDevices is off)",
                )
            if self._on_state is not None:
                self._on_state()
        return found

    def _set_taints(self, found: DeviceTaints, how: str) -> None:
        if found is self.taints:
            return
        self.taints = found
        if found is DeviceTaints.DROPPED:
            log.warning(
                "The API server drops ResourceSlice device taints (seen in %s; DRADeviceTaints is off): "
                "unhealthy devices, and devices the device plugin still hands out, are left out of "
                "the slices of %s instead",
                how,
                self.driver,
            )
        else:
            log.info("The API server keeps ResourceSlice device taints (seen in %s)", how)
        if self._on_state is not None:
            self._on_state()

    def _publish(self) -> list[dict[str, Any]]:
        """The slice documents of the devices to publish now; sets `withheld`."""
        devices, withheld = published(self._devices(), self.taints is DeviceTaints.KEPT)
        if self.sharing is not DeviceTaints.KEPT:
            devices = [replace(d, shares=1) if d.shares > 1 else d for d in devices]
        if self._cut is not None and self.partitions is DeviceTaints.KEPT:
            devices = partitioned(devices, self._cut)
        if tuple(withheld) != self.withheld:
            if withheld:
                log.info(
                    "Leaving %d device(s) out of the ResourceSlices of %s (they need a taint the API "
                    "server drops): %s",
                    len(withheld),
                    self.driver,
                    ", ".join(withheld),
                )
            self.withheld = tuple(withheld)
            if self._on_state is not None:
                self._on_state()
        return slice_documents(self.driver, self.node_name, devices, node_uid=self.node_uid)

    async def sync(self) -> bool:
        """Build the slices, write them if they differ from the last written; True when written."""
        if self.taints is DeviceTaints.UNKNOWN and time.monotonic() >= self._probe_at:
            await self.probe_taints()
        docs = self._publish()
        if docs == self.written:
            self.succeeded()
            return False
        if self.node_uid is None:
            self.node_uid = await _node_uid(self._client, self.node_name)
            if self.node_uid is not None:
                docs = self._publish()
        generation = max(self._clock_ms(), self.generation + 1)
        full = with_generation(docs, generation)
        wanted = {d["metadata"]["name"] for d in full}
        try:
            if self._names is None:
                self._names = set(
                    await asyncio.to_thread(self._client.slice_names, self.driver, self.node_name)
                )
            lost: list[str] = []
            for doc in full:
                stored = await asyncio.to_thread(self._client.apply_slice, doc)
                self._repairs.wrote(
                    str((stored.get("metadata") or {}).get("resourceVersion") or ""), dict(stored)
                )
                lost += lost_taints(doc, stored)
            for extra in sorted(self._names - wanted):
                with self._repairs.deleting(extra):
                    await asyncio.to_thread(self._client.delete_slice, extra)
                log.info("Deleted ResourceSlice %s (the pool has fewer slices now)", extra)
        except Exception as e:
            self._metrics.slice_writes.labels("error").inc()
            delay = self.failed()
            self._failing = True
            # What was applied may be partial: know nothing, write everything next time.
            self._names = None
            log.warning(
                "Writing the ResourceSlices of %s failed (%s); retrying in %.1fs", self.driver, e, delay
            )
            return False
        self._names = wanted
        self.written = docs
        self._repairs.written(sorted(wanted))
        self.generation = generation
        self.writes += 1
        if self.writes == 1:
            settle_memory()
        self._metrics.slice_writes.labels("ok").inc()
        self.succeeded()
        devices = [d for doc in docs for d in doc["spec"].get("devices", [])]
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
        if lost:
            # Written, but without taints: the devices that needed one are allocatable now. Leave
            # them out at once (the next sync, without coalescing delay).
            self._set_taints(
                DeviceTaints.DROPPED, f"the answer to a write ({', '.join(lost)} lost their taints)"
            )
            self._probe_at = time.monotonic() + PROBE_AGAIN_SECONDS
            await self.sync()
        return True


async def _node_uid(client: SliceClient, node_name: str) -> str | None:
    """The Node's UID for the slices' owner reference; None (logged) when it cannot be found."""
    try:
        return await asyncio.to_thread(client.node_uid, node_name)
    except Exception as e:
        log.warning(
            "Cannot find node %s's UID (%s): writing ResourceSlices without an owner for now", node_name, e
        )
        return None


def slice_watch(client: object, driver: str, node_name: str) -> OwnWatch | None:
    """The watch of `node_name`'s ResourceSlices of `driver` (the field selectors the kubelet
    uses itself), for a client that can watch (`kubeclient.KubeClient`); None for one that
    cannot (a test's in-memory API)."""
    if not isinstance(client, WatchClient):
        return None
    selection = Selection(
        DRA_GROUP_VERSION, "resourceslices", None, f"spec.driver={driver},spec.nodeName={node_name}"
    )
    return OwnWatch(client, selection)
