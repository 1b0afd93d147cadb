"""The benches' Python floor (bench/patchbay_bench/floor.py) answers on a real Unix socket: the
Allocate floor the ``agent`` scenario times, and the DRA floor the ``dra_path`` scenario times
beside the agent and the Go peer. A floor that answered wrongly would be timed as a failure (the
Go client checks each answer) or, worse, timed doing less than a DRA plugin's answer."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc

import patchbay_bench
from patchbay_agent.api import api_pb2, api_pb2_grpc, dra_v1_pb2, dra_v1_pb2_grpc


@contextmanager
def floor(socket: Path, *args: str) -> Iterator[None]:
    """The floor as the benches start it: a process of its own, ready when it says so."""
    bench = str(Path(patchbay_bench.__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [bench, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "patchbay_bench.floor", str(socket), *args],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == '{"ready": true}'
        yield
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_dra_floor_answers_each_claim_with_one_device_and_unprepares_it(short_dir: Path) -> None:
    socket = short_dir / "floor.sock"

    async def calls() -> tuple[
        dra_v1_pb2.NodePrepareResourcesResponse, dra_v1_pb2.NodeUnprepareResourcesResponse
    ]:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as ch:
            stub = dra_v1_pb2_grpc.DRAPluginStub(ch)  # type: ignore[no-untyped-call]
            claims = [dra_v1_pb2.Claim(namespace="default", uid=f"uid-{n}", name=f"c{n}") for n in range(2)]
            prep = await stub.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=claims), timeout=10
            )
            unprep = await stub.NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(claims=claims), timeout=10
            )
            return prep, unprep

    with floor(socket, "--dra", "node-a", "dra0"):
        prep, unprep = asyncio.run(calls())
    assert sorted(prep.claims) == ["uid-0", "uid-1"]
    for answer in prep.claims.values():
        assert answer.error == ""
        (device,) = answer.devices
        assert (device.pool_name, device.device_name, list(device.request_names)) == (
            "node-a",
            "dra0",
            ["serial"],
        )
        assert list(device.cdi_device_ids) == ["floor/dra=dra0"]
    assert sorted(unprep.claims) == ["uid-0", "uid-1"]
    assert all(a.error == "" for a in unprep.claims.values())


def test_the_allocate_floor_answers_a_constant_response(short_dir: Path) -> None:
    socket = short_dir / "floor.sock"

    async def call() -> api_pb2.AllocateResponse:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as ch:
            stub = api_pb2_grpc.DevicePluginStub(ch)  # type: ignore[no-untyped-call]
            request = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["floor-0"])]
            )
            got: api_pb2.AllocateResponse = await stub.Allocate(request, timeout=10)
            return got

    with floor(socket):
        got = asyncio.run(call())
    (container,) = got.container_responses
    assert container.envs["PATCHBAY_DEVICES"] == "ttyUSB0"
    assert [d.host_path for d in container.devices] == ["/dev/ttyUSB0"]
