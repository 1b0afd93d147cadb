"""``nodes``: one row per node and profile serving it: the agent pods serving it there, of either
shape (the shared node agent's or the profile's own, agentpods.py), whether it registered (an
agent pod's readiness probe is its kubelet registration; the node agent's report says when it
cannot serve the profile), devices healthy/total, the node group it uses, the revision it
serves. And every agent pod that serves a profile (``profile_agents``), what ``why`` explains."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from patchbay_kubectl.agentpods import AgentPods, agent_error, registered, uses_shared_agent
from patchbay_kubectl.views.objects import (
    STATIC,
    Inputs,
    Obj,
    mode_of,
    name_of,
    quantity,
    report_index,
    resource_of,
    selector_matches,
    spec,
)


@dataclass
class NodeRow:
    node: str
    profile: str
    mode: str
    resource: str
    agents: list[str] = field(default_factory=list)
    registered: str = "-"
    healthy: int | None = None
    total: int | None = None
    #: the profile's node group the node uses ("-": the profile has none); see `node_group`
    group: str = "-"
    #: why the node agent cannot serve the profile on the node (its report's agentError reason)
    agent_error: str = ""
    #: the hash of the profile's revision the node's agent serves (its report's ``revision``;
    #: the ControllerRevision ``<profile>-<hash>``); "-" before the agent reports one
    revision: str = "-"

    def as_dict(self) -> Obj:
        return asdict(self)


DEFAULT_NODE_GROUP = "default"
"""The group of a node that none of spec.nodeGroups matches (docs/api.md#node-groups)."""


def node_group(profile: Obj, labels: Mapping[str, str], report: Obj | None) -> str:
    """The node group a node uses for a profile: what its agent reports (`nodeGroup`, the truth on
    the node), else what its labels choose (the first group whose selector matches, else
    `default`); "-" for a profile without node groups."""
    groups = spec(profile).get("nodeGroups") or []
    if not groups:
        return "-"
    reported = (report or {}).get("nodeGroup")
    if reported:
        return str(reported)
    for g in groups:
        if selector_matches(g.get("nodeSelector"), labels):
            return str(g.get("name", ""))
    return DEFAULT_NODE_GROUP


def node_rows(data: Inputs, *, node: str | None = None, profile: str | None = None) -> list[NodeRow]:
    """Per node, one row per profile that selects it (a node no profile selects: one row with
    profile ``<none>``, unless a profile filter is given). The agents are the pods that serve the
    profile there, of either shape, and REGISTERED what they and the profile's report say
    (agentpods.py)."""
    reports = report_index(data.reports)
    pods = AgentPods.of(data.pods, data.node_config)
    profiles = [p for p in data.profiles if profile is None or name_of(p) == profile]
    selectors = [(p, spec(p).get("nodeSelector")) for p in profiles]
    rows: list[NodeRow] = []
    for n in data.nodes:
        meta = n.get("metadata") or {}
        nname, labels = str(meta.get("name", "")), meta.get("labels") or {}
        if node is not None and nname != node:
            continue
        serving = [p for p, sel in selectors if selector_matches(sel, labels)]
        if not serving and profile is None:
            rows.append(NodeRow(node=nname, profile="<none>", mode="", resource=""))
        for p in serving:
            row = NodeRow(node=nname, profile=name_of(p), mode=mode_of(p), resource=resource_of(p))
            row.group = node_group(p, labels, reports.get((row.profile, nname)))
            if row.mode == STATIC:
                alloc = (n.get("status") or {}).get("allocatable") or {}
                cap = (n.get("status") or {}).get("capacity") or {}
                row.healthy, row.total = quantity(alloc.get(row.resource)), quantity(cap.get(row.resource))
            else:
                report = reports.get((row.profile, nname))
                mine = pods.serving(p, nname, labels, report)
                row.agents = [name_of(x) for x in mine]
                row.registered = "yes" if registered(mine, report) else "no"
                row.agent_error = agent_error(report)
                row.revision = str((report or {}).get("revision") or "-")
                summary = (report or {}).get("summary")
                if summary is not None:
                    row.healthy, row.total = int(summary.get("healthy", 0)), int(summary.get("total", 0))
            rows.append(row)
    rows.sort(key=lambda r: (r.node, r.profile))
    return rows


def profile_agents(profile: Obj, data: Inputs) -> list[Obj]:
    """Every agent pod that serves ``profile``: its own agent's pods wherever they are, and the
    shared node agent's on each node (``data.nodes``) where it serves the profile or the
    profile's report names it, and, for a profile it serves, its pods not scheduled yet (they
    hold up every profile it serves); by node, then name. What ``why`` explains."""
    reports = report_index(data.reports)
    pods = AgentPods.of(data.pods, data.node_config)
    pname = name_of(profile)
    out = [p for (owner, _), mine in pods.own.items() if owner == pname for p in mine]
    for n in data.nodes:
        meta = n.get("metadata") or {}
        nname, labels = str(meta.get("name", "")), meta.get("labels") or {}
        report = reports.get((pname, nname))
        if report is not None or selector_matches(spec(profile).get("nodeSelector"), labels):
            out += pods.shared_serving(profile, nname, labels, report)
    if uses_shared_agent(profile):
        out += pods.unscheduled_shared()
    return sorted(out, key=lambda p: (str((p.get("spec") or {}).get("nodeName") or ""), name_of(p)))
