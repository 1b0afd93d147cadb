"""Printing, the kubectl way: aligned upper-case columns (``-o wide`` adds some), or the rows as
``-o json`` / ``-o yaml`` with camelCase keys for scripts. Pure: returns text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import yaml

from patchbay_kubectl.rollout import KIND, HistoryRow
from patchbay_kubectl.views.devices import DeviceRow
from patchbay_kubectl.views.inventory import SUMMARISED, names, nothing_text
from patchbay_kubectl.views.nodes import NodeRow
from patchbay_kubectl.views.objects import Obj, age
from patchbay_kubectl.views.plan import NodePlan, ProfilePlan

FORMATS = ("wide", "json", "yaml")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to the widest cell plus three spaces, as kubectl's printer does."""
    if not rows:
        return ""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = []
    for cells in (header, *rows):
        line = "   ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))
        lines.append(line.rstrip())
    return "\n".join(lines) + "\n"


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(w.title() for w in rest)


def structured(kind: str, items: Sequence[Obj], fmt: str) -> str:
    """``{"kind": ..., "items": [...]}`` as JSON or YAML, keys in camelCase like the API's."""
    doc: dict[str, Any] = {"kind": kind, "items": [{_camel(k): v for k, v in i.items()} for i in items]}
    return dump(doc, fmt)


def dump(doc: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    return str(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))


def _holders(h: Sequence[str], wide: bool) -> str:
    if not h:
        return "<none>"
    return ",".join(h) if wide or len(h) == 1 else f"{h[0]} (+{len(h) - 1})"


def devices(rows: Sequence[DeviceRow], fmt: str | None, now: datetime) -> str:
    if fmt in ("json", "yaml"):
        return structured("DeviceList", [r.as_dict() for r in rows], fmt)
    wide = fmt == "wide"
    header = ["NODE", "PROFILE", "RESOURCE", "DEVICE", "HEALTH", "REASON", "SINCE", "HOLDER"]
    if wide:
        header += ["MODE", "SOURCE", "MESSAGE"]
    out = []
    for r in rows:
        cells = [
            r.node,
            r.profile,
            r.resource,
            r.device,
            r.health,
            r.reason or "-",
            age(r.since, now) if r.since else "-",
            _holders(r.holders, wide),
        ]
        if wide:
            cells += [r.mode, r.source, r.message or "-"]
        out.append(cells)
    return table(header, out)


def _count(n: int | None) -> str:
    return "-" if n is None else str(n)


def nodes(rows: Sequence[NodeRow], fmt: str | None) -> str:
    if fmt in ("json", "yaml"):
        return structured("NodeList", [r.as_dict() for r in rows], fmt)
    wide = fmt == "wide"
    header = ["NODE", "PROFILE", "GROUP", "MODE", "AGENT", "REGISTERED", "DEVICES", "REVISION"]
    if wide:
        header += ["RESOURCE", "AGENT-ERROR"]
    out = []
    for r in rows:
        agent = "-" if r.mode in ("", "Static") else ("<none>" if not r.agents else ",".join(r.agents))
        devices = "-" if r.total is None and r.healthy is None else f"{_count(r.healthy)}/{_count(r.total)}"
        cells = [r.node, r.profile, r.group, r.mode or "-", agent, r.registered, devices, r.revision]
        if wide:
            cells += [r.resource or "-", r.agent_error or "-"]
        out.append(cells)
    return table(header, out)


