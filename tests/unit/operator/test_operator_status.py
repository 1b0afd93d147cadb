"""Status is a pure function of what nodes, the agents' DaemonSet, pods and reports show;
conditions keep their history and always give kstatus (what Flux and Argo CD read) the right
verdict."""

from __future__ import annotations

from typing import Any

from support.clusters import kstatus

from patchbay_operator.agentpods import Trouble
from patchbay_operator.capacity import NodeReport, NodeState
from patchbay_operator.constants import MAX_PROBLEMS, ConditionType, Reason
from patchbay_operator.devicereports import Device, Report
from patchbay_operator.profiles import Profile
from patchbay_operator.status.conditions import Condition, conditions, conflict_status
from patchbay_operator.status.daemonset import AgentDaemonSet
from patchbay_operator.status.deviceplugin import plugin_problems, plugin_status
from patchbay_operator.status.static import static_status

R = "example.com/x"


def prof(mode: str = "Static", generation: int = 3) -> Profile:
    spec: dict[str, Any] = {"resourceName": R, "mode": mode}
    return Profile.from_body({"metadata": {"name": "p", "generation": generation}, "spec": spec})


def verdict(st: dict[str, Any], generation: int = 3) -> str:
    return kstatus({"metadata": {"generation": generation}, "status": st})


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
    assert cond(st, "Reconciling")["status"] == "False"
    assert cond(st, "Stalled")["status"] == "False"
    assert cond(st, "Degraded")["status"] == "False"
    assert [c["type"] for c in st["conditions"]] == ["Ready", "Reconciling", "Stalled", "Degraded"]
    assert all(c["observedGeneration"] == 3 for c in st["conditions"])
    assert verdict(st) == "Current"


def test_transient_problem_is_reconciling_persistent_is_stalled() -> None:
    st = static_status(prof(), [rep("a", True), rep("b", False, (Reason.NOT_ADVERTISED, "x"))], {}, "T1")
    assert cond(st, "Ready")["status"] == "False"
    assert cond(st, "Reconciling")["status"] == "True"
    assert cond(st, "Stalled")["status"] == "False"
    assert cond(st, "Degraded")["status"] == "False"
    assert verdict(st) == "InProgress"
    st = static_status(prof(), [rep("b", False, (Reason.OWNED_BY_OTHER, "someone"))], {}, "T1")
    assert cond(st, "Stalled")["status"] == "True"
    assert cond(st, "Stalled")["reason"] == "ResourceSetByOther"
    assert "node b" in cond(st, "Stalled")["message"]
    assert cond(st, "Reconciling")["status"] == "False"  # kstatus reads Reconciling first
    assert cond(st, "Degraded")["status"] == "True"
    assert verdict(st) == "Failed"


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
    assert verdict(st) == "Failed"


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
    assert cond(st, "Reconciling")["reason"] == "RollingOut"
    assert verdict(st) == "InProgress"
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


def test_plugin_without_daemonset_is_reconciling() -> None:
    st = plugin_status(prof("DevicePlugin"), None, [], {}, "T")
    assert cond(st, "Reconciling")["status"] == "True"
    assert cond(st, "Ready")["status"] == "False"
    assert verdict(st) == "InProgress"


DS_OK = AgentDaemonSet(
    "p",
    generation=1,
    status={
        "observedGeneration": 1,
        "desiredNumberScheduled": 1,
        "numberAvailable": 1,
        "updatedNumberScheduled": 1,
    },
)
DS_STARTING = AgentDaemonSet(
    "p",
    generation=1,
    status={
        "observedGeneration": 1,
        "desiredNumberScheduled": 1,
        "numberAvailable": 0,
        "updatedNumberScheduled": 1,
    },
)


def test_a_stalled_agent_pod_is_failed_in_kstatus_and_names_node_and_reason() -> None:
    stuck = Trouble("node-a", "ErrImageNeverPull", "image x is not present", stalled=True)
    st = plugin_status(
        prof("DevicePlugin"), DS_STARTING, [node("node-a", None, None)], {}, "T", troubles=[stuck]
    )
    assert cond(st, "Stalled")["status"] == "True"
    assert cond(st, "Stalled")["reason"] == "ErrImageNeverPull"
    assert "node node-a" in cond(st, "Stalled")["message"]
    assert cond(st, "Reconciling")["status"] == "False"
    assert verdict(st) == "Failed"
    assert st["problems"] == [
        {"node": "node-a", "reason": "ErrImageNeverPull", "message": "image x is not present"}
    ]
    # Trouble that can still sort itself out is Reconciling, not Failed.
    pulling = Trouble("node-a", "ImagePullBackOff", "backing off", stalled=False)
    st = plugin_status(
        prof("DevicePlugin"), DS_STARTING, [node("node-a", None, None)], st, "T2", troubles=[pulling]
    )
    assert cond(st, "Stalled")["status"] == "False"
    assert verdict(st) == "InProgress"
    # Fixed: the pod runs; Current again.
    st = plugin_status(prof("DevicePlugin"), DS_OK, [node("node-a", "2", "2")], st, "T3")
    assert verdict(st) == "Current"
    assert st["problems"] == []


