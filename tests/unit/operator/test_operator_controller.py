"""The controller without a cluster: the node cache, its error paths (409, 422, 404, 410), the
status writer's debounce, and the peering gate, driven through ``fakekube.FakeKube`` (a FAKE
KubeAPI; the integration tests run the same code against a real API server)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import kopf
import pytest
import yaml
from fakekube import FakeKube, profile
from support.converge import until

from patchbay_operator import controller, handlers, nodes
from patchbay_operator.capacity import NodeState
from patchbay_operator.config import Settings
from patchbay_operator.controller import Controller
from patchbay_operator.informer import Event, Snapshot
from patchbay_operator.kube import KubeError
from patchbay_operator.peering import Peering, StandingByError

RESOURCE = "example.com/dongle"


def state(name: str, rv: str, **labels: str) -> NodeState:
    return NodeState.from_node({"metadata": {"name": name, "resourceVersion": rv, "labels": labels}})


def value(kube: FakeKube, node: str) -> tuple[str | None, str | None]:
    st = kube.nodes[node]["status"]
    return st["capacity"].get(RESOURCE), st["allocatable"].get(RESOURCE)


@pytest.fixture
def kube() -> FakeKube:
    k = FakeKube()
    for i in range(3):
        k.add_node(f"n{i}", {"pool": "a"})
    return k


@pytest.fixture
async def ctl(kube: FakeKube, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Controller]:
    monkeypatch.setattr(nodes, "RETRY_FIRST", 0.05)
    c = Controller(Settings(concurrency=2, status_debounce=0.02), kube)  # type: ignore[arg-type]
    await c.start()
    try:
        yield c
    finally:
        await c.stop()


def test_resync_drops_nodes_deleted_while_not_watching_and_keeps_fresher_state() -> None:
    ctl = Controller(Settings(), FakeKube())  # type: ignore[arg-type]
    ctl.nodes.observe([Event("ADDED", state("a", "10")), Event("ADDED", state("b", "20", x="new"))])
    assert set(ctl.nodes.states) == {"a", "b"}
    # The relist no longer has "a"; its copy of "b" is OLDER than what a patch response gave us.
    ctl.nodes.resync(Snapshot([state("b", "15", x="old"), state("c", "16")], "16"))
    assert set(ctl.nodes.states) == {"b", "c"}
    assert ctl.nodes.states["b"].labels == {"x": "new"}


def test_events_apply_in_order_and_stale_ones_are_ignored() -> None:
    ctl = Controller(Settings(), FakeKube())  # type: ignore[arg-type]
    ctl.nodes.observe(
        [
            Event("ADDED", state("a", "5", v="1")),
            Event("MODIFIED", state("a", "7", v="2")),
            Event("MODIFIED", state("a", "6", v="stale")),
        ]
    )
    assert ctl.nodes.states["a"].labels == {"v": "2"}
    ctl.nodes.observe([Event("DELETED", state("a", "8"))])
    assert ctl.nodes.states == {}
    assert ctl.nodes.events == 4


async def test_one_patch_per_node_and_one_status_write(ctl: Controller, kube: FakeKube) -> None:
    await ctl.reconcile(profile("p", RESOURCE, 2, pool="a"))
    await until(lambda: all(value(kube, f"n{i}") == ("2", "2") for i in range(3)))
    # The status follows the patches after its debounce; on a loaded machine a first write may
    # still count fewer nodes ready.
    await until(lambda: kube.status_writes and kube.status_writes[-1][1]["nodes"]["ready"] == 3)
    await ctl.nodes.queue.wait_idle()
    assert ctl.nodes.patches == 3
    assert max(ctl.nodes.per_node.values()) == 1
    # Re-reconciling the same spec plans nothing: level-based, idempotent.
    await ctl.reconcile(profile("p", RESOURCE, 2, pool="a"))
    await ctl.nodes.queue.wait_idle()
    assert ctl.nodes.patches == 3
    name, written = kube.status_writes[-1]
    assert name == "p"
    assert written["nodes"] == {"desired": 3, "ready": 3}


async def test_a_409_rereads_the_node_and_patches_again(ctl: Controller, kube: FakeKube) -> None:
    kube.fail_next("patch_node_status", 409)
    await ctl.reconcile(profile("p", RESOURCE, 2, pool="a"))
    await until(lambda: all(value(kube, f"n{i}") == ("2", "2") for i in range(3)))
    assert ctl.nodes.patch_failures == 1
    assert kube.calls.count("get_node") == 1
    assert ctl.nodes.failures == {}


async def test_a_patch_rejected_again_and_again_is_reported_and_retried_later(
    ctl: Controller, kube: FakeKube
) -> None:
    for n in list(kube.nodes)[1:]:
        del kube.nodes[n]
    ctl.nodes.resync(Snapshot([NodeState.from_node(kube.nodes["n0"])], "1"))
    kube.fail_next("patch_node_status", *([422] * (nodes.MAX_STALE_RETRIES + 1)))
    await ctl.reconcile(profile("p", RESOURCE, 2, pool="a"))
    failure = await until(lambda: ctl.nodes.failures.get("n0"), within=30)
    assert "scripted 422" in failure
    assert kube.calls.count("get_node") == nodes.MAX_STALE_RETRIES
    # The profile's status names the failing node ...
    await until(lambda: kube.status_writes and kube.status_writes[-1][1]["problems"], within=30)
    problem = kube.status_writes[-1][1]["problems"][0]
    assert (problem["node"], problem["reason"]) == ("n0", "PatchFailed")
    # ... and after the backoff (2 s, +-20%: nodes.RETRY_FIRST) the patch goes through and the
    # failure clears. A bounded wait well past the backoff: a loaded machine runs the loop late.
    await until(lambda: value(kube, "n0") == ("2", "2"), within=30)
    await until(lambda: not ctl.nodes.failures, within=30)


async def test_a_404_forgets_the_node(ctl: Controller, kube: FakeKube) -> None:
    kube.fail_next("patch_node_status", 404)
    await ctl.reconcile(profile("p", RESOURCE, 2, pool="a"))
    await until(lambda: len(ctl.nodes.states) == 2)
    await ctl.nodes.queue.wait_idle()
    assert ctl.nodes.patches == 2


async def test_a_410_watch_relists_and_learns_what_was_deleted(kube: FakeKube) -> None:
    kube.watch_errors.append(KubeError(410, "WATCH", "/api/v1/nodes", "too old resource version"))
    ctl = Controller(Settings(concurrency=1), kube)  # type: ignore[arg-type]
    resyncs: list[Snapshot[NodeState]] = []
    resync = ctl.nodes.resync

    def spy(snapshot: Snapshot[NodeState]) -> None:
        resyncs.append(snapshot)
        resync(snapshot)

    ctl.nodes.resync = spy  # type: ignore[method-assign]
    del kube.nodes["n2"]  # gone while the watch was down
    await ctl.start()
    try:
        await until(lambda: len(resyncs) >= 2)  # the start's LIST, then the relist after 410
        assert set(ctl.nodes.states) == {"n0", "n1"}
        assert kube.calls.count("list") >= 2
    finally:
        await ctl.stop()


@contextlib.asynccontextmanager
async def standby(kube: FakeKube, body: dict[str, Any], concurrency: int = 2) -> AsyncIterator[Controller]:
    """A started replica standing by (a live peer of higher priority) with ``body`` listed as the
    profile; a status debounce longer than any test: a status written is the take-over's own.
    Its gate's loop is left out: every look is the test's own ``gate.step()``, so a take-over
    the test sets up (a failed LIST) is not taken by a look of the loop instead (the loop looks
    every 2 s, and a slow machine's test can be slower than that)."""
    kube.peering = {"status": {"other": {"priority": 5, "lifetime": 60}}}
    kube.profiles[body["metadata"]["name"]] = body
    me = Peering("patchbay", "me", priority=1)
    ctl = Controller(Settings(concurrency=concurrency, status_debounce=30.0), kube, me)  # type: ignore[arg-type]
    assert ctl.gate is not None

    async def no_look() -> None:
        await asyncio.Event().wait()

    ctl.gate.run = no_look  # type: ignore[method-assign]
    await ctl.start()
    try:
        assert ctl.gate is not None
        await ctl.gate.step()
        assert not ctl.gate.active
        yield ctl
    finally:
        await ctl.stop()


async def test_a_waiting_replica_writes_nothing_and_takes_over_from_fresh_profiles(
    kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(controller, "TAKE_OVER_WAIT", 0.05)
    async with standby(kube, profile("p", RESOURCE, 3, pool="a")) as ctl:
        assert ctl.gate is not None
        # kopf hands a profile on before this replica's gate has opened (kopf reads the peering
        # object on its own): refused, kopf tries again later; nothing of it is kept or applied.
        with pytest.raises(StandingByError):
            await ctl.reconcile(profile("p", RESOURCE, 1, pool="a"))
        await ctl.nodes.queue.wait_idle()
        await ctl.status.flush()
        assert kube.calls.count("patch_node_status") == 0
        assert kube.status_writes == []
        assert ctl.stats()["working"] == 0
        # The other replica goes: this one re-lists the profiles BEFORE planning any node, so it
        # applies 3 (the profile as it is now), never its stale copy's 1.
        kube.peering = {"status": {}}
        listed_before = kube.calls.count("list_profiles")
        await ctl.gate.step()
        assert ctl.gate.active
        assert kube.calls.count("list_profiles") == listed_before + 1
        assert kube.status_writes  # at takeover, not a debounce later
        await until(lambda: all(value(kube, f"n{i}") == ("3", "3") for i in range(3)))
        assert ctl.nodes.patches == 3


async def test_a_take_over_whose_list_fails_writes_nothing_and_takes_over_at_the_next_look(
    kube: FakeKube,
) -> None:
    """The leader is gone and the standby's LIST of the profiles fails (a 500, a timeout): it stays
    a standby (no node patch, no status) instead of losing its gate's loop, and the next look
    takes over from the profiles as they are then."""
    async with standby(kube, profile("p", RESOURCE, 3, pool="a")) as ctl:
        assert ctl.gate is not None
        kube.peering = {"status": {}}
        kube.fail_next("list_profiles", 500)
        await ctl.gate.step()
        assert not ctl.gate.active
        await asyncio.sleep(0.1)
        assert kube.calls.count("patch_node_status") == 0
        assert kube.status_writes == []
        await ctl.gate.step()
        assert ctl.gate.active
        await until(lambda: all(value(kube, f"n{i}") == ("3", "3") for i in range(3)))
        assert kube.status_writes


async def test_a_take_over_writes_the_agents_config_of_every_staged_profile(kube: FakeKube) -> None:
    """The rollouts are resumed from the status at a take-over, and a wave its first computation
    moves is not written by the wave's own timer (the gate opens after the take-over): the
    take-over writes the agents' config of every staged profile itself, once."""
    body = profile("p", RESOURCE, 2, pool="a")
    plugin = {"discovery": {"virtual": {"count": 2}}}
    body["spec"] = {**body["spec"], "mode": "DevicePlugin", "plugin": plugin}
    del body["spec"]["static"]
    async with standby(kube, body, concurrency=1) as ctl:
        assert ctl.gate is not None
        await asyncio.sleep(0.05)
        assert [o for o in kube.applied if o["kind"] == "ConfigMap"] == []
        kube.peering = {"status": {}}
        await ctl.gate.step()
        assert ctl.gate.active
        written = [o for o in kube.applied if o["kind"] == "ConfigMap"]
        assert [o["metadata"]["name"] for o in written] == ["patchbay-node-agent"]
        entries = yaml.safe_load(written[0]["data"]["node.yaml"])["profiles"]
        assert [e["profile"] for e in entries] == ["p"]


async def test_a_loop_that_ends_with_an_error_fails_the_liveness_probe(ctl: Controller) -> None:
    """One of the operator's own loops raised: it is named, and the liveness probe (kopf's
    /healthz) fails, so the kubelet restarts the operator rather than leave it up doing nothing."""
    assert handlers.loops(memo=kopf.Memo(controller=ctl)) == ctl.loops.running() > 0

    async def broken() -> None:
        raise RuntimeError("a bug")

    ctl.loops.spawn(broken())
    await until(lambda: ctl.loops.failed)
    assert ctl.loops.failed == [
        f"{test_a_loop_that_ends_with_an_error_fails_the_liveness_probe.__name__}.<locals>.broken"
    ]
    with pytest.raises(kopf.PermanentError, match="broken"):
        handlers.loops(memo=kopf.Memo(controller=ctl))


async def test_a_pruned_report_is_deleted_once_however_often_the_status_is_computed(kube: FakeKube) -> None:
    """Until the watch shows the deletion, every status computation sees the report; it must not
    send another DELETE (FAKE KubeAPI: fakekube.py)."""
    from patchbay_operator.agentwatch import AgentWatch
    from patchbay_operator.devicereports import Report
    from patchbay_operator.profiles import Registry

    async def call(fn: Callable[..., Any], *args: Any) -> Any:
        await asyncio.sleep(0.01)  # a DELETE in flight while the next computation runs
        return fn(*args)

    changed: list[str] = []
    agents = AgentWatch(
        kube, call, Settings(namespace="patchbay-system"), registry=Registry(), mark=changed.extend
    )
    agents.reports.fold("ADDED", Report("p.gone", "p", "gone"))
    agents.reports.fold("ADDED", Report("p.kept", "p", "kept"))
    await asyncio.gather(*(agents.prune_reports("p", keep={"kept"}) for _ in range(3)))
    await agents.prune_reports("p", keep={"kept"})
    assert [ref.name for ref in kube.deleted] == ["p.gone"]
    assert set(agents.reports.items) == {"p.kept"}


async def test_device_taint_rules_served_later_are_watched_from_then_on(
    kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A control plane upgraded to 1.37 while the operator runs: not served at start, so asked
    again; once the discovery document lists them, they are listed and watched."""
    from patchbay_operator import controller as module

    monkeypatch.setattr(module, "RULES_RECHECK_SECONDS", 0.02)
    c = Controller(Settings(concurrency=1, status_debounce=0.02), kube)  # type: ignore[arg-type]
    await c.start()
    try:
        watched = len(c._informers)
        await asyncio.sleep(0.1)
        assert len(c._informers) == watched  # asked again, still not served
        kube.objects["/apis/resource.k8s.io/v1"] = {"resources": [{"name": "devicetaintrules"}]}
        await until(lambda: len(c._informers) == watched + 1)
        await asyncio.sleep(0.1)
        assert len(c._informers) == watched + 1  # watched once, the asking ends
    finally:
        await c.stop()
