"""`patchbay-agent`: the command line. Parses flags, loads the config, runs the agent until
SIGTERM/SIGINT, then shuts down gracefully (streams ended, socket removed).

Exit codes: 0 after a clean shutdown, 2 for a bad config or flags (the message names the field
or the flag), 3 when discovery cannot work on this node or the device list cannot fit the
kubelet's limit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from patchbay_agent.config import ConfigError, load
from patchbay_agent.constants import (
    DEFAULT_CDI_SPEC_DIR,
    DEFAULT_DEVICE_PLUGIN_DIR,
    DEFAULT_HTTP_MAX_CONNECTIONS,
    DEFAULT_KUBELET_ROOT_DIR,
    DEFAULT_POD_RESOURCES_SOCKET,
)
from patchbay_agent.kubelet.sockets import check_instance
from patchbay_agent.options import AgentOptions, DraOptions, ReportOptions

log = logging.getLogger("patchbay_agent")

EXIT_CONFIG = 2
EXIT_NODE = 3

DEFAULT_POD_RESOURCES_PERIOD = 10.0
#: A DNS-1123 label: a namespace, and a profile name (also a label value, so at most 63).
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
#: Flags that only mean something with --profile.
_REPORT_FLAGS = ("report_namespace", "kubeconfig", "pod_resources_socket", "pod_resources_period")


def _address(value: str) -> tuple[str, int] | None:
    if value in ("", "0", "off"):
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise argparse.ArgumentTypeError(f"{value!r} must be HOST:PORT (or 'off')")
    return host.strip("[]"), int(port)


def _at_least_two(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 2:
        raise argparse.ArgumentTypeError(f"{value!r} must be a whole number of at least 2")
    return n


def _instance(value: str) -> str:
    try:
        return check_instance(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _dns_label(value: str) -> str:
    if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} must be 1-63 lowercase letters, digits or '-', starting and ending with a "
            "letter or digit"
        )
    return value


def _driver_name(value: str) -> str:
    """A DRA driver name: a DNS subdomain of at most 63 characters (the API's rule)."""
    if len(value) > 63 or not _DNS_SUBDOMAIN.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} must be a DNS subdomain of at most 63 characters (lowercase letters, digits, "
            "'-' and '.'), e.g. gpu.example.com"
        )
    return value


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r} must be a positive number of seconds")
    return seconds


