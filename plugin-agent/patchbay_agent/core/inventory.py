"""What the kubelet is told: the advertised device list and the lookups Allocate needs.

Every change produces a new immutable `Snapshot`: the ListAndWatch message already encoded once
(every stream sends the same object), the replica -> physical device map, and the DeviceSpecs of
every physical device. Allocate and GetPreferredAllocation only read the current snapshot, so they
never wait for discovery, health probes or I/O.

Sharing: with `replicas: N > 1` each physical device `d` is advertised as `d::0` ... `d::N-1`
(profile contract); with N = 1 the ID is `d` itself. A replica is as healthy as its device.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from patchbay_agent.api import api_pb2
from patchbay_agent.config import MAX_DEVICE_ID_LENGTH, MAX_LIST_AND_WATCH_BYTES
from patchbay_agent.constants import REPLICA_SEPARATOR, DeviceHealth
from patchbay_agent.core.health import DeviceHealthTracker
from patchbay_agent.discovery import PhysicalDevice


class ListTooLargeError(RuntimeError):
    """The advertised list would exceed the kubelet's 4 MiB ListAndWatch message limit
    (docs/facts.md#device-plugin-api)."""


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
class Snapshot:
    """One consistent view of the devices; replaced, never mutated."""

    version: int
    response: api_pb2.ListAndWatchResponse
    #: physical ID -> device
    physical: Mapping[str, PhysicalDevice] = field(default_factory=dict)
    #: advertised ID -> physical ID
    replica_of: Mapping[str, str] = field(default_factory=dict)
    #: advertised IDs that are Healthy
    healthy: frozenset[str] = frozenset()
    #: physical ID -> its DeviceSpecs (host path = container path)
    specs: Mapping[str, tuple[api_pb2.DeviceSpec, ...]] = field(default_factory=dict)
    size_bytes: int = 0

    @property
    def advertised(self) -> int:
        return len(self.replica_of)


class Inventory:
    """Holds the current snapshot and wakes ListAndWatch streams when it changes."""

    def __init__(
        self,
        replicas: int,
        permissions: str,
        max_bytes: int = MAX_LIST_AND_WATCH_BYTES,
        host_path_prefix: str = "",
    ) -> None:
        self._replicas = replicas
        self._permissions = permissions
        # What the container runtime must put before a device path to find it on the node: ""
        # when discovery reads the node's own /dev (the DaemonSet), the tree's directory when the
        # "host" is a directory on the node (a fake device tree in tests and the demo).
        self._host_path_prefix = host_path_prefix.rstrip("/")
        self._max_bytes = max_bytes
        self.current = Snapshot(0, api_pb2.ListAndWatchResponse())
        self._changed = asyncio.Event()
        self._closed = False
        self._key: tuple[object, ...] = ()

    def update(self, devices: Sequence[PhysicalDevice], health: DeviceHealthTracker) -> bool:
        """Publish a new snapshot if the advertised list changed; True when it did.

        Raises ListTooLargeError (and keeps the previous snapshot) when the encoded list would
        not fit the kubelet's limit.
        """
        entries: list[tuple[str, str, tuple[int, ...]]] = []
        replica_of: dict[str, str] = {}
        healthy: set[str] = set()
        for dev in devices:
            state = DeviceHealth.HEALTHY if health.healthy(dev.id) else DeviceHealth.UNHEALTHY
            for n in range(self._replicas):
                rid = replica_id(dev.id, n, self._replicas)
                entries.append((rid, state.value, dev.numa_nodes))
                replica_of[rid] = dev.id
                if state is DeviceHealth.HEALTHY:
                    healthy.add(rid)
        key = (tuple(entries), tuple(devices))
        if key == self._key and self.current.version > 0:
            return False
        response = api_pb2.ListAndWatchResponse(
            devices=[
                api_pb2.Device(
                    ID=rid,
                    health=state,
                    topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n) for n in numa])
                    if numa
                    else None,
                )
                for rid, state, numa in entries
            ]
        )
        size = response.ByteSize()
        if size > self._max_bytes:
            raise ListTooLargeError(
                f"{len(devices)} devices x {self._replicas} replicas = {len(entries)} entries encode to "
                f"{size} bytes, over the kubelet's {self._max_bytes}-byte ListAndWatch limit: lower "
                "plugin.sharing.replicas or narrow plugin.discovery"
            )
        specs = {
            dev.id: tuple(
                api_pb2.DeviceSpec(
                    container_path=p, host_path=self._host_path_prefix + p, permissions=self._permissions
                )
                for p in dev.dev_paths
            )
            for dev in devices
        }
        self._key = key
        self.current = Snapshot(
            version=self.current.version + 1,
            response=response,
            physical={d.id: d for d in devices},
            replica_of=replica_of,
            healthy=frozenset(healthy),
            specs=specs,
            size_bytes=size,
        )
        self._wake()
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
        """End every ListAndWatch stream (graceful shutdown)."""
        self._closed = True
        self._wake()
