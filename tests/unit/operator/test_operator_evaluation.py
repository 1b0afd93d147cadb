"""A profile's evaluation is pure: inputs -> status, problems, when to look again and which
reports to prune, each computed once; the controller only performs what it says."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from patchbay_operator.agentpods import Trouble
from patchbay_operator.capacity import NodeState
from patchbay_operator.devicereports import Device, Report
from patchbay_operator.evaluation import Evaluation, Inputs, evaluate
from patchbay_operator.profiles import Profile
from patchbay_operator.status.deviceplugin import plugin_problems, plugin_status
from patchbay_operator.status.dra import dra_problems

R = "example.com/x"
LATER = datetime(2030, 1, 1, tzinfo=UTC)


def prof(mode: str, name: str = "p", selector: dict[str, str] | None = None) -> Profile:
    spec: dict[str, Any] = {"resourceName": R, "mode": mode}
    if selector is not None:
        spec["nodeSelector"] = {"matchLabels": selector}
    return Profile.from_body({"metadata": {"name": name, "generation": 1}, "spec": spec})


def node(name: str, labels: dict[str, str] | None = None, cap: str | None = None) -> NodeState:
    extended = {R: cap} if cap is not None else {}
    return NodeState(name, labels=labels or {}, capacity=extended, allocatable=dict(extended))


def test_device_plugin_problems_are_the_status_problems_and_stale_reports_are_pruned() -> None:
    profile = prof("DevicePlugin", selector={"dev": "yes"})
    nodes = [node("a", {"dev": "yes"}, "2"), node("b", {"dev": "yes"}), node("c")]
    reports = [
        Report("p.a", "p", "a", (Device("d0", True), Device("d1", False, "Vanished", "gone"))),
        Report("p.c", "p", "c", (Device("d0", True),)),  # c is no longer selected
    ]
    troubles = [Trouble("b", "ImagePullBackOff", "backing off", stalled=False, recheck_at=LATER)]
    result = evaluate(Inputs(profile, {}, "T1", nodes, troubles=troubles, reports=reports))
    matching = nodes[:2]
    assert result.problems == plugin_problems(profile, matching, troubles, reports)
    assert {(p.node, p.reason) for p in result.problems} == {("a", "Vanished"), ("b", "ImagePullBackOff")}
    revisions = ("currentRevision", "updateRevision", "desiredNumberScheduled", "updatedNumberScheduled")
    assert result.status is not None
    status = {k: v for k, v in result.status.items() if k not in (*revisions, "updatedNumberReady")}
    assert status == plugin_status(profile, None, nodes, {}, "T1", troubles=troubles, reports=reports)
    assert result.recheck_at == LATER
    assert result.keep_reports == {"a", "b"}


def test_nothing_to_prune_or_recheck_when_every_report_is_of_a_selected_node() -> None:
    profile = prof("DRA")
    reports = [Report("p.a", "p", "a", (Device("d0", True),))]
    result = evaluate(Inputs(profile, {}, "T1", [node("a")], reports=reports))
    assert result.keep_reports is None
    assert result.recheck_at is None
    assert result.problems == dra_problems(profile, [node("a")], [], reports) == []


def test_dra_lists_nodes_the_node_capacity_twin_serves_too() -> None:
    dra, twin = prof("DRA", "p"), prof("DevicePlugin", "q", selector={"old": "yes"})
    nodes = [node("a", {"old": "yes"}), node("b")]
    reports = [Report("p.b", "p", "b", (Device("d0", True),))]
    result = evaluate(Inputs(dra, {}, "T1", nodes, twin=twin, reports=reports))
    twice = [p for p in result.problems if p.reason == "ResourceServedTwice"]
    assert [p.node for p in twice] == ["a"]
    assert result.status is not None
    assert result.status["problemCount"] == len(result.problems)


def test_a_conflict_and_a_deletion_need_nothing_but_their_status() -> None:
    lost = evaluate(Inputs(prof("DevicePlugin"), {}, "T1", [node("a")], winner="older"))
    assert lost.status is not None and lost.problems == [] and lost.keep_reports is None
    assert "older" in lost.status["conditions"][0]["message"]
    from dataclasses import replace

    gone = evaluate(Inputs(replace(prof("Static"), deleting=True), {}, "T1", [node("a")]))
    assert gone.status is None


def _conds(st: dict[str, Any] | None) -> dict[str, tuple[str, str]]:
    assert st is not None
    return {c["type"]: (c["status"], c["reason"]) for c in st["conditions"]}


def test_a_node_that_counts_fewer_devices_than_its_agent_serves_is_a_problem_after_the_grace() -> None:
    """On kubelets before 1.37 a leaving agent's exit can make the kubelet drop the new agent's
    devices while that agent serves them all healthy (its report says 4, allocatable 0). Within
    KUBELET_BEHIND_GRACE of first seeing it, that may be the kubelet's status sync still on its
    way: no problem, a look again when the grace ends. Past it: DevicesNotAllocatable on the node,
    Degraded, and Ready False, although every agent is available."""
    from patchbay_operator.constants import KUBELET_BEHIND_GRACE
    from patchbay_operator.status.daemonset import AgentDaemonSet

    profile = prof("DevicePlugin")
    short = NodeState("a", capacity={R: "4"}, allocatable={R: "0"})
    fine = NodeState("b", capacity={R: "4"}, allocatable={R: "4"})
    reports = [Report(f"p.{n}", "p", n, tuple(Device(f"d{i}", True) for i in range(4))) for n in "ab"]
    ds = AgentDaemonSet(
        "p",
        1,
        {
            "desiredNumberScheduled": 2,
            "numberAvailable": 2,
            "updatedNumberScheduled": 2,
            "observedGeneration": 1,
        },
    )
    t0 = datetime(2026, 11, 26, 12, 0, 0, tzinfo=UTC)

    def at(now: str, nodes: list[NodeState], previous: Evaluation | None, **since: datetime) -> Evaluation:
        """The evaluation at ``now``, after ``previous`` (its status), with the nodes short ``since``."""
        status = previous.status or {} if previous is not None else {}
        inputs = Inputs(profile, status, now, nodes, daemonset=ds, reports=reports, short_since=since)
        return evaluate(inputs)

    first = at("2026-11-26T12:00:00Z", [short, fine], None)
    assert first.short_nodes == {"a"}
    assert first.problems == []
    assert _conds(first.status)["Ready"] == ("True", "AllNodesReady")
    assert first.recheck_at is not None
    assert (first.recheck_at - t0).total_seconds() == KUBELET_BEHIND_GRACE

    later = at("2026-11-26T12:00:31Z", [short, fine], first, a=t0)
    assert [(p.node, p.reason, p.since) for p in later.problems] == [
        ("a", "DevicesNotAllocatable", "2026-11-26T12:00:00Z")
    ]
    assert "allocatable counts 0 of the 4" in later.problems[0].message
    conds = _conds(later.status)
    assert conds["Degraded"] == ("True", "DevicesNotAllocatable")
    assert conds["Ready"] == ("False", "DevicesNotAllocatable")

    # The kubelet counts them again: nothing short, no problem.
    back = NodeState("a", capacity={R: "4"}, allocatable={R: "4"})
    healed = at("2026-11-26T12:01:00Z", [back, fine], later, a=t0)
    assert healed.short_nodes == frozenset() and healed.problems == []
    assert _conds(healed.status)["Degraded"] == ("False", "AsExpected")


def test_shared_devices_count_once_per_replica_against_allocatable() -> None:
    spec = {"resourceName": R, "mode": "DevicePlugin", "plugin": {"sharing": {"replicas": 2}}}
    profile = Profile.from_body({"metadata": {"name": "p", "generation": 1}, "spec": spec})
    reports = [Report("p.a", "p", "a", (Device("d0", True), Device("d1", True)))]
    full = NodeState("a", capacity={R: "4"}, allocatable={R: "4"})
    assert (
        evaluate(Inputs(profile, {}, "2026-11-26T12:00:00Z", [full], reports=reports)).short_nodes
        == frozenset()
    )
    half = NodeState("a", capacity={R: "4"}, allocatable={R: "2"})
    assert evaluate(Inputs(profile, {}, "2026-11-26T12:00:00Z", [half], reports=reports)).short_nodes == {"a"}


def test_a_report_no_longer_believed_is_still_pruned_when_its_node_left_the_profile() -> None:
    """The node's label goes: its agent pod is deleted, so its report names a pod that is no
    longer an agent of the profile and is not believed (left out of `reports`). It must still be
    pruned (the e2e test saw it stay for good when the operator noticed the pod's deletion first)."""
    profile = prof("DevicePlugin", selector={"dev": "yes"})
    result = evaluate(
        Inputs(profile, {}, "T1", [node("a", {"dev": "yes"}), node("b")], report_nodes=frozenset({"a", "b"}))
    )
    assert result.keep_reports == {"a"}
    kept = evaluate(Inputs(profile, {}, "T1", [node("a", {"dev": "yes"})], report_nodes=frozenset({"a"})))
    assert kept.keep_reports is None


def test_a_pod_not_ready_yet_is_no_problem_once_the_daemonsets_status_counts_it_available() -> None:
    """The DaemonSet's status (nodesReady) and the pod watch (the problems) arrive apart: a
    status must not read 3/3 and name a node AgentStarting at once. A stalled trouble stays,
    and so does one while the DaemonSet's status still counts a pod unavailable."""
    from patchbay_operator.status.daemonset import AgentDaemonSet

    profile = prof("DevicePlugin")
    nodes = [node("a", cap="2"), node("b", cap="2")]
    starting = Trouble("a", "AgentStarting", "the agent pod is Running, not Ready yet", stalled=False)
    pulling = Trouble("b", "ImagePullBackOff", "backing off", stalled=False)
    OF_PODS = {"AgentStarting", "AgentNotReady", "ImagePullBackOff"}

    def reasons(available: int, observed: int = 1, *troubles: Trouble) -> set[tuple[str, str]]:
        status = {
            "desiredNumberScheduled": 2,
            "numberAvailable": available,
            "updatedNumberScheduled": 2,
            "observedGeneration": observed,
        }
        ds = AgentDaemonSet("p", 1, status, "p-agent", "uid")
        result = evaluate(Inputs(profile, {}, "T1", nodes, daemonset=ds, troubles=list(troubles)))
        assert result.status is not None
        assert result.status["problemCount"] == len(result.problems)
        return {(p.node, p.reason) for p in result.problems if p.reason in OF_PODS}

    assert reasons(2, 1, starting, pulling) == {("b", "ImagePullBackOff")}
    assert reasons(1, 1, starting) == {("a", "AgentStarting")}
    assert reasons(2, 0, starting) == {("a", "AgentStarting")}  # the controller has not seen generation 1
    stalled = Trouble("a", "AgentNotReady", "the agent runs but has not registered", stalled=True)
    assert reasons(2, 1, stalled) == {("a", "AgentNotReady")}
