"""Observed state -> a profile's status (pure functions; the controller writes the result).

What the scheduler really sees is the truth: node capacity and allocatable for the resource.
In DevicePlugin mode the agents tell the rest: their DaemonSet's rollout, their pods' trouble
(agentpods.py) and, per node, every device's health, why and who holds it (DeviceReports).
In DRA mode devices never reach node capacity (the scheduler reads ResourceSlices), so the
agents' DeviceReports are the device counts, and there is no wait for the kubelet's node status;
what the API server kept of the DeviceClass (``extendedResourceName``) and of the slices' device
taints is read back, never assumed (docs/dra.md#releases), and said in ``status.dra``.

Conditions follow the abnormal-true convention that kstatus (and so Flux and Argo CD) reads,
docs/facts.md#kstatus, always all four, metav1.Condition shape:

- ``Ready``: every selected node advertises the resource as intended;
- ``Reconciling``: work is under way that can finish by itself (patching nodes, a rollout, a
  first start) -> kstatus InProgress;
- ``Stalled``: it cannot finish without a change (an image that cannot be pulled, a crash loop,
  an invalid label, a name conflict) -> kstatus Failed; ``Reconciling`` is then False;
- ``Degraded``: something does not work (devices unhealthy, agents down, nodes that need a fix).

Problems name the node, the device where there is one, a CamelCase reason, a message and since
when; the status lists at most ``MAX_PROBLEMS`` of them, sorted, so it stays small and stable at
thousands of nodes (``problemCount`` has them all). Equal inputs give an equal dict, so the
caller can skip writes when nothing changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from patchbay_operator.agentpods import Trouble, profile_key
from patchbay_operator.capacity import NodeReport, NodeState, quantity_to_int
from patchbay_operator.constants import MAX_PROBLEMS, ConditionType, Reason
from patchbay_operator.devicereports import AgentError, Report
from patchbay_operator.maintenance import Rule
from patchbay_operator.maintenance import entries as maintenance_entries
from patchbay_operator.profiles import Profile

PERSISTENT = {Reason.INVALID_CAPACITY_LABEL, Reason.OWNED_BY_OTHER, Reason.PATCH_FAILED}
"""Static problems that will not go away by waiting: they make the profile Stalled."""


@dataclass(frozen=True)
class AgentDaemonSet:
    """The slice of an agent DaemonSet that ``plugin_status`` reads (agents.py keeps one per profile)."""

    profile: str
    generation: int
    status: Mapping[str, Any] = field(default_factory=dict)
    #: its name and uid: which FailedCreate events are about it (agentpods.refusal)
    name: str = ""
    uid: str = ""

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> AgentDaemonSet:
        meta = obj.get("metadata") or {}
        return cls(
            profile=profile_key(meta.get("labels") or {}),
            generation=int(meta.get("generation") or 0),
            status=dict(obj.get("status") or {}),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
        )


@dataclass(frozen=True)
class StoredDeviceClass:
    """A DRA profile's DeviceClass as the API server stored it: the answer to the operator's apply.

    An API server whose DRAExtendedResource gate is off (before 1.36) drops
    ``spec.extendedResourceName`` silently (docs/facts.md#dra-dropped-fields); then unchanged pods
    that ask for the resource in their limits find no DRA path, only ResourceClaims do.
    """

    name: str
    #: as stored: "" when the API server dropped it
    extended_resource_name: str

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> StoredDeviceClass:
        spec = obj.get("spec") or {}
        return cls(
            name=str((obj.get("metadata") or {}).get("name") or ""),
            extended_resource_name=str(spec.get("extendedResourceName") or ""),
        )


@dataclass(frozen=True, order=True)
class Problem:
    """One thing that needs attention; ordered (and identified) by node, device and reason."""

    node: str
    device: str
    reason: str
    message: str = field(compare=False)
    since: str = field(default="", compare=False)
    stalled: bool = field(default=False, compare=False)
    #: a wait that ends by itself (an agent starting, a node not patched yet): in the status,
    #: but no Event, or every rollout would post Warnings and Recovereds
    transient: bool = field(default=False, compare=False)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.node, self.device, self.reason)

    def as_dict(self) -> dict[str, str]:
        out = {"node": self.node, "reason": self.reason, "message": self.message}
        if self.device:
            out["device"] = self.device
        if self.since:
            out["since"] = self.since
        return out


#: A condition's verdict before it becomes a metav1.Condition: (status, reason, message).
Verdict = tuple[bool, Reason | str, str]


@dataclass(frozen=True)
class Condition:
    type: ConditionType
    status: bool
    reason: Reason | str
    message: str


def conditions(
    new: Sequence[Condition], previous: Iterable[Mapping[str, Any]], generation: int, now: str
) -> list[dict[str, Any]]:
    """metav1.Conditions; ``lastTransitionTime`` moves only when a condition's status flips."""
    before = {str(c.get("type")): c for c in previous}
    out = []
    for c in new:
        status = "True" if c.status else "False"
        old = before.get(c.type.value)
        since = old.get("lastTransitionTime") if old and old.get("status") == status else None
        out.append(
            {
                "type": c.type.value,
                "status": status,
                "observedGeneration": generation,
                "lastTransitionTime": since or now,
                "reason": str(c.reason),
                "message": c.message,
            }
        )
    return out


def _conds(ready: Verdict, reconciling: Verdict, stalled: Verdict, degraded: Verdict) -> list[Condition]:
    types = (ConditionType.READY, ConditionType.RECONCILING, ConditionType.STALLED, ConditionType.DEGRADED)
    return [Condition(t, *c) for t, c in zip(types, (ready, reconciling, stalled, degraded), strict=True)]


def assemble(
    profile: Profile,
    *,
    conds: Sequence[Condition],
    previous: Mapping[str, Any],
    now: str,
    desired: int,
    ready: int,
    devices: Mapping[str, int],
    problems: Iterable[Problem],
) -> dict[str, Any]:
    ordered = sorted(problems)
    return {
        "observedGeneration": profile.generation,
        "conditions": conditions(conds, previous.get("conditions") or [], profile.generation, now),
        "nodes": {"desired": desired, "ready": ready},
        "devices": dict(devices),
        "nodesReady": f"{ready}/{desired}",
        "devicesAllocatable": f"{devices.get('allocatable', 0)}/{devices.get('capacity', 0)}",
        "problemCount": len(ordered),
        "problems": [p.as_dict() for p in ordered[:MAX_PROBLEMS]],
    }


def _stalled(stuck: Sequence[Problem], noun: str) -> tuple[Verdict, Verdict]:
    """Stalled and Reconciling when something cannot finish without a change: Stalled names the
    first problem's reason, and Reconciling is False (kstatus reads Failed, not InProgress)."""
    stalled = (
        True,
        min(stuck).reason,
        f"cannot finish without a change on {_n(len(stuck), noun)}; {_first(stuck)}",
    )
    return stalled, (False, Reason.STALLED, "waiting for a change (see Stalled)")


def _n(count: int, noun: str) -> str:
    """``1 node``, ``2 nodes``: status messages are read by people."""
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _waiting(nodes: Sequence[str], resource: str) -> str:
    shown = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
    where = _n(len(nodes), "node")
    return f"agents registered; the kubelet has not published {resource} yet on {where}: {shown}"


def _lost(problems: Sequence[Problem]) -> str:
    return f"the kubelet lost the agent's devices on {_n(len(problems), 'node')}; {_first(problems)}"


def _first(problems: Sequence[Problem]) -> str:
    """The first problem, for a condition's message; one of no node (pods the API server refused
    to create, agentpods.refusal) sorts first and its message names the DaemonSet instead."""
    p = min(problems)
    if not p.node:
        return f"first: {p.reason}: {p.message}"
    where = f"node {p.node}" + (f", device {p.device}" if p.device else "")
    return f"first on {where}: {p.reason}: {p.message}"


# --- name conflict ---------------------------------------------------------------------------


def conflict_status(
    profile: Profile, winner: str, previous: Mapping[str, Any], now: str, what: str = ""
) -> dict[str, Any]:
    """The newer of two profiles for one resource name (or one CDI kind: `what`) is not applied
    and says so."""
    msg = f"{what or profile.resource} is already provided by DevicePluginProfile {winner}; not applied"
    r = Reason.CDI_KIND_CONFLICT if what else Reason.RESOURCE_NAME_CONFLICT
    conds = _conds((False, r, msg), (False, r, msg), (True, r, msg), (True, r, msg))
    empty = {"capacity": 0, "allocatable": 0}
    return assemble(
        profile, conds=conds, previous=previous, now=now, desired=0, ready=0, devices=empty, problems=()
    )


# --- Static ----------------------------------------------------------------------------------


def static_problems(reports: Iterable[NodeReport]) -> list[Problem]:
    return [
        Problem(
            rep.name,
            "",
            rep.problem[0].value,
            rep.problem[1],
            stalled=rep.problem[0] in PERSISTENT,
            transient=rep.problem[0] not in PERSISTENT,
        )
        for rep in reports
        if rep.problem is not None
    ]


def static_status(
    profile: Profile,
    reports: Iterable[NodeReport],
    previous: Mapping[str, Any],
    now: str,
    *,
    problems: list[Problem] | None = None,
) -> dict[str, Any]:
    """Static mode: ready nodes advertise exactly the desired count in capacity AND allocatable.
    `problems`: `static_problems(reports)` when the caller has them already."""
    reports = list(reports)
    desired, ready = len(reports), sum(r.ready for r in reports)
    devices = {
        "capacity": sum(r.capacity for r in reports),
        "allocatable": sum(r.allocatable for r in reports),
    }
    if problems is None:
        problems = static_problems(reports)
    stuck = [p for p in problems if p.stalled]
    moving = [p for p in problems if not p.stalled]
    if desired == 0:
        ready_c = (True, Reason.NO_MATCHING_NODES, "no node is selected")
    elif ready == desired:
        ready_c = (True, Reason.ALL_NODES_READY, f"{profile.resource} advertised on {_n(ready, 'node')}")
    else:
        ready_c = (
            False,
            Reason.NODES_NOT_READY,
            f"{profile.resource} not advertised as intended on {desired - ready} of {_n(desired, 'node')}",
        )
    if stuck:
        stalled_c, reconciling_c = _stalled(stuck, "node")
    else:
        stalled_c = (False, Reason.AS_EXPECTED, "nothing is stuck")
        reconciling_c = (
            (True, Reason.APPLYING, f"patching {_n(len(moving), 'node')}")
            if moving
            else (False, Reason.UP_TO_DATE, "every node was patched")
        )
    degraded_c = (
        (True, stalled_c[1], stalled_c[2])
        if stuck
        else (False, Reason.AS_EXPECTED, "no node needs attention")
    )
    return assemble(
        profile,
        conds=_conds(ready_c, reconciling_c, stalled_c, degraded_c),
        previous=previous,
        now=now,
        desired=desired,
        ready=ready,
        devices=devices,
        problems=problems,
    )


# --- DevicePlugin ----------------------------------------------------------------------------


def plugin_problems(
    profile: Profile, nodes: Iterable[NodeState], troubles: Iterable[Trouble], reports: Iterable[Report]
) -> list[Problem]:
    """Agent pods that do not work, unhealthy devices (per device, from the agents' reports; per
    node from capacity vs allocatable where an agent has not reported), nodes without the resource."""
    r = profile.resource
    by_node = {rep.node: rep for rep in reports}
    problems = [
        Problem(t.node, "", t.reason, t.message, stalled=t.stalled, transient=not t.stalled) for t in troubles
    ]
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
    healthy (each physical device counts `sharing.replicas` times, as the kubelet counts them):
    node -> what is short, said for people. Nodes without the resource in capacity, without a
    report or with an agent error are not judged here (other problems cover them)."""
    r = profile.resource
    by_node = {rep.node: rep for rep in reports}
    out = {}
    for node in nodes:
        report = by_node.get(node.name)
        if report is None or report.error is not None or node.capacity.get(r) is None:
            continue
        expected = report.healthy * max(1, profile.shares)
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


def agent_error_problem(node: str, error: AgentError) -> Problem:
    """The node agent cannot serve the profile on this node (the node's other profiles are not
    affected): a refused config needs a change (Stalled), a failure is retried (transient)."""
    return Problem(
        node,
        "",
        error.reason,
        error.message,
        error.since,
        stalled=error.needs_change,
    )


def publishing(report: Report | None) -> bool:
    """The node's agent has devices to offer but the kubelet has not put them in the node's
    status yet: it does so on its node status sync (about 10 s, docs/facts.md#kubelet-endpoints), so this is
    a wait that ends by itself, not a problem."""
    return report is not None and report.total > 0


def unlisted_problem(node: str, report: Report) -> list[Problem]:
    """One problem for the unhealthy devices of a report past the ones the operator keeps
    (devicereports.MAX_KEPT_DEVICES): how many, so the count of sick devices stays true."""
    more = report.unlisted_unhealthy
    if more <= 0:
        return []
    return [
        Problem(
            node,
            "",
            Reason.DEVICES_UNHEALTHY.value,
            f"{more} more unhealthy devices (the agent's DeviceReport {report.name} lists them all)",
        )
    ]


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
    return _agents_status(
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


def _agents_status(
    profile: Profile,
    daemonset: AgentDaemonSet | None,
    previous: Mapping[str, Any],
    now: str,
    *,
    devices: Mapping[str, int],
    problems: list[Problem],
    unhealthy: Sequence[Problem],
    waiting: str = "",
    served_twice: Verdict | None = None,
    not_served: Verdict | None = None,
    ready_note: str = "",
    not_allocatable: Sequence[Problem] = (),
) -> dict[str, Any]:
    """The conditions of a profile whose agents run as a DaemonSet (DevicePlugin and DRA): the
    rollout from the DaemonSet's status, stuck agents (Stalled), then what degrades the service.
    `waiting`: why Ready waits for the kubelet although the rollout is done (DevicePlugin);
    `served_twice`: the Degraded condition for nodes served both ways (DRA); `not_served`: the
    Degraded condition for a way of asking that this cluster does not serve (DRA: unchanged pods
    where the extended resource name was dropped); `ready_note`: what Ready's message adds then
    (Ready stays True: the agents work and claims are served); `not_allocatable`: nodes whose
    kubelet has lost the agent's devices (DevicePlugin): Ready False and Degraded, whatever the
    rollout says, since what the scheduler sees is short."""
    st = daemonset.status if daemonset is not None else {}
    desired = int(st.get("desiredNumberScheduled") or 0)
    available = int(st.get("numberAvailable") or 0)
    updated = int(st.get("updatedNumberScheduled") or 0)
    observed = int(st.get("observedGeneration") or 0)
    generation = daemonset.generation if daemonset is not None else 0
    rolling = daemonset is None or observed < generation or updated < desired or available < desired
    stuck = [p for p in problems if p.stalled]

    ready_c: Verdict
    if daemonset is not None and desired == 0:
        ready_c = (True, Reason.NO_MATCHING_NODES, "no node is selected")
    elif not rolling and not_allocatable:
        ready_c = (False, Reason.DEVICES_NOT_ALLOCATABLE, _lost(not_allocatable))
    elif not rolling and waiting:
        ready_c = (False, Reason.PUBLISHING, waiting)
    elif not rolling:
        note = f"; {ready_note}" if ready_note else ""
        ready_c = (True, Reason.ALL_NODES_READY, f"{_n(available, 'agent')} available{note}")
    elif daemonset is None:
        ready_c = (False, Reason.APPLYING, "agent DaemonSet not created yet")
    else:
        ready_c = (False, Reason.NODES_NOT_READY, f"{available} of {_n(desired, 'agent')} available")
    if stuck:
        stalled_c, reconciling_c = _stalled(stuck, "agent")
    else:
        stalled_c = (False, Reason.AS_EXPECTED, "nothing is stuck")
        if daemonset is None:
            reconciling_c = (True, Reason.APPLYING, "creating the agent DaemonSet")
        elif rolling:
            reconciling_c = (
                True,
                Reason.ROLLING_OUT,
                f"{updated} of {_n(desired, 'agent')} updated, {available} available",
            )
        elif waiting:
            reconciling_c = (True, Reason.PUBLISHING, waiting)
        else:
            reconciling_c = (False, Reason.UP_TO_DATE, f"{_n(desired, 'agent')} up to date")
    down = int(st.get("numberUnavailable") or 0)
    if stuck:
        degraded_c = (True, stalled_c[1], stalled_c[2])
    elif not_allocatable:
        degraded_c = (True, Reason.DEVICES_NOT_ALLOCATABLE, _lost(not_allocatable))
    elif served_twice is not None:
        degraded_c = served_twice
    elif not_served is not None:
        also = ""
        if unhealthy:
            also = f"; also unhealthy devices on {_n(len({p.node for p in unhealthy}), 'node')}"
        degraded_c = (not_served[0], not_served[1], not_served[2] + also)
    elif unhealthy:
        nodes_hit = len({p.node for p in unhealthy})
        degraded_c = (
            True,
            Reason.DEVICES_UNHEALTHY,
            f"unhealthy devices on {_n(nodes_hit, 'node')}; {_first(unhealthy)}",
        )
    elif not rolling and down > 0:
        degraded_c = (True, Reason.AGENTS_UNAVAILABLE, f"{_n(down, 'agent')} down")
    else:
        degraded_c = (False, Reason.AS_EXPECTED, "no node needs attention")
    return assemble(
        profile,
        conds=_conds(ready_c, reconciling_c, stalled_c, degraded_c),
        previous=previous,
        now=now,
        desired=desired,
        ready=available,
        devices=devices,
        problems=problems,
    )


# --- DRA -------------------------------------------------------------------------------------


def served_twice(profile: Profile, other: Profile | None, nodes: Iterable[NodeState]) -> list[str]:
    """The nodes (sorted) that both ``profile`` and ``other`` select, when ``other`` serves the
    same resource name the other way (node capacity vs DRA).

    KEP-5004: a node must never expose one extended resource both through a device plugin (or
    node capacity) and through DRA; the scheduler's answer for such a node is undefined. A
    profile being deleted is going away, so it overlaps nothing.
    """
    if other is None or other.resource != profile.resource or other.dra == profile.dra:
        return []
    if other.deleting or profile.deleting:
        return []
    return sorted(
        n.name for n in nodes if profile.selector.matches(n.labels) and other.selector.matches(n.labels)
    )


def served_twice_problems(profile: Profile, other: str, nodes: Sequence[str]) -> list[Problem]:
    """One problem per node served twice, so each appears (and goes) with an Event."""
    msg = (
        f"also selected by DevicePluginProfile {other}, which serves {profile.resource} here through "
        "node capacity, so this profile's DRA agent stays off the node (one way per node); move "
        "the node's label from that profile's selector to this one's"
    )
    return [Problem(node, "", Reason.RESOURCE_SERVED_TWICE.value, msg) for node in nodes]


def dra_problems(
    profile: Profile, nodes: Iterable[NodeState], troubles: Iterable[Trouble], reports: Iterable[Report]
) -> list[Problem]:
    """Agent pods that do not work, unhealthy devices (from the agents' reports) and selected
    nodes whose agent reports no device (or has not reported yet: a start, no Event)."""
    by_node = {rep.node: rep for rep in reports}
    problems = [
        Problem(t.node, "", t.reason, t.message, stalled=t.stalled, transient=not t.stalled) for t in troubles
    ]
    troubled = {t.node for t in troubles}
    for node in nodes:
        if not profile.selector.matches(node.labels):
            continue
        report = by_node.get(node.name)
        if report is not None and report.error is not None:
            problems.append(agent_error_problem(node.name, report.error))
            continue
        if report is None or report.total == 0:
            if node.name not in troubled:
                msg = (
                    "no DeviceReport from the agent yet"
                    if report is None
                    else f"the agent found no device for {profile.resource}"
                )
                problems.append(
                    Problem(node.name, "", Reason.NO_DEVICES.value, msg, transient=report is None)
                )
            continue
        problems += [
            Problem(
                node.name,
                d.id,
                d.reason or "Unhealthy",
                (d.message or "unhealthy") + (WITHHELD if d.withheld else ""),
                d.since,
            )
            for d in report.devices
            if not d.healthy
        ]
        problems += unlisted_problem(node.name, report)
    return problems


WITHHELD = "; left out of the node's ResourceSlice (this cluster's API server drops device taints)"
"""Said of an unhealthy device the DRA agent left out of its slice (docs/dra.md#releases)."""


def _what_agents_found(said: Iterable[str]) -> str:
    """What the agents found the API server does with a field: Dropped when any agent saw it
    dropped, Kept when every agent that says saw it kept, Unknown otherwise; "" when none says."""
    seen = {s for s in said if s}
    if not seen:
        return ""
    if "Dropped" in seen:
        return "Dropped"
    return "Kept" if seen == {"Kept"} else "Unknown"


def device_taints(reports: Iterable[Report]) -> str:
    """ResourceSlice device taints, as the agents found (`_what_agents_found`); where Dropped an
    agent leaves the devices that need one out of its slices."""
    return _what_agents_found(r.device_taints for r in reports)


def consumable_capacity(reports: Iterable[Report]) -> str:
    """A shared device's consumable capacity, as the agents of a shared DRA profile found
    (`_what_agents_found`); where Dropped they publish the devices unshared."""
    return _what_agents_found(r.consumable_capacity for r in reports)


def sharing_verdict(profile: Profile, sharing: str) -> Verdict | None:
    """Degraded for a shared profile whose agents found the API server drops consumable capacity
    (they publish the devices unshared); None otherwise."""
    if profile.shares <= 1 or sharing != "Dropped":
        return None
    return (
        True,
        Reason.SHARING_NOT_SERVED,
        f"devices are not shared: the API server drops a ResourceSlice device's allowMultipleAllocations "
        f"and consumable capacity (the DRAConsumableCapacity feature is off, as before Kubernetes 1.36), "
        f"so each device goes to one claim at a time, not {profile.shares}",
    )


def not_served_verdict(profile: Profile, device_class: StoredDeviceClass | None) -> Verdict | None:
    """Degraded for a DeviceClass the API server stored without the profile's resource name as its
    extendedResourceName; None when it kept it or was not read yet."""
    if device_class is None or device_class.extended_resource_name == profile.resource:
        return None
    return (
        True,
        Reason.EXTENDED_RESOURCE_NOT_SERVED,
        f"pods that ask for {profile.resource} in their limits are not served by DRA on this "
        f"cluster: the API server stored DeviceClass {device_class.name} without its "
        "extendedResourceName (the DRAExtendedResource feature is off, as before Kubernetes 1.36); "
        f"ResourceClaims with deviceClassName {device_class.name} still get the devices",
    )


def dra_status(
    profile: Profile,
    daemonset: AgentDaemonSet | None,
    nodes: Iterable[NodeState],
    previous: Mapping[str, Any],
    now: str,
    *,
    troubles: Sequence[Trouble] = (),
    reports: Sequence[Report] = (),
    twin: str = "",
    twice: Sequence[str] = (),
    device_class: StoredDeviceClass | None = None,
    problems: list[Problem] | None = None,
    maintenance: Iterable[Rule] = (),
) -> dict[str, Any]:
    """DRA mode: the agents' rollout and pods, and the devices their DeviceReports list.

    Node counts are the DaemonSet's (desired = scheduled, ready = available agents: an agent is
    Ready once the kubelet registered its driver). Devices come from the reports, because DRA
    devices never appear in node capacity: ``capacity`` is every device reported, ``allocatable``
    the healthy ones (what the agent publishes in its ResourceSlice), plus healthy, unhealthy and
    allocated. ``twice`` are the nodes that DevicePluginProfile ``twin`` also serves the resource
    on through node capacity: Degraded with reason ResourceServedTwice until that is fixed.

    What this cluster serves (``status.dra``): ``device_class`` as stored (an extendedResourceName
    that was dropped is Degraded, ExtendedResourceNotServed) and, from the reports, whether device
    taints are kept and how many devices the agents left out of their slices instead (those are
    not allocatable: ``allocatable`` leaves them out), and the DeviceTaintRules that take the
    profile's devices out of service (``maintenance``, maintenance.py).
    `problems`: `dra_problems(...) + served_twice_problems(...)` when the caller has them already.
    """
    nodes = list(nodes)
    matching = [n for n in nodes if profile.selector.matches(n.labels)]
    names = {n.name for n in matching}
    reports = [rep for rep in reports if rep.node in names]
    healthy = sum(rep.healthy for rep in reports)
    unhealthy_count = sum(rep.unhealthy for rep in reports)
    withheld_healthy = sum(rep.withheld_healthy for rep in reports)
    devices = {
        "capacity": healthy + unhealthy_count,
        "allocatable": healthy - withheld_healthy,
        "healthy": healthy,
        "unhealthy": unhealthy_count,
        "allocated": sum(rep.allocated for rep in reports),
    }
    if problems is None:
        problems = dra_problems(profile, matching, troubles, reports)
        problems += served_twice_problems(profile, twin, twice)
    served_twice: Verdict | None = None
    if twice:
        shown = ", ".join(twice[:3]) + (f" and {len(twice) - 3} more" if len(twice) > 3 else "")
        served_twice = (
            True,
            Reason.RESOURCE_SERVED_TWICE,
            f"{_n(len(twice), 'node')} selected also by DevicePluginProfile {twin}, which serves "
            f"{profile.resource} there through node capacity, so this profile's DRA agents stay off "
            f"them (one way per node): {shown}; move those nodes' label from {twin}'s selector "
            "to this profile's",
        )
    sharing = consumable_capacity(reports) if profile.shares > 1 else ""
    not_served = sharing_verdict(profile, sharing) or not_served_verdict(profile, device_class)
    out = _agents_status(
        profile,
        daemonset,
        previous,
        now,
        devices=devices,
        problems=problems,
        unhealthy=[p for p in problems if p.device],
        served_twice=served_twice,
        not_served=not_served,
        ready_note=(
            f"ResourceClaims only: pods that ask for {profile.resource} in their limits are not served "
            "by DRA on this cluster (see Degraded)"
            if not_served is not None and not_served[1] is Reason.EXTENDED_RESOURCE_NOT_SERVED
            else ""
        ),
    )
    # Every key, None where not known (yet): the status is written as a merge patch, where None
    # removes what an earlier status said.
    taints = device_taints(reports)
    out["dra"] = {
        "deviceClassName": device_class.name if device_class is not None else None,
        "extendedResourceName": device_class.extended_resource_name if device_class is not None else None,
        "deviceTaints": taints or None,
        "consumableCapacity": sharing or None,
        "withheldDevices": sum(rep.withheld for rep in reports) if taints else None,
        "maintenance": maintenance_entries(maintenance, profile.name) or None,
    }
    return out
