"""DevicePlugin mode's status: what the nodes advertise, and what the agents say about it.

Capacity and allocatable come from the nodes (what the scheduler sees), the device detail from
the agents' DeviceReports; a node whose kubelet has not published the resource yet while its agent
has devices is a wait (``publishing``), one whose allocatable counts fewer devices than its agent
serves healthy (``kubelet_short``, past a grace the evaluation keeps) is DevicesNotAllocatable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from patchbay_operator.agentpods import Trouble
from patchbay_operator.capacity import NodeState, quantity_to_int
from patchbay_operator.constants import Reason
from patchbay_operator.devicereports import Report
from patchbay_operator.profiles import Profile
from patchbay_operator.status.conditions import Problem, plural
from patchbay_operator.status.daemonset import (
    AgentDaemonSet,
    agent_error_problem,
    agents_status,
    trouble_problems,
    unlisted_problem,
)


def _waiting(nodes: Sequence[str], resource: str) -> str:
    shown = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
    where = plural(len(nodes), "node")
    return f"agents registered; the kubelet has not published {resource} yet on {where}: {shown}"


def plugin_problems(
    profile: Profile, nodes: Iterable[NodeState], troubles: Iterable[Trouble], reports: Iterable[Report]
) -> list[Problem]:
    """Agent pods that do not work, unhealthy devices (per device, from the agents' reports; per
    node from capacity vs allocatable where an agent has not reported), nodes without the resource."""
    r = profile.resource
    by_node = {rep.node: rep for rep in reports}
    problems = trouble_problems(troubles)
    troubled = {t.node for t in troubles}
    for node in nodes:
        if not profile.selector.matches(node.labels):
            continue
        cap, alloc = node.capacity.get(r), node.allocatable.get(r)
        report = by_node.get(node.name)
        if report is not None and report.error is not None:
            problems.append(agent_error_problem(node.name, report.error))
            continue
        if cap is None:
            if node.name not in troubled and not publishing(report):
                msg = f"{r} not advertised (no agent registered or no device)"
                # Without a report yet this may still be the agent starting: no Event for it.
                problems.append(
                    Problem(node.name, "", Reason.NO_DEVICES.value, msg, transient=report is None)
                )
        elif report is not None:
            problems += [
                Problem(node.name, d.id, d.reason or "Unhealthy", d.message or "unhealthy", d.since)
                for d in report.devices
                if not d.healthy
            ]
            problems += unlisted_problem(node.name, report)
        elif quantity_to_int(alloc) < quantity_to_int(cap):
            bad = quantity_to_int(cap) - quantity_to_int(alloc)
            problems.append(
                Problem(node.name, "", Reason.DEVICES_UNHEALTHY.value, f"{bad} of {cap} devices unhealthy")
            )
    return problems


def kubelet_short(profile: Profile, nodes: Iterable[NodeState], reports: Iterable[Report]) -> dict[str, str]:
    """Nodes whose allocatable counts fewer of the resource's devices than the node's agent reports
    healthy (each physical device counts `sharing.replicas` times, as the kubelet counts them; the
    node's own number, which its node group may set):
    node -> what is short, said for people. Nodes without the resource in capacity, without a
    report or with an agent error are not judged here (other problems cover them)."""
    r = profile.resource
    by_node = {rep.node: rep for rep in reports}
    out = {}
    for node in nodes:
        report = by_node.get(node.name)
        if report is None or report.error is not None or node.capacity.get(r) is None:
            continue
        expected = report.healthy * max(1, profile.plugin_for(node.labels).replicas)
        allocatable = quantity_to_int(node.allocatable.get(r))
        if allocatable < expected:
            out[node.name] = (
                f"node allocatable counts {allocatable} of the {expected} {r} its agent serves healthy: "
                "the kubelet has lost the agent's devices (restart the agent pod on that node to "
                "register it again; docs/operations.md#not-allocatable)"
            )
    return out


def kubelet_short_problems(short: Mapping[str, str], since: Mapping[str, str]) -> list[Problem]:
    """The nodes of `short` that have been short since a time in `since` (past the grace)."""
    return [
        Problem(node, "", Reason.DEVICES_NOT_ALLOCATABLE.value, msg, since[node])
        for node, msg in short.items()
        if node in since
    ]


def publishing(report: Report | None) -> bool:
    """The node's agent has devices to offer but the kubelet has not put them in the node's
    status yet: it does so on its node status sync (about 10 s, docs/facts.md#kubelet-endpoints), so this is
    a wait that ends by itself, not a problem."""
    return report is not None and report.total > 0


def plugin_status(
    profile: Profile,
    daemonset: AgentDaemonSet | None,
    nodes: Iterable[NodeState],
    previous: Mapping[str, Any],
    now: str,
    *,
    troubles: Sequence[Trouble] = (),
    reports: Sequence[Report] = (),
    problems: list[Problem] | None = None,
) -> dict[str, Any]:
    """DevicePlugin mode: the agents' rollout, pods and reports, plus what the nodes advertise.
    `problems`: `plugin_problems(...)` of the same inputs when the caller has them already, plus
    any `kubelet_short_problems` (nodes whose kubelet lost the agent's devices).

    Node counts are the DaemonSet's (desired = scheduled, ready = available agents); capacity and
    allocatable are summed from the nodes, so what the scheduler sees is what is counted; the
    reports add healthy/unhealthy/allocated counts and say which device is unhealthy and why.
    """
    nodes = list(nodes)
    r = profile.resource
    matching = [n for n in nodes if profile.selector.matches(n.labels)]
    names = {n.name for n in matching}
    reports = [rep for rep in reports if rep.node in names]
    devices = {
        "capacity": sum(quantity_to_int(n.capacity.get(r)) for n in matching),
        "allocatable": sum(quantity_to_int(n.allocatable.get(r)) for n in matching),
    }
    if reports:
        devices |= {
            "healthy": sum(rep.healthy for rep in reports),
            "unhealthy": sum(rep.unhealthy for rep in reports),
            "allocated": sum(rep.allocated for rep in reports),
        }
    if problems is None:
        problems = plugin_problems(profile, matching, troubles, reports)
    troubled = {t.node for t in troubles}
    by_node = {rep.node: rep for rep in reports}
    waiting = sorted(
        n.name
        for n in matching
        if n.capacity.get(r) is None and n.name not in troubled and publishing(by_node.get(n.name))
    )
    return agents_status(
        profile,
        daemonset,
        previous,
        now,
        devices=devices,
        problems=problems,
        unhealthy=[p for p in problems if p.device or p.reason == Reason.DEVICES_UNHEALTHY.value],
        waiting=_waiting(waiting, r) if waiting else "",
        not_allocatable=[p for p in problems if p.reason == Reason.DEVICES_NOT_ALLOCATABLE.value],
    )
