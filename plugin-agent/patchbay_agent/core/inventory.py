"""The device core's state: one immutable `Snapshot` per change, and the subscribers told of it.

A snapshot is everything a front-end or a writer needs to know about one resource's devices on
this node, in one consistent piece: the physical devices (first-seen order), the advertised IDs
(replicas) and which of them are healthy, each device's health with since when and why (the
health tracker's `DeviceStatus`, captured in the same step, so health has ONE source), and each
device's device files as plain `DeviceSpec`s. It carries no wire format: the Device Plugin
front-end encodes its ListAndWatch message from it (`deviceplugin.encoding`), DRA its slices and
health stream, the DeviceReport its object.

Front-ends subscribe (`subscribe`, called once per new snapshot) or wait (`next_change`, the
ListAndWatch and health streams). A front-end may also refuse a snapshot before it is published
(`admit`: the kubelet's 4 MiB ListAndWatch limit), which keeps the previous one.

Sharing: with `replicas: N > 1` each physical device `d` is advertised as `d::0` ... `d::N-1`
(profile contract); with N = 1 the ID is `d` itself. A replica is as healthy as its device.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from patchbay_agent.config import MAX_DEVICE_ID_LENGTH
from patchbay_agent.constants import REPLICA_SEPARATOR
from patchbay_agent.core.health import DeviceHealthTracker, DeviceStatus
from patchbay_agent.discovery import PhysicalDevice

log = logging.getLogger(__name__)


class SnapshotRefusedError(RuntimeError):
    """A front-end cannot serve this snapshot (see `Inventory.admit`); the previous one stays."""


def replica_id(physical_id: str, n: int, replicas: int) -> str:
    """The advertised ID of replica `n`; stays within the kubelet's 63-character limit."""
    if replicas == 1:
        return physical_id
    suffix = f"{REPLICA_SEPARATOR}{n}"
    if len(physical_id) + len(suffix) <= MAX_DEVICE_ID_LENGTH:
        return physical_id + suffix
    digest = hashlib.sha256(physical_id.encode()).hexdigest()[:8]
    keep = MAX_DEVICE_ID_LENGTH - len(suffix) - 9
    return f"{physical_id[:keep]}-{digest}{suffix}"


@dataclass(frozen=True)
class DeviceSpec:
    """One device file as a container gets it: its path inside, its path on the node, rwm."""

    container_path: str
    host_path: str
    permissions: str


@dataclass(frozen=True)
class Snapshot:
    """One consistent view of the devices; replaced, never mutated."""

    version: int
    #: physical ID -> device, in first-seen order
    physical: Mapping[str, PhysicalDevice] = field(default_factory=dict)
    #: advertised ID -> physical ID
    replica_of: Mapping[str, str] = field(default_factory=dict)
    #: advertised IDs that are Healthy
    healthy: frozenset[str] = frozenset()
    #: physical ID -> health, since when, why (absent: never observed)
    status: Mapping[str, DeviceStatus] = field(default_factory=dict)
    #: physical ID -> its device files
    specs: Mapping[str, tuple[DeviceSpec, ...]] = field(default_factory=dict)

    @property
    def advertised(self) -> int:
        return len(self.replica_of)

    @functools.cached_property
    def healthy_physical(self) -> frozenset[str]:
        """Physical IDs whose replicas are advertised Healthy."""
        return frozenset(self.replica_of[rid] for rid in self.healthy)

    def status_of(self, physical_id: str) -> DeviceStatus | None:
        return self.status.get(physical_id)


class Inventory:
    """Holds one resource's current snapshot; tells subscribers and wakes streams on change."""

    def __init__(self, replicas: int, permissions: str, host_path_prefix: str = "") -> None:
        self._replicas = replicas
        self._permissions = permissions
        # What the container runtime must put before a device path to find it on the node: ""
        # when discovery reads the node's own /dev (the DaemonSet), the tree's directory when the
        # "host" is a directory on the node (a fake device tree in tests and the demo).
        self._host_path_prefix = host_path_prefix.rstrip("/")
        self.current = Snapshot(0)
        self._changed = asyncio.Event()
        self._closed = False
        self._key: tuple[object, ...] = ()
        self._guards: list[Callable[[Snapshot], None]] = []
        self._subscribers: list[Callable[[Snapshot], None]] = []

    def admit(self, guard: Callable[[Snapshot], None]) -> None:
        """Run `guard` on every new snapshot before it is published; it raises SnapshotRefusedError
        (a subclass of it) to keep the previous one."""
        self._guards.append(guard)

    def subscribe(self, callback: Callable[[Snapshot], None]) -> None:
        """Call `callback` with every new snapshot (on the event loop; it must not block)."""
        self._subscribers.append(callback)

    def update(self, devices: Sequence[PhysicalDevice], health: DeviceHealthTracker) -> bool:
        """Publish a new snapshot if the devices or their health (state, since, reason) changed;
        True when it did. Raises SnapshotRefusedError (and keeps the previous snapshot) when a
        front-end's guard refuses it."""
        replica_of: dict[str, str] = {}
        healthy: set[str] = set()
        status: dict[str, DeviceStatus] = {}
        for dev in devices:
            ok = health.healthy(dev.id)
            st = health.status(dev.id)
            if st is not None:
                status[dev.id] = st
            for n in range(self._replicas):
                rid = replica_id(dev.id, n, self._replicas)
                replica_of[rid] = dev.id
                if ok:
                    healthy.add(rid)
        key = (tuple(devices), tuple(sorted(healthy)), tuple(status.items()))
        if key == self._key and self.current.version > 0:
            return False
        snap = Snapshot(
            version=self.current.version + 1,
            physical={d.id: d for d in devices},
            replica_of=replica_of,
            healthy=frozenset(healthy),
            status=status,
            specs={
                dev.id: tuple(
                    DeviceSpec(p, self._host_path_prefix + p, self._permissions) for p in dev.dev_paths
                )
                for dev in devices
            },
        )
        for guard in self._guards:
            guard(snap)
        self._key = key
        self.current = snap
        self._wake()
        for callback in self._subscribers:
            try:
                callback(snap)
            except Exception:
                # One subscriber's bug must not keep the others (or the kubelet) from the news.
                log.exception("A subscriber of the device snapshots failed")
        return True

    def _wake(self) -> None:
        # Waiters hold the old event; a fresh one is armed for the next change.
        old, self._changed = self._changed, asyncio.Event()
        old.set()

    async def next_change(self, version: int) -> Snapshot | None:
        """The first snapshot newer than `version`, or None once the inventory is closed."""
        while not self._closed and self.current.version == version:
            await self._changed.wait()
        return None if self._closed else self.current

    def close(self) -> None:
        """End every stream that waits for a change (graceful shutdown)."""
        self._closed = True
        self._wake()
