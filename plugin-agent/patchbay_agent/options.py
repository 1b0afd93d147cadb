"""Where an agent runs (its flags), as opposed to what it serves (its config): the options of one
resource's `resourceagent.ResourceAgent`. A leaf module that imports nothing heavy, so the node agent and the
command line can build options without loading gRPC until a profile actually starts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from patchbay_agent.constants import (
    DEFAULT_CDI_SPEC_DIR,
    DEFAULT_HTTP_MAX_CONNECTIONS,
    DEFAULT_KUBELET_ROOT_DIR,
    DEFAULT_POD_RESOURCES_SOCKET,
    NODE_AGENT_PLUGINS_DIR,
)


@dataclass(frozen=True)
class ReportOptions:
    """Where and how the agent publishes its DeviceReport (the `--profile` flags)."""

    profile: str
    namespace: str
    #: the agent's pod (the report's `agent` field); None when unknown
    pod_name: str | None = None
    pod_resources_socket: Path = Path(DEFAULT_POD_RESOURCES_SOCKET)
    pod_resources_period: float = 10.0
    #: None: the in-cluster service account
    kubeconfig: Path | None = None


def node_agent_plugins_dir(kubelet_root_dir: Path) -> Path:
    """`<kubelet root>/plugins/patchbay_node-agent`: the shared node agent's one directory under
    the kubelet's plugins directory, the only part of it its pod mounts, in which it keeps a
    directory per DRA driver it serves (`dra.plugin.service_dir`). Its pod template depends on no
    profile (the node agent is reconfigured live), so the operator mounts this whole directory
    (the same rule: `render.node_agent_plugins_dir`, kept equal by
    tests/unit/operator/test_operator_dra.py) instead of each driver's own `plugins/<driver>`; the
    kubelet does not care where the DRA socket is (it dials the endpoint GetInfo names:
    docs/facts.md#dra-endpoint-path)."""
    return kubelet_root_dir / "plugins" / NODE_AGENT_PLUGINS_DIR


@dataclass(frozen=True)
class DraOptions:
    """DRA mode (the `--dra-driver` flags): be a DRA kubelet plugin for `driver`."""

    driver: str
    kubelet_root_dir: Path = Path(DEFAULT_KUBELET_ROOT_DIR)
    #: None: the in-cluster service account
    kubeconfig: Path | None = None
    #: Where the driver's directory (its service sockets, lock file and claim records) goes: None
    #: for an agent of its own, `<kubelet root>/plugins/<driver>` itself (its pod mounts exactly
    #: that); the shared node agent's units get `node_agent_plugins_dir`, and their directory
    #: is inside it (`dra.plugin.service_dir`).
    plugins_dir: Path | None = None


@dataclass
class AgentOptions:
    """Where the agent runs (flags), as opposed to what it serves (the config)."""

    node_name: str
    plugin_dir: Path
    host_root: Path
    #: (host, port) for /metrics /healthz /readyz; None disables the endpoint.
    http_address: tuple[str, int] | None = ("127.0.0.1", 9464)
    #: Open connections to that endpoint at most (``--http-max-connections``).
    http_max_connections: int = DEFAULT_HTTP_MAX_CONNECTIONS
    #: Name each holding container on /metrics (``--metrics-holder-labels``); off: the total only.
    metrics_holder_labels: bool = False
    poll_interval: float = 10.0
    shutdown_grace: float = 5.0
    backoff_initial: float = 0.1
    backoff_max: float = 10.0
    #: Prefix for device paths in Allocate's DeviceSpecs (see ``--host-path-prefix``).
    host_path_prefix: str = ""
    #: The socket name's instance part (``--instance``); None draws a fresh one per process.
    instance: str | None = None
    #: The DeviceReport (``--profile``); None writes no report and reads no PodResources.
    report: ReportOptions | None = None
    #: Where the runtime reads CDI specs (``--cdi-spec-dir``); used when the config has a CDI kind.
    cdi_spec_dir: Path = Path(DEFAULT_CDI_SPEC_DIR)
    #: DRA mode (``--dra-driver``); None: a device plugin.
    dra: DraOptions | None = None
