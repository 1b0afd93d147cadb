"""Static mode's status: every selected node advertises the count in capacity AND allocatable.

The nodes' reports (capacity.report) say what each node carries; a problem that waiting will not
fix (an invalid capacity label, a resource someone else set, a patch the API server refuses) makes
the profile Stalled, any other is a patch under way (Reconciling).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from patchbay_operator.capacity import NodeReport
from patchbay_operator.constants import Reason
from patchbay_operator.profiles import Profile
from patchbay_operator.status.conditions import (
    Problem,
    assemble,
    kstatus_conditions,
    plural,
    stalled_verdicts,
)

PERSISTENT = {Reason.INVALID_CAPACITY_LABEL, Reason.OWNED_BY_OTHER, Reason.PATCH_FAILED}
"""Static problems that will not go away by waiting: they make the profile Stalled."""


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
        ready_c = (True, Reason.ALL_NODES_READY, f"{profile.resource} advertised on {plural(ready, 'node')}")
    else:
        ready_c = (
            False,
            Reason.NODES_NOT_READY,
            f"{profile.resource} not advertised as intended on {desired - ready} of "
            f"{plural(desired, 'node')}",
        )
    if stuck:
        stalled_c, reconciling_c = stalled_verdicts(stuck, "node")
    else:
        stalled_c = (False, Reason.AS_EXPECTED, "nothing is stuck")
        reconciling_c = (
            (True, Reason.APPLYING, f"patching {plural(len(moving), 'node')}")
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
        conds=kstatus_conditions(ready_c, reconciling_c, stalled_c, degraded_c),
        previous=previous,
        now=now,
        desired=desired,
        ready=ready,
        devices=devices,
        problems=problems,
    )
