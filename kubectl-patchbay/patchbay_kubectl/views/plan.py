"""``kubectl patchbay diff``: what a profile change would take from each node, before it is applied.

Pure: the profile as it is (``before``, None for a new one), as the API server's dry run says it
would be (``after``), the nodes and the profile's DeviceReports in; per node out: selected before
/ after (``spec.nodeSelector``), node group before / after (the first group whose selector matches;
before: what the agent reports), the devices it serves now that the new settings would no longer
serve, the pods holding them (the report's ``pods``), and for Static the capacity before / after
and, where it is lowered, the pods on the node that use more than the new capacity
(``static_holders``: the caller lists those nodes' pods).

A device is kept when the node's new discovery (its group's ``plugin`` merged over
``spec.plugin``, docs/api.md#node-groups) still names it: a glob still matching its ID (a glob's
device ID is the path below /dev with "/" as "_", so the glob is read the same way), a group
still listing it, a virtual token still counted. What only the node can know is said as such,
never guessed: files a new glob may match that are not in the report, what a PCI, USB or NVML
filter finds, and which share of a device a holder has when ``sharing.replicas`` is lowered (a
device with more holders than the new count loses some for certain: counted).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from patchbay_kubectl.views.inventory import SUMMARISED, Match, match
from patchbay_kubectl.views.objects import (
    STATIC,
    Obj,
    group_of,
    name_of,
    pod_request,
    report_index,
    selector_matches,
    spec,
    static_desired,
)

RENAMED = "resourceName changes: the pods asked for the old one"


@dataclass
class Lost:
    device: str
    reason: str
    holders: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"device": self.device, "reason": self.reason, "holders": self.holders}


@dataclass
class NodePlan:
    node: str
    selected_before: bool
    selected_after: bool
    group_before: str = "-"
    group_after: str = "-"
    lost: list[Lost] = field(default_factory=list)
    #: Static: the node's capacity before and after (None: not selected, or a label not a count)
    capacity_before: int | None = None
    capacity_after: int | None = None
    #: what cannot be known before the node runs the change
    unknown: list[str] = field(default_factory=list)
    #: what the new discovery matches in the node's NodeInventory (None: no inventory, or no
    #: discovery change to check), and against what it serves now
    inventory: Match | None = None
    gains: list[str] = field(default_factory=list)
    drops: list[str] = field(default_factory=list)
    #: how many devices it serves now (None: not known, no DeviceReport)
    serving: int | None = None

    @property
    def loses(self) -> bool:
        cap_lower = (self.capacity_before or 0) > (self.capacity_after or 0)
        return bool(self.lost) or cap_lower

    @property
    def holders(self) -> list[str]:
        return sorted({h for lo in self.lost for h in lo.holders})

    def changed(self) -> bool:
        return (
            self.selected_before != self.selected_after
            or self.group_before != self.group_after
            or self.capacity_before != self.capacity_after
            or bool(self.lost or self.unknown or self.gains or self.drops)
        )

    def inventory_dict(self) -> dict[str, Any] | None:
        if self.inventory is None:
            return None
        d = self.inventory.as_dict()
        d["gains"], d["loses"] = self.gains, self.drops
        if self.serving is not None:
            d["servingNow"] = self.serving
        return d

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "node": self.node,
            "selectedBefore": self.selected_before,
            "selectedAfter": self.selected_after,
            "groupBefore": self.group_before,
            "groupAfter": self.group_after,
            "lost": [lo.as_dict() for lo in self.lost],
            "holders": self.holders,
            "unknown": self.unknown,
            "inventory": self.inventory_dict(),
        }
        if self.capacity_before is not None or self.capacity_after is not None:
            d["capacityBefore"], d["capacityAfter"] = self.capacity_before, self.capacity_after
        return d


@dataclass
class ProfilePlan:
    profile: str
    #: what the dry run says the apply would do: created, configured, unchanged
    action: str
    nodes: list[NodePlan] = field(default_factory=list)

    @property
    def loses(self) -> bool:
        return any(n.loses for n in self.nodes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "action": self.action,
            "loses": self.loses,
            "nodes": [n.as_dict() for n in self.nodes],
        }


def _backend(discovery: Mapping[str, Any]) -> str:
    return next((k for k in ("paths", "pci", "usb", "nvml", "virtual") if k in discovery), "")


def _glob_as_id(pattern: str) -> str:
    """A glob over /dev read the way device IDs are made: the part below /dev, "/" as "_"."""
    return pattern.removeprefix("/dev/").replace("/", "_")


def _virtual_ids(count: int) -> set[str]:
    width = len(str(max(count, 1) - 1))
    return {f"virtual-{i:0{width}d}" for i in range(count)}


def _verdict(device: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    """Why ``device`` (an ID the node reports under discovery ``old``) would not be served under
    ``new``; None when it still would be, or when only the node can tell (see ``_unknowns``)."""
    if old == new:
        return None
    kind, was = _backend(new), _backend(old)
    if kind != was:
        return f"discovery {was or '<none>'} -> {kind or '<none>'}: the node's devices get other IDs"
    spec_new = new.get(kind) or {}
    if kind == "paths":
        if device in {str(g.get("id")) for g in spec_new.get("groups") or []}:
            return None
        if any(fnmatchcase(device, _glob_as_id(str(p))) for p in spec_new.get("globs") or []):
            return None
        return "no glob or group of the new settings matches it"
    if kind == "virtual":
        count = int(spec_new.get("count") or 0)
        if device in _virtual_ids(count):
            return None
        before = int((old.get(kind) or {}).get("count") or 0)
        return f"virtual.count {before} -> {count}"
    return None  # pci, usb, nvml: the filter's answer is the node's (an unknown)


def _unknowns(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What the node alone can answer about ``new`` discovery."""
    if old == new:
        return []
    kind = _backend(new)
    spec_new, spec_old = new.get(kind) or {}, old.get(kind) or {}
    if kind == "paths":
        added = [g for g in spec_new.get("globs") or [] if g not in (spec_old.get("globs") or [])]
        if added and _backend(old) == "paths":
            return [f"files {', '.join(added)} may match beyond the report: known once the node runs it"]
        if added:
            return [f"what {', '.join(added)} match: known once the node runs it"]
        return []
    if kind in ("pci", "usb", "nvml"):
        return [f"what the new {kind} filter finds: known once the node runs it"]
    return []


