"""The agents' DeviceReports as the operator keeps them (pure).

Each agent writes one ``DeviceReport`` per profile and node (crds/patchbay.dev_devicereports.yaml):
every device's health, why, since when and which pods hold it; in DRA mode also whether the API
server keeps ResourceSlice device taints and which devices the agent left out of its slices
because it drops them. The operator keeps a small ``Report`` per object and sums them into the
profile's status.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_KEPT_DEVICES = 16
"""Unhealthy devices kept per report: the status lists 10 problems in all, and a node with more
sick devices than this gets one problem saying how many more (status/daemonset.py)."""


@dataclass(frozen=True)
class Device:
    id: str
    healthy: bool
    reason: str = ""
    message: str = ""
    since: str = ""
    holders: tuple[str, ...] = ()  # "namespace/pod/container" (not kept from reports: counted)
    #: DRA: left out of the node's ResourceSlices (the taint it needs would be dropped)
    withheld: bool = False


@dataclass(frozen=True)
class AgentError:
    """The node agent cannot serve the profile on the node (`agentError`): why, since when."""

    reason: str
    message: str
    since: str = ""

    @property
    def needs_change(self) -> bool:
        """A refused config does not go away by waiting (the profile must change)."""
        return self.reason == "ConfigInvalid"


@dataclass(frozen=True)
class Counts:
    """A report's device counts, over every device it lists (kept or not)."""

    total: int = 0
    healthy: int = 0
    allocated: int = 0
    withheld: int = 0
    withheld_healthy: int = 0

    def plus(self, healthy: bool, held: bool, withheld: bool) -> Counts:
        return Counts(
            self.total + 1,
            self.healthy + healthy,
            self.allocated + held,
            self.withheld + withheld,
            self.withheld_healthy + (withheld and healthy),
        )

    @classmethod
    def of(cls, devices: Iterable[Device]) -> Counts:
        c = cls()
        for d in devices:
            c = c.plus(d.healthy, bool(d.holders), d.withheld)
        return c


@dataclass(frozen=True)
class Report:
    """One report as the operator keeps it: counts over every device, and the unhealthy devices
    (the ones the status names), at most ``MAX_KEPT_DEVICES`` of them. A report may list 2,048
    devices with long messages (about 1 MiB decoded); kept whole, 5,000 such reports would hold
    gigabytes in the operator, kept like this 80 MiB (docs/benchmarks.md, "Operator memory at the
    report bounds"). ``devices`` are the kept ones; ``counts`` (counted from ``devices`` when not
    given) are every device's."""

    name: str
    profile: str
    node: str
    devices: tuple[Device, ...] = ()
    #: the agent pod that wrote it (the admission policy binds it to the writer's token)
    agent: str = ""
    #: DRA: Kept, Dropped or Unknown; "" when the report does not say (DevicePlugin mode)
    device_taints: str = ""
    error: AgentError | None = None
    counts: Counts | None = None
    #: DRA, shared devices: Kept, Dropped or Unknown (consumable capacity); "" when not said
    consumable_capacity: str = ""
    #: DRA, partitioned devices: Kept, Dropped or Unknown (counters); "" when not said
    partitionable_devices: str = ""
    #: the profile's node group the agent serves the node with; "" for a profile without groups
    #: (or an agent older than node groups)
    node_group: str = ""
    #: the hash of the profile's revision the agent serves; "" from an agent older than revisions
    revision: str = ""
    #: `allocationFailures`: the kubelet's calls the agent answered with an error since
    #: `failures_since` (its start; "" and 0 while none failed), the last one's message
    failures: int = 0
    failures_since: str = ""
    last_failure: str = ""

    @property
    def all(self) -> Counts:
        return self.counts if self.counts is not None else Counts.of(self.devices)

    @property
    def total(self) -> int:
        return self.all.total

    @property
    def healthy(self) -> int:
        return self.all.healthy

    @property
    def unhealthy(self) -> int:
        c = self.all
        return c.total - c.healthy

    @property
    def allocated(self) -> int:
        return self.all.allocated

    @property
    def withheld(self) -> int:
        return self.all.withheld

    @property
    def withheld_healthy(self) -> int:
        return self.all.withheld_healthy

    @property
    def unlisted_unhealthy(self) -> int:
        """Unhealthy devices the operator did not keep (past ``MAX_KEPT_DEVICES``)."""
        return self.unhealthy - sum(not d.healthy for d in self.devices)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Report:
        devices: list[Device] = []
        counts = Counts()
        for d in obj.get("devices") or []:
            healthy, withheld = d.get("health") == "Healthy", d.get("withheld") is True
            # Holders are counted, not kept: the status says how many devices are held, not by whom
            # (kubectl patchbay devices reads them from the report itself).
            counts = counts.plus(healthy, bool(d.get("pods")), withheld)
            if healthy or len(devices) >= MAX_KEPT_DEVICES:
                continue
            devices.append(
                Device(
                    id=str(d.get("id", "")),
                    healthy=False,
                    reason=str(d.get("reason") or ""),
                    message=str(d.get("message") or ""),
                    since=str(d.get("since") or ""),
                    withheld=withheld,
                )
            )
        raw_error = obj.get("agentError")
        error = None
        if isinstance(raw_error, Mapping):
            error = AgentError(
                str(raw_error.get("reason") or "AgentFailed"),
                str(raw_error.get("message") or ""),
                str(raw_error.get("since") or ""),
            )
        raw_failures = obj.get("allocationFailures")
        if not isinstance(raw_failures, Mapping):
            raw_failures = {}
        last = raw_failures.get("last")
        return cls(
            name=str((obj.get("metadata") or {}).get("name", "")),
            profile=str(obj.get("profile") or ""),
            node=str(obj.get("nodeName") or ""),
            devices=tuple(devices),
            counts=counts,
            agent=str(obj.get("agent") or ""),
            device_taints=str(obj.get("deviceTaints") or ""),
            error=error,
            consumable_capacity=str(obj.get("consumableCapacity") or ""),
            partitionable_devices=str(obj.get("partitionableDevices") or ""),
            node_group=str(obj.get("nodeGroup") or ""),
            revision=str(obj.get("revision") or ""),
            failures=int(raw_failures.get("count") or 0),
            failures_since=str(raw_failures.get("since") or ""),
            last_failure=str(last.get("message") or "") if isinstance(last, Mapping) else "",
        )
