"""A profile's node groups in its status: which group each node uses, and the nodes that more
than one group matches (pure).

A node uses the FIRST of ``spec.nodeGroups`` whose selector matches its labels, or ``default``
(``spec.plugin`` alone) when none does: the agents choose so (their DeviceReports say which,
``nodeGroup``), and ``Profile.group_of`` chooses the same from the node cache. The status counts
both per group: ``nodes``, the agents that serve their node with the group's settings (what is
true on the nodes), and ``matching``, the nodes whose labels choose it (what should be; the two
differ while an agent has not caught up with a label change, or has not reported yet). A node
that several groups match is a problem, ``NodeGroupsOverlap``: a warning (an Event, a line in
``status.problems``), not a failure; the node is served with the first group's settings, and the
message names them all, so that the order the user relied on is visible.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from patchbay_operator.capacity import NodeState
from patchbay_operator.constants import DEFAULT_NODE_GROUP, Reason
from patchbay_operator.devicereports import Report
from patchbay_operator.profiles import Profile
from patchbay_operator.status.conditions import Problem


def overlap_problems(profile: Profile, nodes: Iterable[NodeState]) -> list[Problem]:
    """A ``NodeGroupsOverlap`` problem for each of ``nodes`` (the profile's) that more than one
    node group matches."""
    out = []
    for node in nodes:
        groups = [g.name for g in profile.groups_matching(node.labels)]
        if len(groups) > 1:
            out.append(
                Problem(
                    node.name,
                    "",
                    Reason.NODE_GROUPS_OVERLAP.value,
                    f"node groups {', '.join(groups)} all match node {node.name}; it uses {groups[0]}, "
                    "the first in spec.nodeGroups (narrow the selectors, or order the list as meant)",
                )
            )
    return out


def node_groups_status(
    profile: Profile, nodes: Sequence[NodeState], reports: Iterable[Report]
) -> list[dict[str, Any]]:
    """``status.nodeGroups``: each group in list order, then ``default``, with ``nodes`` (agents
    serving their node with it, from ``reports``) and ``matching`` (the profile's ``nodes`` whose
    labels choose it). Bounded by the CRD's 4 groups, whatever the number of nodes."""
    serving: dict[str, int] = {}
    for report in reports:
        if report.error is None and report.node_group:
            serving[report.node_group] = serving.get(report.node_group, 0) + 1
    matching: dict[str, int] = {}
    for node in nodes:
        group = profile.group_of(node.labels)
        matching[group] = matching.get(group, 0) + 1
    names = [g.name for g in profile.node_groups] + [DEFAULT_NODE_GROUP]
    return [{"name": n, "nodes": serving.get(n, 0), "matching": matching.get(n, 0)} for n in names]


def with_node_groups(
    status: dict[str, Any],
    profile: Profile,
    nodes: Sequence[NodeState],
    reports: Iterable[Report],
    previous: Mapping[str, Any],
) -> dict[str, Any]:
    """``status`` with ``nodeGroups`` for a profile that has node groups; for one that has none
    (any more), without it (None removes an earlier list: the status goes as a merge patch)."""
    if profile.node_groups:
        status["nodeGroups"] = node_groups_status(profile, nodes, reports)
    elif previous.get("nodeGroups") is not None:
        status["nodeGroups"] = None
    return status