def build_parser() -> argparse.ArgumentParser:
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
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--config", metavar="FILE", help="agent config YAML (resourceName + plugin)")
    which.add_argument(
        "--node-config",
        metavar="FILE",
        help="the node agent's config: every profile sharing the default agent (profile, mode, "
        "resourceName, plugin, nodeSelectorTerms); serves, in one process, each profile whose terms "
        "select this node's labels (read from the API server), each with its own socket, registration "
        "and DeviceReport in --report-namespace; a profile that fails is reported and restarted alone",
    )
    p.add_argument(
        "--watch-config",
        metavar="CONFIGMAP",
        help="with --node-config: follow this ConfigMap (in --report-namespace, key node.yaml) and this "
        "node's labels through the API server, and reconfigure live: a changed profile is applied "
        "in place (its registration kept) or, when the kubelet must hear of it, restarts alone; the "
        "others are untouched",
    )
    p.add_argument("--node-name", required=True, help="this node's name (labels metrics and logs)")
    p.add_argument(
        "--device-plugin-dir",
        default=DEFAULT_DEVICE_PLUGIN_DIR,
        type=Path,
        metavar="DIR",
        help="directory holding kubelet.sock and plugin sockets (default: %(default)s)",
    )
    p.add_argument(
        "--host-root",
        default=Path("/"),
        type=Path,
        metavar="DIR",
        help="where the host's / is mounted; discovery reads DIR/dev and DIR/sys (default: /)",
    )
    p.add_argument(
        "--host-path-prefix",
        default="",
        metavar="DIR",
        help="prefix the container runtime needs before device paths (default: none, right when "
        "--host-root is the node's / mounted into the agent's pod); set it to --host-root when "
        "that is a directory ON the node, e.g. a fake device tree",
    )
    p.add_argument(
        "--cdi-spec-dir",
        default=Path(DEFAULT_CDI_SPEC_DIR),
        type=Path,
        metavar="DIR",
        help="where the container runtime reads CDI specs; with allocation.cdi.kind the agent "
        "writes its resource's spec here (default: %(default)s)",
    )
    p.add_argument(
        "--http-address",
        default="127.0.0.1:9464",
        type=_address,
        metavar="HOST:PORT",
        help="serve /metrics, /healthz, /readyz here; port 0 picks one, 'off' disables "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--http-max-connections",
        default=DEFAULT_HTTP_MAX_CONNECTIONS,
        type=_at_least_two,
        metavar="N",
        help="open connections to the HTTP endpoint at most; one peer address may hold half of "
        "them, so a flood from one pod leaves room for probes and scrapes (default: %(default)s)",
    )
    p.add_argument(
        "--metrics-holder-labels",
        action="store_true",
        help="on /metrics, one patchbay_agent_allocated_devices series per holding container "
        "(labels holder_namespace, holder_pod, holder_container) instead of the total; off by "
        "default because the port is open to the pod network",
    )
    p.add_argument(
        "--shutdown-grace",
        default=5.0,
        type=float,
        metavar="SECONDS",
        help="on SIGTERM, how long in-flight calls may finish; the process exits at the latest "
        f"{HARD_EXIT_MARGIN:g} s after that, whatever is left (default: %(default)s)",
    )
    p.add_argument(
        "--poll-interval",
        default=10.0,
        type=float,
        metavar="SECONDS",
        help="backstop poll of the socket inodes; inotify does the real work (default: %(default)s)",
    )
    p.add_argument(
        "--instance",
        type=_instance,
        metavar="ID",
        help="the instance part of the socket name, 1-16 lowercase letters or digits (default: a "
        "fresh random one per process; a name another process serves is refused)",
    )
    dra = p.add_argument_group(
        "DRA mode",
        "with --dra-driver the agent is a Dynamic Resource Allocation (resource.k8s.io/v1) kubelet "
        "plugin instead of a device plugin: no device-plugin socket, no kubelet.sock registration. "
        "It serves DIR/plugins_registry/<driver>-<instance>.sock (plugin registration) and "
        "DIR/plugins/<driver>/dra-<instance>.sock (the DRA service; with --node-config every driver's "
        "directory is inside DIR/plugins/patchbay_node-agent/ instead), publishes this node's devices "
        "as ResourceSlices <node>-<driver> and prepares claims by writing one CDI spec per claim "
        "into --cdi-spec-dir. Needs API access (--kubeconfig or the in-cluster service account); "
        "see docs/dra.md",
    )
    dra.add_argument(
        "--dra-driver",
        type=_driver_name,
        metavar="NAME",
        help="the DRA driver name (a DNS subdomain, at most 63 characters)",
    )
    dra.add_argument(
        "--kubelet-root-dir",
        type=Path,
        default=Path(DEFAULT_KUBELET_ROOT_DIR),
        metavar="DIR",
        help="the kubelet's root directory, which holds plugins_registry/ and plugins/ "
        "(default: %(default)s)",
    )
    report = p.add_argument_group(
        "DeviceReport", "all optional; without --profile the agent writes no report and reads no PodResources"
    )
    report.add_argument(
        "--profile",
        type=_dns_label,
        metavar="NAME",
        help="the DevicePluginProfile this agent serves: publish the DeviceReport <NAME>.<node-name>",
    )
    report.add_argument(
        "--report-namespace",
        type=_dns_label,
        metavar="NS",
        help="namespace of the DeviceReport (default: $POD_NAMESPACE)",
    )
    report.add_argument(
        "--pod-name",
        metavar="NAME",
        help="this agent's pod, the report's `agent` field (default: $POD_NAME; none if unset)",
    )
    report.add_argument(
        "--pod-resources-socket",
        type=Path,
        metavar="PATH",
        help=f"PodResources socket (default: {DEFAULT_POD_RESOURCES_SOCKET})",
    )
    report.add_argument(
        "--pod-resources-period",
        type=_seconds,
        metavar="SECONDS",
        help="read PodResources this often, besides about 1 s after each Allocate (default: "
        f"{DEFAULT_POD_RESOURCES_PERIOD:g})",
    )
    report.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        help="kubeconfig for writing the report and, in DRA mode, for claims and slices "
        "(default: the in-cluster service account: $KUBERNETES_SERVICE_HOST/PORT "
        "and the token and ca.crt under "
        "/var/run/secrets/kubernetes.io/serviceaccount/; the token is re-read when it rotates)",
    )
    p.add_argument("--log-format", choices=("text", "json"), default="text", help="default: %(default)s")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    return p


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def _setup_logging(fmt: str, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


#: After SIGTERM, how much longer than --shutdown-grace the process may take before it exits
#: without finishing its shutdown (a worker thread stuck in an API call would otherwise hold the
#: interpreter's exit, and every rollout and drain would wait for the kubelet's SIGKILL).
HARD_EXIT_MARGIN = 3.0


def _stop_on_signals(stop: asyncio.Event, grace: float) -> None:
    """SIGTERM/SIGINT set `stop`, and arm a last-resort exit `grace` + HARD_EXIT_MARGIN later."""
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            return
        stop.set()
        timer = threading.Timer(grace + HARD_EXIT_MARGIN, _hard_exit, args=(grace + HARD_EXIT_MARGIN,))
        timer.daemon = True
        timer.start()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)


