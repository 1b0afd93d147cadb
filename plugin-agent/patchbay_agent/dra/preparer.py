"""DRA mode's driver: what NodePrepareResources and NodeUnprepareResources do to claims, under
the kubelet-plugin layer (`kubelet/draplugin.py`: sockets, registration, API versions, the lock).

NodePrepareResources reads each claim from the API server off the event loop with a deadline, maps
its allocation results of our driver and pool to physical devices, and writes the claim's CDI spec
file (`dra/claims.py`); NodeUnprepareResources deletes that file. Per-claim failures go in the
claim's `error`, never fail the call (the kubelet retries just those claims).

What the kubelet and the runtime need is written BEFORE the answer: the CDI spec and the device
metadata files it mounts (the runtime reads both when it creates the container, any time after
the answer). What only an agent restart or a node reboot needs comes AFTER it, once the calls
are quiet, in a task of its own (`LateWrites`): the spec's copy on the kubelet's disk (written
back into the CDI directory when a reboot emptied it, cdi.py) and the PodResources re-read. If the
agent dies between the answer and the copy, its next start makes the copy from the spec still in
the CDI directory (`keep_copies`, before it registers); if the node reboots first, the kubelet
prepares the claim again (docs/dra.md#prepare-and-what-comes-after-the-answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from patchbay_agent.cdi import SpecCopies, write_spec
from patchbay_agent.config import Allocation, Partitions
from patchbay_agent.core.inventory import Inventory, Snapshot
from patchbay_agent.dra.claims import (
    AllocatedDevice,
    ClaimError,
    allocated_devices,
    cdi_device_id,
    cdi_kind,
    check_claim_name,
    check_claim_uid,
    claim_spec_document,
    spec_file_name,
)
from patchbay_agent.dra.claimstatus import ClaimStatusClient, ClaimStatusWriter
from patchbay_agent.dra.metadata import HEALTHY_ATTRIBUTE, ClaimInfo, DeviceMetadataFiles
from patchbay_agent.dra.slices import SliceClient, pool_devices
from patchbay_agent.kubelet.draplugin import (
    CallActivity,
    ClaimRef,
    ClaimResult,
    PreparedDevice,
    base_request,
    node_lock,
)
from patchbay_agent.metrics import Metrics

log = logging.getLogger(__name__)
#: The kubelet's deadline for a whole NodePrepareResources / NodeUnprepareResources call is 45 s
#: (docs/dra.md#kubelet-registration); one claim read gets at most this long.
CLAIM_READ_TIMEOUT = 10.0
#: How many specs' copies `LateWrites` makes under one node lock, in one turn of the event loop.
COPIES_AT_ONCE = 16


class ClaimReader(Protocol):
    """What preparing needs of the API (synchronous; `kubeclient.KubeClient` in the agent)."""

    def resource_claim(self, namespace: str, name: str, *, timeout: float | None = None) -> dict[str, Any]:
        """The ResourceClaim object; raise when it cannot be read."""


#: The claim's GET on the event loop: (namespace, name, timeout in seconds) -> the claim.
AsyncClaimRead = Callable[[str, str, float], Awaitable[dict[str, Any]]]


class DraClient(ClaimReader, ClaimStatusClient, SliceClient, Protocol):
    """Everything DRA mode needs of the API: claims to read and their status to write, slices
    to write."""

    def claim_read_async(self) -> AsyncClaimRead | None:
        """Prepare's claim GET on the event loop (the agent's client: keep-alive connections,
        `apiget.py`), or None when the client has none: `resource_claim` then runs in a worker
        thread. Call it on the loop that will use the reader."""


class LateWrites:
    """What a prepare writes after its answer (the module doc): the copies of the claims' specs,
    then `on_change`, in one task of the event loop that waits until the prepare and unprepare
    calls have been quiet (`CallActivity.quiet`: 50 ms, at most 5 s), then writes every copy
    asked for since, COPIES_AT_ONCE per node lock. Written right after each answer instead, a copy ran on
    the loop while the kubelet's next call of a burst waited for it (the dra_path benchmark: the
    agent's gRPC part of a call was 3.8x Python's floor's, docs/benchmarks.md). The copy is made
    from the spec as it is then, so an unprepare that ran between the answer and the copy (spec
    gone) gets none. `settle` waits for every one (the agent's shutdown)."""

    def __init__(self, preparer: ClaimPreparer, on_change: Callable[[], None] | None) -> None:
        self._preparer = preparer
        self._on_change = on_change
        #: spec file names whose copies are due, in the order asked (a dict: no duplicates)
        self._due: dict[str, None] = {}
        self._changed = False
        self._task: asyncio.Task[None] | None = None

    def after_answer(self, names: Sequence[str]) -> None:
        """Schedule the writes for the spec files `names` (the claims prepared without an error)
        and the `on_change` call."""
        if self._preparer.copies is None and self._on_change is None:
            return
        if self._preparer.copies is not None:
            self._due.update(dict.fromkeys(names))
        self._changed = True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain(), name="dra-late-writes")

    async def _drain(self) -> None:
        while self._changed:
            await self._preparer.calls.quiet()
            names, self._due, self._changed = list(self._due), {}, False
            # A few at a time, the lock and the loop given back between them: after a burst
            # longer than quiet's 5 s, hundreds may be due while calls still come.
            for at in range(0, len(names), COPIES_AT_ONCE):
                chunk = names[at : at + COPIES_AT_ONCE]
                try:
                    async with node_lock(self._preparer.lock_path):
                        self.keep_copies(chunk)
                except OSError as e:  # the lock file: the next start's recovery makes the copies
                    log.error("Cannot take the node lock to keep the CDI spec copies of %s: %s", chunk, e)
                await asyncio.sleep(0)
            if self._on_change is not None:
                self._on_change()

    def keep_copies(self, names: Sequence[str] | None = None) -> int:
        """Make the copy of each of our claims' spec files `names` (None: every one in the CDI
        directory, the start's recovery) equal to the spec: it is written before the answer and
        its copy after, so the spec is never the older one. A spec that is gone (unprepared, or
        the directory emptied: `SpecCopies.restore`'s turn) or is not ours is left; the caller
        holds the node lock. Returns how many copies it wrote."""
        p = self._preparer
        if p.copies is None:
            return 0
        if names is None:
            prefix = p.spec_path("").name.removesuffix(".json")
            with contextlib.suppress(OSError):
                names = [
                    n
                    for n in os.listdir(p.cdi_spec_dir)
                    if n.startswith(prefix)
                    and n.endswith(".json")
                    and check_claim_uid(n[len(prefix) : -len(".json")]) is None
                ]
        written = 0
        for name in names or ():
            try:
                doc = json.loads((p.cdi_spec_dir / name).read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(doc, dict) or doc.get("kind") != cdi_kind(p.driver):
                continue
            try:
                written += _write_if_changed(p.copies.dir / name, doc)
            except OSError as e:
                # The claim works now; only a reboot would lose its spec. Said loudly.
                log.error("CDI spec %s: cannot keep a copy of it in %s: %s", name, p.copies.dir, e)
        return written

    def recover_copies(self) -> int:
        """At start, before registering: the copies a previous agent did not make because it
        died between a prepare's answer and its late writes (`keep_copies` under the node lock,
        taken blocking: another instance holds it for a call's writes only)."""
        p = self._preparer
        if p.copies is None:
            return 0
        fd = None
        if p.lock_path is not None:
            try:
                fd = os.open(p.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except FileNotFoundError:
                return 0  # no driver directory: no agent of the driver has prepared a claim here
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if written := self.keep_copies():
                log.warning("Kept %d prepared claim CDI spec(s) the previous agent had not copied", written)
            return written
        finally:
            if fd is not None:
                os.close(fd)

    async def settle(self) -> None:
        """Every late write scheduled so far is done."""
        while self._task is not None and not self._task.done():
            await asyncio.gather(self._task, return_exceptions=True)


def _tell_failures(on_failure: Callable[[str], None] | None, results: Sequence[ClaimResult]) -> None:
    """Every claim a prepare answered with an error, to ``on_failure`` (the report's count)."""
    for r in results:
        if on_failure is not None and r.error:
            on_failure(f"NodePrepareResources: {r.error}")


class ClaimPreparer:
    """NodePrepareResources / NodeUnprepareResources as plain Python (see the module doc)."""

    def __init__(
        self,
        driver: str,
        pool: str,
        reader: ClaimReader,
        inventory: Inventory,
        *,
        allocation: Allocation,
        cdi_spec_dir: Path,
        read_timeout: float = CLAIM_READ_TIMEOUT,
        lock_path: Path | None = None,
        read_async: AsyncClaimRead | None = None,
        copies: SpecCopies | None = None,
        calls: CallActivity | None = None,
        status: ClaimStatusWriter | None = None,
        on_change: Callable[[], None] | None = None,
        metrics: Metrics | None = None,
        metadata: DeviceMetadataFiles | None = None,
        partitions: Partitions | None = None,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        """`lock_path`: the file whose lock serialises calls across instances (`node_lock`).
        `read_async`: the claim's GET on the event loop (`KubeClient.getter`, `apiget.py`); None:
        `reader` in a worker thread. `copies`: where each claim's CDI spec is also kept, so that
        it can be written again after a reboot emptied the CDI directory (cdi.py). `calls`: where
        its calls are marked in flight (the claim status writer waits until they are quiet).
        `status`: told of every claim prepared or unprepared (writes the claims'
        status.devices). `on_change`: called after claims were prepared or unprepared (the
        holders read PodResources again). `metrics`: where the time of a prepare's two slow steps
        goes (the claim's GET, the CDI write). `metadata`: where each prepared request's device
        metadata file goes (None: none is written, `allocation.deviceMetadata: false`).
        `partitions`: how the devices are cut (`plugin.partitions`): a claim may name a partition
        (its place goes into the container's env) or, where the API server dropped the counters,
        the whole device. `on_failure`: called with the error of every claim a prepare answers
        with one (the report's `allocationFailures`)."""
        self.driver = driver
        self.pool = pool
        self._reader = reader
        self._read_async = read_async
        self._inventory = inventory
        self._allocation = allocation
        self.cdi_spec_dir = cdi_spec_dir
        self._read_timeout = read_timeout
        self.lock_path = lock_path
        self.copies = copies
        #: the pool's device names (whole devices and partitions), once per snapshot
        self._pool = pool_devices(partitions)
        self.calls = calls or CallActivity()
        self._status = status
        self.late = LateWrites(self, on_change)
        self._on_failure = on_failure
        self._metrics = metrics
        self.metadata = metadata
        #: (snapshot version, slice device name -> its metadata attributes)
        self._attributes: tuple[int, dict[str, dict[str, Any]]] = (-1, {})

    def spec_path(self, claim_uid: str) -> Path:
        return self.cdi_spec_dir / spec_file_name(self.driver, claim_uid)

    def metadata_attributes(self, snap: Snapshot | None = None) -> dict[str, dict[str, Any]]:
        """Each device's attributes as its slice shows them, and whether it is healthy now
        (`patchbay.dev/healthy`): what a device metadata file lists; once per snapshot."""
        snap = snap or self._inventory.current
        if self._attributes[0] != snap.version:
            self._attributes = (
                snap.version,
                {
                    d.name: {**d.attributes, HEALTHY_ATTRIBUTE: {"bool": d.unhealthy is None}}
                    for d in self._pool(snap).devices
                },
            )
        return self._attributes[1]

    def refresh_metadata(self) -> int:
        """Rewrite the metadata files whose devices changed (a health change, new attributes);
        how many it rewrote."""
        if self.metadata is None:
            return 0
        return self.metadata.refresh(self.metadata_attributes)

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        """Every claim's outcome by UID. The claims are read in parallel BEFORE the node lock is
        taken (a read changes nothing on the node, and concurrent calls, of this instance or
        another, then overlap their GETs instead of queueing them behind the lock); only what
        writes to the node (the CDI spec, the metadata files) runs under it, against the
        inventory as it is then. The specs' copies follow the answer once the calls are quiet
        (`LateWrites`)."""
        async with self.calls.call():
            read = await asyncio.gather(*(self._read(c) for c in claims))
            async with node_lock(self.lock_path):
                results = [
                    obj if isinstance(obj, ClaimResult) else self._prepare_read(claim, obj)
                    for claim, obj in zip(claims, read, strict=True)
                ]
        _tell_failures(self._on_failure, results)
        self.late.after_answer(
            [self.spec_path(c.uid).name for c, r in zip(claims, results, strict=True) if not r.error]
        )
        return {c.uid: r for c, r in zip(claims, results, strict=True)}

    async def _read(self, claim: ClaimRef) -> dict[str, Any] | ClaimResult:
        """The claim object from the API server, or the claim's failed result."""
        where = f"ResourceClaim {claim.namespace}/{claim.name}"
        if (bad := check_claim_name(claim.namespace, claim.name)) is not None:
            return ClaimResult(error=f"ResourceClaim {claim.uid[:80]!r}: {bad}")
        if (bad := check_claim_uid(claim.uid)) is not None:
            return ClaimResult(error=f"{where}: {bad}")
        started = time.perf_counter()
        try:
            if self._read_async is not None:
                obj = await self._read_async(claim.namespace, claim.name, self._read_timeout)
            else:
                obj = await asyncio.wait_for(
                    asyncio.to_thread(
                        self._reader.resource_claim, claim.namespace, claim.name, timeout=self._read_timeout
                    ),
                    self._read_timeout + 1.0,
                )
        except TimeoutError:
            return ClaimResult(error=f"cannot read {where}: no answer within {self._read_timeout:g}s")
        except Exception as e:
            return ClaimResult(error=f"cannot read {where}: {e}")
        if self._metrics is not None:
            self._metrics.dra_claim_read_seconds.observe(time.perf_counter() - started)
        return obj

    def _prepare_read(self, claim: ClaimRef, obj: dict[str, Any]) -> ClaimResult:
        """The read claim's devices, CDI spec and metadata files (under the node lock)."""
        where = f"ResourceClaim {claim.namespace}/{claim.name}"
        snap = self._inventory.current
        try:
            pool = self._pool(snap)
            devices = allocated_devices(
                obj, claim.uid, self.driver, self.pool, pool.physical, places=pool.places
            )
        except ClaimError as e:
            return ClaimResult(error=f"{where}: {e}")
        healthy = snap.healthy_physical
        sick = [d.device_name for d in devices if d.physical_id not in healthy]
        if sick:
            return ClaimResult(error=f"{where}: device(s) {', '.join(sick)} are unhealthy now")
        doc = claim_spec_document(self.driver, claim.uid, devices, snap.specs, self._allocation)
        extra = self._write_metadata(obj, claim, devices, snap, doc)
        path = self.spec_path(claim.uid)
        started = time.perf_counter()
        try:
            # On the loop, not a worker thread: a spec is a few hundred bytes written to the page
            # cache (no fsync), about 0.1 ms, less than the hop to a thread and back costs in a
            # busy pod (the dra_path benchmark: docs/benchmarks.md).
            _write_if_changed(path, doc)
        except OSError as e:
            return ClaimResult(error=f"{where}: cannot write the CDI spec {path}: {e}")
        if self._metrics is not None:
            self._metrics.dra_cdi_write_seconds.observe(time.perf_counter() - started)
        log.info("Prepared %s (%s): %d device(s), CDI spec %s", where, claim.uid, len(devices), path)
        prepared = tuple(
            PreparedDevice(
                d.request,
                self.pool,
                d.device_name,
                cdi_device_id(self.driver, claim.uid, d.device_name),
                d.share_id,
                (extra.pop(base_request(d.request)),) if base_request(d.request) in extra else (),
            )
            for d in devices
        )
        if self._status is not None:
            self._status.prepared(
                claim.namespace,
                claim.name,
                claim.uid,
                [
                    (d.device_name, d.physical_id, p.cdi_id, d.share_id)
                    for d, p in zip(devices, prepared, strict=True)
                ],
            )
        return ClaimResult(prepared)

    def _write_metadata(
        self,
        obj: Mapping[str, Any],
        claim: ClaimRef,
        devices: Sequence[AllocatedDevice],
        snap: Snapshot,
        doc: dict[str, Any],
    ) -> dict[str, str]:
        """Write the claim's device metadata files and add the CDI devices that mount them to
        its spec `doc`; returns their CDI IDs by request. A file that cannot be written costs
        the container its metadata, never the claim (upstream's library does the same): said
        loudly."""
        if self.metadata is None or not devices:
            return {}
        try:
            info = ClaimInfo.of(obj, claim.namespace, claim.name, claim.uid)
            mounts = self.metadata.write(
                info, [(d.request, d.device_name) for d in devices], self.metadata_attributes(snap)
            )
        except (OSError, ValueError) as e:
            log.error(
                "ResourceClaim %s/%s: cannot write its device metadata in %s: %s",
                claim.namespace,
                claim.name,
                self.metadata.root,
                e,
            )
            return {}
        doc["devices"].extend(mounts.values())
        kind = doc["kind"]
        return {request: f"{kind}={device['name']}" for request, device in mounts.items()}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Every claim's error ("" when done) by UID: its spec file deleted (absent is fine)."""
        out = {}
        async with self.calls.call(), node_lock(self.lock_path):
            for claim in claims:
                if (bad := check_claim_uid(claim.uid)) is not None:
                    out[claim.uid] = bad
                    continue
                path = self.spec_path(claim.uid)
                try:
                    # The copy first: a spec deleted while its copy is still there would be
                    # written again (cdi.SpecGuard).
                    if self.copies is not None:
                        self.copies.forget(path.name)
                    path.unlink(missing_ok=True)
                except OSError as e:
                    out[claim.uid] = f"cannot delete the CDI spec {path}: {e}"
                    continue
                if self.metadata is not None and check_claim_name(claim.namespace, claim.name) is None:
                    # A claim whose names could not be a claim's was never prepared (above):
                    # it has no metadata files, and its names must not reach a path.
                    try:
                        self.metadata.remove(claim.namespace, claim.name, claim.uid)
                    except OSError as e:
                        out[claim.uid] = f"cannot delete the device metadata in {self.metadata.root}: {e}"
                        continue
                out[claim.uid] = ""
                log.info("Unprepared ResourceClaim %s/%s (%s)", claim.namespace, claim.name, claim.uid)
                if self._status is not None:
                    self._status.unprepared(claim.namespace, claim.name, claim.uid)
        self.late.after_answer(())
        return out


def _write_if_changed(path: Path, doc: dict[str, Any]) -> bool:
    """Prepare twice = the same file, written once (the runtime re-reads on every write); True
    when it wrote."""
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()) == doc:
            return False
    write_spec(path, doc)
    return True
