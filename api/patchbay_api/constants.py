"""The names Patchbay's programs share with its API and with each other, in one place.

The API group and versions, the kinds, the label and annotation keys on the objects the operator
creates and the agents and the kubectl plugin read, the condition types and reasons of a
profile's status (CamelCase string enums, as the API conventions ask) and the reasons a
DeviceReport gives for an unhealthy device. The CRDs in ``crds/`` are the API's truth; a unit test
holds the enums here to their schemas where a schema lists them.
"""

from __future__ import annotations

from enum import StrEnum

API_GROUP = "patchbay.dev"
API_VERSION = "v1beta1"
PROFILE_KIND = "DevicePluginProfile"
PROFILE_PLURAL = "devicepluginprofiles"
REPORT_KIND = "DeviceReport"
REPORT_PLURAL = "devicereports"
INVENTORY_KIND = "NodeInventory"
INVENTORY_PLURAL = "nodeinventories"
"""What hardware one node has (cluster-scoped, named after the node), kept by the shared node agent."""
INVENTORY_LABEL_PREFIX = "inventory.patchbay.dev/"
"""Opt-in node labels saying a kind of device is present: ``inventory.patchbay.dev/usb-0403-6001``,
``inventory.patchbay.dev/pci-10de-2330`` (value ``present``)."""

LABEL_PROFILE = "patchbay.dev/profile"
"""On every object made for one profile (its agent's ConfigMap, DaemonSet and pods, its reports)."""
LABEL_SHARED_AGENT = "patchbay.dev/agent"
"""On the shared node agent's objects, with the value ``SHARED_AGENT_VALUE``, instead of a profile."""
SHARED_AGENT_VALUE = "shared"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_INSTANCE = "app.kubernetes.io/instance"
AGENT_NAME = "patchbay-agent"
"""``LABEL_NAME`` of every agent pod (each profile's own and the shared node agent's)."""
NO_NODE_LABEL = "patchbay.dev/no-node"
"""A node label Patchbay never sets: a node selector requirement that it ``Exists`` selects no node."""

DRA_DRIVER_SUFFIX = ".patchbay.dev"
"""A DRA profile's driver (and DeviceClass) is ``<profile name>.patchbay.dev``; the CRD caps DRA
profile names at 50 characters so the driver name stays within 63. The chart's admission policy
lets an agent write only ResourceSlices of drivers with this suffix."""
TAINT_DOMAIN = "patchbay.dev/"
"""Device taints of unhealthy devices are ``patchbay.dev/<kind of fault>`` (value: the reason)."""
TAINT_PLUGIN_HELD = "patchbay.dev/held-by-device-plugin"
"""The taint of a device a pod still holds through the device plugin (a hand-over, not a fault)."""
ATTR_ID = "patchbay.dev/id"
"""The ResourceSlice device attribute holding the agent's device ID."""
NODE_AGENT_PLUGINS_DIR = "patchbay_node-agent"
"""The shared node agent's one directory under the kubelet's ``plugins/`` directory: each DRA
driver it serves gets a directory inside it (service sockets, ``calls.lock``, ``claim-<uid>.json``),
so its pod mounts this directory alone, never the other CSI and DRA drivers' sockets beside it
(docs/security.md#host-access). The underscore makes it an invalid DNS subdomain, so it is never
a DRA driver's own ``plugins/<driver>`` directory."""
DEFAULT_NODE_GROUP = "default"
"""The node group of a node no ``spec.nodeGroups`` entry matches (``spec.plugin`` alone): what
``status.nodeGroups`` and the agents' DeviceReports (``nodeGroup``) call it; the CRD reserves it."""


class Mode(StrEnum):
    """``spec.mode`` of a profile."""

    STATIC = "Static"
    DEVICE_PLUGIN = "DevicePlugin"
    DRA = "DRA"

    @property
    def runs_agents(self) -> bool:
        """DevicePlugin and DRA profiles run an agent DaemonSet; Static ones do not."""
        return self is not Mode.STATIC


class ConditionType(StrEnum):
    """The profile's conditions, in kstatus's abnormal-true shape (docs/facts.md#kstatus)."""

    READY = "Ready"
    RECONCILING = "Reconciling"
    STALLED = "Stalled"
    DEGRADED = "Degraded"


