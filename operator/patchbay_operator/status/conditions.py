"""What every mode's status shares: problems, the four kstatus conditions, the status document.

``Problem`` is what needs attention (node, device, reason, message, since); ``Verdict`` a
condition's (status, reason, message) before ``kstatus_conditions`` makes the four conditions and
``conditions`` gives them their metav1 shape (``lastTransitionTime`` kept until a status flips);
``assemble`` is the status document every mode writes. A profile that lost a name conflict gets
``conflict_status`` whatever its mode.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from patchbay_operator.constants import MAX_PROBLEMS, ConditionType, Reason
from patchbay_operator.profiles import Profile


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


def kstatus_conditions(
    ready: Verdict, reconciling: Verdict, stalled: Verdict, degraded: Verdict
) -> list[Condition]:
    """The four conditions, always all of them and in this order (kstatus reads them)."""
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


def stalled_verdicts(stuck: Sequence[Problem], noun: str) -> tuple[Verdict, Verdict]:
    """Stalled and Reconciling when something cannot finish without a change: Stalled names the
    first problem's reason, and Reconciling is False (kstatus reads Failed, not InProgress)."""
    stalled = (
        True,
        min(stuck).reason,
        f"cannot finish without a change on {plural(len(stuck), noun)}; {first_problem(stuck)}",
    )
    return stalled, (False, Reason.STALLED, "waiting for a change (see Stalled)")


def plural(count: int, noun: str) -> str:
    """``1 node``, ``2 nodes``: status messages are read by people."""
    return f"{count} {noun}" + ("" if count == 1 else "s")


def first_problem(problems: Sequence[Problem]) -> str:
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
    conds = kstatus_conditions((False, r, msg), (False, r, msg), (True, r, msg), (True, r, msg))
    empty = {"capacity": 0, "allocatable": 0}
    return assemble(
        profile, conds=conds, previous=previous, now=now, desired=0, ready=0, devices=empty, problems=()
    )
