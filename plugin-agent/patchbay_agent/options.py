"""Where an agent runs (its flags), as opposed to what it serves (its config): every option of
`patchbay-agent`, defined ONCE in `OPTIONS`, and the options objects filled from them.

Each `Option` names its flag, how its text is read (`parse`, which also checks it: a bad value
exits 2 naming the flag), its default written as it would be typed (parsed like a given value, so
a default can never be one the flag would refuse), its help, its group in `--help`, the
environment variable read when the flag is not given (`env`), which options it means nothing
without (`needs`) and which options field(s) it fills (`into`). From the table: the argparse
parser (`build_parser`; docs/agent.md is generated from it), the values as given, read from the
environment or defaulted (`Values`), and the defaults of `AgentOptions`, `ReportOptions` and
`DraOptions` (`DEFAULTS`), so a test or the node agent building options by hand gets what the
command line would.

A leaf module that imports nothing heavy, so the node agent and the command line can build
options without loading gRPC until a profile actually starts.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchbay_agent.constants import (
    DEFAULT_CDI_SPEC_DIR,
    DEFAULT_DEVICE_PLUGIN_DIR,
    DEFAULT_HTTP_MAX_CONNECTIONS,
    DEFAULT_KUBELET_ROOT_DIR,
    DEFAULT_POD_RESOURCES_SOCKET,
    INSTANCE_RE,
    MAX_INSTANCE_LENGTH,
    NODE_AGENT_PLUGINS_DIR,
)

#: After SIGTERM, how much longer than --shutdown-grace the process may take before it exits
#: without finishing its shutdown (a worker thread stuck in an API call would otherwise hold the
#: interpreter's exit, and every rollout and drain would wait for the kubelet's SIGKILL).
HARD_EXIT_MARGIN = 3.0
#: A DNS-1123 label: a namespace, and a profile name (also a label value, so at most 63).
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def address(value: str) -> tuple[str, int] | None:
    """HOST:PORT (IPv6 in brackets); '', '0' or 'off': none."""
    if value in ("", "0", "off"):
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise argparse.ArgumentTypeError(f"{value!r} must be HOST:PORT (or 'off')")
    return host.strip("[]"), int(port)


def at_least_two(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 2:
        raise argparse.ArgumentTypeError(f"{value!r} must be a whole number of at least 2")
    return n


def instance(value: str) -> str:
    """A socket name's instance part (`kubelet/sockets.py`)."""
    if not INSTANCE_RE.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"instance {value!r} must be 1-{MAX_INSTANCE_LENGTH} lowercase letters or digits"
        )
    return value


def dns_label(value: str) -> str:
    if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} must be 1-63 lowercase letters, digits or '-', starting and ending with a "
            "letter or digit"
        )
    return value


def driver_name(value: str) -> str:
    """A DRA driver name: a DNS subdomain of at most 63 characters (the API's rule)."""
    if len(value) > 63 or not _DNS_SUBDOMAIN.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} must be a DNS subdomain of at most 63 characters (lowercase letters, digits, "
            "'-' and '.'), e.g. gpu.example.com"
        )
    return value


def positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r} must be a positive number of seconds")
    return seconds


