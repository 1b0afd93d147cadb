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
import signal
import sys
import threading
from typing import Any

from patchbay_agent.config import ConfigError, load
from patchbay_agent.options import (
    HARD_EXIT_MARGIN,
    AgentOptions,
    DraOptions,
    ReportOptions,
    Values,
    build_parser,
)

log = logging.getLogger("patchbay_agent")

EXIT_CONFIG = 2
EXIT_NODE = 3


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


def _report_values(parser: argparse.ArgumentParser, values: Values) -> dict[str, Any]:
    """The DeviceReport's values by field; parser.error() (exit 2) for a bad environment variable,
    naming it and its flag."""
    try:
        return values.section("report")
    except ValueError as e:
        parser.error(str(e))


def _report_options(parser: argparse.ArgumentParser, values: Values) -> ReportOptions | None:
    """The DeviceReport's options, or None without --profile; parser.error() (exit 2, naming the
    flag) when they cannot work."""
    if not values.given("profile"):
        if ignored := sorted(values.ignored()):
            log.warning("%s ignored: there is no report without --profile", ", ".join(ignored))
        return None
    from patchbay_agent.report.devicereport import MAX_NAME_LENGTH, report_name

    report = _report_values(parser, values)
    if report["namespace"] is None:
        parser.error("--profile needs --report-namespace (or $POD_NAMESPACE)")
    name = report_name(report["profile"], values["node_name"])
    if len(name) > MAX_NAME_LENGTH:
        parser.error(
            f"--profile and --node-name: the report name {name[:40]}... is {len(name)} characters, "
            f"over {MAX_NAME_LENGTH}"
        )
    return ReportOptions(**report)


def _node_main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """`--node-config`: one process for every profile of the shared agent (`nodeagent.NodeAgent`)."""
    from patchbay_agent.kubeclient import ClientConfigError, KubeClient
    from patchbay_agent.nodeagent import NodeAgent, NodeOptions
    from patchbay_agent.nodeconfig import load_node_config

    if args.profile is not None or args.dra_driver is not None:
        parser.error(
            "--node-config names every profile (and DRA driver) itself: leave out --profile/--dra-driver"
        )
    values = Values(args, os.environ)
    report = _report_values(parser, values)
    if not report["namespace"]:
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
        AgentOptions(**values.section("agent"), report=ReportOptions(**(report | {"profile": "node"}))),
        report_namespace=report["namespace"],
        **values.section("node"),
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
    values = Values(args, os.environ)
    report = _report_options(parser, values)
    try:
        config = load(args.config)
    except ConfigError as e:
        print(f"patchbay-agent: invalid config {args.config}: {e}", file=sys.stderr)
        return EXIT_CONFIG
    dra = DraOptions(**values.section("dra")) if values.given("dra_driver") else None
    options = AgentOptions(**values.section("agent"), report=report, dra=dra)
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
