"""What the two agent modes share: the agent DaemonSet, its rollout and the conditions it drives.

DevicePlugin and DRA profiles are both served by agents a DaemonSet runs (their own, or the shared
node agent's): ``agents_status`` turns its rollout, the stuck agents and what degrades the service
into the four conditions; ``agent_error_problem`` and ``unlisted_problem`` read the agents'
DeviceReports the same way in both modes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from patchbay_operator.agentpods import Trouble, profile_key
from patchbay_operator.constants import Reason
from patchbay_operator.devicereports import AgentError, Report
from patchbay_operator.owned import Owned, managed
from patchbay_operator.profiles import Profile
from patchbay_operator.status.conditions import (
    Problem,
    Verdict,
    assemble,
    first_problem,
    kstatus_conditions,
    plural,
    stalled_verdicts,
)


@dataclass(frozen=True)
class AgentDaemonSet:
    """The slice of an agent DaemonSet that ``plugin_status`` reads (agentwatch.py keeps one per profile)."""

    profile: str
    generation: int
    status: Mapping[str, Any] = field(default_factory=dict)
    #: its name and uid: which FailedCreate events are about it (agentpods.refusal)
    name: str = ""
    uid: str = ""
    #: the hash of the fields the operator's apply owns, and the other appliers (owned.managed):
    #: what repairs.py sees an edit by, from this same informer
    fields: str = ""
    appliers: frozenset[str] = frozenset()

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> AgentDaemonSet:
        meta = obj.get("metadata") or {}
        fields, appliers = managed(meta)
        return cls(
            profile=profile_key(meta.get("labels") or {}),
            generation=int(meta.get("generation") or 0),
            status=dict(obj.get("status") or {}),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            fields=fields,
            appliers=appliers,
        )

    @property
    def owned(self) -> Owned:
        return Owned("DaemonSet", self.name, self.profile, self.fields, self.appliers)

    @property
    def rolled_out(self) -> bool:
        """The DaemonSet controller has seen this generation and counts every pod it wants
        updated and available (its own status; no pod is read)."""
        st = self.status
        desired = int(st.get("desiredNumberScheduled") or 0)
        return (
            int(st.get("observedGeneration") or 0) >= self.generation
            and int(st.get("updatedNumberScheduled") or 0) >= desired
            and int(st.get("numberAvailable") or 0) >= desired
        )


def _lost(problems: Sequence[Problem]) -> str:
    where = plural(len(problems), "node")
    return f"the kubelet lost the agent's devices on {where}; {first_problem(problems)}"


def trouble_problems(troubles: Iterable[Trouble]) -> list[Problem]:
    """Each agent pod that does not work (agentpods.trouble), or the pods the API server refuses to
    create (agentpods.refusal), as a problem: stalled ones need a change, the others end by
    themselves (no Event for those)."""
    return [
        Problem(t.node, "", t.reason, t.message, stalled=t.stalled, transient=not t.stalled) for t in troubles
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


def agents_status(
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
    rolling = daemonset is None or not daemonset.rolled_out
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
        ready_c = (True, Reason.ALL_NODES_READY, f"{plural(available, 'agent')} available{note}")
    elif daemonset is None:
        ready_c = (False, Reason.APPLYING, "agent DaemonSet not created yet")
    else:
        ready_c = (False, Reason.NODES_NOT_READY, f"{available} of {plural(desired, 'agent')} available")
    if stuck:
        stalled_c, reconciling_c = stalled_verdicts(stuck, "agent")
    else:
        stalled_c = (False, Reason.AS_EXPECTED, "nothing is stuck")
        if daemonset is None:
            reconciling_c = (True, Reason.APPLYING, "creating the agent DaemonSet")
        elif rolling:
            reconciling_c = (
                True,
                Reason.ROLLING_OUT,
                f"{updated} of {plural(desired, 'agent')} updated, {available} available",
            )
        elif waiting:
            reconciling_c = (True, Reason.PUBLISHING, waiting)
        else:
            reconciling_c = (False, Reason.UP_TO_DATE, f"{plural(desired, 'agent')} up to date")
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
            also = f"; also unhealthy devices on {plural(len({p.node for p in unhealthy}), 'node')}"
        degraded_c = (not_served[0], not_served[1], not_served[2] + also)
    elif unhealthy:
        nodes_hit = len({p.node for p in unhealthy})
        degraded_c = (
            True,
            Reason.DEVICES_UNHEALTHY,
            f"unhealthy devices on {plural(nodes_hit, 'node')}; {first_problem(unhealthy)}",
        )
    elif not rolling and down > 0:
        degraded_c = (True, Reason.AGENTS_UNAVAILABLE, f"{plural(down, 'agent')} down")
    else:
        degraded_c = (False, Reason.AS_EXPECTED, "no node needs attention")
    return assemble(
        profile,
        conds=kstatus_conditions(ready_c, reconciling_c, stalled_c, degraded_c),
        previous=previous,
        now=now,
        desired=desired,
        ready=available,
        devices=devices,
        problems=problems,
    )
