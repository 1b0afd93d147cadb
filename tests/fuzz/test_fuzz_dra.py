"""Bad input, tried: the DRA agent's kubelet plugin service (NodePrepareResources and
NodeUnprepareResources over a real Unix socket), with the claims it is asked for shaped at random
in the stand-in API server (tests/support/draapi.py): missing or mistyped allocation results,
other drivers and pools, unknown and odd device names, huge and odd claim names. Every claim gets
an answer keyed by its UID: prepared, or an error that says what was wrong; the call itself never
fails (one bad claim must not fail the others); the agent keeps serving; a claim that was never
prepared unprepares cleanly."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.agentrun import make_config
from support.draapi import InMemoryApi
from support.fakehw import FakeHardware
from support.fuzzing import LoopThread, tally

from patchbay_agent.api import dra_v1_pb2, dra_v1_pb2_grpc
from patchbay_agent.dra.slices import device_name
from patchbay_agent.options import AgentOptions, DraOptions
from patchbay_agent.resourceagent import ResourceAgent

DRIVER = "fuzz.patchbay.dev"
NODE = "node-1"
NAMES = [device_name(f"ttyUSB{i}") for i in range(4)]
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def dra(
    loop_thread: LoopThread, module_dir: Path
) -> Iterator[tuple[dra_v1_pb2_grpc.DRAPluginStub, InMemoryApi]]:
    hw = FakeHardware(module_dir / "host")
    for i in range(4):
        hw.add_dev(f"/dev/ttyUSB{i}")
    plugins = module_dir / "dp"
    plugins.mkdir()
    api = InMemoryApi()
    options = AgentOptions(
        node_name=NODE,
        plugin_dir=plugins,
        host_root=hw.root,
        http_address=None,
        shutdown_grace=1.0,
        cdi_spec_dir=module_dir / "cdi",
        dra=DraOptions(DRIVER, module_dir / "k"),
    )
    stop = asyncio.Event()

    async def start() -> tuple[ResourceAgent, asyncio.Task[None]]:
        agent = ResourceAgent(
            make_config({"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}}), options, client=api
        )
        task = asyncio.create_task(agent.run(stop))
        await asyncio.wait_for(agent.started.wait(), 10)
        return agent, task

    agent, task = loop_thread.run(start())
    assert agent.dra is not None
    channel = grpc.insecure_channel(f"unix://{agent.dra.service_socket}")
    try:
        yield dra_v1_pb2_grpc.DRAPluginStub(channel), api
    finally:
        channel.close()
        loop_thread.loop.call_soon_threadsafe(stop.set)
        loop_thread.run(asyncio.wait_for(asyncio.shield(task), 15))


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
_result = st.fixed_dictionaries(
    {},
    optional={
        "request": st.one_of(st.text(max_size=30), _json),
        "driver": st.one_of(st.just(DRIVER), st.text(max_size=30), _json),
        "pool": st.one_of(st.just(NODE), st.text(max_size=30), _json),
        "device": st.one_of(st.sampled_from(NAMES), st.text(max_size=70), _json),
        "adminAccess": st.one_of(st.booleans(), _json),
    },
)
_claim_doc = st.one_of(
    _json,
    st.builds(
        lambda uid, results, extra: {
            "metadata": {"uid": uid, **extra},
            "status": {"allocation": {"devices": {"results": results}}},
        },
        st.text(max_size=40),
        st.one_of(st.lists(_result, max_size=5), _json),
        st.dictionaries(st.text(max_size=10), _json, max_size=2),
    ),
)
_ref = st.tuples(
    st.text(max_size=63), st.text(max_size=253), st.one_of(st.uuids().map(str), st.text(max_size=40))
)


@FUZZ
@given(
    drawn=st.lists(
        st.tuples(_ref, _claim_doc, st.booleans()), min_size=1, max_size=4, unique_by=lambda c: c[0][2]
    )
)
def test_prepare_and_unprepare(
    dra: tuple[dra_v1_pb2_grpc.DRAPluginStub, InMemoryApi],
    drawn: list[tuple[tuple[str, str, str], Any, bool]],
) -> None:
    stub, api = dra
    api.claims.clear()
    claims = []
    for (namespace, name, uid), doc, matching in drawn:
        if matching and isinstance(doc, dict) and isinstance(doc.get("metadata"), dict):
            doc["metadata"]["uid"] = uid  # the claim the kubelet means: its results decide
        api.claims[namespace, name] = doc
        claims.append(((namespace, name, uid), doc))
    request = dra_v1_pb2.NodePrepareResourcesRequest(
        claims=[dra_v1_pb2.Claim(namespace=ns, name=name, uid=uid) for (ns, name, uid), _ in claims]
    )
    answer = stub.NodePrepareResources(request, timeout=30)
    assert set(answer.claims) == {uid for (_, _, uid), _ in claims}
    for result in answer.claims.values():
        if result.error:
            assert len(result.error) < 4096, len(result.error)
            tally("dra NodePrepareResources", "error")
        else:
            assert all(d.device_name in NAMES and d.pool_name == NODE for d in result.devices), result
            tally("dra NodePrepareResources", "prepared")
    un = stub.NodeUnprepareResources(
        dra_v1_pb2.NodeUnprepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace=ns, name=name, uid=uid) for (ns, name, uid), _ in claims]
        ),
        timeout=30,
    )
    assert set(un.claims) == {uid for (_, _, uid), _ in claims}
    for result in un.claims.values():
        tally("dra NodeUnprepareResources", "error" if result.error else "ok")


def test_a_good_claim_still_prepares(dra: tuple[dra_v1_pb2_grpc.DRAPluginStub, InMemoryApi]) -> None:
    stub, api = dra
    results = [{"request": "r", "driver": DRIVER, "pool": NODE, "device": NAMES[1]}]
    api.claims["ns", "good"] = {
        "metadata": {"uid": "u-good"},
        "status": {"allocation": {"devices": {"results": results}}},
    }
    answer = stub.NodePrepareResources(
        dra_v1_pb2.NodePrepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace="ns", name="good", uid="u-good")]
        ),
        timeout=30,
    )
    assert answer.claims["u-good"].error == ""
    assert [d.device_name for d in answer.claims["u-good"].devices] == [NAMES[1]]
