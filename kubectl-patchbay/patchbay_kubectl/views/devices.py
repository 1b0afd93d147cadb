"""``devices``: one row per device across every profile and mode: a DevicePlugin profile's devices
from its agents' DeviceReports; a DRA profile's from its driver's ResourceSlices (a taint
``patchbay.dev/<kind of fault>=<reason>`` is an unhealthy device), holders from the ResourceClaims
allocated to them, reasons and since-when from the DeviceReports the DRA agents write too; a
Static profile's as one row per selected node, healthy when the node's allocatable holds the
count the profile asks for (the operator's own check)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from patchbay_kubectl.views.objects import (
    ATTR_ID,
    DRA,
    STATIC,
    Inputs,
    Obj,
    driver_of,
    is_fault_taint,
    mode_of,
    name_of,
    pod_request,
    quantity,
    report_index,
    resource_of,
    selector_matches,
    spec,
    static_desired,
)


@dataclass
class DeviceRow:
    node: str
    profile: str
    mode: str
    resource: str
    device: str
    health: str
    reason: str = ""
    message: str = ""
    since: str | None = None
    holders: list[str] = field(default_factory=list)
    source: str = ""
    #: the physical device (its `patchbay.dev/id`): `device` itself, except on a partition's row,
    #: whose `device` also names its slots
    physical: str = ""

    def __post_init__(self) -> None:
        self.physical = self.physical or self.device

    @classmethod
    def of(cls, profile: Obj, node: str, device: str, **fields: Any) -> DeviceRow:
        """A row of ``profile`` (its name, mode and resource) for ``device`` on ``node``."""
        return cls(node, name_of(profile), mode_of(profile), resource_of(profile), device, **fields)

    def as_dict(self) -> Obj:
        return asdict(self)


def _holders(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    return sorted({f"{p.get('namespace', '')}/{p.get('name', '')}" for p in pods})


def _report_rows(profile: Obj, report: Obj, source: str = "DeviceReport") -> list[DeviceRow]:
    rows = []
    for d in report.get("devices") or []:
        rows.append(
            DeviceRow.of(
                profile,
                str(report.get("nodeName", "")),
                str(d.get("id", "")),
                health=str(d.get("health", "")),
                reason=str(d.get("reason", "")),
                message=str(d.get("message", "")),
                since=d.get("since"),
                holders=_holders(d.get("pods") or []),
                source=source,
            )
        )
    return rows


def _claim_holders(claims: Iterable[Obj]) -> dict[tuple[str, str, str], list[str]]:
    """(driver, pool, device) -> who holds it: the pods a claim is reserved for, or the claim
    itself while it is allocated but reserved for nobody yet."""
    held: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for claim in claims:
        meta, st = claim.get("metadata") or {}, claim.get("status") or {}
        ns = str(meta.get("namespace", ""))
        users = [
            f"{ns}/{r.get('name', '')}" for r in st.get("reservedFor") or [] if r.get("resource") == "pods"
        ] or [f"{ns}/claim:{meta.get('name', '')}"]
        for result in ((st.get("allocation") or {}).get("devices") or {}).get("results") or []:
            key = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
            held[key].update(users)
    return {k: sorted(v) for k, v in held.items()}


MAINTENANCE = "Maintenance"
"""The health shown for a device a DeviceTaintRule takes out of service (cordon or drain)."""


def maintenance_rule(rules: Iterable[Obj], driver: str, pool: str, device: str) -> Obj | None:
    """The first DeviceTaintRule (by name) that takes the device out of service: it selects the
    device (each selector field it sets matches) with effect NoSchedule or NoExecute. A rule
    without a selector selects nothing; effect None is a preview and changes nothing."""
    for rule in sorted(rules, key=name_of):
        spec = rule.get("spec") or {}
        sel = spec.get("deviceSelector")
        if sel is None or (spec.get("taint") or {}).get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        wanted = {"driver": driver, "pool": pool, "device": device}
        if all(not sel.get(k) or sel.get(k) == v for k, v in wanted.items()):
            return rule
    return None


#: Between a partition's physical device and its slots in the DEVICE column.
PARTITION_ROW = " slots "


def _slice_rows(
    profile: Obj,
    slices: Iterable[Obj],
    reports: Mapping[tuple[str, str], Obj],
    held: Mapping[tuple[str, str, str], list[str]],
    rules: Sequence[Obj] = (),
) -> list[DeviceRow]:
    """A DRA profile's devices from its driver's ResourceSlices; each device's reason, message and
    since come from the node's DeviceReport when it names the device (by its ``patchbay.dev/id``
    attribute), the holders from the claims allocated to it. A device is unhealthy when its slice
    taints it OR its report says so: API servers before 1.36 drop slice taints, and there the
    agent leaves an unhealthy device out of the slice (its report says ``withheld``), so such a
    device is listed from the report alone. A healthy device that a DeviceTaintRule cordons or
    drains shows as Maintenance, the effect as its reason, the rule in its message."""
    driver, rows = driver_of(profile), []
    seen: set[tuple[str, str]] = set()
    for s in slices:
        sp = s.get("spec") or {}
        if sp.get("driver") != driver:
            continue
        node, pool = str(sp.get("nodeName", "")), str((sp.get("pool") or {}).get("name", ""))
        by_id = {
            str(d.get("id")): d for d in (reports.get((name_of(profile), node)) or {}).get("devices") or []
        }
        for dev in sp.get("devices") or []:
            dname = str(dev.get("name", ""))
            attributes = dev.get("attributes") or {}
            physical = str((attributes.get(ATTR_ID) or {}).get("string") or dname)
            shown = physical
            if "consumesCounters" in dev and "patchbay.dev/slots" in attributes:
                # A partition (plugin.partitions): one row per size and place, named by its slots.
                first = int((attributes.get("patchbay.dev/firstSlot") or {}).get("int") or 0)
                size = int((attributes["patchbay.dev/slots"] or {}).get("int") or 1)
                shown = f"{physical}{PARTITION_ROW}{first}-{first + size - 1}"
            taint = next((t for t in dev.get("taints") or [] if is_fault_taint(t)), None)
            reported = by_id.get(physical) or {}
            report_sick = reported.get("health") not in (None, "Healthy")
            seen.add((node, physical))
            sick = bool(taint or report_sick)
            rule = None if sick else maintenance_rule(rules, driver, pool, dname)
            if rule is not None:
                health, source = MAINTENANCE, "DeviceTaintRule"
                reason = str(((rule.get("spec") or {}).get("taint") or {}).get("effect", ""))
                message = f"DeviceTaintRule {name_of(rule)}"
                since = str((rule.get("metadata") or {}).get("creationTimestamp") or "") or None
            else:
                health, source = ("Unhealthy" if sick else "Healthy"), "ResourceSlice"
                reason = (
                    str(taint.get("value", "")) if taint else str(reported.get("reason", "")) if sick else ""
                )
                message = str(reported.get("message", "")) if sick else ""
                since = reported.get("since")
            rows.append(
                DeviceRow.of(
                    profile,
                    node,
                    shown,
                    health=health,
                    reason=reason,
                    message=message,
                    since=since,
                    holders=held.get((driver, pool, dname), []),
                    source=source,
                    physical=physical,
                )
            )
    for (pname, node), report in reports.items():
        if pname != name_of(profile):
            continue
        for d in report.get("devices") or []:
            physical = str(d.get("id", ""))
            if (node, physical) in seen or not d.get("withheld"):
                continue
            rows.append(
                DeviceRow.of(
                    profile,
                    node,
                    physical,
                    health=str(d.get("health") or "Unhealthy"),
                    reason=str(d.get("reason", "")),
                    message=str(d.get("message", "")) or "withheld from the ResourceSlice",
                    since=d.get("since"),
                    holders=[],
                    source="DeviceReport",
                )
            )
    return rows


def _static_rows(profile: Obj, nodes: Iterable[Obj], pods: Iterable[Obj]) -> list[DeviceRow]:
    """One row per selected node; its holders are the node's pods that ask for the resource
    (a Static resource has no devices of its own to hold: the units are counted, not named)."""
    res, rows = resource_of(profile), []
    holders: dict[str, set[str]] = {}
    for pod in pods:
        if pod_request(pod, res) > 0:
            meta = pod.get("metadata") or {}
            node_name = str((pod.get("spec") or {}).get("nodeName") or "")
            holders.setdefault(node_name, set()).add(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
    problems = {
        str(p.get("node")): p for p in (profile.get("status") or {}).get("problems") or [] if p.get("node")
    }
    for node in nodes:
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        if not selector_matches(spec(profile).get("nodeSelector"), labels):
            continue
        want = static_desired(profile, labels)
        have = quantity(((node.get("status") or {}).get("allocatable") or {}).get(res))
        problem = problems.get(str(meta.get("name")), {})
        ok = want is not None and have == want
        reason = (
            "" if ok else str(problem.get("reason") or ("NotAdvertised" if have is None else "ValueMismatch"))
        )
        rows.append(
            DeviceRow.of(
                profile,
                str(meta.get("name", "")),
                f"{have if have is not None else 0} units",
                holders=sorted(holders.get(str(meta.get("name", "")), ())),
                health="Healthy" if ok else "Unhealthy",
                reason=reason,
                message="" if ok else str(problem.get("message") or f"allocatable {have}, intended {want}"),
                source="Node",
            )
        )
    return rows


def device_rows(
    data: Inputs, *, node: str | None = None, profile: str | None = None, unhealthy: bool = False
) -> list[DeviceRow]:
    """Every device of every profile (filtered), sorted by node, profile and device."""
    reports = report_index(data.reports)
    held = _claim_holders(data.claims)
    rows: list[DeviceRow] = []
    for p in data.profiles:
        if profile is not None and name_of(p) != profile:
            continue
        mode = mode_of(p)
        if mode == STATIC:
            rows += _static_rows(p, data.nodes, data.pods)
        elif mode == DRA:
            from_slices = _slice_rows(p, data.slices, reports, held, data.rules)
            rows += from_slices
            # By physical device: a device's partitions are rows of their own.
            seen = {(r.node, r.physical) for r in from_slices}
            # A report of a node whose slice is not there (not written yet, or the API server
            # lacks DRA): its devices still show, from the report.
            for (pname, _), report in reports.items():
                if pname == name_of(p):
                    rows += [r for r in _report_rows(p, report) if (r.node, r.device) not in seen]
        else:
            for (pname, _), report in reports.items():
                if pname == name_of(p):
                    rows += _report_rows(p, report)
    rows = [r for r in rows if (node is None or r.node == node) and (not unhealthy or r.health != "Healthy")]
    rows.sort(key=lambda r: (r.node, r.profile, r.device))
    return rows
