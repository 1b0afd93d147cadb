"""The device core's snapshot in the Device Plugin API's v1beta1 wire format, within its limit.

ListAndWatch sends the whole list on every change; every open stream sends the same message, so
it is encoded once per snapshot (`ListAndWatchEncoder.response_for`). A snapshot whose list the
kubelet would not take, over its 4 MiB gRPC receive limit (docs/facts.md#device-plugin-api), is
refused BEFORE it is published (`check`, installed with `Inventory.admit`): the kubelet keeps the
last list that fitted, and the agent says why. A snapshot that changes only what the kubelet does
not see (a reason, a `since`) reuses the previous message object, so streams skip it.
"""

from __future__ import annotations

from collections.abc import Callable

from patchbay_agent.api import api_pb2
from patchbay_agent.config import MAX_LIST_AND_WATCH_BYTES
from patchbay_agent.constants import DeviceHealth
from patchbay_agent.core.inventory import DeviceSpec, Snapshot, SnapshotRefusedError


class ListTooLargeError(SnapshotRefusedError):
    """The advertised list would exceed the kubelet's 4 MiB ListAndWatch message limit
    (docs/facts.md#device-plugin-api)."""


Entries = tuple[tuple[str, str, tuple[int, ...]], ...]


def entries(snap: Snapshot) -> Entries:
    """(advertised ID, health, NUMA nodes) of every advertised ID, in the snapshot's order."""
    out = []
    for rid, pid in snap.replica_of.items():
        state = DeviceHealth.HEALTHY if rid in snap.healthy else DeviceHealth.UNHEALTHY
        out.append((rid, state.value, snap.physical[pid].numa_nodes))
    return tuple(out)


def list_response(listed: Entries) -> api_pb2.ListAndWatchResponse:
    return api_pb2.ListAndWatchResponse(
        devices=[
            api_pb2.Device(
                ID=rid,
                health=state,
                topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n) for n in numa]) if numa else None,
            )
            for rid, state, numa in listed
        ]
    )


def device_spec(spec: DeviceSpec) -> api_pb2.DeviceSpec:
    return api_pb2.DeviceSpec(
        container_path=spec.container_path, host_path=spec.host_path, permissions=spec.permissions
    )


class ListAndWatchEncoder:
    """The ListAndWatch message of the newest snapshot it saw (see the module doc)."""

    def __init__(
        self,
        replicas: int = 1,
        max_bytes: int = MAX_LIST_AND_WATCH_BYTES,
        on_size: Callable[[int], None] | None = None,
    ) -> None:
        """`replicas` only words the refusal; `on_size` hears each new message's size (the
        `patchbay_agent_list_and_watch_bytes` gauge)."""
        self._replicas = replicas
        self._max_bytes = max_bytes
        self._on_size = on_size
        self.response = api_pb2.ListAndWatchResponse()
        self.size_bytes = 0
        self._version = -1
        self._entries: Entries | None = None

    def check(self, snap: Snapshot) -> None:
        """Encode `snap`; raises ListTooLargeError (keeping the last message) when it is too large."""
        self.response_for(snap)

    def response_for(self, snap: Snapshot) -> api_pb2.ListAndWatchResponse:
        if snap.version == self._version:
            return self.response
        listed = entries(snap)
        if listed != self._entries:
            response = list_response(listed)
            size = response.ByteSize()
            if size > self._max_bytes:
                raise ListTooLargeError(
                    f"{len(snap.physical)} devices x {self._replicas} replicas = {len(listed)} entries "
                    f"encode to {size} bytes, over the kubelet's {self._max_bytes}-byte ListAndWatch "
                    "limit: lower plugin.sharing.replicas or narrow plugin.discovery"
                )
            self.response, self.size_bytes, self._entries = response, size, listed
            if self._on_size is not None:
                self._on_size(size)
        self._version = snap.version
        return self.response
