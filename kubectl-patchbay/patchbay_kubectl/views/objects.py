"""What the views share: small readers of the objects the API returned (profiles, nodes, pods,
DeviceReports), the API's quantities and label selectors by the API package's parsers, and the
``Inputs`` each command lists once. Pure: no I/O (``utcnow`` is the one clock, for the caller)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from patchbay_api import constants as api
from patchbay_api.quantity import QuantityError, quantity_value
from patchbay_api.selectors import label_selector_matches
from patchbay_kubectl.agentpods import NodeConfig

Obj = dict[str, Any]

ATTR_ID = api.ATTR_ID
DRA_DRIVER_SUFFIX = api.DRA_DRIVER_SUFFIX
TAINT_DOMAIN = api.TAINT_DOMAIN
TAINT_PLUGIN_HELD = api.TAINT_PLUGIN_HELD
STATIC, DEVICE_PLUGIN, DRA = "Static", "DevicePlugin", "DRA"


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


def report_index(reports: Iterable[Obj]) -> dict[tuple[str, str], Obj]:
    """(profile, node) -> the newest report (there is one per pair; a stale namespace's copy,
    seen with -A, loses to the newer ``observedAt``)."""
    index: dict[tuple[str, str], Obj] = {}
    for r in reports:
        key = (str(r.get("profile", "")), str(r.get("nodeName", "")))
        old = index.get(key)
        if old is None or str(r.get("observedAt", "")) > str(old.get("observedAt", "")):
            index[key] = r
    return index


DEFAULT_GROUP = "default"
"""The node group of a node no group of the profile's ``nodeGroups`` selects."""


def merged(base: Mapping[str, Any], override: Mapping[str, Any], *, top: bool = True) -> dict[str, Any]:
    """A node group's ``plugin`` over ``spec.plugin``: mappings merge key by key, lists and
    values replace, and ``discovery`` (at the top) replaces whole (docs/api.md#node-groups)."""
    out = dict(base)
    for k, v in override.items():
        old = out.get(k)
        if isinstance(v, Mapping) and isinstance(old, Mapping) and not (top and k == "discovery"):
            out[k] = merged(old, v, top=False)
        else:
            out[k] = v
    return out


def group_of(profile: Obj, labels: Mapping[str, str]) -> tuple[str, Obj]:
    """The node group a node's labels choose and the settings it gets; ("-", spec.plugin)
    for a profile without groups."""
    sp = spec(profile)
    plugin = sp.get("plugin") or {}
    groups = sp.get("nodeGroups") or []
    if not groups:
        return "-", plugin
    for g in groups:
        if selector_matches(g.get("nodeSelector"), labels):
            return str(g.get("name", "")), merged(plugin, g.get("plugin") or {})
    return DEFAULT_GROUP, plugin


DONE_PHASES = ("Succeeded", "Failed")


def pod_request(pod: Obj, resource: str) -> int:
    """How much of ``resource`` a pod holds on its node, by the kubelet's rule: the larger of the
    containers' sum and the largest init container's (an extended resource's request equals its
    limit; a limit alone counts as the request). 0 for a pod that has ended."""
    if (pod.get("status") or {}).get("phase") in DONE_PHASES:
        return 0
    pod_spec = pod.get("spec") or {}

    def ask(container: Obj) -> int:
        res = container.get("resources") or {}
        value = (res.get("requests") or {}).get(resource, (res.get("limits") or {}).get(resource))
        return quantity(value) or 0

    main = sum(ask(c) for c in pod_spec.get("containers") or [])
    init = max((ask(c) for c in pod_spec.get("initContainers") or []), default=0)
    return max(main, init)
