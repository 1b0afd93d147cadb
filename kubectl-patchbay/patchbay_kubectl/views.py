"""What each command shows, computed from the objects the API returned. Pure: no I/O, no clock.

``devices``: one row per device across every profile and mode: a DevicePlugin profile's devices
from its agents' DeviceReports; a DRA profile's from its driver's ResourceSlices (a taint
``patchbay.dev/<kind of fault>=<reason>`` is an unhealthy device), holders from the ResourceClaims
allocated to them, reasons and since-when from the DeviceReports the DRA agents write too; a
Static profile's as one row per selected node, healthy when the node's allocatable holds the
count the profile asks for (the operator's own check).

``nodes``: one row per node and profile serving it: the agent pods serving it there, of either
shape (the shared node agent's or the profile's own, agentpods.py), whether it registered (an
agent pod's readiness probe is its kubelet registration; the node agent's report says when it
cannot serve the profile), devices healthy/total.

``why``: the profile's conditions, problems, its agent pods' trouble with the kubelet's own words
(container waiting and termination reasons, the pods' Warning events), the profile's last Events
and what to do next, keyed by the reasons docs/operations.md#troubleshooting explains.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from patchbay_api import constants as api
from patchbay_api.agentpods import AgentPod, Warning, explain
from patchbay_api.constants import AGENT_NAME, LABEL_NAME, LABEL_SHARED_AGENT, SHARED_AGENT_VALUE
from patchbay_api.quantity import QuantityError, quantity_value
from patchbay_api.selectors import label_selector_matches
from patchbay_kubectl.agentpods import (
    AgentPods,
    NodeConfig,
    agent_error,
    registered,
    uses_shared_agent,
)

Obj = dict[str, Any]

ATTR_ID = api.ATTR_ID
DRA_DRIVER_SUFFIX = api.DRA_DRIVER_SUFFIX
LABEL_PROFILE = api.LABEL_PROFILE
TAINT_DOMAIN = api.TAINT_DOMAIN
TAINT_PLUGIN_HELD = api.TAINT_PLUGIN_HELD
AGENT_SELECTOR = f"{LABEL_NAME}={AGENT_NAME}"
#: The shared node agent's pods (profiles without an agent section of their own).
SHARED_AGENT_SELECTOR = f"{AGENT_SELECTOR},{LABEL_SHARED_AGENT}={SHARED_AGENT_VALUE}"
STATIC, DEVICE_PLUGIN, DRA = "Static", "DevicePlugin", "DRA"


# --- small readers -----------------------------------------------------------------------------


def is_fault_taint(taint: Obj) -> bool:
    """A taint the agent puts on an unhealthy device: one key per kind of fault under
    patchbay.dev/ (`patchbay.dev/vanished`, older agents `patchbay.dev/unhealthy`), the reason as
    its value; not the device-plugin hand-over taint."""
    key = str(taint.get("key", ""))
    return key.startswith(TAINT_DOMAIN) and key != TAINT_PLUGIN_HELD


def parse_time(text: str | None) -> datetime | None:
    """An RFC 3339 timestamp of the API (``Z`` or an offset, fractions or not); None if absent."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def age(since: str | None, now: datetime) -> str:
    """kubectl's short age: ``45s``, ``3m12s``, ``5h2m``, ``3d4h``; ``<unknown>`` without a time."""
    t = parse_time(since)
    if t is None:
        return "<unknown>"
    s = max(0, int((now - t).total_seconds()))
    if s < 120:
        return f"{s}s"
    if s < 600:
        return f"{s // 60}m{s % 60}s"
    if s < 3 * 3600:
        return f"{s // 60}m"
    if s < 8 * 3600:
        return f"{s // 3600}h{(s % 3600) // 60}m"
    if s < 2 * 86400:
        return f"{s // 3600}h"
    return f"{s // 86400}d{(s % 86400) // 3600}h" if s < 8 * 86400 else f"{s // 86400}d"


def utcnow() -> datetime:
    return datetime.now(UTC)


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A profile's (or node group's) LabelSelector against a node's labels, by the API package's
    one evaluator; absent selects every node, as the profile's ``spec.nodeSelector`` says."""
    return label_selector_matches(selector or {}, labels)


def spec(profile: Obj) -> Obj:
    return profile.get("spec") or {}


def name_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def mode_of(profile: Obj) -> str:
    return str(spec(profile).get("mode", ""))


def resource_of(profile: Obj) -> str:
    return str(spec(profile).get("resourceName", ""))


def driver_of(profile: Obj) -> str:
    return name_of(profile) + DRA_DRIVER_SUFFIX


