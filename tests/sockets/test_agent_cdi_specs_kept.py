"""The CDI spec files an agent owns come back when the CDI directory loses them: at start (a
reboot empties /var/run/cdi, a tmpfs on most nodes, and the kubelet does not prepare a claim again
that its checkpoint holds as prepared) BEFORE the agent serves anything, and at once when one is
deleted while the agent runs. DRA claims' specs are written again from the copies the driver keeps
beside its claim records; a device plugin's spec from its devices. An unprepared claim's spec is
never brought back. The kubelet side is played by a Python gRPC client (the real node's version
of this check is tests/e2e/test_reboot_on_real_node.py)."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from support.agentparts import cdi_of, dra_of
from support.agentrun import dra_agent, running_agent, until
from support.draapi import InMemoryApi
from support.fakehw import FakeHardware

from patchbay_agent.api import dra_v1_pb2, dra_v1_pb2_grpc
from patchbay_agent.dra.frontend import DraFrontEnd
from patchbay_agent.dra.slices import device_name
from patchbay_agent.resourceagent import ResourceAgent

DRIVER = "serial.patchbay.dev"
NODE = "node-1"
PLUGIN = {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}}


def _dra_agent(short_dir: Path, hw: FakeHardware, api: InMemoryApi) -> ResourceAgent:
    return dra_agent(short_dir, hw.root, api, DRIVER, poll_interval=3600)


async def _prepare(agent: ResourceAgent, uid: str, name: str, op: str = "prepare") -> str:
    dra_of(agent)  # a DRA agent (asserts it)
    async with grpc.aio.insecure_channel(f"unix://{dra_of(agent).service_socket}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        claim = dra_v1_pb2.Claim(namespace="ns", uid=uid, name=name)
        if op == "prepare":
            got = await stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim]))
        else:
            got = await stub.NodeUnprepareResources(dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[claim]))
        return str(got.claims[uid].error)


def test_dra_claim_specs_come_back_after_the_cdi_directory_was_emptied(
    short_dir: Path, hw: FakeHardware
) -> None:
    hw.add_dev("/dev/ttyUSB0")
    hw.add_dev("/dev/ttyUSB1")
    (short_dir / "dp").mkdir()
    cdi = short_dir / "cdi"
    api = InMemoryApi()
    for uid, name, dev in (("uid-1", "c1", "ttyUSB0"), ("uid-2", "c2", "ttyUSB1")):
        results = [{"request": "r", "driver": DRIVER, "pool": NODE, "device": device_name(dev)}]
        api.claims["ns", name] = {
            "metadata": {"uid": uid},
            "status": {"allocation": {"devices": {"results": results}}},
        }
    spec1, spec2 = (cdi / f"patchbay_{DRIVER}_{uid}.json" for uid in ("uid-1", "uid-2"))

    async def scenario() -> None:
        # The first agent prepares two claims, then unprepares one.
        first = _dra_agent(short_dir, hw, api)
        stop = asyncio.Event()
        task = asyncio.create_task(first.run(stop))
        await asyncio.wait_for(first.started.wait(), 10)
        assert await _prepare(first, "uid-1", "c1") == ""
        assert await _prepare(first, "uid-2", "c2") == ""
        assert await _prepare(first, "uid-2", "c2", "unprepare") == ""
        kept = json.loads(spec1.read_text())
        stop.set()
        await asyncio.wait_for(task, 15)

        # A reboot: the CDI directory is empty (gone, even); a new agent starts.
        shutil.rmtree(cdi)
        second = _dra_agent(short_dir, hw, api)
        assert dra_of(second) is not None
        stop = asyncio.Event()
        task = asyncio.create_task(second.run(stop))
        try:
            await asyncio.wait_for(second.started.wait(), 10)
            # Written before the sockets the kubelet registers through were served.
            assert dra_of(second).registry_socket.exists()
            assert json.loads(spec1.read_text()) == kept
            assert not spec2.exists()  # unprepared: never brought back
            # Deleted while the agent runs: written again at once.
            spec1.unlink()
            await until(spec1.exists, within=10)
            assert json.loads(spec1.read_text()) == kept
            # Unprepared now: the spec goes and stays gone.
            assert await _prepare(second, "uid-1", "c1", "unprepare") == ""
            await asyncio.sleep(0.3)
            assert not spec1.exists()
            assert list(cdi.iterdir()) == []
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)

    asyncio.run(scenario())


def test_a_copy_the_agent_died_before_writing_is_made_at_its_next_start(
    short_dir: Path, hw: FakeHardware, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spec's copy is written after the answer. An agent that died in between (answered,
    copy not written) leaves the spec alone in the CDI directory; the kubelet holds the claim as
    prepared and will not prepare it again, so the next agent makes the copy when it starts,
    before it registers, and a reboot after that still gets the spec back."""
    hw.add_dev("/dev/ttyUSB0")
    (short_dir / "dp").mkdir()
    cdi = short_dir / "cdi"
    api = InMemoryApi()
    results = [{"request": "r", "driver": DRIVER, "pool": NODE, "device": device_name("ttyUSB0")}]
    api.claims["ns", "c1"] = {
        "metadata": {"uid": "uid-1"},
        "status": {"allocation": {"devices": {"results": results}}},
    }
    spec = cdi / f"patchbay_{DRIVER}_uid-1.json"

    async def run(agent: ResourceAgent, then: Callable[[], Awaitable[None]]) -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        try:
            await asyncio.wait_for(agent.started.wait(), 10)
            await then()
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)

    async def scenario() -> None:
        first = _dra_agent(short_dir, hw, api)
        front = first.front
        assert isinstance(front, DraFrontEnd)
        copy = front.preparer.copies.dir / spec.name if front.preparer.copies else None
        assert copy is not None
        # The agent dies after the answer, before its late writes: they never happen.
        monkeypatch.setattr(front.preparer.late, "after_answer", lambda names: None)

        async def answered_then_died() -> None:
            assert await _prepare(first, "uid-1", "c1") == ""
            assert spec.exists() and not copy.exists()

        await run(first, answered_then_died)
        kept = json.loads(spec.read_text())
        assert not copy.exists()

        async def copied_at_start() -> None:
            # Made before the sockets the kubelet registers through were served.
            assert json.loads(copy.read_text()) == kept

        await run(_dra_agent(short_dir, hw, api), copied_at_start)
        # A reboot now: the CDI directory is empty; the spec comes back from the copy.
        shutil.rmtree(cdi)

        async def back() -> None:
            assert json.loads(spec.read_text()) == kept

        await run(_dra_agent(short_dir, hw, api), back)

    asyncio.run(scenario())


def test_a_device_plugin_spec_deleted_while_the_agent_runs_is_written_again(
    short_dir: Path, hw: FakeHardware
) -> None:
    hw.add_dev("/dev/ttyUSB0")
    plugin_dir = short_dir / "dp"
    plugin_dir.mkdir()
    cdi = short_dir / "cdi"
    plugin = {**PLUGIN, "allocation": {"cdi": {"kind": "example.com/serial"}}}

    async def scenario() -> None:
        async with running_agent(plugin, plugin_dir, hw.root, cdi_spec_dir=cdi, poll_interval=3600) as agent:
            assert cdi_of(agent) is not None
            spec = cdi_of(agent).path
            before = json.loads(spec.read_text())
            spec.unlink()
            await until(spec.exists, within=10)
            assert json.loads(spec.read_text()) == before
            shutil.rmtree(cdi)  # the whole directory
            await until(spec.exists, within=10)

    asyncio.run(scenario())
