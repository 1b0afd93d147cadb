"""Observed state -> a profile's status (pure functions; the controller writes the result).

What the scheduler really sees is the truth: node capacity and allocatable for the resource,
plus, in DevicePlugin mode, the agent DaemonSet's rollout. The status carries counts, the three
conditions (Ready, Progressing, Degraded; metav1.Condition shape, the whole list every time) and
a list of problem nodes capped at MAX_PROBLEMS so it stays small at thousands of nodes. Equal
inputs give an equal dict, so the caller can skip writes when nothing changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from patchbay_operator.capacity import NodeReport, NodeState, quantity_to_int
from patchbay_operator.constants import LABEL_PROFILE, MAX_PROBLEMS, ConditionType, Reason
from patchbay_operator.profiles import Profile

PERSISTENT = {Reason.INVALID_CAPACITY_LABEL, Reason.OWNED_BY_OTHER, Reason.PATCH_FAILED}
"""Problems that will not go away by waiting: they make the profile Degraded, not Progressing."""


@dataclass(frozen=True)
class AgentDaemonSet:
    """The slice of an agent DaemonSet that ``plugin_status`` reads (agents.py keeps one per profile)."""

    profile: str
    generation: int
    status: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> AgentDaemonSet:
        meta = obj.get("metadata") or {}
        return cls(
            profile=str((meta.get("labels") or {}).get(LABEL_PROFILE, "")),
            generation=int(meta.get("generation") or 0),
            status=dict(obj.get("status") or {}),
        )


@dataclass(frozen=True)
class Condition:
    type: ConditionType
    status: bool
    reason: Reason
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
                "reason": c.reason.value,
                "message": c.message,
            }
        )
    return out


def _problems(items: Iterable[tuple[str, Reason, str]]) -> tuple[int, list[dict[str, str]]]:
    ordered = sorted(items)
    return len(ordered), [{"node": n, "reason": r.value, "message": m} for n, r, m in ordered[:MAX_PROBLEMS]]


def _assemble(
    profile: Profile,
    *,
    conds: Sequence[Condition],
    previous: Mapping[str, Any],
    now: str,
    desired: int,
    ready: int,
    capacity: int,
    allocatable: int,
    problems: Iterable[tuple[str, Reason, str]],
) -> dict[str, Any]:
    count, listed = _problems(problems)
    return {
        "observedGeneration": profile.generation,
        "conditions": conditions(conds, previous.get("conditions") or [], profile.generation, now),
        "nodes": {"desired": desired, "ready": ready},
        "devices": {"capacity": capacity, "allocatable": allocatable},
        "nodesReady": f"{ready}/{desired}",
        "devicesAllocatable": f"{allocatable}/{capacity}",
        "problemCount": count,
        "problems": listed,
    }


def conflict_status(profile: Profile, winner: str, previous: Mapping[str, Any], now: str) -> dict[str, Any]:
    """The newer of two profiles for one resource name is not applied and says so."""
    msg = f"{profile.resource} is already provided by DevicePluginProfile {winner}; not applied"
    conds = [
        Condition(ConditionType.READY, False, Reason.RESOURCE_NAME_CONFLICT, msg),
        Condition(ConditionType.PROGRESSING, False, Reason.RESOURCE_NAME_CONFLICT, msg),
        Condition(ConditionType.DEGRADED, True, Reason.RESOURCE_NAME_CONFLICT, msg),
    ]
    return _assemble(
        profile,
        conds=conds,
        previous=previous,
        now=now,
        desired=0,
        ready=0,
        capacity=0,
        allocatable=0,
        problems=(),
    )


def static_status(
    profile: Profile, reports: Iterable[NodeReport], previous: Mapping[str, Any], now: str
) -> dict[str, Any]:
    """Static mode: ready nodes advertise exactly the desired count in capacity AND allocatable."""
    desired = ready = capacity = allocatable = 0
    problems: list[tuple[str, Reason, str]] = []
    for rep in reports:
        desired += 1
        ready += rep.ready
        capacity += rep.capacity
        allocatable += rep.allocatable
        if rep.problem is not None:
            problems.append((rep.name, rep.problem[0], rep.problem[1]))
    persistent = [p for p in problems if p[1] in PERSISTENT]
    transient = [p for p in problems if p[1] not in PERSISTENT]
    if desired == 0:
        ready_c = Condition(ConditionType.READY, True, Reason.NO_MATCHING_NODES, "no node is selected")
    elif ready == desired:
        ready_c = Condition(
            ConditionType.READY, True, Reason.ALL_NODES_READY, f"{ready} nodes advertise {profile.resource}"
        )
    else:
        ready_c = Condition(
            ConditionType.READY,
            False,
            Reason.NODES_NOT_READY,
            f"{desired - ready} of {desired} nodes do not advertise {profile.resource} as intended",
        )
    progressing = Condition(
        ConditionType.PROGRESSING,
        bool(transient),
        Reason.APPLYING if transient else Reason.UP_TO_DATE,
        f"patching {len(transient)} nodes" if transient else "every node was patched",
    )
    if persistent:
        first = sorted(persistent)[0]
        degraded = Condition(
            ConditionType.DEGRADED,
            True,
            first[1],
            f"{len(persistent)} nodes need attention, first {first[0]}: {first[2]}",
        )
    else:
        degraded = Condition(ConditionType.DEGRADED, False, Reason.AS_EXPECTED, "no node needs attention")
    return _assemble(
        profile,
        conds=[ready_c, progressing, degraded],
        previous=previous,
        now=now,
        desired=desired,
        ready=ready,
        capacity=capacity,
        allocatable=allocatable,
        problems=problems,
    )


def plugin_status(
    profile: Profile,
    daemonset: AgentDaemonSet | None,
    nodes: Iterable[NodeState],
    previous: Mapping[str, Any],
    now: str,
) -> dict[str, Any]:
    """DevicePlugin mode: the agents' rollout (DaemonSet status) plus what the nodes advertise.

    Nodes counts are the DaemonSet's (desired = scheduled, ready = available agents); devices
    are summed from node capacity/allocatable, so unhealthy devices (capacity > allocatable)
    show up even when every agent runs.
    """
    r = profile.resource
    capacity = allocatable = 0
    problems: list[tuple[str, Reason, str]] = []
    for node in nodes:
        if not profile.selector.matches(node.labels):
            continue
        cap, alloc = node.capacity.get(r), node.allocatable.get(r)
        capacity += quantity_to_int(cap)
        allocatable += quantity_to_int(alloc)
        if cap is None:
            problems.append(
                (node.name, Reason.NO_DEVICES, f"{r} not advertised (no agent registered or no device)")
            )
        elif quantity_to_int(alloc) < quantity_to_int(cap):
            bad = quantity_to_int(cap) - quantity_to_int(alloc)
            problems.append((node.name, Reason.DEVICES_UNHEALTHY, f"{bad} of {cap} devices unhealthy"))
    if daemonset is None:
        conds = [
            Condition(ConditionType.READY, False, Reason.APPLYING, "agent DaemonSet not created yet"),
            Condition(ConditionType.PROGRESSING, True, Reason.APPLYING, "creating the agent DaemonSet"),
            Condition(ConditionType.DEGRADED, False, Reason.AS_EXPECTED, "nothing failed"),
        ]
        return _assemble(
            profile,
            conds=conds,
            previous=previous,
            now=now,
            desired=0,
            ready=0,
            capacity=capacity,
            allocatable=allocatable,
            problems=problems,
        )
    st = daemonset.status
    generation = daemonset.generation
    desired = int(st.get("desiredNumberScheduled") or 0)
    available = int(st.get("numberAvailable") or 0)
    updated = int(st.get("updatedNumberScheduled") or 0)
    observed = int(st.get("observedGeneration") or 0)
    rolling = observed < generation or updated < desired or available < desired
    if rolling:
        progressing = Condition(
            ConditionType.PROGRESSING,
            True,
            Reason.ROLLING_OUT,
            f"{updated} of {desired} agents updated, {available} available",
        )
    else:
        progressing = Condition(
            ConditionType.PROGRESSING, False, Reason.UP_TO_DATE, f"{desired} agents up to date"
        )
    if desired == 0:
        ready_c = Condition(ConditionType.READY, True, Reason.NO_MATCHING_NODES, "no node is selected")
    elif not rolling:
        ready_c = Condition(
            ConditionType.READY, True, Reason.ALL_NODES_READY, f"{available} agents available"
        )
    else:
        ready_c = Condition(
            ConditionType.READY, False, Reason.NODES_NOT_READY, f"{available} of {desired} agents available"
        )
    unhealthy = [p for p in problems if p[1] is Reason.DEVICES_UNHEALTHY]
    if unhealthy:
        degraded = Condition(
            ConditionType.DEGRADED,
            True,
            Reason.DEVICES_UNHEALTHY,
            f"{len(unhealthy)} nodes have unhealthy devices",
        )
    elif not rolling and int(st.get("numberUnavailable") or 0) > 0:
        degraded = Condition(
            ConditionType.DEGRADED,
            True,
            Reason.AGENTS_UNAVAILABLE,
            f"{st.get('numberUnavailable')} agents down",
        )
    else:
        degraded = Condition(ConditionType.DEGRADED, False, Reason.AS_EXPECTED, "no node needs attention")
    return _assemble(
        profile,
        conds=[ready_c, progressing, degraded],
        previous=previous,
        now=now,
        desired=desired,
        ready=available,
        capacity=capacity,
        allocatable=allocatable,
        problems=problems,
    )