def _inventory_verdict(
    device: str, old: Mapping[str, Any], new: Mapping[str, Any], found: Match | None
) -> str | None:
    """``_verdict``, answered by the node's inventory where it lists ``device`` under the same
    discovery backend as now (so the same IDs): the agent's own rules on what the node has."""
    groups = {str(g.get("id")) for g in (old.get("paths") or {}).get("groups") or []}
    if found is None or found.backend != _backend(old) or device not in found.listed or device in groups:
        return _verdict(device, old, new)
    if device in found.ids:
        return None
    what = {"paths": "globs and groups", "pci": "pci filter", "usb": "usb filter", "nvml": "nvml discovery"}
    return f"the node's inventory: the new {what.get(found.backend, found.backend)} do not match it"


def _inventory_unknowns(found: Match) -> list[str]:
    """What the inventory cannot say: files of no class it lists, entries it left out."""
    out = []
    if found.summarised:
        out.append(f"the node's inventory is {SUMMARISED}")
    return out


def _holders(device: Obj) -> list[str]:
    return sorted(f"{p.get('namespace', '')}/{p.get('name', '')}" for p in device.get("pods") or [])


InventoryOf = Callable[[str], "Obj | None"]
"""A node's NodeInventory by the node's name (None: it has none); asked only for the nodes whose
discovery the change touches."""


def _no_inventory(_node: str) -> Obj | None:
    return None