def condition(obj: Obj, ctype: str) -> Obj | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return dict(c)
    return None


def pod_ready(pod: Obj) -> bool:
    c = condition(pod, "Ready")
    return bool(c and c.get("status") == "True")


def static_desired(profile: Obj, labels: Mapping[str, str]) -> int | None:
    """The count a Static profile asks of a node (its label override when set); None when the
    label holds no non-negative integer (the operator reports that node, advertises nothing)."""
    st = spec(profile).get("static") or {}
    key = st.get("capacityFromLabel")
    if key and key in labels:
        value = labels[key]
        return int(value) if re.fullmatch(r"[0-9]+", value) else None
    return int(st.get("capacity", 0))


def quantity(value: Any) -> int | None:
    """An extended resource's quantity as the scheduler counts it (``2k``, ``1e3`` and ``1Ki``
    too, by the API package's parser); None when absent or not a quantity."""
    if value is None:
        return None
    try:
        return quantity_value(str(value))
    except QuantityError:
        return None


# --- devices ----------------------------------------------------------------------------------


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

    def as_dict(self) -> Obj:
        return asdict(self)


@dataclass
class Inputs:
    """Everything ``devices`` and ``nodes`` read, listed once per command."""

    profiles: list[Obj]
    reports: list[Obj] = field(default_factory=list)
    nodes: list[Obj] = field(default_factory=list)
    pods: list[Obj] = field(default_factory=list)
    slices: list[Obj] = field(default_factory=list)
    claims: list[Obj] = field(default_factory=list)
    #: DeviceTaintRules (device maintenance, Kubernetes 1.37 on; empty where not served)
    rules: list[Obj] = field(default_factory=list)
    #: the shared node agent's config (agentpods.node_config); None when not read
    node_config: NodeConfig | None = None


def _report_index(reports: Iterable[Obj]) -> dict[tuple[str, str], Obj]:
    """(profile, node) -> the newest report (there is one per pair; a stale namespace's copy,
    seen with -A, loses to the newer ``observedAt``)."""
    index: dict[tuple[str, str], Obj] = {}
    for r in reports:
        key = (str(r.get("profile", "")), str(r.get("nodeName", "")))
        old = index.get(key)
        if old is None or str(r.get("observedAt", "")) > str(old.get("observedAt", "")):
            index[key] = r
    return index