def _hard_exit(after: float) -> None:
    log.error("Shutdown did not finish within %.1fs of the signal: exiting now", after)
    logging.shutdown()
    os._exit(0)


async def _run(agent: Any) -> None:
    stop = asyncio.Event()
    _stop_on_signals(stop, agent.options.shutdown_grace)
    await agent.run(stop)


def _report_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ReportOptions | None:
    """The DeviceReport's options, or None without --profile; parser.error() (exit 2, naming the
    flag) when they cannot work."""
    if args.profile is None:
        flags = (
            _REPORT_FLAGS if args.dra_driver is None else tuple(f for f in _REPORT_FLAGS if f != "kubeconfig")
        )
        given = [f"--{name.replace('_', '-')}" for name in flags if getattr(args, name) is not None]
        if given:
            log.warning("%s ignored: there is no report without --profile", ", ".join(given))
        return None
    from patchbay_agent.report.devicereport import MAX_NAME_LENGTH, report_name

    namespace = args.report_namespace
    if namespace is None:
        env = os.environ.get("POD_NAMESPACE", "")
        if not env:
            parser.error("--profile needs --report-namespace (or $POD_NAMESPACE)")
        try:
            namespace = _dns_label(env)
        except argparse.ArgumentTypeError as e:
            parser.error(f"$POD_NAMESPACE (the default of --report-namespace): {e}")
    name = report_name(args.profile, args.node_name)
    if len(name) > MAX_NAME_LENGTH:
        parser.error(
            f"--profile and --node-name: the report name {name[:40]}... is {len(name)} characters, "
            f"over {MAX_NAME_LENGTH}"
        )
    return ReportOptions(
        profile=args.profile,
        namespace=namespace,
        pod_name=args.pod_name or os.environ.get("POD_NAME") or None,
        pod_resources_socket=args.pod_resources_socket or Path(DEFAULT_POD_RESOURCES_SOCKET),
        pod_resources_period=args.pod_resources_period or DEFAULT_POD_RESOURCES_PERIOD,
        kubeconfig=args.kubeconfig,
    )


