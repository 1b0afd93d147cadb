"""The operator's names and limits: one place, no magic strings.

What it shares with the agent and the kubectl plugin (API group and version, label keys,
condition types and reasons) comes from the API package (``patchbay_api.constants``) and is
named here too; the operator's own are here alone: the kopf storage keys, its annotations, the
agent's mounts, and the limits that keep status bounded.
"""

from __future__ import annotations

# The names the operator shares with the agent and the kubectl plugin are the API package's.
from patchbay_api import agentpods
from patchbay_api import constants as api

API_GROUP = api.API_GROUP
API_VERSION = api.API_VERSION
DEFAULT_NODE_GROUP = api.DEFAULT_NODE_GROUP
DRA_DRIVER_SUFFIX = api.DRA_DRIVER_SUFFIX
LABEL_COMPONENT = api.LABEL_COMPONENT
LABEL_INSTANCE = api.LABEL_INSTANCE
LABEL_MANAGED_BY = api.LABEL_MANAGED_BY
LABEL_NAME = api.LABEL_NAME
LABEL_PROFILE = api.LABEL_PROFILE
LABEL_SHARED_AGENT = api.LABEL_SHARED_AGENT
NODE_AGENT_PLUGINS_DIR = api.NODE_AGENT_PLUGINS_DIR
SHARED_AGENT_VALUE = api.SHARED_AGENT_VALUE
ConditionType = api.ConditionType
Mode = api.Mode
Reason = api.Reason
SHARED_KEY = agentpods.SHARED_KEY
KIND = api.PROFILE_KIND
PLURAL = api.PROFILE_PLURAL

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

CONFIG_HASH_ANNOTATION = "patchbay.dev/config-hash"
AGENT_CONFIG_DIR = "/etc/patchbay"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
HOST_ROOT = "/host"
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

STALL_AFTER_SECONDS = 60.0
"""How long an agent pod may be in trouble that can fix itself (an image pull backing off, a
sandbox retry, unschedulable, never Ready), or a DaemonSet's pods refused at creation, before the
profile counts as Stalled: long enough for a first image pull or a sandbox retry, short enough
that a broken rollout turns kstatus Failed within two minutes (``--stall-after``)."""

KUBELET_BEHIND_GRACE = 30.0
"""DevicePlugin: how long a node's allocatable may count fewer devices than its agent reports
healthy before that is a problem (Degraded, DevicesNotAllocatable). The kubelet publishes a
changed count on its node status sync (about every 10 s) and the agent's report follows its own
changes within a second: a longer gap is a kubelet that lost the agent's devices."""

MAX_PROBLEMS = 10
"""Status lists at most this many problem nodes; `problemCount` has the full count."""
