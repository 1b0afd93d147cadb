"""Names the operator shares with the API, the agent and the tests: one place, no magic strings.

API group and version, the kopf storage keys, label and annotation keys, condition types and
reasons (CamelCase string enums), and the limits that keep status bounded.
"""

from __future__ import annotations

from enum import StrEnum

API_GROUP = "patchbay.dev"
API_VERSION = "v1beta1"
PLURAL = "devicepluginprofiles"
KIND = "DevicePluginProfile"

FIELD_MANAGER = "patchbay-operator"
"""The one server-side-apply field manager for everything the operator owns."""

FINALIZER = "patchbay.dev/cleanup"
"""kopf's finalizer on profiles: the resource is removed from nodes before the profile goes."""

KOPF_STORAGE_PREFIX = "kopf.patchbay.dev"
"""kopf keeps its handler progress and diff base in annotations on profiles under this prefix."""

OWNER_ANNOTATION_PREFIX = "static.patchbay.dev/"
"""Node annotations recording which static resource the operator set, and for which profile.

One annotation per resource, written in the same JSON patch as the capacity, so ownership
survives an operator restart and costs no extra write.
"""

LABEL_PROFILE = "patchbay.dev/profile"
#: The shared node agent's objects carry this label (value SHARED_AGENT_VALUE) instead of a profile.
LABEL_SHARED_AGENT = "patchbay.dev/agent"
SHARED_AGENT_VALUE = "shared"
#: How the operator's stores key the shared node agent's DaemonSet and pods: no profile is named so.
SHARED_KEY = "*shared*"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_INSTANCE = "app.kubernetes.io/instance"
CONFIG_HASH_ANNOTATION = "patchbay.dev/config-hash"
AGENT_CONFIG_KEY = "config.yaml"
AGENT_CONFIG_DIR = "/etc/patchbay"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
HOST_ROOT = "/host"
#: The shared node agent's one directory under the kubelet's plugins directory, the only part of
#: it its pod mounts; the agent keeps a directory per DRA driver inside it (the agent's
#: `constants.NODE_AGENT_PLUGINS_DIR`, the same name). Not a valid DNS subdomain (the underscore),
#: so never a DRA driver's own `plugins/<driver>` directory.
NODE_AGENT_PLUGINS_DIR = "patchbay_node-agent"

DRA_DRIVER_SUFFIX = ".patchbay.dev"
"""A DRA profile's driver (and DeviceClass) is ``<profile name>.patchbay.dev``; the CRD caps DRA
profile names at 50 characters so the driver name stays within 63. The chart's admission
policy lets an agent write only ResourceSlices of drivers with this suffix."""

DEVICE_CLASS_API_VERSION = "resource.k8s.io/v1"
"""The DeviceClass the operator applies per DRA profile (Kubernetes 1.34+). Its
``spec.extendedResourceName`` needs DRAExtendedResource (on from 1.36); an API server without it
drops the field, which the operator reads back (docs/facts.md#dra-dropped-fields)."""

DEVICE_CLASS_RECHECK_SECONDS = 600.0
"""Where the API server dropped a DeviceClass's extendedResourceName, how often the operator applies
it again (a control plane upgraded since then keeps it)."""

ORPHAN_GRACE_SECONDS = 5.0
"""How long a DeviceReport of an unknown profile may stay before the operator deletes it."""

RETRY_CREATE_ANNOTATION = "patchbay.dev/retry-create"
"""Set (to the time) on an agent DaemonSet whose pods the API server refuses: any change to the
DaemonSet makes its controller sync it at once, instead of after its own backoff for failed
creates, which grows to minutes (docs/security.md#pod-security)."""

RETRY_CREATE_SECONDS = 5.0
"""How often the operator nudges a refused DaemonSet (RETRY_CREATE_ANNOTATION): the operator
cannot watch what lifts a refusal (namespace labels, quotas, ServiceAccounts, admission
policies: other RBAC than it has), so it asks the controller to try again. One PATCH and one
refused create per period per refused DaemonSet; recovery follows within this period."""

KUBELET_BEHIND_GRACE = 30.0
"""DevicePlugin: how long a node's allocatable may count fewer devices than its agent reports
healthy before that is a problem (Degraded, DevicesNotAllocatable). The kubelet publishes a
changed count on its node status sync (about every 10 s) and the agent's report follows its own
changes within a second: a longer gap is a kubelet that lost the agent's devices."""

MAX_PROBLEMS = 10
"""Status lists at most this many problem nodes; `problemCount` has the full count."""

DEFAULT_NODE_GROUP = "default"
"""The node group of a node that no ``spec.nodeGroups`` entry matches (it uses ``spec.plugin``
alone): what ``status.nodeGroups`` and the agents' DeviceReports (``nodeGroup``) call it. The CRD
reserves the name. The agent's constant of the same name must stay equal (a unit test checks)."""


class Mode(StrEnum):
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
    """Condition and problem reasons (CamelCase, as the API conventions ask)."""

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
    #: longer than KUBELET_BEHIND_GRACE (the kubelet dropped the agent: docs/operations.md#not-allocatable)
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
    #: is being recreated (repairs.py, docs/operations.md#what-patchbay-repairs)
    OWNED_OBJECT_MISSING = "OwnedObjectMissing"
    #: another field manager took fields of such an object by server-side apply: left to it
    FIELDS_TAKEN_OVER = "FieldsTakenOver"
    #: Events of a repair (Normal): an owned object recreated, or an edit of it undone
    RECREATED = "Recreated"
    RESTORED = "Restored"
