"""DRA mode's status: the devices the agents' DeviceReports list, and what this cluster serves.

DRA devices never reach node capacity, so the reports are the device counts. What the API server
kept of the DeviceClass (``extendedResourceName``), of the slices' device taints and of a shared
device's consumable capacity is read back, never assumed (docs/dra.md#releases), and said in
``status.dra``; a node that a node-capacity profile of the same resource also selects is served
twice (KEP-5004) and said so.

A staged rollout's gate also asks whether a wave node's ResourceSlices agree with its report
(``SliceRead``, ``published``, ``slices_short``): the operator reads them (one LIST per node, by
field selectors) only for the nodes of a wave at the end of its gate, never the cluster's slices.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from patchbay_api.constants import ATTR_ID, TAINT_PLUGIN_HELD
from patchbay_operator.agentpods import Trouble
from patchbay_operator.capacity import NodeState
from patchbay_operator.constants import Reason
from patchbay_operator.devicereports import Report
from patchbay_operator.maintenance import Rule
from patchbay_operator.maintenance import entries as maintenance_entries
from patchbay_operator.profiles import Profile
from patchbay_operator.status.conditions import Problem, Verdict, plural
from patchbay_operator.status.daemonset import (
    AgentDaemonSet,
    agent_error_problem,
    agents_status,
    trouble_problems,
    unlisted_problem,
)


@dataclass(frozen=True)
class StoredDeviceClass:
    """A DRA profile's DeviceClass as the API server stored it: the answer to the operator's apply.

    An API server whose DRAExtendedResource gate is off (before 1.36) drops
    ``spec.extendedResourceName`` silently (docs/facts.md#dra-dropped-fields); then unchanged pods
    that ask for the resource in their limits find no DRA path, only ResourceClaims do.
    """

    name: str
    #: as stored: "" when the API server dropped it
    extended_resource_name: str

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> StoredDeviceClass:
        spec = obj.get("spec") or {}
        return cls(
            name=str((obj.get("metadata") or {}).get("name") or ""),
            extended_resource_name=str(spec.get("extendedResourceName") or ""),
        )


SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"


def slices_selector(driver: str, node: str) -> str:
    """The field selector of one node's pool of one driver (the kubelet's and the agent's own)."""
    return f"spec.driver={driver},spec.nodeName={node}"


@dataclass(frozen=True)
class SliceRead:
    """A wave node's ResourceSlices of the profile's driver as read for the rollout's gate."""

    #: when the read was sent
    at: datetime
    #: the devices they publish as serving (``published``); None: the read failed
    devices: int | None
    error: str = ""


def _serving(device: Mapping[str, Any]) -> bool:
    """A published device a claim may get: no taint but an informational one (effect None) or the
    hand-over taint of a device the device plugin still hands out (healthy all the same)."""
    return all(
        t.get("effect") == "None" or t.get("key") == TAINT_PLUGIN_HELD for t in device.get("taints") or ()
    )


def published(slices: Iterable[Mapping[str, Any]]) -> int:
    """The physical devices the slices publish as serving: distinct ``patchbay.dev/id`` values (a
    partitioned device is one device however many partitions it has), the device's name where it
    has none."""
    ids = set()
    for s in slices:
        for d in (s.get("spec") or {}).get("devices") or ():
            if _serving(d):
                attr = ((d.get("attributes") or {}).get(ATTR_ID) or {}).get("string")
                ids.add(str(attr) if attr else f"name:{d.get('name')}")
    return len(ids)


def slices_short(driver: str, report: Report, devices: int) -> str:
    """What a node's ResourceSlices lack of its report ("" they publish every device it says
    healthy, less the ones it says it left out: ``withheld``)."""
    expected = report.healthy - report.all.withheld_healthy
    if report.error is not None or devices >= expected:
        return ""
    return (
        f"its ResourceSlices of {driver} publish {devices} of the {expected} devices its "
        "DeviceReport says healthy"
    )


def served_twice(profile: Profile, other: Profile | None, nodes: Iterable[NodeState]) -> list[str]:
    """The nodes (sorted) that both ``profile`` and ``other`` select, when ``other`` serves the
    same resource name the other way (node capacity vs DRA).

    KEP-5004: a node must never expose one extended resource both through a device plugin (or
    node capacity) and through DRA; the scheduler's answer for such a node is undefined. A
    profile being deleted is going away, so it overlaps nothing.
    """
    if other is None or other.resource != profile.resource or other.dra == profile.dra:
        return []
    if other.deleting or profile.deleting:
        return []
    return sorted(
        n.name for n in nodes if profile.selector.matches(n.labels) and other.selector.matches(n.labels)
    )


def served_twice_problems(profile: Profile, other: str, nodes: Sequence[str]) -> list[Problem]:
    """One problem per node served twice, so each appears (and goes) with an Event."""
    msg = (
        f"also selected by DevicePluginProfile {other}, which serves {profile.resource} here through "
        "node capacity, so this profile's DRA agent stays off the node (one way per node); move "
        "the node's label from that profile's selector to this one's"
    )
    return [Problem(node, "", Reason.RESOURCE_SERVED_TWICE.value, msg) for node in nodes]


def dra_problems(
    profile: Profile, nodes: Iterable[NodeState], troubles: Iterable[Trouble], reports: Iterable[Report]
) -> list[Problem]:
    """Agent pods that do not work, unhealthy devices (from the agents' reports) and selected
    nodes whose agent reports no device (or has not reported yet: a start, no Event)."""
    by_node = {rep.node: rep for rep in reports}
    problems = trouble_problems(troubles)
    troubled = {t.node for t in troubles}
    for node in nodes:
        if not profile.selector.matches(node.labels):
            continue
        report = by_node.get(node.name)
        if report is not None and report.error is not None:
            problems.append(agent_error_problem(node.name, report.error))
            continue
        if report is None or report.total == 0:
            if node.name not in troubled:
                msg = (
                    "no DeviceReport from the agent yet"
                    if report is None
                    else f"the agent found no device for {profile.resource}"
                )
                problems.append(
                    Problem(node.name, "", Reason.NO_DEVICES.value, msg, transient=report is None)
                )
            continue
        problems += [
            Problem(
                node.name,
                d.id,
                d.reason or "Unhealthy",
                (d.message or "unhealthy") + (WITHHELD if d.withheld else ""),
                d.since,
            )
            for d in report.devices
            if not d.healthy
        ]
        problems += unlisted_problem(node.name, report)
    return problems


WITHHELD = "; left out of the node's ResourceSlice (this cluster's API server drops device taints)"
"""Said of an unhealthy device the DRA agent left out of its slice (docs/dra.md#releases)."""


def _what_agents_found(said: Iterable[str]) -> str:
    """What the agents found the API server does with a field: Dropped when any agent saw it
    dropped, Kept when every agent that says saw it kept, Unknown otherwise; "" when none says."""
    seen = {s for s in said if s}
    if not seen:
        return ""
    if "Dropped" in seen:
        return "Dropped"
    return "Kept" if seen == {"Kept"} else "Unknown"


def device_taints(reports: Iterable[Report]) -> str:
    """ResourceSlice device taints, as the agents found (`_what_agents_found`); where Dropped an
    agent leaves the devices that need one out of its slices."""
    return _what_agents_found(r.device_taints for r in reports)


def consumable_capacity(reports: Iterable[Report]) -> str:
    """A shared device's consumable capacity, as the agents of a shared DRA profile found
    (`_what_agents_found`); where Dropped they publish the devices unshared."""
    return _what_agents_found(r.consumable_capacity for r in reports)


def partitionable_devices(reports: Iterable[Report]) -> str:
    """A partitioned device's counters, as the agents of a partitioned DRA profile found
    (`_what_agents_found`); where Dropped they publish the devices whole."""
    return _what_agents_found(r.partitionable_devices for r in reports)


def partitions_verdict(profile: Profile, partitions: str) -> Verdict | None:
    """Degraded for a partitioned profile whose agents found the API server drops counters (they
    publish the devices whole); None otherwise."""
    if not profile.partitioned or partitions != "Dropped":
        return None
    return (
        True,
        Reason.PARTITIONS_NOT_SERVED,
        "devices are not partitioned: the API server drops a ResourceSlice's sharedCounters and a "
        "device's consumesCounters (the DRAPartitionableDevices feature is off, as before Kubernetes "
        "1.36), so each device is published whole and goes to one claim at a time",
    )


def sharing_verdict(profile: Profile, sharing: str) -> Verdict | None:
    """Degraded for a shared profile whose agents found the API server drops consumable capacity
    (they publish the devices unshared); None otherwise."""
    if profile.shares <= 1 or sharing != "Dropped":
        return None
    return (
        True,
        Reason.SHARING_NOT_SERVED,
        f"devices are not shared: the API server drops a ResourceSlice device's allowMultipleAllocations "
        f"and consumable capacity (the DRAConsumableCapacity feature is off, as before Kubernetes 1.36), "
        f"so each device goes to one claim at a time, not {profile.shares}",
    )


def not_served_verdict(profile: Profile, device_class: StoredDeviceClass | None) -> Verdict | None:
    """Degraded for a DeviceClass the API server stored without the profile's resource name as its
    extendedResourceName; None when it kept it or was not read yet."""
    if device_class is None or device_class.extended_resource_name == profile.resource:
        return None
    return (
        True,
        Reason.EXTENDED_RESOURCE_NOT_SERVED,
        f"pods that ask for {profile.resource} in their limits are not served by DRA on this "
        f"cluster: the API server stored DeviceClass {device_class.name} without its "
        "extendedResourceName (the DRAExtendedResource feature is off, as before Kubernetes 1.36); "
        f"ResourceClaims with deviceClassName {device_class.name} still get the devices",
    )


def dra_status(
    profile: Profile,
    daemonset: AgentDaemonSet | None,
    nodes: Iterable[NodeState],
    previous: Mapping[str, Any],
    now: str,
    *,
    troubles: Sequence[Trouble] = (),
    reports: Sequence[Report] = (),
    twin: str = "",
    twice: Sequence[str] = (),
    device_class: StoredDeviceClass | None = None,
    problems: list[Problem] | None = None,
    maintenance: Iterable[Rule] = (),
) -> dict[str, Any]:
    """DRA mode: the agents' rollout and pods, and the devices their DeviceReports list.

    Node counts are the DaemonSet's (desired = scheduled, ready = available agents: an agent is
    Ready once the kubelet registered its driver). Devices come from the reports, because DRA
    devices never appear in node capacity: ``capacity`` is every device reported, ``allocatable``
    the healthy ones (what the agent publishes in its ResourceSlice), plus healthy, unhealthy and
    allocated. ``twice`` are the nodes that DevicePluginProfile ``twin`` also serves the resource
    on through node capacity: Degraded with reason ResourceServedTwice until that is fixed.

    What this cluster serves (``status.dra``): ``device_class`` as stored (an extendedResourceName
    that was dropped is Degraded, ExtendedResourceNotServed) and, from the reports, whether device
    taints are kept and how many devices the agents left out of their slices instead (those are
    not allocatable: ``allocatable`` leaves them out), and the DeviceTaintRules that take the
    profile's devices out of service (``maintenance``, maintenance.py).
    `problems`: `dra_problems(...) + served_twice_problems(...)` when the caller has them already.
    """
    nodes = list(nodes)
    matching = [n for n in nodes if profile.selector.matches(n.labels)]
    names = {n.name for n in matching}
    reports = [rep for rep in reports if rep.node in names]
    healthy = sum(rep.healthy for rep in reports)
    unhealthy_count = sum(rep.unhealthy for rep in reports)
    withheld_healthy = sum(rep.withheld_healthy for rep in reports)
    devices = {
        "capacity": healthy + unhealthy_count,
        "allocatable": healthy - withheld_healthy,
        "healthy": healthy,
        "unhealthy": unhealthy_count,
        "allocated": sum(rep.allocated for rep in reports),
    }
    if problems is None:
        problems = dra_problems(profile, matching, troubles, reports)
        problems += served_twice_problems(profile, twin, twice)
    served_twice: Verdict | None = None
    if twice:
        shown = ", ".join(twice[:3]) + (f" and {len(twice) - 3} more" if len(twice) > 3 else "")
        served_twice = (
            True,
            Reason.RESOURCE_SERVED_TWICE,
            f"{plural(len(twice), 'node')} selected also by DevicePluginProfile {twin}, which serves "
            f"{profile.resource} there through node capacity, so this profile's DRA agents stay off "
            f"them (one way per node): {shown}; move those nodes' label from {twin}'s selector "
            "to this profile's",
        )
    sharing = consumable_capacity(reports) if profile.shares > 1 else ""
    partitions = partitionable_devices(reports) if profile.partitioned else ""
    not_served = (
        sharing_verdict(profile, sharing)
        or partitions_verdict(profile, partitions)
        or not_served_verdict(profile, device_class)
    )
    out = agents_status(
        profile,
        daemonset,
        previous,
        now,
        devices=devices,
        problems=problems,
        unhealthy=[p for p in problems if p.device],
        served_twice=served_twice,
        not_served=not_served,
        ready_note=(
            f"ResourceClaims only: pods that ask for {profile.resource} in their limits are not served "
            "by DRA on this cluster (see Degraded)"
            if not_served is not None and not_served[1] is Reason.EXTENDED_RESOURCE_NOT_SERVED
            else ""
        ),
    )
    # Every key, None where not known (yet): the status is written as a merge patch, where None
    # removes what an earlier status said.
    taints = device_taints(reports)
    out["dra"] = {
        "deviceClassName": device_class.name if device_class is not None else None,
        "extendedResourceName": device_class.extended_resource_name if device_class is not None else None,
        "deviceTaints": taints or None,
        "consumableCapacity": sharing or None,
        "partitionableDevices": partitions or None,
        "withheldDevices": sum(rep.withheld for rep in reports) if taints else None,
        "maintenance": maintenance_entries(maintenance, profile.name) or None,
    }
    return out