def _indented(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["  " + x for x in table(header, rows).splitlines()] or ["  <none>"]


def why(doc: Obj, fmt: str | None) -> str:
    """One screen: the verdict, conditions, problems, agent trouble, last events, what to do."""
    if fmt in ("json", "yaml"):
        return dump(doc, fmt)
    verdict = "Ready" if doc["ready"] else "NOT Ready"
    lines = [
        f"Profile {doc['profile']} ({doc['mode']}, {doc['resource']}): {verdict}"
        f"  nodes {doc['nodesReady'] or '?'}  devices {doc['devicesAllocatable'] or '?'}",
        "",
        "Conditions:",
    ]
    conds = [
        [c["type"] or "", c["status"] or "", c["reason"], c["age"], c["message"]] for c in doc["conditions"]
    ]
    lines += _indented(["TYPE", "STATUS", "REASON", "AGE", "MESSAGE"], conds)
    shown = len(doc["problems"])
    lines += [
        "",
        f"Problems ({doc['problemCount']}{'' if shown == doc['problemCount'] else f', {shown} shown'}):",
    ]
    probs = [
        [p.get("node", ""), p.get("device", "") or "-", p.get("reason", ""), p.get("message", "")]
        for p in doc["problems"]
    ]
    lines += _indented(["NODE", "DEVICE", "REASON", "MESSAGE"], probs)
    agents = doc["agentPods"]
    if doc["mode"] != "Static":
        lines += ["", f"Agent pods: {agents['total'] - agents['notReady']}/{agents['total']} ready"]
        for t in agents["trouble"]:
            lines.append(
                f"  {t['pod']} on {t['node'] or '<unscheduled>'}: {t['reason']}: {t['message']}".rstrip(": ")
            )
            if t.get("lastExit"):
                le = t["lastExit"]
                lines.append(f"    last exit {le['exitCode']} ({le['reason']}): {le['message']}".rstrip(": "))
            for e in t["events"]:
                lines.append(f"    {e['reason']} (x{e['count']}): {e['message']}")
    lines += ["", "Events (last):"]
    evs = [[e["age"], e["type"], e["reason"], e["message"]] for e in doc["events"]]
    lines += _indented(["AGE", "TYPE", "REASON", "MESSAGE"], evs)
    nodes = doc.get("nodeInventories") or []
    if nodes:
        lines += ["", "Nodes (what each serves; from its inventory, what the discovery matches there):"]
    for n in nodes:
        serving = n.get("serving")
        serves = (
            "no DeviceReport" if serving is None else f"serves {serving} device{'s' if serving != 1 else ''}"
        )
        lines.append(f"  {n['node']}: {serves}; {n['text']}")
    lines += ["", "What to do next:"]
    lines += [f"  - {h['reason']}: {h['do']}" for h in doc["next"]] or ["  nothing: the profile is Ready"]
    return "\n".join(lines) + "\n"


def history(title: str, rows: Sequence[HistoryRow], fmt: str | None) -> str:
    """``kubectl rollout history``: the object, then REVISION and CHANGE-CAUSE (``-o wide``: the
    ControllerRevision and whether the status serves it as current or update)."""
    if fmt in ("json", "yaml"):
        return structured("RevisionList", [r.as_dict() for r in rows], fmt)
    if fmt == "wide":
        header = ["REVISION", "NAME", "SERVED", "CHANGE-CAUSE"]
        cells = [[str(r.revision), r.name, r.served, r.change_cause] for r in rows]
    else:
        header, cells = ["REVISION", "CHANGE-CAUSE"], [[str(r.revision), r.change_cause] for r in rows]
    return f"{title}\n" + table(header, cells)


def _yes(b: bool) -> str:
    return "yes" if b else "no"


def _before_after(a: str, b: str) -> str:
    return a if a == b else f"{a} -> {b}"


def plan(plans: Sequence[ProfilePlan], fmt: str | None) -> str:
    """``diff``: per profile a line (the dry run's answer and the count of nodes losing devices),
    then one row per node where something changes; ``-o json|yaml``: every node selected before
    or after."""
    if fmt in ("json", "yaml"):
        return dump({"kind": "ProfileDiffList", "items": [p.as_dict() for p in plans]}, fmt)
    out = []
    for p in plans:
        losing = [n for n in p.nodes if n.loses]
        holders = sorted({h for n in losing for h in n.holders})
        out.append(
            f"{KIND}/{p.profile}: {p.action} (server dry run); {len(p.nodes)} nodes selected before "
            f"or after, {len(losing)} would lose devices, held by {len(holders)} pods"
        )
        rows = []
        for n in p.nodes:
            if not n.changed() and fmt != "wide":
                continue
            if n.capacity_before is not None or n.capacity_after is not None:
                lost = _before_after(_count(n.capacity_before), _count(n.capacity_after))
                lost = f"capacity {lost}"
            else:
                lost = ",".join(lo.device for lo in n.lost) or "-"
            reasons = sorted({lo.reason for lo in n.lost}) + n.unknown
            rows.append(
                [
                    n.node,
                    _before_after(_yes(n.selected_before), _yes(n.selected_after)),
                    _before_after(n.group_before, n.group_after),
                    lost,
                    ",".join(n.holders) or "-",
                    "; ".join(reasons) or "-",
                ]
            )
        if rows:
            out.append(table(["NODE", "SELECTED", "GROUP", "LOSES", "HOLDERS", "NOTE"], rows).rstrip("\n"))
        else:
            out.append("no node changes")
        out += inventory_lines(p)
    return "\n".join(out) + "\n"


def inventory_lines(p: ProfilePlan) -> list[str]:
    """What the new discovery matches on each node, from the node's inventory; a node the change
    touches without one says so."""
    found = [n for n in p.nodes if n.inventory is not None]
    lines = [f"{n.node}: {node_inventory_text(n)}" for n in found]
    lacking = [
        n.node
        for n in p.nodes
        if n.inventory is None and n.selected_after and any("known once" in u for u in n.unknown)
    ]
    if lacking and lines:
        lines.append(
            f"{names(lacking)}: no NodeInventory: what the new settings match is known once the node runs "
            "them"
        )
    return (
        ["", "What the new discovery matches, from each node's inventory:", *(f"  {x}" for x in lines)]
        if lines
        else []
    )


def node_inventory_text(n: NodePlan) -> str:
    """``from the node's inventory (written at T): matches /dev/ttyUSB0, /dev/ttyUSB1; gains
    /dev/ttyUSB1``, or what matches nothing and what comes closest."""
    m = n.inventory
    assert m is not None
    head = f"from the node's inventory (written at {m.written_at}): "
    if m.matched:
        what = f"matches {names(e.name for e in m.matched)}"
        if n.serving is not None or not n.selected_before:
            what += f"; gains {names(n.gains) or 'nothing'}; loses {names(n.drops) or 'nothing'}"
        if m.unmatched:
            what += f"; {nothing_text(m)}"
    else:
        what = f"MATCHES NOTHING: {nothing_text(m)}"
        if n.serving:
            what += f"; it serves {n.serving} device{'s' if n.serving != 1 else ''} now"
            what += f" ({names(n.drops)})" if n.drops else ""
    extra = [*m.notes, *([SUMMARISED] if m.summarised else [])]
    return head + what + "".join(f" ({x})" for x in extra)


class Exit(Exception):  # noqa: N818 - a way out, not an error
    """A command's text and its exit code other than 0 (``rollout status`` of a halted rollout,
    ``diff`` when something would be lost)."""

    def __init__(self, text: str, code: int) -> None:
        super().__init__(text)
        self.text, self.code = text, code