def _node_main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """`--node-config`: one process for every profile of the shared agent (`nodeagent.NodeAgent`)."""
    from patchbay_agent.kubeclient import ClientConfigError, KubeClient
    from patchbay_agent.nodeagent import NodeAgent, NodeOptions
    from patchbay_agent.nodeconfig import load_node_config

    if args.profile is not None or args.dra_driver is not None:
        parser.error(
            "--node-config names every profile (and DRA driver) itself: leave out --profile/--dra-driver"
        )
    namespace = args.report_namespace or os.environ.get("POD_NAMESPACE", "")
    if not namespace:
        parser.error("--node-config needs --report-namespace (or $POD_NAMESPACE)")
    try:
        entries = load_node_config(args.node_config)
    except ConfigError as e:
        print(f"patchbay-agent: invalid node config {args.node_config}: {e}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        client = KubeClient(args.kubeconfig)
    except ClientConfigError as e:
        print(f"patchbay-agent: {e}", file=sys.stderr)
        return EXIT_CONFIG
    options = NodeOptions(
        AgentOptions(
            node_name=args.node_name,
            plugin_dir=args.device_plugin_dir,
            host_root=args.host_root,
            host_path_prefix=args.host_path_prefix,
            http_address=args.http_address,
            http_max_connections=args.http_max_connections,
            metrics_holder_labels=args.metrics_holder_labels,
            poll_interval=args.poll_interval,
            shutdown_grace=args.shutdown_grace,
            cdi_spec_dir=args.cdi_spec_dir,
            report=ReportOptions(
                profile="node",
                namespace=namespace,
                pod_name=args.pod_name or os.environ.get("POD_NAME") or None,
                pod_resources_socket=args.pod_resources_socket or Path(DEFAULT_POD_RESOURCES_SOCKET),
                pod_resources_period=args.pod_resources_period or DEFAULT_POD_RESOURCES_PERIOD,
                kubeconfig=args.kubeconfig,
            ),
        ),
        report_namespace=namespace,
        kubelet_root_dir=args.kubelet_root_dir,
        kubeconfig=args.kubeconfig,
    )
    log.info(
        "Starting the node agent on node %s: %d profile(s) in %s",
        args.node_name,
        len(entries),
        args.node_config,
    )

    async def run() -> None:
        stop = asyncio.Event()
        _stop_on_signals(stop, args.shutdown_grace)
        await NodeAgent(entries, options, client, follow=args.watch_config).run(stop)

    asyncio.run(run())
    log.info("Stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.log_format, args.log_level)
    if args.node_config is not None:
        return _node_main(parser, args)
    report = _report_options(parser, args)
    try:
        config = load(args.config)
    except ConfigError as e:
        print(f"patchbay-agent: invalid config {args.config}: {e}", file=sys.stderr)
        return EXIT_CONFIG
    options = AgentOptions(
        node_name=args.node_name,
        plugin_dir=args.device_plugin_dir,
        host_root=args.host_root,
        host_path_prefix=args.host_path_prefix,
        http_address=args.http_address,
        http_max_connections=args.http_max_connections,
        metrics_holder_labels=args.metrics_holder_labels,
        poll_interval=args.poll_interval,
        shutdown_grace=args.shutdown_grace,
        instance=args.instance,
        report=report,
        cdi_spec_dir=args.cdi_spec_dir,
        dra=None
        if args.dra_driver is None
        else DraOptions(args.dra_driver, args.kubelet_root_dir, args.kubeconfig),
    )
    client = None
    if report is not None or options.dra is not None:
        # Only now: pykube (and requests) stay out of an agent without reports.
        from patchbay_agent.kubeclient import ClientConfigError, KubeClient

        try:
            client = KubeClient(args.kubeconfig)
        except ClientConfigError as e:
            print(f"patchbay-agent: {e}", file=sys.stderr)
            return EXIT_CONFIG
        if report is not None:
            log.info("Publishing DeviceReport %s/%s.%s", report.namespace, report.profile, args.node_name)
    if options.dra is not None:
        log.info(
            "Starting as DRA driver %s (%s) on node %s",
            options.dra.driver,
            config.resource_name,
            args.node_name,
        )
    else:
        log.info("Starting for %s on node %s", config.resource_name, args.node_name)
    # Only now: the front-ends (gRPC and its stubs) are loaded by the agent that serves one.
    from patchbay_agent.core.inventory import SnapshotRefusedError
    from patchbay_agent.discovery import DiscoveryError
    from patchbay_agent.resourceagent import ResourceAgent

    try:
        asyncio.run(_run(ResourceAgent(config, options, client)))
    except (DiscoveryError, SnapshotRefusedError, ValueError) as e:
        print(f"patchbay-agent: {e}", file=sys.stderr)
        return EXIT_NODE
    log.info("Stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
