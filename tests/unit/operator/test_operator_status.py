"""Status is a pure function of what nodes and the DaemonSet show; conditions keep their history."""

from __future__ import annotations

from typing import Any

from patchbay_operator.capacity import NodeReport, NodeState
from patchbay_operator.constants import MAX_PROBLEMS, ConditionType, Reason
from patchbay_operator.profiles import Profile
from patchbay_operator.status import (
    AgentDaemonSet,
    Condition,
    conditions,
    conflict_status,
    plugin_status,
    static_status,
)

R = "example.com/x"


def prof(mode: str = "Static", generation: int = 3) -> Profile:
    spec: dict[str, Any] = {"resourceName": R, "mode": mode}
    return Profile.from_body({"metadata": {"name": "p", "generation": generation}, "spec": spec})


def cond(st: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in st["conditions"] if c["type"] == type_)


def rep(name: str, ready: bool, problem: tuple[Reason, str] | None = None) -> NodeReport:
    return NodeReport(name, 4, 4 if ready else 0, 4 if ready else 0, ready, problem)


def test_all_ready() -> None:
    st = static_status(prof(), [rep("a", True), rep("b", True)], {}, "T1")
    assert st["observedGeneration"] == 3
    assert st["nodes"] == {"desired": 2, "ready": 2}
    assert st["devices"] == {"capacity": 8, "allocatable": 8}
    assert st["nodesReady"] == "2/2" and st["devicesAllocatable"] == "8/8"
    assert cond(st, "Ready")["status"] == "True"
    assert cond(st, "Progressing")["status"] == "False"
    assert cond(st, "Degraded")["status"] == "False"
    assert [c["type"] for c in st["conditions"]] == ["Ready", "Progressing", "Degraded"]
    assert all(c["observedGeneration"] == 3 for c in st["conditions"])


def test_transient_problem_is_progressing_persistent_is_degraded() -> None:
    st = static_status(prof(), [rep("a", True), rep("b", False, (Reason.NOT_ADVERTISED, "x"))], {}, "T1")
    assert cond(st, "Ready")["status"] == "False"
    assert cond(st, "Progressing")["status"] == "True"
    assert cond(st, "Degraded")["status"] == "False"
    st = static_status(prof(), [rep("b", False, (Reason.OWNED_BY_OTHER, "someone"))], {}, "T1")
    assert cond(st, "Degraded")["status"] == "True"
    assert cond(st, "Degraded")["reason"] == "ResourceSetByOther"


def test_problem_list_is_capped_and_counted() -> None:
    reports = [rep(f"n{i:03}", False, (Reason.NOT_ADVERTISED, "x")) for i in range(50)]
    st = static_status(prof(), reports, {}, "T1")
    assert st["problemCount"] == 50
    assert len(st["problems"]) == MAX_PROBLEMS
    assert st["problems"][0] == {"node": "n000", "reason": "NotAdvertised", "message": "x"}


def test_last_transition_time_moves_only_on_flip_and_equal_input_gives_equal_status() -> None:
    first = static_status(prof(), [rep("a", True)], {}, "T1")
    again = static_status(prof(), [rep("a", True)], first, "T2")
    assert again == first
    flipped = static_status(prof(), [rep("a", False, (Reason.NOT_ADVERTISED, "x"))], first, "T3")
    assert cond(flipped, "Ready")["lastTransitionTime"] == "T3"
    assert cond(flipped, "Degraded")["lastTransitionTime"] == "T1"


def test_conditions_helper_keeps_time_for_same_status() -> None:
    prev = [{"type": "Ready", "status": "True", "lastTransitionTime": "T0"}]
    out = conditions([Condition(ConditionType.READY, True, Reason.ALL_NODES_READY, "m")], prev, 1, "T9")
    assert out[0]["lastTransitionTime"] == "T0"


def test_no_matching_nodes_is_ready() -> None:
    st = static_status(prof(), [], {}, "T1")
    assert cond(st, "Ready") | {} == cond(st, "Ready")
    assert cond(st, "Ready")["reason"] == "NoMatchingNodes"


def test_conflict() -> None:
    st = conflict_status(prof(), "older", {}, "T1")
    assert cond(st, "Ready")["status"] == "False"
    assert cond(st, "Ready")["reason"] == "ResourceNameConflict"
    assert "older" in cond(st, "Ready")["message"]


def node(name: str, cap: str | None, alloc: str | None) -> NodeState:
    res = {} if cap is None else {R: cap}
    al = {} if alloc is None else {R: alloc}
    return NodeState.from_node({"metadata": {"name": name}, "status": {"capacity": res, "allocatable": al}})


def test_plugin_rollout_and_unhealthy_devices() -> None:
    rollout = {
        "observedGeneration": 2,
        "desiredNumberScheduled": 2,
        "numberAvailable": 1,
        "updatedNumberScheduled": 1,
    }
    ds = AgentDaemonSet("p", generation=2, status=rollout)
    st = plugin_status(prof("DevicePlugin"), ds, [node("a", "4", "3"), node("b", None, None)], {}, "T")
    assert cond(st, "Progressing")["reason"] == "RollingOut"
    assert cond(st, "Ready")["status"] == "False"
    assert st["devices"] == {"capacity": 4, "allocatable": 3}
    assert {p["reason"] for p in st["problems"]} == {"DevicesUnhealthy", "NoDevices"}
    assert cond(st, "Degraded")["reason"] == "DevicesUnhealthy"
    ds = AgentDaemonSet(
        "p", generation=2, status={**rollout, "numberAvailable": 2, "updatedNumberScheduled": 2}
    )
    st = plugin_status(prof("DevicePlugin"), ds, [node("a", "4", "4"), node("b", "2", "2")], st, "T2")
    assert cond(st, "Ready")["status"] == "True"
    assert st["nodes"] == {"desired": 2, "ready": 2}
    assert st["problemCount"] == 0


def test_plugin_without_daemonset_is_progressing() -> None:
    st = plugin_status(prof("DevicePlugin"), None, [], {}, "T")
    assert cond(st, "Progressing")["status"] == "True"
    assert cond(st, "Ready")["status"] == "False"
