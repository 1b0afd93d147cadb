"""The agents' DeviceReports as the operator keeps them (pure).

Each agent writes one ``DeviceReport`` per profile and node (crds/patchbay.dev_devicereports.yaml):
every device's health, why, since when and which pods hold it; in DRA mode also whether the API
server keeps ResourceSlice device taints and which devices the agent left out of its slices
because it drops them. The operator keeps a small ``Report`` per object and sums them into the
profile's status.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Device:
    id: str
    healthy: bool
    reason: str = ""
    message: str = ""
    since: str = ""
    holders: tuple[str, ...] = ()  # "namespace/pod/container"
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
class Report:
    name: str
    profile: str
    node: str
    devices: tuple[Device, ...] = ()
    #: the agent pod that wrote it (the admission policy binds it to the writer's token)
    agent: str = ""
    #: DRA: Kept, Dropped or Unknown; "" when the report does not say (DevicePlugin mode)
    device_taints: str = ""
    error: AgentError | None = None

    @property
    def healthy(self) -> int:
        return sum(d.healthy for d in self.devices)

    @property
    def unhealthy(self) -> int:
        return len(self.devices) - self.healthy

    @property
    def allocated(self) -> int:
        return sum(bool(d.holders) for d in self.devices)

    @property
    def withheld(self) -> int:
        return sum(d.withheld for d in self.devices)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Report:
        devices = []
        for d in obj.get("devices") or []:
            holders = tuple(
                f"{p.get('namespace')}/{p.get('name')}/{p.get('container')}" for p in d.get("pods") or []
            )
            devices.append(
                Device(
                    id=str(d.get("id", "")),
                    healthy=d.get("health") == "Healthy",
                    reason=str(d.get("reason") or ""),
                    message=str(d.get("message") or ""),
                    since=str(d.get("since") or ""),
                    holders=holders,
                    withheld=d.get("withheld") is True,
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
        return cls(
            name=str((obj.get("metadata") or {}).get("name", "")),
            profile=str(obj.get("profile") or ""),
            node=str(obj.get("nodeName") or ""),
            devices=tuple(devices),
            agent=str(obj.get("agent") or ""),
            device_taints=str(obj.get("deviceTaints") or ""),
            error=error,
        )
