"""`patchbay-agent`: the command line. Parses flags, loads the config, runs the agent until
SIGTERM/SIGINT, then shuts down gracefully (streams ended, socket removed).

Exit codes: 0 after a clean shutdown, 2 for a bad config or flags (the message names the field),
3 when discovery cannot work on this node or the device list cannot fit the kubelet's limit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path

from patchbay_agent.agent import Agent, AgentOptions
from patchbay_agent.config import ConfigError, load
from patchbay_agent.constants import DEFAULT_DEVICE_PLUGIN_DIR
from patchbay_agent.discovery import DiscoveryError
from patchbay_agent.inventory import ListTooLargeError
from patchbay_agent.sockets import check_instance

log = logging.getLogger("patchbay_agent")

EXIT_CONFIG = 2
EXIT_NODE = 3


def _address(value: str) -> tuple[str, int] | None:
    if value in ("", "0", "off"):
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise argparse.ArgumentTypeError(f"{value!r} must be HOST:PORT (or 'off')")
    return host.strip("[]"), int(port)


def _instance(value: str) -> str:
    try:
        return check_instance(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


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
            "--host-root /host with the host's /dev and /sys mounted read-only under it."
        ),
    )
    p.add_argument(
        "--config", required=True, metavar="FILE", help="agent config YAML (resourceName + plugin)"
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
        "--http-address",
        default="127.0.0.1:9464",
        type=_address,
        metavar="HOST:PORT",
        help="serve /metrics, /healthz, /readyz here; port 0 picks one, 'off' disables "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--shutdown-grace",
        default=5.0,
        type=float,
        metavar="SECONDS",
        help="on SIGTERM, how long in-flight calls may finish (default: %(default)s)",
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


async def _run(agent: Agent) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await agent.run(stop)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_format, args.log_level)
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
        poll_interval=args.poll_interval,
        shutdown_grace=args.shutdown_grace,
        instance=args.instance,
    )
    log.info("Starting for %s on node %s", config.resource_name, args.node_name)
    try:
        asyncio.run(_run(Agent(config, options)))
    except (DiscoveryError, ListTooLargeError, ValueError) as e:
        print(f"patchbay-agent: {e}", file=sys.stderr)
        return EXIT_NODE
    log.info("Stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
