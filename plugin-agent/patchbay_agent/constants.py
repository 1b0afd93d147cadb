"""Names shared across the agent: API strings, env var names, file names.

The kubelet's side of them: docs/facts.md#device-plugin-api.
"""

from __future__ import annotations

import re

# The names the agent shares with the operator and the kubectl plugin are the API package's.
from patchbay_api import constants as api

#: The device plugin API version sent in RegisterRequest (the only one the kubelet supports).
API_VERSION = "v1beta1"
#: The kubelet's registration socket, inside the device-plugin directory.
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
#: Where the kubelet serves the PodResources API (v1.PodResourcesLister).
#: Open connections to the agent's HTTP endpoint at most, by default (`--http-max-connections`).
DEFAULT_HTTP_MAX_CONNECTIONS = 128
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"

#: Env vars an exec health probe receives.
ENV_PROBE_DEVICE_ID = "PATCHBAY_DEVICE_ID"
ENV_PROBE_DEVICE_PATHS = "PATCHBAY_DEVICE_PATHS"
#: Env var the preStart command receives: the allocated device IDs, comma-separated.
ENV_PRESTART_DEVICE_IDS = "PATCHBAY_DEVICE_IDS"

#: A socket name's instance part (`--instance`, kubelet/sockets.py): lowercase letters and digits,
#: never "-".
INSTANCE_RE = re.compile(r"[a-z0-9]{1,16}")
MAX_INSTANCE_LENGTH = 16

#: Replica IDs are "<device id>::<n>" (profile contract, plugin.sharing).
REPLICA_SEPARATOR = "::"


#: The two health strings the kubelet understands in a Device message (a DeviceReport's too).
DeviceHealth = api.DeviceHealth


#: The DeviceReport API (crds/patchbay.dev_devicereports.yaml): one object per profile and node.
REPORT_GROUP = api.API_GROUP
REPORT_KIND = api.REPORT_KIND
REPORT_PLURAL = api.REPORT_PLURAL
REPORT_VERSION = api.API_VERSION
#: The NodeInventory API (crds/patchbay.dev_nodeinventories.yaml): one object per node.
INVENTORY_KIND = api.INVENTORY_KIND
INVENTORY_PLURAL = api.INVENTORY_PLURAL
#: The server-side apply field manager of the agent's writes, and its managed-by label value.
FIELD_MANAGER = "patchbay-agent"
LABEL_MANAGED_BY = api.LABEL_MANAGED_BY
LABEL_PROFILE = api.LABEL_PROFILE
#: Where a pod finds its service-account token, CA and namespace.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

#: DRA mode (docs/dra.md): the API of ResourceSlices and ResourceClaims, and the kubelet's side.
DRA_GROUP_VERSION = "resource.k8s.io/v1"
DEFAULT_KUBELET_ROOT_DIR = "/var/lib/kubelet"
NODE_AGENT_PLUGINS_DIR = api.NODE_AGENT_PLUGINS_DIR
#: The plugin type a DRA driver's GetInfo names, and the DRA services the agent serves, best first.
DRA_PLUGIN_TYPE = "DRAPlugin"
DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
#: The optional device health services (docs/dra.md#health-to-the-kubelet), newest first: listed in
#: GetInfo's supported_versions after the DRA services, served on the same socket. Kubelets 1.37 to
#: 1.39 pick v1 when listed; 1.34 to 1.36 dial v1alpha1 whatever is listed
#: (docs/facts.md#dra-health-v1alpha1).
DRA_HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


#: Whether the API server keeps ResourceSlice device taints (DRA mode; a DeviceReport's
#: `deviceTaints`): read back from what it stores, docs/facts.md#dra-dropped-fields. Unknown (not
#: found out yet, or the check failed) is treated as Dropped, which is safe everywhere.
DeviceTaints = api.Served


#: Where the container runtime reads CDI specs (containerd's and CRI-O's default).
DEFAULT_CDI_SPEC_DIR = "/var/run/cdi"