def _holders(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    return sorted({f"{p.get('namespace', '')}/{p.get('name', '')}" for p in pods})


def _report_rows(profile: Obj, report: Obj, source: str = "DeviceReport") -> list[DeviceRow]:
    rows = []
    for d in report.get("devices") or []:
        rows.append(
            DeviceRow(
                node=str(report.get("nodeName", "")),
                profile=name_of(profile),
                mode=mode_of(profile),
                resource=resource_of(profile),
                device=str(d.get("id", "")),
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
                DeviceRow(
                    node=node,
                    profile=name_of(profile),
                    mode=DRA,
                    resource=resource_of(profile),
                    device=shown,
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
                DeviceRow(
                    node=node,
                    profile=name_of(profile),
                    mode=DRA,
                    resource=resource_of(profile),
                    device=physical,
                    health=str(d.get("health") or "Unhealthy"),
                    reason=str(d.get("reason", "")),
                    message=str(d.get("message", "")) or "withheld from the ResourceSlice",
                    since=d.get("since"),
                    holders=[],
                    source="DeviceReport",
                )
            )
    return rows


def _static_rows(profile: Obj, nodes: Iterable[Obj]) -> list[DeviceRow]:
    res, rows = resource_of(profile), []
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
            DeviceRow(
                node=str(meta.get("name", "")),
                profile=name_of(profile),
                mode=STATIC,
                resource=res,
                device=f"{have if have is not None else 0} units",
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
    reports = _report_index(data.reports)
    held = _claim_holders(data.claims)
    rows: list[DeviceRow] = []
    for p in data.profiles:
        if profile is not None and name_of(p) != profile:
            continue
        mode = mode_of(p)
        if mode == STATIC:
            rows += _static_rows(p, data.nodes)
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


# --- nodes ------------------------------------------------------------------------------------


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
    reports = _report_index(data.reports)
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
    reports = _report_index(data.reports)
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


# --- why --------------------------------------------------------------------------------------

HINTS: dict[str, str] = {
    "ErrImageNeverPull": "load the agent image on the node, or fix spec.agent.image (chart: agent.image)",
    "InvalidImageName": "fix spec.agent.image / the chart's agent.image",
    "ImagePullBackOff": "check the registry, the pull secrets and the image name",
    "ErrImagePull": "check the registry, the pull secrets and the image name",
    "CrashLoopBackOff": "read the message, then `kubectl logs --previous` of the agent pod",
    "CreateContainerConfigError": "the agent pod's configuration: `kubectl describe pod` of the agent pod",
    "FailedCreatePodSandBox": "the node's kubelet and CNI: the pod's events",
    "FailedMount": "the node's kubelet and the pod's volumes: the pod's events",
    "Unschedulable": "spec.agent.tolerations, spec.agent.priorityClassName, the node's free resources",
    "AgentNotReady": "the agent's log: the kubelet socket, --device-plugin-dir, discovery errors",
    "AgentStarting": "the agent's log: the kubelet socket, --device-plugin-dir, discovery errors",
    "Vanished": "the hardware: the device file is gone (`kubectl patchbay devices --unhealthy`)",
    "OpenFailed": "the hardware or its permissions: the message says what open() answered",
    "ProbeFailed": "the profile's plugin.health.exec probe failed: its message has the probe's stderr",
    "ProbeTimedOut": "the probe outlived plugin.health.exec.timeoutSeconds: the device or the timeout",
    "Flapping": "the device keeps coming and going (a loose connector, a reset loop): the hardware; "
    "it recovers after 30 s without a change",
    "DevicesUnhealthy": "`kubectl patchbay devices --unhealthy` lists them; then the hardware",
    "NoDevices": "the agent found nothing: the profile's plugin.discovery against the node; the agent's log",
    "DevicesNotAllocatable": "the kubelet lost the agent's devices (kubelets before 1.37, after an agent "
    "left): delete the agent pod on that node so its successor registers; then the kubelet's log",
    "WaitingForKubelet": "transient (the kubelet's node status sync, ~10 s); if it lasts, the kubelet's log",
    "NoMatchingNodes": "check spec.nodeSelector against `kubectl get nodes --show-labels`",
    "ResourceNameConflict": "an older profile advertises this resource: delete one of them",
    "ResourceSetByOther": "something else set this resource on the node: remove the other source",
    "InvalidCapacityLabel": "fix the node's capacity label: a non-negative integer",
    "PatchFailed": "the message names the API error (often RBAC on nodes/status)",
    "ValueMismatch": "transient after a change; if it persists, the operator's log",
    "NotAdvertised": "transient after a change; if it persists, the operator's log",
    "NodesNotReady": "transient while agents start; `kubectl patchbay nodes --profile` shows which",
    "RollingOut": "transient: a rollout keeps every node's resource",
    "NodeGroupsOverlap": "two of spec.nodeGroups match the node and the first listed wins: narrow their "
    "nodeSelectors, or order the list as meant",
    "OwnedObjectMissing": "an object the operator renders was deleted: the operator recreates it within "
    "seconds (a Recreated Event on the profile); if it stays missing, the operator's log",
    "FieldsTakenOver": "another field manager took fields the operator manages by server-side apply, and "
    "the operator leaves them: apply without those fields (or delete the object: it is recreated)",
}

_MISSING_CONFIGMAP = re.compile(r'configmaps? "([^"]+)" not found')
_WAITS = ("NodesNotReady", "RollingOut")
"""Reasons whose hint calls the wait transient: not so while an object the agents need is missing."""


def missing_owned(problems: Sequence[Obj], troubles: Sequence[Obj]) -> list[str]:
    """What the operator renders that is missing, as the cause of not being Ready: the status's
    OwnedObjectMissing problem, or an agent pod that cannot mount its ConfigMap (FailedMount:
    configmap "patchbay-node-agent" not found)."""
    out = [str(p.get("message", "")) for p in problems if p.get("reason") == "OwnedObjectMissing"]
    for t in troubles:
        texts = [str(t.get("message", ""))] + [str(e.get("message", "")) for e in t.get("events") or []]
        for name in sorted({m for text in texts for m in _MISSING_CONFIGMAP.findall(text)}):
            cause = f"ConfigMap {name}, which the agent pods mount, is missing: the operator recreates it"
            if cause not in out:
                out.append(cause)
    return out


def pod_trouble(pod: Obj, events: Sequence[Obj]) -> Obj | None:
    """Why an agent pod does not work, in the words the operator's status uses (the API package's
    ``explain``: the kubelet's and scheduler's reasons), with its last exit and latest events;
    None when it works. ``events`` are the pod's Warning events, newest last."""
    agent = AgentPod.from_object(pod)
    found = explain(agent, Warning.from_object(events[-1]) if events else None)
    if found is None:
        return None
    out: Obj = {
        "pod": agent.name,
        "node": agent.node,
        "phase": agent.phase,
        "reason": str(found.reason),
        "message": found.message,
    }
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        last = (cs.get("lastState") or {}).get("terminated") or {}
        if last:
            out["lastExit"] = {
                "exitCode": last.get("exitCode"),
                "reason": last.get("reason", ""),
                "message": (last.get("message") or "").strip(),
            }
    out["events"] = [
        {"reason": e.get("reason", ""), "message": e.get("message", ""), "count": e.get("count", 1)}
        for e in events[-3:]
    ]
    return out


def _event_time(e: Obj) -> str:
    return str(
        e.get("lastTimestamp")
        or e.get("eventTime")
        or (e.get("metadata") or {}).get("creationTimestamp")
        or ""
    )


def why(profile: Obj, pods: Sequence[Obj], events: Sequence[Obj], now: datetime, last: int = 8) -> Obj:
    """One screen's worth of why ``profile`` is (not) Ready, as data (``render_why`` prints it)."""
    st = profile.get("status") or {}
    conds = st.get("conditions") or []
    pname = name_of(profile)
    profile_events = sorted(
        (
            e
            for e in events
            if (e.get("involvedObject") or {}).get("kind") == "DevicePluginProfile"
            and (e.get("involvedObject") or {}).get("name") == pname
        ),
        key=_event_time,
    )
    by_pod: dict[str, list[Obj]] = defaultdict(list)
    for e in sorted(events, key=_event_time):
        inv = e.get("involvedObject") or {}
        if inv.get("kind") == "Pod" and e.get("type") == "Warning":
            by_pod[f"{inv.get('namespace', '')}/{inv.get('name', '')}"].append(e)
    troubles = []
    for pod in sorted(pods, key=lambda p: (str((p.get("spec") or {}).get("nodeName")), name_of(p))):
        meta = pod.get("metadata") or {}
        t = pod_trouble(pod, by_pod.get(f"{meta.get('namespace', '')}/{meta.get('name', '')}", []))
        if t is not None:
            troubles.append(t)
    ready: Obj = next((c for c in conds if c.get("type") == "Ready"), {})
    reasons: list[str] = []
    for c in conds:
        if (c.get("type") == "Ready" and c.get("status") != "True") or (
            c.get("type") != "Ready" and c.get("status") == "True"
        ):
            reasons.append(str(c.get("reason", "")))
    reasons += [str(p.get("reason", "")) for p in st.get("problems") or []]
    reasons += [str(t["reason"]) for t in troubles]
    seen: set[str] = set()
    hints = []
    causes = missing_owned(st.get("problems") or [], troubles)
    if causes:
        # The cause, not a wait: what is missing and what the operator does about it.
        hints.append(
            {"reason": "OwnedObjectMissing", "do": "; ".join(causes) + f". {HINTS['OwnedObjectMissing']}"}
        )
        seen.update(("OwnedObjectMissing", *_WAITS))
    for r in reasons:
        if r in HINTS and r not in seen:
            seen.add(r)
            hints.append({"reason": r, "do": HINTS[r]})
    if not st:
        hints.append(
            {
                "reason": "NoStatus",
                "do": "no status yet: is the operator running? (its log)",
            }
        )
    elif st.get("observedGeneration") != (profile.get("metadata") or {}).get("generation"):
        hints.append(
            {"reason": "NotObserved", "do": "the operator has not seen the latest spec yet: its log"}
        )
    return {
        "profile": pname,
        "mode": mode_of(profile),
        "resource": resource_of(profile),
        "ready": ready.get("status") == "True",
        "nodesReady": st.get("nodesReady", ""),
        "devicesAllocatable": st.get("devicesAllocatable", ""),
        "conditions": [
            {
                "type": c.get("type"),
                "status": c.get("status"),
                "reason": c.get("reason", ""),
                "message": c.get("message", ""),
                "since": c.get("lastTransitionTime"),
                "age": age(c.get("lastTransitionTime"), now),
            }
            for c in conds
        ],
        "problemCount": st.get("problemCount", len(st.get("problems") or [])),
        "problems": list(st.get("problems") or []),
        "agentPods": {"total": len(pods), "notReady": len(troubles), "trouble": troubles[:5]},
        "events": [
            {
                "type": e.get("type", ""),
                "reason": e.get("reason", ""),
                "message": e.get("message", ""),
                "count": e.get("count", 1),
                "age": age(_event_time(e) or None, now),
            }
            for e in profile_events[-last:]
        ],
        "next": hints,
    }
