"""The operator's settings: one typed object, from command-line flags with environment fallbacks.

Every setting is declared once, as the agent's options are: its type, default and meaning in
``Settings``, and its flag, environment variable, parser and help in one row of ``FLAGS``, from
which the parser, docs/operator.md and ``load`` all come. Every flag has an environment variable
(``PATCHBAY_<NAME>``) so the Helm chart can set them either way; the variable is simply the flag's
argparse default, so both go through the same conversion and checks. A bad value raises
``ConfigError`` naming the flag, never a traceback from deep inside kopf.
"""

from __future__ import annotations

import argparse
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

from patchbay_operator.constants import KUBELET_BEHIND_GRACE, STALL_AFTER_SECONDS
from patchbay_operator.version import VERSION

DEFAULT_AGENT_IMAGE = f"ghcr.io/kube-patchbay/patchbay-agent:{VERSION}"
"""The agent image of this release (the chart sets ``--agent-image`` to its ``agent.image``)."""


class ConfigError(ValueError):
    """A setting is invalid; the message names it and says what is accepted."""


@dataclass(frozen=True)
class Settings:
    namespace: str = "patchbay-system"
    """Where agent ConfigMaps and DaemonSets live (the operator's own namespace)."""

    agent_image: str = DEFAULT_AGENT_IMAGE
    """Agent image for profiles that do not set spec.agent.image."""

    log_format: Literal["text", "json"] = "text"
    """text for people, json for log pipelines."""

    verbose: bool = False
    """Debug logging (kopf's and ours)."""

    kubeconfig: str | None = None
    """Kubeconfig file; absent: $KUBECONFIG, ~/.kube/config, then the pod's service account."""

    peering: str | None = None
    """kopf peering name; absent runs standalone. With several replicas give each a distinct
    --priority: kopf freezes every replica when priorities are equal."""

    priority: int = 0
    """This replica's kopf peering priority (the highest runs, the others wait); random when
    peering without an explicit one, so replicas of one Deployment never tie."""

    peering_lifetime: int = 10
    """Seconds a peered replica's keep-alive record lives (kopf's ``settings.peering.lifetime``,
    whose own default is 60). A standby takes over a leader killed without a clean exit once its
    record expires, so this bounds the failover; kopf renews it every 1-5 s at 10 (lifetime minus
    5-10 s, at least 1 s), so one slow keep-alive does not expire a live leader."""

    concurrency: int = 16
    """Node patches in flight at once (and the client's connection pool size)."""

    status_debounce: float = 1.0
    """Seconds to gather changes before writing a profile's status (bounds status writes)."""

    kubelet_behind_grace: float = KUBELET_BEHIND_GRACE
    """DevicePlugin: how long a node's allocatable may count fewer devices than its agent serves
    healthy before that is a problem (DevicesNotAllocatable); above the kubelet's node status
    sync period (10 s by default)."""

    stall_after: float = STALL_AFTER_SECONDS
    """How long an agent pod's trouble that may fix itself (an image pull backing off, a sandbox
    retry, unschedulable, never Ready), or a DaemonSet's pods refused at creation (Pod Security, a
    quota), may last before the profile is Stalled (kstatus Failed: it needs a change)."""

    liveness: str | None = None
    """kopf liveness endpoint, e.g. http://127.0.0.1:8080/healthz (absent: none)."""

    metrics_address: tuple[str, int] | None = None
    """Where to serve Prometheus /metrics (host, port); absent: not served."""

    agent_service_account: str = "patchbay-agent"
    """The agents' ServiceAccount in ``namespace``: its pod-bound token names the agent's node,
    which the chart's admission policy checks on every DeviceReport write."""
    agent_dra_service_account: str = "patchbay-agent-dra"
    """The ServiceAccount of DRA profiles' agents and of the shared node agent (it may serve DRA
    profiles): the only one bound to the DRA ClusterRole."""

    agent_api_server: tuple[str, int] | None = None
    """API server (host, port) the agents dial instead of the ``kubernetes`` Service (clusters
    without kube-proxy); absent: the Service, as the kubelet announces it."""

    kubelet_root_dir: str = "/var/lib/kubelet"
    """The kubelet's --root-dir on the nodes: the agents read its pod-resources socket."""

    node_agent_node_selector: tuple[tuple[str, str], ...] = ()
    """Labels a node must carry for the shared node agent to run there (empty: every node). On a
    big cluster where few nodes have devices this keeps the idle agent off the others; a profile
    that selects a node outside it is Stalled there with reason NodeAgentExcluded."""

    node_agent_always_on: bool = False
    """Keep the shared node agent running with no profile using it (the chart's
    ``inventory.alwaysOn``): it then serves nothing and only keeps each node's NodeInventory, so
    ``kubectl patchbay discover`` answers before the first profile. Off: it goes with the last
    profile (no agent pod on any node until someone asks for one)."""

    inventory_node_labels: bool = False
    """Keep the opt-in inventory labels on the nodes (the chart's ``inventory.nodeLabels``): each
    node carries ``inventory.patchbay.dev/<usb|pci>-<vendor>-<device>: present`` for every kind of
    device its NodeInventory lists, and nothing else under that prefix that Patchbay set. Off: no
    NodeInventory is read, and labels Patchbay set while it was on are removed."""

    agent_metrics_holder_labels: bool = False
    """Agents name each container holding a device on their /metrics (namespace, pod,
    container); off, they export the total only: the port is open to the pod network."""

    cdi_spec_dir: str = "/var/run/cdi"
    """Where the nodes' container runtime reads CDI specs: agents of profiles with
    ``allocation.cdi`` write their resource's spec there (docs/cdi.md)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad value raises ``ConfigError`` (naming the flag) instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
    if not 0 <= value <= 60:
        raise argparse.ArgumentTypeError(f"must be between 0 and 60 seconds, got {value}")
    return value


def _namespace(raw: str) -> str:
    if not raw.replace("-", "").isalnum() or raw != raw.lower() or len(raw) > 63:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a valid namespace name")
    return raw


def _log_format(raw: str) -> str:
    # Not ``choices=``: argparse checks choices on the command line only, not on defaults, and
    # the defaults here come from the environment.
    if raw not in ("text", "json"):
        raise argparse.ArgumentTypeError(f"must be text or json, got {raw!r}")
    return raw


def _address(raw: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (IPv6 in brackets); ``""`` or ``off``: none."""
    if raw in ("", "off"):
        return None
    host, sep, port = raw.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{raw!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def _absolute(raw: str) -> str:
    if not raw.startswith("/"):
        raise argparse.ArgumentTypeError(f"{raw!r} is not an absolute path")
    return raw.rstrip("/") or "/"


def _labels(raw: str) -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE[,KEY=VALUE...]`` (empty: none), sorted."""
    if not raw.strip():
        return ()
    out: dict[str, str] = {}
    for item in raw.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"{item.strip()!r} is not KEY=VALUE")
        out[key] = value
    return tuple(sorted(out.items()))


def _true(raw: str | None) -> bool:
    return raw is not None and raw.lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class Flag:
    """One setting's command line: the ``Settings`` attribute it fills (the flag is
    ``--<field with dashes>``, the environment variable ``PATCHBAY_<FIELD>``), its help (``{default}``
    stands for the ``Settings`` default), how its text is read and checked (``parse``), and, for a
    setting whose default is "none", the text that means it (parsed like a given value)."""

    field: str
    help: str
    parse: Callable[[str], Any] | None = None
    unset: str | None = None
    switch: bool = False  # a flag without a value (store_true); the variable says 1, true or yes
    metavar: str | None = None
    #: False: not given means "not given", which ``load`` decides on (``--priority``)
    defaulted: bool = True

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")

    @property
    def env(self) -> str:
        return "PATCHBAY_" + self.field.upper()


FLAGS: tuple[Flag, ...] = (
    Flag("namespace", "namespace of the agents' ConfigMaps and DaemonSets (default {default})", _namespace),
    Flag("agent_image", "agent image for profiles without spec.agent.image (default {default})"),
    Flag("log_format", "text (default) or json", _log_format, metavar="{text,json}"),
    Flag("verbose", "debug logging", switch=True),
    Flag("kubeconfig", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then in-cluster)"),
    Flag(
        "peering",
        "kopf peering name, for several replicas: the highest priority works, the others wait "
        "(needs crds/kopf.dev_clusterkopfpeerings.yaml; default: standalone)",
    ),
    Flag(
        "priority",
        "peering priority (default: random when peering, so replicas never tie)",
        _int_at_least(-(2**31)),
        defaulted=False,
    ),
    Flag(
        "peering_lifetime",
        "seconds a replica's peering record lives without a keep-alive: how soon a standby takes "
        "over a leader that died without a clean exit (default {default})",
        _int_at_least(5),
        metavar="SECONDS",
    ),
    Flag("concurrency", "node patches in flight at once (default {default})", _int_at_least(1)),
    Flag(
        "status_debounce",
        "seconds to gather changes before writing a profile's status (default {default})",
        _seconds,
    ),
    Flag(
        "kubelet_behind_grace",
        "seconds a node's allocatable may count fewer devices than its agent serves healthy before "
        "the profile says DevicesNotAllocatable (default {default})",
        _seconds,
    ),
    Flag(
        "stall_after",
        "seconds an agent pod's trouble that may fix itself, or its pods refused at creation, may "
        "last before the profile is Stalled (default {default})",
        _seconds,
    ),
    Flag("liveness", "liveness endpoint, e.g. http://127.0.0.1:8080/healthz (default: none)"),
    Flag(
        "metrics_address",
        "serve Prometheus /metrics on HOST:PORT, e.g. 0.0.0.0:8081 (default: off)",
        _address,
        unset="",
    ),
    Flag("agent_service_account", "the agents' ServiceAccount in --namespace (default {default})"),
    Flag(
        "agent_dra_service_account",
        "ServiceAccount in --namespace of DRA profiles' agents and of the shared node agent, the "
        "only one that may read claims and write ResourceSlices (default {default})",
    ),
    Flag(
        "agent_api_server",
        "HOST:PORT the agents dial instead of the kubernetes Service, for clusters without "
        "kube-proxy (default: the Service)",
        _address,
        unset="",
    ),
    Flag(
        "kubelet_root_dir",
        "the kubelet's --root-dir on the nodes, for pod-resources and, in DRA mode, "
        "plugins_registry and plugins (default {default})",
        _absolute,
    ),
    Flag(
        "node_agent_node_selector",
        "KEY=VALUE[,KEY=VALUE...]: the shared node agent runs only on nodes with these labels "
        "(default: every node)",
        _labels,
        unset="",
    ),
    Flag(
        "node_agent_always_on",
        "keep the shared node agent on its nodes with no profile, serving nothing but each "
        "node's NodeInventory, so `kubectl patchbay discover` answers before the first profile "
        "(default: it goes with the last profile)",
        switch=True,
    ),
    Flag(
        "inventory_node_labels",
        "keep a label inventory.patchbay.dev/<usb|pci>-<vendor>-<device>=present on every node for "
        "each kind of device its NodeInventory lists (default: off, and labels set while it was on "
        "are removed)",
        switch=True,
    ),
    Flag(
        "agent_metrics_holder_labels",
        "agents name every container holding a device on their /metrics (default: the "
        "total only, since the port is open to the pod network)",
        switch=True,
    ),
    Flag(
        "cdi_spec_dir",
        "a CDI spec directory of the nodes' container runtime, mounted for allocation.cdi "
        "and DRA profiles (default {default})",
        _absolute,
    ),
)
"""Every setting's flag, defined once: the parser, docs/operator.md (generated from it) and
``load`` come from this table, and ``Settings`` holds each one's type, default and meaning."""


