"""The DeviceReport: what one agent publishes about its node's devices for its profile.

Pure: a report is built from the inventory's snapshot (which devices, in the order the kubelet
sees them), the health tracker's statuses (health, since when, why) and the containers the
kubelet's PodResources API says hold this resource's device IDs. No I/O here; `report/reporter.py`
decides when to write and `kubeclient.py` writes.

The shape is the CRD's (crds/patchbay.dev_devicereports.yaml), which the API server validates:
one object per profile and node named `<profile>.<node>`, owned by the Node (so the garbage
collector removes it with the node), every PHYSICAL device once (replicas `<id>::<n>` are counted
as their device), and the capped fields capped here (a message of at most 512 characters, at most
64 containers per device, at most 2,048 devices, at most 512 holders and 65,536 characters of
messages in all), so a write is never refused for its size. The CRD's bounds keep the largest
report it admits under the 1.5 MiB etcd takes in one request (docs/security.md#report-size): a
report that passed admission is never refused by storage.
`observedAt` is added at write time: two reports are compared without it.

In DRA mode the report also says what the API server does with ResourceSlice device taints
(`deviceTaints`: Kept, Dropped or Unknown, docs/facts.md#dra-dropped-fields) and which devices the
agent left out of its slices because they would need a taint that is dropped (`withheld: true`
on the device, `summary.withheld`): those are not allocatable through DRA on this node.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from patchbay_agent.constants import (
    FIELD_MANAGER,
    LABEL_MANAGED_BY,
    LABEL_PROFILE,
    REPORT_GROUP,
    REPORT_KIND,
    REPORT_VERSION,
    DeviceHealth,
)
from patchbay_agent.core.health import DeviceStatus
from patchbay_agent.core.holders import PodRef
from patchbay_agent.core.inventory import Snapshot
from patchbay_agent.kubeobjects import owner_reference

#: The CRD's limits.
MAX_MESSAGE_LENGTH = 512
MAX_REASON_LENGTH = 64
MAX_DEVICES = 2048
MAX_PODS_PER_DEVICE = 64
#: Holders (devices[].pods entries) in one report, all devices together.
MAX_HOLDERS = 512
#: Characters of devices[].message in one report, all devices together.
MAX_MESSAGE_TOTAL = 65536
MAX_NAME_LENGTH = 253

_REPLICA_SUFFIX = re.compile(r"::\d+$")
_ELLIPSIS = "..."


@dataclass(frozen=True)
class ReportTarget:
    """Whose report this is and where it goes (the flags, not the devices)."""

    profile: str
    node_name: str
    namespace: str
    resource_name: str
    #: the agent's pod name (its `agent` field); None when not known
    agent: str | None = None

    @property
    def name(self) -> str:
        """`<profile>.<node>`, what the CRD's rule requires."""
        return report_name(self.profile, self.node_name)


def report_name(profile: str, node_name: str) -> str:
    return f"{profile}.{node_name}"


def rfc3339(seconds: float) -> str:
    """Wall-clock seconds as RFC 3339 in UTC, whole seconds ("2026-01-02T03:04:05Z")."""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cap(text: str, limit: int) -> str:
    """`text` shortened to at most `limit` characters, marked with "..." when cut."""
    if len(text) <= limit:
        return text
    return text[: limit - len(_ELLIPSIS)] + _ELLIPSIS


def physical_of(advertised: str, replica_of: Mapping[str, str]) -> str:
    """The physical device of an advertised ID: through the snapshot, else by dropping `::<n>`
    (an ID the kubelet still reports after the device left the list)."""
    found = replica_of.get(advertised)
    if found is not None:
        return found
    return _REPLICA_SUFFIX.sub("", advertised)


def holders_by_device(
    containers: Mapping[PodRef, Sequence[str]], replica_of: Mapping[str, str]
) -> dict[str, list[PodRef]]:
    """Physical device ID -> the containers holding it (any of its replicas), sorted, unique."""
    out: dict[str, set[PodRef]] = {}
    for ref, ids in containers.items():
        for advertised in ids:
            out.setdefault(physical_of(advertised, replica_of), set()).add(ref)
    return {dev: sorted(refs) for dev, refs in out.items()}


@dataclass(frozen=True)
class SliceState:
    """DRA mode: what the slice publisher found out and did (`drapublisher.SlicePublisher`)."""

    #: `constants.DeviceTaints`: Kept, Dropped or Unknown
    device_taints: str
    #: physical IDs left out of the slices
    withheld: frozenset[str] = frozenset()
    #: a shared profile's devices (`sharing.replicas` > 1): whether the API server keeps their
    #: consumable capacity (Kept, Dropped, Unknown); "" for unshared devices
    consumable_capacity: str = ""
    #: a partitioned profile's devices (`plugin.partitions`): whether the API server keeps their
    #: counters (Kept, Dropped, Unknown); "" for devices offered whole
    partitionable_devices: str = ""


def _device_entry(
    dev_id: str, status: DeviceStatus | None, healthy: bool, pods: Sequence[PodRef], withheld: bool = False
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": dev_id,
        "health": (DeviceHealth.HEALTHY if healthy else DeviceHealth.UNHEALTHY).value,
    }
    if withheld:
        entry["withheld"] = True
    if status is not None and status.healthy == healthy:
        if not healthy:
            entry["reason"] = cap(status.reason, MAX_REASON_LENGTH)
            if status.message:
                entry["message"] = cap(status.message, MAX_MESSAGE_LENGTH)
        entry["since"] = rfc3339(status.since)
    if pods:
        entry["pods"] = [p.as_dict() for p in pods[:MAX_PODS_PER_DEVICE]]
    return entry


