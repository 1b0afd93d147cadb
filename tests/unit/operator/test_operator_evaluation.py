"""A profile's evaluation is pure: inputs -> status, problems, when to look again and which
reports to prune, each computed once; the controller only performs what it says."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from patchbay_operator.agentpods import Trouble
from patchbay_operator.capacity import NodeState
from patchbay_operator.devicereports import Device, Report
from patchbay_operator.evaluation import Inputs, evaluate
from patchbay_operator.profiles import Profile
from patchbay_operator.status import dra_problems, plugin_problems, plugin_status

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
    assert result.status == plugin_status(profile, None, nodes, {}, "T1", troubles=troubles, reports=reports)
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
