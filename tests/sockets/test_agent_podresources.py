"""The PodResources v1 client against a tiny in-test `v1.PodResourcesLister` server on a real Unix
socket: plain dataclasses out, the wire contract (service and method paths) as the kubelet's."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from patchbay_agent.api import podresources_pb2 as pb
from patchbay_agent.api import podresources_pb2_grpc as pb_grpc
from patchbay_agent.kubelet import podresources

GPU = "nvidia.com/gpu"
SERIAL = "example.com/serial"


def _numa(*nodes: int) -> pb.TopologyInfo:
    return pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in nodes])


POD = pb.PodResources(
    name="trainer",
    namespace="ml",
    cpu_ids=[2, 3],
    containers=[
        pb.ContainerResources(
            name="main",
            devices=[
                pb.ContainerDevices(
                    resource_name=GPU, device_ids=["GPU-1::0", "GPU-1::1"], topology=_numa(0)
                ),
                pb.ContainerDevices(resource_name=SERIAL, device_ids=["ttyUSB0"]),
            ],
            cpu_ids=[2, 3],
            memory=[pb.ContainerMemory(memory_type="hugepages-2Mi", size=4 << 20, topology=_numa(1))],
            dynamic_resources=[
                pb.DynamicResource(
                    claim_name="gpu-claim",
                    claim_namespace="ml",
                    claim_resources=[
                        pb.ClaimResource(
                            driver_name="gpu.example.com",
                            pool_name="node-1",
                            device_name="gpu-0",
                            cdi_devices=[pb.CDIDevice(name="example.com/gpu=gpu-0")],
                            share_id="s1",
                        ),
                        pb.ClaimResource(
                            driver_name="gpu.example.com", pool_name="node-1", device_name="gpu-1"
                        ),
                    ],
                )
            ],
        ),
        pb.ContainerResources(name="sidecar"),
    ],
)


class Lister(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.allocatable = pb.AllocatableResourcesResponse(
            devices=[
                pb.ContainerDevices(
                    resource_name=GPU, device_ids=["GPU-1::0", "GPU-1::1"], topology=_numa(0)
                ),
                pb.ContainerDevices(resource_name=GPU, device_ids=["GPU-2::0"], topology=_numa(1)),
                pb.ContainerDevices(resource_name=SERIAL, device_ids=["ttyUSB0", "ttyUSB1"]),
            ],
            cpu_ids=[0, 1, 2, 3],
            memory=[pb.ContainerMemory(memory_type="memory", size=8 << 30, topology=_numa(0, 1))],
        )
        self.calls: list[str] = []

    async def GetAllocatableResources(
        self, request: pb.AllocatableResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocatableResourcesResponse:
        self.calls.append("GetAllocatableResources")
        return self.allocatable

    async def List(
        self, request: pb.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        self.calls.append("List")
        return pb.ListPodResourcesResponse(
            pod_resources=[POD, pb.PodResources(name="idle", namespace="default")]
        )

    async def Get(
        self, request: pb.GetPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetPodResourcesResponse:
        self.calls.append("Get")
        if (request.pod_name, request.pod_namespace) != ("trainer", "ml"):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name}")
        return pb.GetPodResourcesResponse(pod_resources=POD)


@contextlib.asynccontextmanager
async def serving(socket: Path) -> AsyncIterator[Lister]:
    lister = Lister()
    server = grpc.aio.server()
    pb_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    try:
        yield lister
    finally:
        await server.stop(0)


def test_get_allocatable_resources(short_dir: Path) -> None:
    sock = short_dir / "kubelet.sock"

    async def scenario() -> None:
        async with serving(sock) as lister:
            got = await podresources.get_allocatable_resources(sock)
            assert lister.calls == ["GetAllocatableResources"]
        assert got.count(GPU) == 3
        assert got.device_ids(GPU) == ["GPU-1::0", "GPU-1::1", "GPU-2::0"]
        assert got.count(SERIAL) == 2
        assert got.count("example.com/none") == 0
        assert got.devices[0] == podresources.Devices(GPU, ("GPU-1::0", "GPU-1::1"), (0,))
        assert got.devices[2].numa_nodes == ()
        assert got.cpu_ids == (0, 1, 2, 3)
        assert got.memory == (podresources.Memory("memory", 8 << 30, (0, 1)),)

    asyncio.run(scenario())


def test_list_pods_and_get_pod(short_dir: Path) -> None:
    sock = short_dir / "kubelet.sock"

    async def scenario() -> None:
        async with serving(sock):
            pods = await podresources.list_pods(str(sock))
            one = await podresources.get_pod("trainer", "ml", sock)
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await podresources.get_pod("nope", "ml", sock)
            assert missing.value.code() is grpc.StatusCode.NOT_FOUND
        assert [(p.namespace, p.name) for p in pods] == [("ml", "trainer"), ("default", "idle")]
        trainer, idle = pods
        assert one == trainer
        assert idle.containers == ()
        assert trainer.cpu_ids == (2, 3)
        main = trainer.container("main")
        assert main is not None
        assert trainer.container("absent") is None
        # Replica IDs exactly as the kubelet allocated them.
        assert main.device_ids(GPU) == ["GPU-1::0", "GPU-1::1"]
        assert main.device_ids(SERIAL) == ["ttyUSB0"]
        assert main.devices[0].numa_nodes == (0,)
        assert main.memory == (podresources.Memory("hugepages-2Mi", 4 << 20, (1,)),)
        (claim,) = main.dynamic_resources
        assert (claim.claim_name, claim.claim_namespace) == ("gpu-claim", "ml")
        assert claim.claim_resources == (
            podresources.ClaimResource(
                "gpu.example.com", "node-1", "gpu-0", ("example.com/gpu=gpu-0",), "s1"
            ),
            podresources.ClaimResource("gpu.example.com", "node-1", "gpu-1", (), None),
        )
        assert trainer.container("sidecar") == podresources.Container("sidecar")

    asyncio.run(scenario())


def test_answers_over_the_grpc_default_4_mib_limit_are_read(short_dir: Path) -> None:
    """A node with many devices: the kubelet allows 16 MiB, so must the client."""
    sock = short_dir / "kubelet.sock"
    ids = [f"device-{n:08d}-{'x' * 40}" for n in range(100_000)]

    async def scenario() -> None:
        async with serving(sock) as lister:
            lister.allocatable = pb.AllocatableResourcesResponse(
                devices=[pb.ContainerDevices(resource_name=SERIAL, device_ids=ids)]
            )
            assert lister.allocatable.ByteSize() > 4 * 1024 * 1024
            got = await podresources.get_allocatable_resources(sock)
        assert got.count(SERIAL) == len(ids)

    asyncio.run(scenario())


def test_no_kubelet_is_an_rpc_error(short_dir: Path) -> None:
    async def scenario() -> None:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await podresources.get_allocatable_resources(short_dir / "absent.sock", rpc_timeout=2)
        assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

    asyncio.run(scenario())


def test_the_method_paths_are_the_kubelets() -> None:
    service = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert sorted(m.name for m in service.methods) == ["Get", "GetAllocatableResources", "List"]
    # Field numbers the kubelet encodes (a renumbered field would decode silently wrong).
    fields = {f.name: f.number for f in pb.ContainerDevices.DESCRIPTOR.fields}
    assert fields == {"resource_name": 1, "device_ids": 2, "topology": 3}
    assert {f.name: f.number for f in pb.ClaimResource.DESCRIPTOR.fields}["share_id"] == 5