def test_reports_name_each_unhealthy_device_and_count_holders() -> None:
    report = Report(
        "p.node-a",
        "p",
        "node-a",
        (
            Device("ttyUSB0", True, holders=("default/app/main",)),
            Device("ttyUSB1", False, "OpenFailed", "open failed: ENXIO", "2026-11-23T10:00:00Z"),
            Device("ttyUSB2", True),
        ),
    )
    st = plugin_status(prof("DevicePlugin"), DS_OK, [node("node-a", "3", "2")], {}, "T", reports=[report])
    assert st["devices"] == {"capacity": 3, "allocatable": 2, "healthy": 2, "unhealthy": 1, "allocated": 1}
    assert st["problems"] == [
        {
            "node": "node-a",
            "device": "ttyUSB1",
            "reason": "OpenFailed",
            "message": "open failed: ENXIO",
            "since": "2026-11-23T10:00:00Z",
        }
    ]
    assert cond(st, "Degraded")["status"] == "True"
    assert "device ttyUSB1" in cond(st, "Degraded")["message"]
    assert verdict(st) == "Current"  # serving what it has: degraded, not failed
    # A report of a node the profile does not select is not counted.
    other = Report("p.node-z", "p", "node-z", (Device("x", False, "Vanished"),))
    st = plugin_status(prof("DevicePlugin"), DS_OK, [node("node-a", "3", "3")], {}, "T", reports=[other])
    assert "healthy" not in st["devices"]
    assert st["problems"] == []


def test_agent_registered_but_kubelet_not_published_yet_is_in_progress_not_a_problem() -> None:
    """Between the agent's registration and the kubelet's next node status sync the node has no
    capacity yet: kstatus must not say Current (the scheduler cannot place pods yet), and it is
    not a problem either, since it ends by itself."""
    offering = Report("p.node-a", "p", "node-a", (Device("d0", True), Device("d1", True)))
    st = plugin_status(prof("DevicePlugin"), DS_OK, [node("node-a", None, None)], {}, "T", reports=[offering])
    assert verdict(st) == "InProgress"
    assert cond(st, "Reconciling")["reason"] == cond(st, "Ready")["reason"] == "WaitingForKubelet"
    assert "node-a" in cond(st, "Reconciling")["message"]
    assert st["problems"] == [] and cond(st, "Degraded")["status"] == "False"
    # Once the kubelet publishes it, Current.
    st = plugin_status(prof("DevicePlugin"), DS_OK, [node("node-a", "2", "2")], st, "T2", reports=[offering])
    assert verdict(st) == "Current" and cond(st, "Ready")["status"] == "True"
    # An agent that found nothing to offer is a problem, not a wait.
    empty = Report("p.node-a", "p", "node-a", ())
    st = plugin_status(prof("DevicePlugin"), DS_OK, [node("node-a", None, None)], {}, "T", reports=[empty])
    assert verdict(st) == "Current"
    assert [p["reason"] for p in st["problems"]] == ["NoDevices"]


def test_no_devices_is_an_event_only_once_the_agent_has_reported_none() -> None:
    """Before the agent's first report the node may simply not be there yet (no Event); a report
    with no device in it is a real problem."""
    st_nodes = [node("node-a", None, None)]
    (waiting,) = plugin_problems(prof("DevicePlugin"), st_nodes, [], [])
    assert waiting.reason == "NoDevices" and waiting.transient
    (real,) = plugin_problems(prof("DevicePlugin"), st_nodes, [], [Report("p.node-a", "p", "node-a", ())])
    assert real.reason == "NoDevices" and not real.transient


def test_a_report_at_its_bounds_is_kept_small_and_its_counts_stay_true() -> None:
    """A report may list 2,048 devices: the operator keeps their counts and at most
    MAX_KEPT_DEVICES unhealthy ones; the rest become one problem saying how many."""
    from patchbay_operator.devicereports import MAX_KEPT_DEVICES, Report
    from patchbay_operator.status.daemonset import unlisted_problem

    devices = [
        {"id": f"d{i}", "health": "Unhealthy", "reason": "Vanished", "message": "m" * 512}
        for i in range(2000)
    ] + [
        {"id": f"h{i}", "health": "Healthy", "pods": [{"namespace": "a", "name": "p", "container": "c"}]}
        for i in range(48)
    ]
    rep = Report.from_object(
        {"metadata": {"name": "p.n1"}, "profile": "p", "nodeName": "n1", "devices": devices}
    )
    assert len(rep.devices) == MAX_KEPT_DEVICES and all(not d.healthy for d in rep.devices)
    assert (rep.total, rep.healthy, rep.unhealthy, rep.allocated) == (2048, 48, 2000, 48)
    (more,) = unlisted_problem("n1", rep)
    assert more.message.startswith(f"{2000 - MAX_KEPT_DEVICES} more unhealthy devices")
    small = Report.from_object(
        {"metadata": {"name": "p.n2"}, "profile": "p", "nodeName": "n2", "devices": devices[:3]}
    )
    assert unlisted_problem("n2", small) == []