def seconds_or_zero(value: str) -> float:
    """A number of seconds, 0 included (0: not at all)."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds >= 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r} must be a number of seconds, 0 or more")
    return seconds


#: One `key=value` of an equality label selector: a label key (an optional DNS-subdomain prefix
#: and a name of at most 63) and a label value.
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_SELECTOR_TERM = re.compile(rf"(?:{_DNS_SUBDOMAIN.pattern}/)?{_LABEL_NAME}=(?:{_LABEL_NAME})?")


def label_selector(value: str) -> str:
    """An equality label selector, `key=value[,key=value...]` (how a DaemonSet's matchLabels read)."""
    terms = value.split(",")
    if not value or not all(_SELECTOR_TERM.fullmatch(t) for t in terms):
        raise argparse.ArgumentTypeError(
            f"{value!r} must be key=value[,key=value...] with label keys and values, "
            "e.g. app.kubernetes.io/name=patchbay-agent,patchbay.dev/profile=serial"
        )
    return value


@dataclass(frozen=True)
class Option:
    """One option of the agent (see the module doc)."""

    flag: str
    help: str | None
    #: reads (and checks) the text; None: the text itself
    parse: Callable[[str], Any] | None = None
    #: the default as typed on the command line (None: none); `%(default)s` in `help` shows it
    default: str | None = None
    metavar: str | None = None
    #: its heading in --help (`GROUPS`); None: the main options
    group: str | None = None
    #: read from this environment variable when the flag is not given
    env: str | None = None
    required: bool = False
    #: a flag without a value (True when given)
    switch: bool = False
    choices: tuple[str, ...] | None = None
    #: one of the required alternatives (`--config` or `--node-config`)
    alternative: bool = False
    #: the options it means something only with (one of them); given without, it is ignored
    #: with a warning, so its default is applied here rather than by argparse
    needs: tuple[str, ...] = ()
    #: the options fields it fills, as "<section>.<field>" (agent, report, dra, node)
    into: tuple[str, ...] = field(default=())

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    def value(self, text: str) -> Any:
        return self.parse(text) if self.parse is not None else text


#: --help's headings of the option groups, and what each says.
GROUPS = {
    "DRA mode": "with --dra-driver the agent is a Dynamic Resource Allocation (resource.k8s.io/v1) kubelet "
    "plugin instead of a device plugin: no device-plugin socket, no kubelet.sock registration. "
    "It serves DIR/plugins_registry/<driver>-<instance>.sock (plugin registration) and "
    "DIR/plugins/<driver>/dra-<instance>.sock (the DRA service; with --node-config every driver's "
    "directory is inside DIR/plugins/patchbay_node-agent/ instead), publishes this node's devices "
    "as ResourceSlices <node>-<driver> and prepares claims by writing one CDI spec per claim "
    "into --cdi-spec-dir. Needs API access (--kubeconfig or the in-cluster service account); "
    "see docs/dra.md",
    "DeviceReport": "all optional; without --profile the agent writes no report and reads no PodResources",
}

_REPORT = ("profile",)
OPTIONS: tuple[Option, ...] = (
    Option(
        "--config", "agent config, JSON or YAML (resourceName + plugin)", metavar="FILE", alternative=True
    ),
    Option(
        "--node-config",
        "the node agent's config: every profile sharing the default agent (profile, mode, "
        "resourceName, plugin, nodeSelectorTerms); serves, in one process, each profile whose terms "
        "select this node's labels (read from the API server), each with its own socket, registration "
        "and DeviceReport in --report-namespace; a profile that fails is reported and restarted alone",
        metavar="FILE",
        alternative=True,
    ),
    Option(
        "--watch-config",
        "with --node-config: follow this ConfigMap (in --report-namespace, key node.yaml) and this "
        "node's labels through the API server, and reconfigure live: a changed profile is applied "
        "in place (its registration kept) or, when the kubelet must hear of it, restarts alone; the "
        "others are untouched",
        metavar="CONFIGMAP",
    ),
    Option(
        "--inventory-rescan",
        "with --node-config: keep this node's NodeInventory (what hardware it has, written only "
        "when it changes: a device file coming or going under /dev, at once; anything else, "
        "found by a rescan of /sys this often); 0 keeps none (default: %(default)s)",
        seconds_or_zero,
        "60",
        "SECONDS",
        into=("node.inventory_rescan",),
    ),
    Option(
        "--node-plugins-dir",
        "with --node-config: the directory DRA profiles' driver directories go in (default: "
        "<kubelet-root-dir>/plugins/patchbay_node-agent, the shared node agent's own); the "
        "kubelet's plugins directory itself gives each driver its own directory there, as "
        "--dra-driver does (an agent of its own, whose pod mounts only its driver's)",
        Path,
        metavar="DIR",
        into=("node.plugins_dir",),
    ),
    Option(
        "--node-name", "this node's name (labels metrics and logs)", required=True, into=("agent.node_name",)
    ),
    Option(
        "--device-plugin-dir",
        "directory holding kubelet.sock and plugin sockets (default: %(default)s)",
        Path,
        DEFAULT_DEVICE_PLUGIN_DIR,
        "DIR",
        into=("agent.plugin_dir",),
    ),
    Option(
        "--host-root",
        "where the host's / is mounted; discovery reads DIR/dev and DIR/sys (default: /)",
        Path,
        "/",
        "DIR",
        into=("agent.host_root",),
    ),
    Option(
        "--host-path-prefix",
        "prefix the container runtime needs before device paths (default: none, right when "
        "--host-root is the node's / mounted into the agent's pod); set it to --host-root when "
        "that is a directory ON the node, e.g. a fake device tree",
        default="",
        metavar="DIR",
        into=("agent.host_path_prefix",),
    ),
    Option(
        "--cdi-spec-dir",
        "where the container runtime reads CDI specs; with allocation.cdi.kind the agent "
        "writes its resource's spec here (default: %(default)s)",
        Path,
        DEFAULT_CDI_SPEC_DIR,
        "DIR",
        into=("agent.cdi_spec_dir",),
    ),
    Option(
        "--http-address",
        "serve /metrics, /healthz, /readyz here; port 0 picks one, 'off' disables (default: %(default)s)",
        address,
        "127.0.0.1:9464",
        "HOST:PORT",
        into=("agent.http_address",),
    ),
    Option(
        "--http-max-connections",
        "open connections to the HTTP endpoint at most; one peer address may hold half of "
        "them, so a flood from one pod leaves room for probes and scrapes (default: %(default)s)",
        at_least_two,
        str(DEFAULT_HTTP_MAX_CONNECTIONS),
        "N",
        into=("agent.http_max_connections",),
    ),
    Option(
        "--metrics-holder-labels",
        "on /metrics, one patchbay_agent_allocated_devices series per holding container "
        "(labels holder_namespace, holder_pod, holder_container) instead of the total; off by "
        "default because the port is open to the pod network",
        switch=True,
        into=("agent.metrics_holder_labels",),
    ),
    Option(
        "--shutdown-grace",
        "on SIGTERM, how long in-flight calls may finish; the process exits at the latest "
        f"{HARD_EXIT_MARGIN:g} s after that, whatever is left (default: %(default)s)",
        float,
        "5.0",
        "SECONDS",
        into=("agent.shutdown_grace",),
    ),
    Option(
        "--daemonset-selector",
        "the label selector of this agent's DaemonSet's pods (key=value,...); on SIGTERM another pod "
        "of it on this node, not being deleted, is the agent's successor (a rollout's new agent), "
        "and the agent serves on until that pod is Ready, at most --successor-wait, so the kubelet "
        "never lacks an endpoint of the resource. Needs API access and $POD_NAME; without it the "
        "agent stops at once (default: $PATCHBAY_DAEMONSET_SELECTOR, which the operator sets; none if unset)",
        label_selector,
        metavar="SELECTOR",
        env="PATCHBAY_DAEMONSET_SELECTOR",
    ),
    Option(
        "--successor-wait",
        "with --daemonset-selector: how long, at most, to serve on after SIGTERM until the "
        "successor is Ready; 0: never wait (default: %(default)s)",
        seconds_or_zero,
        "10",
        "SECONDS",
    ),
    Option(
        "--poll-interval",
        "backstop poll of the socket inodes; inotify does the real work (default: %(default)s)",
        float,
        "10.0",
        "SECONDS",
        into=("agent.poll_interval",),
    ),
    Option(
        "--instance",
        "the instance part of the socket name, 1-16 lowercase letters or digits (default: a "
        "fresh random one per process; a name another process serves is refused)",
        instance,
        metavar="ID",
        into=("agent.instance",),
    ),
    Option(
        "--dra-driver",
        "the DRA driver name (a DNS subdomain, at most 63 characters)",
        driver_name,
        metavar="NAME",
        group="DRA mode",
        into=("dra.driver",),
    ),
    Option(
        "--kubelet-root-dir",
        "the kubelet's root directory, which holds plugins_registry/ and plugins/ (default: %(default)s)",
        Path,
        DEFAULT_KUBELET_ROOT_DIR,
        "DIR",
        group="DRA mode",
        into=("dra.kubelet_root_dir", "node.kubelet_root_dir"),
    ),
    Option(
        "--profile",
        "the DevicePluginProfile this agent serves: publish the DeviceReport <NAME>.<node-name>",
        dns_label,
        metavar="NAME",
        group="DeviceReport",
        into=("report.profile",),
    ),
    Option(
        "--report-namespace",
        "namespace of the DeviceReport (default: $POD_NAMESPACE)",
        dns_label,
        metavar="NS",
        group="DeviceReport",
        env="POD_NAMESPACE",
        needs=_REPORT,
        into=("report.namespace",),
    ),
    Option(
        "--pod-name",
        "this agent's pod, the report's `agent` field (default: $POD_NAME; none if unset)",
        metavar="NAME",
        group="DeviceReport",
        env="POD_NAME",
        into=("report.pod_name",),
    ),
    Option(
        "--pod-resources-socket",
        "PodResources socket (default: %(default)s)",
        Path,
        DEFAULT_POD_RESOURCES_SOCKET,
        "PATH",
        group="DeviceReport",
        needs=_REPORT,
        into=("report.pod_resources_socket",),
    ),
    Option(
        "--pod-resources-period",
        "read PodResources this often, besides about 1 s after each Allocate (default: %(default)s)",
        positive_seconds,
        "10",
        "SECONDS",
        group="DeviceReport",
        needs=_REPORT,
        into=("report.pod_resources_period",),
    ),
    Option(
        "--kubeconfig",
        "kubeconfig for writing the report and, in DRA mode, for claims and slices "
        "(default: the in-cluster service account: $KUBERNETES_SERVICE_HOST/PORT "
        "and the token and ca.crt under "
        "/var/run/secrets/kubernetes.io/serviceaccount/; the token is re-read when it rotates)",
        Path,
        metavar="FILE",
        group="DeviceReport",
        needs=(*_REPORT, "dra_driver"),
        into=("report.kubeconfig", "dra.kubeconfig", "node.kubeconfig"),
    ),
    Option("--log-format", "default: %(default)s", default="text", choices=("text", "json")),
    Option("--log-level", None, default="info", choices=("debug", "info", "warning", "error")),
)
_BY_DEST = {o.dest: o for o in OPTIONS}


#: Every option's default value, parsed once from the table (None: it has none): also the
#: defaults of the options objects below.
DEFAULTS: Mapping[str, Any] = {o.dest: o.value(o.default) if o.default is not None else None for o in OPTIONS}


def build_parser() -> argparse.ArgumentParser:
    """`patchbay-agent`'s command line, from `OPTIONS`."""
    p = argparse.ArgumentParser(
        prog="patchbay-agent",
        description=(
            "Kubelet device plugin (Device Plugin API v1beta1) for one extended resource. It finds "
            "devices as the config says, serves them on its own Unix socket in the device-plugin "
            "directory (patchbay-<resource>-<instance>.sock, one per process, so the old and the "
            "new agent of a rollout overlap without sharing one), registers with the kubelet, "
            "re-registers when the kubelet restarts, and tracks device health. On start it removes "
            "sockets of its resource whose agents are gone (connection refused); on SIGTERM only "
            "its own."
        ),
        epilog=(
            "The config is the ConfigMap the Patchbay operator renders from a DevicePluginProfile "
            "(resourceName + plugin; see docs/design/profile-contract.md). By hand on a node: "
            "patchbay-agent --config dongle.yaml --node-name $(hostname). In a DaemonSet: "
            "--host-root /host with the host's /dev and /sys mounted read-only under it. "
            "With --profile, the agent also publishes a DeviceReport <profile>.<node> in "
            "--report-namespace (server-side apply, only when something changed): each device's "
            "health, why, since when, and which containers hold it (from the kubelet's PodResources "
            "API)."
        ),
    )
    alternatives = p.add_mutually_exclusive_group(required=True)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for o in OPTIONS:
        where: Any = p
        if o.alternative:
            where = alternatives
        elif o.group is not None:
            if o.group not in groups:
                groups[o.group] = p.add_argument_group(o.group, GROUPS[o.group])
            where = groups[o.group]
        kw: dict[str, Any] = {"help": o.help}
        if o.switch:
            kw["action"] = "store_true"
        else:
            kw |= {"metavar": o.metavar, "type": o.parse, "choices": o.choices}
            if o.default is not None and not o.needs:
                kw["default"] = o.default
            elif o.default is not None and o.help is not None:
                # Applied by `Values`, not argparse (None tells "not given"); shown all the same.
                kw["help"] = o.help.replace("%(default)s", o.default)
        if o.required:
            kw["required"] = True
        where.add_argument(o.flag, **{k: v for k, v in kw.items() if v is not None})
    return p


class Values:
    """The options as given on the command line, else read from their environment variable, else
    defaulted (`OPTIONS`)."""

    def __init__(self, args: argparse.Namespace, environ: Mapping[str, str]) -> None:
        self._args = args
        self._environ = environ

    def given(self, dest: str) -> bool:
        """Whether the flag was given (a switch: set), for an option argparse gives no default."""
        return getattr(self._args, dest) not in (None, False)

    def ignored(self) -> list[str]:
        """The flags given without any option they mean something with (`Option.needs`)."""
        return [
            o.flag
            for o in OPTIONS
            if o.needs and self.given(o.dest) and not any(self.given(n) for n in o.needs)
        ]

    def __getitem__(self, dest: str) -> Any:
        """The value: given, else from the environment (checked like a given one; ValueError
        naming the variable and the flag), else the default."""
        value = getattr(self._args, dest)
        option = _BY_DEST[dest]
        if not (option.needs or option.env) or value not in (None, ""):
            return value  # given, or argparse's default (an option with neither needs nor env)
        if option.env is not None and (text := self._environ.get(option.env, "")):
            try:
                return option.value(text)
            except argparse.ArgumentTypeError as e:
                raise ValueError(f"${option.env} (the default of {option.flag}): {e}") from None
        return DEFAULTS[dest]

    def section(self, name: str) -> dict[str, Any]:
        """The values that fill the options object `name` (agent, report, dra, node), by field."""
        return {
            target.split(".", 1)[1]: self[o.dest]
            for o in OPTIONS
            for target in o.into
            if target.split(".", 1)[0] == name
        }


@dataclass(frozen=True)
class ReportOptions:
    """Where and how the agent publishes its DeviceReport (the `--profile` flags)."""

    profile: str
    namespace: str
    #: the agent's pod (the report's `agent` field); None when unknown
    pod_name: str | None = None
    pod_resources_socket: Path = DEFAULTS["pod_resources_socket"]
    pod_resources_period: float = DEFAULTS["pod_resources_period"]
    #: None: the in-cluster service account
    kubeconfig: Path | None = None


def node_agent_plugins_dir(kubelet_root_dir: Path) -> Path:
    """`<kubelet root>/plugins/patchbay_node-agent`: the shared node agent's one directory under
    the kubelet's plugins directory, the only part of it its pod mounts, in which it keeps a
    directory per DRA driver it serves (`kubelet.draplugin.service_dir`). Its pod template depends on no
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
    kubelet_root_dir: Path = DEFAULTS["kubelet_root_dir"]
    #: None: the in-cluster service account
    kubeconfig: Path | None = None
    #: Where the driver's directory (its service sockets, lock file and claim records) goes: None
    #: for an agent of its own, `<kubelet root>/plugins/<driver>` itself (its pod mounts exactly
    #: that); the shared node agent's units get `node_agent_plugins_dir`, and their directory
    #: is inside it (`kubelet.draplugin.service_dir`).
    plugins_dir: Path | None = None


@dataclass
class AgentOptions:
    """Where the agent runs (flags), as opposed to what it serves (the config)."""

    node_name: str
    plugin_dir: Path
    host_root: Path
    #: (host, port) for /metrics /healthz /readyz; None disables the endpoint.
    http_address: tuple[str, int] | None = DEFAULTS["http_address"]
    #: Open connections to that endpoint at most (``--http-max-connections``).
    http_max_connections: int = DEFAULTS["http_max_connections"]
    #: Name each holding container on /metrics (``--metrics-holder-labels``); off: the total only.
    metrics_holder_labels: bool = False
    poll_interval: float = DEFAULTS["poll_interval"]
    shutdown_grace: float = DEFAULTS["shutdown_grace"]
    backoff_initial: float = 0.1
    backoff_max: float = 10.0
    #: Prefix for device paths in Allocate's DeviceSpecs (see ``--host-path-prefix``).
    host_path_prefix: str = DEFAULTS["host_path_prefix"]
    #: The socket name's instance part (``--instance``); None draws a fresh one per process.
    instance: str | None = None
    #: The DeviceReport (``--profile``); None writes no report and reads no PodResources.
    report: ReportOptions | None = None
    #: Where the runtime reads CDI specs (``--cdi-spec-dir``); used when the config has a CDI kind.
    cdi_spec_dir: Path = DEFAULTS["cdi_spec_dir"]
    #: DRA mode (``--dra-driver``); None: a device plugin.
    dra: DraOptions | None = None