def node_plan(
    before: Obj | None,
    after: Obj,
    node: Obj,
    report: Obj | None,
    *,
    inventory_of: InventoryOf = _no_inventory,
) -> NodePlan:
    """One node's plan (the module doc)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    sel_before = before is not None and selector_matches(spec(before).get("nodeSelector"), labels)
    sel_after = selector_matches(spec(after).get("nodeSelector"), labels)
    plan = NodePlan(name_of(node), sel_before, sel_after)
    old_group, old_plugin = group_of(before, labels) if before is not None else ("-", {})
    new_group, new_plugin = group_of(after, labels)
    if sel_before:
        plan.group_before = str((report or {}).get("nodeGroup") or old_group)
    if sel_after:
        plan.group_after = new_group
    if spec(after).get("mode") == STATIC or (before is not None and spec(before).get("mode") == STATIC):
        plan.capacity_before = static_desired(before, labels) if sel_before and before else None
        plan.capacity_after = static_desired(after, labels) if sel_after else None
        return plan
    if not sel_after:
        if sel_before and report is not None:
            plan.lost = [
                Lost(str(d.get("id", "")), "the node is no longer selected", _holders(d))
                for d in report.get("devices") or []
            ]
        return plan
    old_disc, new_disc = old_plugin.get("discovery") or {}, new_plugin.get("discovery") or {}
    found = None
    if not sel_before or old_disc != new_disc:
        inv = inventory_of(plan.node)
        found = match(new_disc, inv) if inv is not None else None
    plan.inventory = found
    if not sel_before:
        if found is None:
            plan.unknown = ["newly selected: what it finds is known once its agent runs"]
        else:
            plan.gains = [e.name for e in found.matched]
            plan.unknown = _inventory_unknowns(found)
        return plan
    if report is None:
        plan.unknown = ["no DeviceReport from this node: what it serves now is not known"]
        return plan
    renamed = spec(after).get("resourceName") != (spec(before).get("resourceName") if before else None)
    was, now = _replicas(old_plugin), _replicas(new_plugin)
    shared_unknown = False
    devices = report.get("devices") or []
    plan.serving = len(devices)
    for d in devices:
        dev = str(d.get("id", ""))
        why = RENAMED if renamed else _inventory_verdict(dev, old_disc, new_disc, found)
        holders = _holders(d)
        if not why and now < was and len(holders) > now:
            why = f"sharing.replicas {was} -> {now}: {len(holders)} pods hold it"
        elif not why and now < was and holders:
            shared_unknown = True
        if why:
            plan.lost.append(Lost(dev, why, holders))
    plan.unknown = _unknowns(old_disc, new_disc) if found is None else _inventory_unknowns(found)
    if found is not None:
        served = [str(d.get("id", "")) for d in devices]
        plan.gains = [e.name for e in found.matched if e.id not in set(served)]
        plan.drops = [found.name_of(dev) for dev in served if dev not in found.ids]
    if shared_unknown:
        plan.unknown.append(
            f"sharing.replicas {was} -> {now}: whether a holder's share is one that goes, only the "
            "kubelet (DevicePlugin) or its claim (DRA) knows"
        )
    return plan


def _replicas(plugin: Mapping[str, Any]) -> int:
    """How many pods (or claims) may use a device at once: ``sharing.replicas``, absent 1."""
    value = (plugin.get("sharing") or {}).get("replicas")
    return value if isinstance(value, int) and value > 0 else 1


def static_holders(plan: NodePlan, resource: str, pods: Sequence[Obj]) -> None:
    """A Static node whose capacity the change lowers below what its pods use: one ``Lost`` naming
    them. They keep running (capacity is not enforced on a running pod), but the scheduler sees
    the node over capacity, and a kubelet restart admits them again against the new capacity
    (docs/observability.md#rollouts-and-diffs)."""
    before, after = plan.capacity_before, plan.capacity_after or 0  # None after: nothing advertised
    if before is None or after >= before:
        return
    using = {
        f"{(p.get('metadata') or {}).get('namespace', '')}/{name_of(p)}": pod_request(p, resource)
        for p in pods
    }
    using = {k: v for k, v in using.items() if v > 0}
    in_use = sum(using.values())
    if in_use <= after:
        return
    reason = (
        f"capacity {before} -> {after}: {in_use} in use; the scheduler "
        "sees the node over capacity, a kubelet restart admits the pods against the new capacity"
    )
    plan.lost.append(Lost(resource, reason, sorted(using)))


def lowered_static_nodes(plan: ProfilePlan) -> list[str]:
    """The nodes where a Static change lowers the capacity: the only ones whose pods ``diff`` lists."""
    return [
        n.node
        for n in plan.nodes
        if n.capacity_before is not None and (n.capacity_after or 0) < n.capacity_before
    ]


def profile_plan(
    before: Obj | None,
    after: Obj,
    action: str,
    nodes: Sequence[Obj],
    reports: Sequence[Obj],
    *,
    inventory_of: InventoryOf = _no_inventory,
) -> ProfilePlan:
    """Every node the profile selects before or after, with what changes on it."""
    name = name_of(after)
    index = report_index(reports)
    plan = ProfilePlan(name, action)
    for node in sorted(nodes, key=name_of):
        np = node_plan(before, after, node, index.get((name, name_of(node))), inventory_of=inventory_of)
        if np.selected_before or np.selected_after:
            plan.nodes.append(np)
    return plan