class Reason(StrEnum):
    """A profile's condition and problem reasons (CamelCase, as the API conventions ask)."""

    ALL_NODES_READY = "AllNodesReady"
    NO_MATCHING_NODES = "NoMatchingNodes"
    NODES_NOT_READY = "NodesNotReady"
    APPLYING = "Applying"
    ROLLING_OUT = "RollingOut"
    UP_TO_DATE = "UpToDate"
    AS_EXPECTED = "AsExpected"
    RESOURCE_NAME_CONFLICT = "ResourceNameConflict"
    CDI_KIND_CONFLICT = "CDIKindConflict"
    NOT_ADVERTISED = "NotAdvertised"
    VALUE_MISMATCH = "ValueMismatch"
    INVALID_CAPACITY_LABEL = "InvalidCapacityLabel"
    OWNED_BY_OTHER = "ResourceSetByOther"
    DEVICES_UNHEALTHY = "DevicesUnhealthy"
    AGENTS_UNAVAILABLE = "AgentsUnavailable"
    #: DevicePlugin: the node's allocatable counts fewer devices than its agent serves healthy, for
    #: longer than the operator's grace (the kubelet dropped the agent: docs/operations.md#not-allocatable)
    DEVICES_NOT_ALLOCATABLE = "DevicesNotAllocatable"
    NO_DEVICES = "NoDevices"
    PUBLISHING = "WaitingForKubelet"
    PATCH_FAILED = "PatchFailed"
    RESOURCE_SERVED_TWICE = "ResourceServedTwice"
    #: DRA: the API server stored the DeviceClass without extendedResourceName (docs/dra.md#releases)
    EXTENDED_RESOURCE_NOT_SERVED = "ExtendedResourceNotServed"
    #: DRA: the API server drops a shared device's consumable capacity (docs/dra.md#sharing)
    SHARING_NOT_SERVED = "SharingNotServed"
    #: DRA: the API server drops a partitioned device's counters (docs/dra.md#partitions)
    PARTITIONS_NOT_SERVED = "PartitionsNotServed"
    STALLED = "WaitingForChange"
    #: a node the profile selects where the shared node agent does not run (its node selector)
    NODE_AGENT_EXCLUDED = "NodeAgentExcluded"
    #: a node that more than one of spec.nodeGroups matches (it uses the first: docs/api.md#node-groups)
    NODE_GROUPS_OVERLAP = "NodeGroupsOverlap"
    #: an object the operator renders (agent ConfigMap or DaemonSet, DeviceClass) is missing: it
    #: is being recreated (the operator's repairs.py, docs/operations.md#what-patchbay-repairs)
    OWNED_OBJECT_MISSING = "OwnedObjectMissing"
    #: another field manager took fields of such an object by server-side apply: left to it
    FIELDS_TAKEN_OVER = "FieldsTakenOver"
    #: a shared profile whose settings would take the node agent's ConfigMap past 1 MiB: refused
    #: (the ConfigMap is not written: docs/design/staged-rollouts.md)
    CONFIG_TOO_LARGE = "AgentConfigTooLarge"
    #: a staged rollout halted: a wave failed its health gate or its deadline (Stalled; the
    #: failed nodes put back: docs/operations.md#staged-rollouts)
    ROLLOUT_HALTED = "RolloutHalted"
    #: Events of a repair (Normal): an owned object recreated, or an edit of it undone
    RECREATED = "Recreated"
    RESTORED = "Restored"


class AgentPodReason(StrEnum):
    """Why an agent pod does not work, beyond the kubelet's own waiting reasons and the Warning
    events' reasons, which are passed on as they are (``agentpods.explain``)."""

    UNSCHEDULABLE = "Unschedulable"
    AGENT_NOT_READY = "AgentNotReady"
    AGENT_STARTING = "AgentStarting"
    #: the DaemonSet controller's Warning when the API server refuses one of its pods
    FAILED_CREATE = "FailedCreate"


class HealthReason(StrEnum):
    """Why a device is Unhealthy (a DeviceReport's ``devices[].reason``, a device taint's value)."""

    #: a check path is missing, or discovery no longer finds the device
    VANISHED = "Vanished"
    #: a check path exists but stat() failed otherwise (EACCES on a parent, ELOOP, ...)
    STAT_FAILED = "StatFailed"
    #: open() of a device node failed (ENXIO/ENODEV/EIO: no hardware behind it)
    OPEN_FAILED = "OpenFailed"
    #: the exec probe exited non-zero (or was killed by a signal)
    PROBE_FAILED = "ProbeFailed"
    PROBE_TIMED_OUT = "ProbeTimedOut"
    #: the exec probe could not be started (missing binary, not executable)
    PROBE_NOT_RUN = "ProbeNotRun"
    #: a failed check that named no reason
    CHECK_FAILED = "CheckFailed"
    #: its health changed too often within a short window: held Unhealthy until it is quiet
    FLAPPING = "Flapping"


class DeviceHealth(StrEnum):
    """A DeviceReport's ``devices[].health`` (the two strings the kubelet understands too)."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


class Served(StrEnum):
    """Whether the API server keeps a DRA field (a DeviceReport's ``deviceTaints``,
    ``consumableCapacity``, ``partitionableDevices``), read back from what it stores."""

    KEPT = "Kept"
    #: dropped on write (the feature gate is off)
    DROPPED = "Dropped"
    #: not found out yet (or the check failed): treated as Dropped, which is safe everywhere
    UNKNOWN = "Unknown"
