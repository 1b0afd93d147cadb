"""A small async client for the kubelet's PodResources API v1 (`api/podresources.proto`).

The kubelet serves `v1.PodResourcesLister` on `<kubelet root>/pod-resources/kubelet.sock`:

* `get_allocatable_resources()`: what the kubelet may hand out; for device plugin resources, the
  IDs of the Healthy devices it holds (the same numbers as the node's allocatable);
* `list_pods()`: every pod and the devices each of its containers was given, as the kubelet
  allocated them (replica IDs `<id>::<n>` as such);
* `get_pod()`: one pod (needs the kubelet's KubeletPodResourcesGet feature gate).

Each call opens its own channel (a private subchannel pool, like `registration`: a kubelet that
restarted must not be answered from a connection to its predecessor) and returns plain frozen
dataclasses, so callers never handle protobuf messages.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc

from patchbay_agent.api import podresources_pb2, podresources_pb2_grpc
from patchbay_agent.constants import DEFAULT_POD_RESOURCES_SOCKET

#: The kubelet's own limit for PodResources messages (16 MiB); gRPC's default client limit is 4
#: (docs/facts.md#plugin-sockets).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Devices:
    """Device plugin devices of one resource (and, when the plugin said, their NUMA nodes)."""

    resource_name: str
    device_ids: tuple[str, ...]
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Memory:
    memory_type: str
    size: int
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class ClaimResource:
    driver_name: str
    pool_name: str
    device_name: str
    cdi_devices: tuple[str, ...] = ()
    share_id: str | None = None


@dataclass(frozen=True)
class DynamicResource:
    """Devices a container got through a DRA resource claim."""

    claim_name: str
    claim_namespace: str
    claim_resources: tuple[ClaimResource, ...] = ()


@dataclass(frozen=True)
class Allocatable:
    """GetAllocatableResources: everything the kubelet may hand out."""

    devices: tuple[Devices, ...] = ()
    cpu_ids: tuple[int, ...] = ()
    memory: tuple[Memory, ...] = ()

    def device_ids(self, resource_name: str) -> list[str]:
        """The allocatable device IDs of one resource (the kubelet may split them by NUMA node)."""
        return [i for d in self.devices if d.resource_name == resource_name for i in d.device_ids]

    def count(self, resource_name: str) -> int:
        """How many devices of the resource the kubelet can allocate: the node's allocatable."""
        return len(self.device_ids(resource_name))


@dataclass(frozen=True)
class Container:
    name: str
    devices: tuple[Devices, ...] = ()
    cpu_ids: tuple[int, ...] = ()
    memory: tuple[Memory, ...] = ()
    dynamic_resources: tuple[DynamicResource, ...] = ()

    def device_ids(self, resource_name: str) -> list[str]:
        return [i for d in self.devices if d.resource_name == resource_name for i in d.device_ids]

    def claimed_devices(self, driver: str, pool: str) -> list[str]:
        """The DRA devices (ResourceSlice device names) of one driver's pool this container got
        through its resource claims."""
        return [
            r.device_name
            for d in self.dynamic_resources
            for r in d.claim_resources
            if r.driver_name == driver and r.pool_name == pool
        ]


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    containers: tuple[Container, ...] = ()
    cpu_ids: tuple[int, ...] = ()
    memory: tuple[Memory, ...] = ()

    def container(self, name: str) -> Container | None:
        return next((c for c in self.containers if c.name == name), None)


def _numa(topology: podresources_pb2.TopologyInfo) -> tuple[int, ...]:
    return tuple(n.ID for n in topology.nodes)


def _devices(items: Iterable[podresources_pb2.ContainerDevices]) -> tuple[Devices, ...]:
    return tuple(Devices(d.resource_name, tuple(d.device_ids), _numa(d.topology)) for d in items)


def _memory(items: Iterable[podresources_pb2.ContainerMemory]) -> tuple[Memory, ...]:
    return tuple(Memory(m.memory_type, m.size, _numa(m.topology)) for m in items)


def _dynamic(items: Iterable[podresources_pb2.DynamicResource]) -> tuple[DynamicResource, ...]:
    return tuple(
        DynamicResource(
            d.claim_name,
            d.claim_namespace,
            tuple(
                ClaimResource(
                    c.driver_name,
                    c.pool_name,
                    c.device_name,
                    tuple(x.name for x in c.cdi_devices),
                    c.share_id if c.HasField("share_id") else None,
                )
                for c in d.claim_resources
            ),
        )
        for d in items
    )


def _pod(p: podresources_pb2.PodResources) -> Pod:
    return Pod(
        p.name,
        p.namespace,
        tuple(
            Container(
                c.name,
                _devices(c.devices),
                tuple(c.cpu_ids),
                _memory(c.memory),
                _dynamic(c.dynamic_resources),
            )
            for c in p.containers
        ),
        tuple(p.cpu_ids),
        _memory(p.memory),
    )


def _channel(socket: Path | str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(
        f"unix://{socket}",
        options=[
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ],
    )


async def get_allocatable_resources(
    socket: Path | str = DEFAULT_POD_RESOURCES_SOCKET, *, rpc_timeout: float = 10.0
) -> Allocatable:
    """The kubelet's GetAllocatableResources; raises grpc.aio.AioRpcError on failure."""
    async with _channel(socket) as channel:
        stub = podresources_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        r = await stub.GetAllocatableResources(
            podresources_pb2.AllocatableResourcesRequest(), timeout=rpc_timeout
        )
    return Allocatable(_devices(r.devices), tuple(r.cpu_ids), _memory(r.memory))


async def list_pods(
    socket: Path | str = DEFAULT_POD_RESOURCES_SOCKET, *, rpc_timeout: float = 10.0
) -> list[Pod]:
    """The kubelet's List: every pod it knows, with its containers' resources."""
    async with _channel(socket) as channel:
        stub = podresources_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        r = await stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=rpc_timeout)
    return [_pod(p) for p in r.pod_resources]


async def get_pod(
    name: str, namespace: str, socket: Path | str = DEFAULT_POD_RESOURCES_SOCKET, *, rpc_timeout: float = 10.0
) -> Pod:
    """The kubelet's Get for one pod (feature gate KubeletPodResourcesGet)."""
    async with _channel(socket) as channel:
        stub = podresources_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
        r = await stub.Get(
            podresources_pb2.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace),
            timeout=rpc_timeout,
        )
    return _pod(r.pod_resources)