def build_report(
    target: ReportTarget,
    snap: Snapshot,
    containers: Mapping[PodRef, Sequence[str]],
    node_uid: str | None = None,
    *,
    slices: SliceState | None = None,
    node_group: str = "",
    revision: str = "",
    allocation_failures: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole DeviceReport object (without `observedAt`), ready for server-side apply.
    `node_group`: the profile's node group the agent serves this node with ("" for a profile
    without node groups: no `nodeGroup` field, as before node groups existed). `revision`: the
    hash of the profile's revision the agent serves ("" when the operator names none: no
    `revision` field). `allocation_failures`: the `allocationFailures` field
    (`report/failures.py`; None while nothing failed: no field).

    Health, since when and why all come from the one snapshot. A device the snapshot lists
    without a status (never observed; it cannot happen in the agent, whose monitor observes every
    device before it publishes) is reported without `since`. Over `MAX_DEVICES` devices, Unhealthy and
    held ones are kept first; `summary` always counts every device.
    """
    healthy_physical = snap.healthy_physical
    held = holders_by_device(containers, snap.replica_of)
    ids = list(snap.physical)
    withheld = slices.withheld if slices is not None else frozenset()
    devices = [
        _device_entry(d, snap.status_of(d), d in healthy_physical, held.get(d, ()), d in withheld)
        for d in ids
    ]
    summary = {
        "total": len(ids),
        "healthy": sum(1 for d in ids if d in healthy_physical),
        "unhealthy": sum(1 for d in ids if d not in healthy_physical),
        "allocated": sum(1 for d in ids if held.get(d)),
    }
    if slices is not None:
        summary["withheld"] = sum(1 for d in ids if d in withheld)
    if len(devices) > MAX_DEVICES:
        order = sorted(
            range(len(devices)),
            key=lambda i: (ids[i] in healthy_physical and not held.get(ids[i]) and ids[i] not in withheld, i),
        )
        keep = sorted(order[:MAX_DEVICES])
        devices = [devices[i] for i in keep]
    _within_report_budgets(devices)
    metadata: dict[str, Any] = {
        "name": target.name,
        "namespace": target.namespace,
        "labels": {LABEL_PROFILE: target.profile, LABEL_MANAGED_BY: FIELD_MANAGER},
    }
    if node_uid:
        metadata["ownerReferences"] = [owner_reference(target.node_name, node_uid)]
    report: dict[str, Any] = {
        "apiVersion": f"{REPORT_GROUP}/{REPORT_VERSION}",
        "kind": REPORT_KIND,
        "metadata": metadata,
        "profile": target.profile,
        "nodeName": target.node_name,
        "resourceName": target.resource_name,
    }
    if target.agent:
        report["agent"] = target.agent
    if node_group:
        report["nodeGroup"] = node_group
    if revision:
        report["revision"] = revision
    if slices is not None:
        report["deviceTaints"] = slices.device_taints
        if slices.consumable_capacity:
            report["consumableCapacity"] = slices.consumable_capacity
        if slices.partitionable_devices:
            report["partitionableDevices"] = slices.partitionable_devices
    if allocation_failures is not None:
        report["allocationFailures"] = dict(allocation_failures)
    report["summary"] = summary
    report["devices"] = devices
    return report


def _within_report_budgets(devices: list[dict[str, Any]]) -> None:
    """Cut holders and messages, in place, to the report-wide budgets the CRD enforces: Unhealthy
    devices first (their message says why), then the list's order. A cut message ends in "...";
    past the budget a device keeps its reason and loses its message; holders past it are left out
    (`summary.allocated` still counts the device as held)."""
    order = sorted(
        range(len(devices)), key=lambda i: (devices[i]["health"] != DeviceHealth.UNHEALTHY.value, i)
    )
    holders, chars = MAX_HOLDERS, MAX_MESSAGE_TOTAL
    for i in order:
        entry = devices[i]
        if "pods" in entry:
            entry["pods"] = entry["pods"][:holders]
            holders -= len(entry["pods"])
            if not entry["pods"]:
                del entry["pods"]
        if "message" in entry:
            if chars <= len(_ELLIPSIS):
                del entry["message"]
            else:
                entry["message"] = cap(entry["message"], chars)
                chars -= len(entry["message"])


def with_observed_at(report: Mapping[str, Any], seconds: float) -> dict[str, Any]:
    """The report as written: `observedAt` set to when the agent saw the change."""
    return {**report, "observedAt": rfc3339(seconds)}


def failure_report(
    target: ReportTarget,
    reason: str,
    message: str,
    since: float,
    node_uid: str | None = None,
    *,
    node_group: str = "",
    revision: str = "",
) -> dict[str, Any]:
    """The report of a profile the node agent cannot serve on this node (its config was refused,
    its discovery or front-end failed): no devices, and `agentError` saying why, so the profile's
    status names the node while the node's other profiles keep serving (docs/agent.md); with
    node groups, which group's settings were refused or failed."""
    report = build_report(target, Snapshot(0), {}, node_uid, node_group=node_group, revision=revision)
    report["agentError"] = {
        "reason": cap(reason, MAX_REASON_LENGTH),
        "message": cap(message, MAX_MESSAGE_LENGTH),
        "since": rfc3339(since),
    }
    return report
