"""Bad input, tried: the agent's device plugin gRPC service, as the kubelet (or anything that can
reach its socket on the node) calls it, over a real Unix socket against ONE running agent with a
fake device tree (8 devices, 2 replicas each). Allocate, GetPreferredAllocation and
PreStartContainer get random and oversize ID lists. Every answer is OK or INVALID_ARGUMENT whose
message names an ID that was wrong; never UNKNOWN or INTERNAL (an exception in the agent); a
request over gRPC's 4 MiB limit is refused by gRPC itself; the agent keeps serving throughout."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.agentrun import make_config
from support.fakehw import FakeHardware
from support.fuzzing import LoopThread, tally

from patchbay_agent.agent import Agent, AgentOptions
from patchbay_agent.api import api_pb2, api_pb2_grpc

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
GOOD = [f"ttyUSB{i}::{r}" for i in range(8) for r in range(2)]


@pytest.fixture(scope="module")
def stub(loop_thread: LoopThread, module_dir: Path) -> Iterator[api_pb2_grpc.DevicePluginStub]:
    hw = FakeHardware(module_dir / "host")
    for i in range(8):
        hw.add_dev(f"/dev/ttyUSB{i}")
    plugins = module_dir / "dp"
    plugins.mkdir()
    config = make_config(
        {
            "discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}},
            "sharing": {"replicas": 2},
            "preferredAllocation": {"policy": "Pack"},
        }
    )
    options = AgentOptions(
        node_name="node-1", plugin_dir=plugins, host_root=hw.root, http_address=None, shutdown_grace=1.0
    )
    stop = asyncio.Event()

    async def start() -> tuple[Agent, asyncio.Task[None]]:
        agent = Agent(config, options)
        task = asyncio.create_task(agent.run(stop))
        await asyncio.wait_for(agent.started.wait(), 10)
        return agent, task

    agent, task = loop_thread.run(start())
    channel = grpc.insecure_channel(f"unix://{agent.registrar.socket_path}")
    try:
        yield api_pb2_grpc.DevicePluginStub(channel)
    finally:
        channel.close()
        loop_thread.loop.call_soon_threadsafe(stop.set)
        loop_thread.run(asyncio.wait_for(asyncio.shield(task), 15))


_id = st.one_of(
    st.sampled_from(GOOD),
    st.text(max_size=80),
    st.sampled_from(["", "::", "ttyUSB0::", "ttyUSB0::9", "../ttyUSB0", "ttyUSB0\x00", "ttyUSB99::0"]),
)
_ids = st.lists(_id, max_size=40)


def _judge(
    surface: str, call: object, ids: list[str], empty: bool = False, fields: tuple[str, ...] = ()
) -> None:
    """`call` answers OK or INVALID_ARGUMENT naming a wrong ID, or the request's field that was
    wrong (`fields`), or, when a container request had no IDs at all, saying so."""
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as e:
        code = e.code()
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, e.details())  # noqa: PT017 - either outcome is fine
        details = e.details() or ""
        assert len(details) < 2048, len(details)
        wrong = [i for i in ids if i not in GOOD]
        named = any(repr(i if len(i) <= 80 else i[:80] + "...") in details for i in wrong)
        field = any(f in details for f in fields)
        assert named or field or (empty and "without device IDs" in details), details[:300]
        tally(surface, "INVALID_ARGUMENT")
        return
    tally(surface, "OK")


@FUZZ
@given(requests=st.lists(_ids, min_size=0, max_size=5))
def test_allocate(stub: api_pb2_grpc.DevicePluginStub, requests: list[list[str]]) -> None:
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in requests]
    )
    _judge(
        "deviceplugin Allocate",
        lambda: stub.Allocate(request, timeout=10),
        [i for r in requests for i in r],
        empty=any(not r for r in requests),
    )


@FUZZ
@given(available=_ids, must=_ids, size=st.integers(min_value=-5, max_value=100))
def test_get_preferred_allocation(
    stub: api_pb2_grpc.DevicePluginStub, available: list[str], must: list[str], size: int
) -> None:
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=max(size, 0)
            )
        ]
    )
    _judge(
        "deviceplugin GetPreferredAllocation",
        lambda: stub.GetPreferredAllocation(request, timeout=10),
        available + must,
        fields=("allocation_size", "must_include", "available"),
    )


@FUZZ
@given(ids=_ids)
def test_pre_start_container(stub: api_pb2_grpc.DevicePluginStub, ids: list[str]) -> None:
    request = api_pb2.PreStartContainerRequest(devices_ids=ids)
    _judge("deviceplugin PreStartContainer", lambda: stub.PreStartContainer(request, timeout=10), ids)


def test_huge_requests(stub: api_pb2_grpc.DevicePluginStub) -> None:
    """100,000 IDs (about 1.5 MB): refused naming the first unknown one; 5 MB: refused by gRPC
    (RESOURCE_EXHAUSTED) before the agent sees it; then a good Allocate still works."""
    many = [f"nope-{i}" for i in range(100_000)]
    with pytest.raises(grpc.RpcError) as refused:
        stub.Allocate(
            api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=many)]),
            timeout=30,
        )
    # Named, and short: the first few IDs and how many more (a 1 MB message would not get through).
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert "'nope-0'" in (refused.value.details() or "") and "and 99992 more" in (
        refused.value.details() or ""
    )
    tally("deviceplugin Allocate", "INVALID_ARGUMENT")
    huge = ["x" * 1000] * 5000
    with pytest.raises(grpc.RpcError) as too_big:
        stub.Allocate(
            api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=huge)]),
            timeout=30,
        )
    assert too_big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    tally("deviceplugin Allocate", "RESOURCE_EXHAUSTED")
    ok = stub.Allocate(
        api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["ttyUSB3::1"])]
        ),
        timeout=10,
    )
    assert ok.container_responses[0].devices[0].host_path.endswith("/dev/ttyUSB3")
