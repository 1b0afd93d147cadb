"""Bad input, tried: the agent's device plugin gRPC service, as the kubelet (or anything that can
reach its socket on the node) calls it, over a real Unix socket against ONE running agent with a
fake device tree (8 devices, 2 replicas each) and a preStart command (which records the IDs it
was run with). Allocate, GetPreferredAllocation and PreStartContainer get random and oversize ID
lists. Every answer is OK or INVALID_ARGUMENT whose message names an ID that was wrong; never
UNKNOWN or INTERNAL (an exception in the agent); Allocate and PreStartContainer answer OK only for
IDs the agent serves (Allocate with exactly their device files, PreStartContainer having run its
command once with exactly those IDs; refused, it runs nothing); a request over gRPC's 4 MiB limit
is refused by gRPC itself; the agent keeps serving throughout.

The last tests run the Allocate and PreStartContainer fuzzers against the same agent broken on
purpose (an Allocate that answers OK for IDs it does not serve, a PreStartContainer that runs its
command without checking the IDs) and see each fail, then restore it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.agentparts import registrar_of
from support.agentrun import make_config
from support.fuzzing import PROVE, LoopThread, fuzzed_agent_options, tally

from patchbay_agent.api import api_pb2, api_pb2_grpc
from patchbay_agent.config import Allocation
from patchbay_agent.core.inventory import Snapshot
from patchbay_agent.deviceplugin import allocation, server
from patchbay_agent.resourceagent import ResourceAgent

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
GOOD = [f"ttyUSB{i}::{r}" for i in range(8) for r in range(2)]


class Plugin(NamedTuple):
    stub: api_pb2_grpc.DevicePluginStub
    #: one line per run of the preStart command: the IDs it was given (PATCHBAY_DEVICE_IDS)
    pre_start_runs: Path


@pytest.fixture(scope="module")
def plugin(loop_thread: LoopThread, module_dir: Path) -> Iterator[Plugin]:
    options = fuzzed_agent_options(module_dir, serials=8)
    runs = module_dir / "pre-start-runs"
    runs.touch()
    config = make_config(
        {
            "discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}},
            "sharing": {"replicas": 2},
            "preferredAllocation": {"policy": "Pack"},
            "preStart": {
                "command": ["/bin/sh", "-c", 'printf "%s\\n" "$PATCHBAY_DEVICE_IDS" >> "$0"', str(runs)],
            },
        }
    )
    with loop_thread.agent(lambda: ResourceAgent(config, options)) as agent:
        channel = grpc.insecure_channel(f"unix://{registrar_of(agent).socket_path}")
        try:
            yield Plugin(api_pb2_grpc.DevicePluginStub(channel), runs)
        finally:
            channel.close()


_id = st.one_of(
    st.sampled_from(GOOD),
    st.text(max_size=80),
    st.sampled_from(["", "::", "ttyUSB0::", "ttyUSB0::9", "../ttyUSB0", "ttyUSB0\x00", "ttyUSB99::0"]),
)
_ids = st.lists(_id, max_size=40)


def _judge(
    surface: str,
    call: Callable[[], Any],
    ids: Sequence[str],
    empty: bool = False,
    fields: tuple[str, ...] = (),
    served_only: bool = False,
    wrong: Callable[[Any], str] | None = None,
) -> Any:
    """`call` answers OK or INVALID_ARGUMENT naming a wrong ID, or the request's field that was
    wrong (`fields`), or, when a request had no IDs at all, saying so. `served_only`: an OK is
    wrong when any ID is one the agent does not serve, or a request had none. `wrong`: what is
    wrong with an OK answer ("" when nothing). The answer (None when refused)."""
    try:
        answer = call()
    except grpc.RpcError as e:
        code = e.code()
        tally(surface, code.name)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, e.details())  # noqa: PT017 - either outcome is fine
        details = e.details() or ""
        assert len(details) < 2048, len(details)
        wrong = [i for i in ids if i not in GOOD]
        named = any(repr(i if len(i) <= 80 else i[:80] + "...") in details for i in wrong)
        field = any(f in details for f in fields)
        assert named or field or (empty and "without device IDs" in details), details[:300]
        return None
    wrongly = served_only and (empty or any(i not in GOOD for i in ids))
    why = wrong(answer) if wrong is not None and not wrongly else ""
    tally(surface, "OK for IDs it does not serve" if wrongly else ("wrong OK" if why else "OK"))
    assert not wrongly, f"OK for IDs the agent does not serve, or none: {list(ids[:8])!r}"
    assert not why, why
    return answer


def _fuzz_allocate(stub: api_pb2_grpc.DevicePluginStub, requests: list[list[str]], surface: str) -> None:
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in requests]
    )
    answer = _judge(
        surface,
        lambda: stub.Allocate(request, timeout=10),
        [i for r in requests for i in r],
        empty=any(not r for r in requests),
        served_only=True,
    )
    if answer is not None:  # each container gets the device files of exactly what it asked for
        assert len(answer.container_responses) == len(requests)
        for ids, response in zip(requests, answer.container_responses, strict=True):
            files = {d.host_path.rsplit("/", 1)[-1] for d in response.devices}
            assert files == {i.split("::")[0] for i in ids}, (ids, files)


@FUZZ
@given(requests=st.lists(_ids, min_size=0, max_size=5))
def test_allocate(plugin: Plugin, requests: list[list[str]]) -> None:
    _fuzz_allocate(plugin.stub, requests, "deviceplugin Allocate")


def _preferred_wrong(available: list[str], must: list[str], size: int) -> Callable[[Any], str]:
    """What is wrong with an OK GetPreferredAllocation answer, by the kubelet's contract (its
    devicemanager asks for `allocation_size` devices out of `available_deviceIDs`, which holds
    `must_include_deviceIDs`, and takes what it gets as a set): IDs it was not offered, a
    must-include ID left out, or not exactly `allocation_size` distinct IDs."""

    def wrong(answer: Any) -> str:
        if len(answer.container_responses) != 1:
            return f"preferred allocation: {len(answer.container_responses)} answers to 1 request"
        got = list(answer.container_responses[0].deviceIDs)
        if stray := [i for i in got if i not in available]:
            return f"preferred allocation names IDs it was not offered: {stray[:8]!r} (answer {got[:8]!r})"
        if left := [i for i in dict.fromkeys(must) if i not in got]:
            return f"preferred allocation leaves out must_include IDs: {left[:8]!r} (answer {got[:8]!r})"
        if len(got) != size or len(set(got)) != len(got):
            distinct = len(set(got))
            return f"preferred allocation of {len(got)} IDs ({distinct} distinct), not allocation_size {size}"
        return ""

    return wrong


def _fuzz_preferred(
    stub: api_pb2_grpc.DevicePluginStub, available: list[str], must: list[str], size: int, surface: str
) -> None:
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
        ]
    )
    _judge(
        surface,
        lambda: stub.GetPreferredAllocation(request, timeout=10),
        available + must,
        fields=("allocation_size", "must_include", "available"),
        wrong=_preferred_wrong(available, must, size),
    )


@st.composite
def _preferred_request(draw: st.DrawFn) -> tuple[list[str], list[str], int]:
    """(available, must_include, allocation_size): random, or as the kubelet asks (must_include
    out of available, a size between the two), so that both refusals and answers are judged."""
    available = draw(_ids)
    must = draw(st.one_of(_ids, st.lists(st.sampled_from(available), max_size=8) if available else _ids))
    size = draw(
        st.one_of(
            st.integers(min_value=-5, max_value=100),
            st.integers(min_value=len(set(must)), max_value=max(len(set(available)), len(set(must)))),
        )
    )
    return available, must, max(size, 0)


@FUZZ
@given(request=_preferred_request())
def test_get_preferred_allocation(plugin: Plugin, request: tuple[list[str], list[str], int]) -> None:
    _fuzz_preferred(plugin.stub, *request, "deviceplugin GetPreferredAllocation")


def _fuzz_pre_start(plugin: Plugin, ids: list[str], surface: str) -> None:
    before = plugin.pre_start_runs.read_text()
    request = api_pb2.PreStartContainerRequest(devices_ids=ids)
    answer = _judge(
        surface,
        lambda: plugin.stub.PreStartContainer(request, timeout=10),
        ids,
        empty=not ids,
        served_only=True,
    )
    ran = plugin.pre_start_runs.read_text()[len(before) :]
    # OK: the command ran once with exactly these IDs; refused: it did not run at all.
    assert ran == ("" if answer is None else ",".join(ids) + "\n"), (ids, ran)


@FUZZ
@given(ids=_ids)
def test_pre_start_container(plugin: Plugin, ids: list[str]) -> None:
    _fuzz_pre_start(plugin, ids, "deviceplugin PreStartContainer")


def test_huge_requests(plugin: Plugin) -> None:
    """100,000 IDs (about 1.5 MB): refused naming the first unknown one; 5 MB: refused by gRPC
    (RESOURCE_EXHAUSTED) before the agent sees it; then a good Allocate still works."""
    stub = plugin.stub
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


def _allocate_anything(
    request: api_pb2.AllocateRequest, snap: Snapshot, cfg: Allocation
) -> api_pb2.AllocateResponse:
    """Broken on purpose: answers OK to every request, allocating the IDs it serves and
    leaving out the rest without a word."""
    response = api_pb2.AllocateResponse()
    for creq in request.container_requests:
        served = [i for i in creq.devices_ids if i in snap.replica_of]
        if not served:
            response.container_responses.add()
            continue
        one = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=served)]
        )
        response.container_responses.extend(allocation.allocate(one, snap, cfg).container_responses)
    return response


#: Requests with IDs in every container request: what is left to find is an OK for unknown IDs.
_nonempty_requests = st.lists(st.lists(_id, min_size=1, max_size=40), min_size=1, max_size=5)


def test_the_allocate_judge_fails_an_agent_that_allocates_unknown_ids(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "allocate", _allocate_anything)

    @PROVE
    @given(requests=_nonempty_requests)
    def fuzz_broken(requests: list[list[str]]) -> None:
        _fuzz_allocate(plugin.stub, requests, "deviceplugin Allocate, broken on purpose")

    with pytest.raises(AssertionError, match="OK for IDs the agent does not serve"):
        fuzz_broken()
    monkeypatch.undo()
    _fuzz_allocate(plugin.stub, [["ttyUSB0::0", "ttyUSB99::0"]], "deviceplugin Allocate")


def test_the_pre_start_judge_fails_an_agent_that_does_not_check_the_ids(
    plugin: Plugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "check_served", lambda ids, snap: None)

    @PROVE
    @given(ids=st.lists(_id, min_size=1, max_size=40))
    def fuzz_broken(ids: list[str]) -> None:
        _fuzz_pre_start(plugin, ids, "deviceplugin PreStartContainer, broken on purpose")

    with pytest.raises(AssertionError, match="OK for IDs the agent does not serve"):
        fuzz_broken()
    monkeypatch.undo()
    _fuzz_pre_start(plugin, ["ttyUSB0::0", "ttyUSB99::0"], "deviceplugin PreStartContainer")


class _BrokenPreferred(api_pb2_grpc.DevicePluginServicer):
    """Broken on purpose: GetPreferredAllocation answered by the agent's own, with the request or
    the answer spoiled on the way as `how` says: `must_include` (the must-include IDs dropped from
    the request), `offered` (the agent's own device IDs added to what the kubelet offered), `short`
    (the IDs the agent does not serve, but for must-include ones, left out of the answer: what
    the agent did before this judge)."""

    def __init__(self, agent: api_pb2_grpc.DevicePluginStub, how: str) -> None:
        self._agent = agent
        self._how = how

    def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        forwarded = api_pb2.PreferredAllocationRequest()
        forwarded.CopyFrom(request)
        for creq in forwarded.container_requests:
            if self._how == "must_include":
                del creq.must_include_deviceIDs[:]
            elif self._how == "offered":
                creq.available_deviceIDs[:0] = GOOD
        try:
            answer = self._agent.GetPreferredAllocation(forwarded, timeout=10)
        except grpc.RpcError as e:
            context.abort(e.code(), e.details() or "")
        if self._how == "short":
            for creq, cresp in zip(request.container_requests, answer.container_responses, strict=False):
                kept = [i for i in cresp.deviceIDs if i in GOOD or i in creq.must_include_deviceIDs]
                del cresp.deviceIDs[:]
                cresp.deviceIDs.extend(kept)
        return answer


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("must_include", "leaves out must_include IDs"),
        ("offered", "names IDs it was not offered"),
        ("short", "not allocation_size"),
    ],
)
def test_the_preferred_allocation_judge_fails_a_wrong_answer(
    plugin: Plugin, module_dir: Path, how: str, says: str
) -> None:
    """The GetPreferredAllocation fuzzer against the agent behind a servicer that spoils its
    requests or answers (given to a gRPC server of its own), then against the agent itself."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_DevicePluginServicer_to_server(_BrokenPreferred(plugin.stub, how), server)
    socket_path = module_dir / f"broken-{how}.sock"
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    channel = grpc.insecure_channel(f"unix://{socket_path}")

    @PROVE
    @given(request=_preferred_request())
    def fuzz_broken(request: tuple[list[str], list[str], int]) -> None:
        _fuzz_preferred(
            api_pb2_grpc.DevicePluginStub(channel),
            *request,
            "deviceplugin GetPreferredAllocation, broken on purpose",
        )

    try:
        with pytest.raises(AssertionError, match=says):
            fuzz_broken()
    finally:
        channel.close()
        server.stop(0)
    _fuzz_preferred(plugin.stub, ["x", *GOOD[:3]], GOOD[2:3], 4, "deviceplugin GetPreferredAllocation")