def build_parser(env: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The flags; each one's default is its ``PATCHBAY_<NAME>`` environment variable, if set,
    else the ``Settings`` default. argparse converts and checks both the same way."""
    env = os.environ if env is None else env
    d = Settings()
    p = _Parser(
        prog="patchbay-operator",
        description=(
            "Patchbay operator: makes each DevicePluginProfile real.\n\n"
            "  Static        writes a fixed count into capacity and allocatable of every selected node\n"
            "                (one JSON patch per node, re-asserted on drift, removed with the profile)\n"
            "  DevicePlugin  runs a per-node agent DaemonSet with its ConfigMap (server-side applied)\n"
            "  DRA           the same agents as DRA kubelet plugins (driver <profile>.patchbay.dev),\n"
            "                plus a DeviceClass whose extendedResourceName is the resource name\n\n"
            "Every flag can also be set from the environment variable shown in brackets."
        ),
        epilog=(
            "examples:\n"
            "  patchbay-operator --kubeconfig ~/.kube/config --namespace patchbay-system\n"
            "  PATCHBAY_LOG_FORMAT=json PATCHBAY_PEERING=patchbay patchbay-operator   # in a pod, 2+ replicas"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for f in FLAGS:
        default = getattr(d, f.field)
        help_text = f"{f.help.format(default=default)} [{f.env}]"
        if f.switch:
            p.add_argument(f.flag, action="store_true", default=_true(env.get(f.env)), help=help_text)
            continue
        text = f.unset if default in (None, ()) or not f.defaulted else str(default)
        kw: dict[str, Any] = {"type": f.parse} if f.parse else {}
        if f.metavar:
            kw["metavar"] = f.metavar
        p.add_argument(f.flag, default=env.get(f.env, text), help=help_text, **kw)
    return p


def load(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Flags win over PATCHBAY_* environment variables, which win over the defaults.

    A peered replica without an explicit priority gets a random one: kopf freezes EVERY replica
    whose priority equals another live one's, so identical replicas must not share the default.
    """
    args = vars(build_parser(env).parse_args(argv))
    d = Settings()
    values = {f.field: args[f.field] for f in FLAGS}
    for f in FLAGS:
        if f.switch:
            values[f.field] = bool(args[f.field])
        elif getattr(d, f.field) is None and f.parse is None:
            values[f.field] = args[f.field] or None  # a text setting whose default is none: "" is none
    values["log_format"] = "json" if args["log_format"] == "json" else "text"
    if values["priority"] is None:
        values["priority"] = secrets.randbelow(2**31 - 1) + 1 if values["peering"] else 0
    return Settings(**values)
