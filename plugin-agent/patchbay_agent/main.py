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
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from patchbay_agent.config import ConfigError, load
from patchbay_agent.options import (
    HARD_EXIT_MARGIN,
    AgentOptions,
    DraOptions,
    ReportOptions,
    Values,
    build_parser,
)
from patchbay_agent.successor import LIST_TIMEOUT, Identity, deleted_already, wait_for_successor

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


#: What to do on the first SIGTERM/SIGINT before `stop` is set (`successor.wait_for_successor`):
#: a coroutine that says, for the log, how it ended.
BeforeStop = Callable[[], Awaitable[str]]

#: Signals that came before the event loop took them over (`_remember_signals`).
_early_signals: list[int] = []


class Leaving(NamedTuple):
    """How the agent leaves on its first SIGTERM/SIGINT; the default: at once (`successor.py`)."""

    #: run first, while everything keeps serving (the successor hand-off)
    before_stop: BeforeStop | None = None
    #: how long `before_stop` may take
    wait: float = 0.0
    #: asked once when the loop has taken the signals: whether the agent's own pod is being
    #: deleted already, so that its SIGTERM may have come before the agent could take it
    #: (`successor.deleted_already`; `_remember_signals` says why one can be lost)
    deleted: Callable[[], Awaitable[bool]] | None = None


def _remember_signals() -> None:
    """Remember SIGTERM/SIGINT from the first line of `main` until the event loop takes them.

    The agent is PID 1 of its container, and the kernel delivers to the init of a PID namespace
    no signal it has no handler for, not even the kubelet's SIGTERM: it is dropped. A pod deleted
    while its agent started (its DaemonSet deleted, a rollout) used to keep an agent that served on
    until the kubelet killed it at the end of the pod's 30 s grace, leaving its sockets behind and
    the kubelet dialing a socket nobody served (docs/facts.md#signals-at-start). Python starts
    before any handler of ours can be set; `Leaving.deleted` covers that moment too."""

    def remember(signum: int, _frame: object) -> None:
        _early_signals.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, remember)


#: Leave at once on the first signal: no successor check, nothing asked at start.
AT_ONCE = Leaving()


def _stop_on_signals(stop: asyncio.Event, grace: float, leaving: Leaving = AT_ONCE) -> None:
    """SIGTERM/SIGINT set `stop`, and arm a last-resort exit `grace` + HARD_EXIT_MARGIN later.

    With `leaving.before_stop` (at most `leaving.wait` seconds), the first signal runs it first
    while everything keeps serving (the successor hand-off, `successor.py`), and the last-resort
    exit comes that much later; a second signal sets `stop` at once. A signal remembered before
    the loop took them (`_remember_signals`), or the agent's pod found being deleted
    (`leaving.deleted`), counts as the first signal."""
    loop = asyncio.get_running_loop()
    before_stop, wait = leaving.before_stop, leaving.wait
    tasks: set[asyncio.Task[None]] = set()
    leaving_task: list[asyncio.Task[None]] = []

    def on_signal() -> None:
        if stop.is_set():
            return
        if leaving_task:
            log.info("Signalled again: stopping now")
            stop.set()
            return
        after = grace + HARD_EXIT_MARGIN + (wait + LIST_TIMEOUT if before_stop is not None else 0.0)
        timer = threading.Timer(after, _hard_exit, args=(after,))
        timer.daemon = True
        timer.start()
        if before_stop is None:
            stop.set()
            return
        task = loop.create_task(_then_stop(before_stop, stop, wait + LIST_TIMEOUT))
        leaving_task.append(task)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    if _early_signals:
        log.info("Signalled while starting (%s): leaving", signal.Signals(_early_signals[0]).name)
        _early_signals.clear()
        on_signal()
    elif leaving.deleted is not None:
        task = loop.create_task(_leave_if_deleted(leaving.deleted, on_signal))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def _leave_if_deleted(deleted: Callable[[], Awaitable[bool]], on_signal: Callable[[], None]) -> None:
    """Leave as on SIGTERM when the agent's pod is being deleted already (`Leaving.deleted`)."""
    try:
        if not await deleted():
            return
    except Exception as e:  # not known: the signal, if one comes, still works
        log.info("Could not read whether this agent's pod is being deleted: %s", e)
        return
    log.warning(
        "This agent's pod is being deleted, and no signal came: one sent while the agent started "
        "was lost (PID 1 of its container takes only signals it has a handler for): leaving as on SIGTERM"
    )
    on_signal()


async def _then_stop(before_stop: BeforeStop, stop: asyncio.Event, bound: float) -> None:
    """Run `before_stop` (at most `bound` seconds, whatever it does), log what it said, set `stop`."""
    try:
        said = await asyncio.wait_for(before_stop(), timeout=bound)
        log.info("Leaving: %s", said)
    except TimeoutError:
        log.warning("Leaving: the successor check took over %.1fs: stopping now", bound)
    except Exception as e:  # never keep a signalled agent from stopping
        log.warning("Leaving: the successor check failed (%s): stopping now", e)
    finally:
        stop.set()


def _hard_exit(after: float) -> None:
    log.error("Shutdown did not finish within %.1fs of the signal: exiting now", after)
    logging.shutdown()
    os._exit(0)


def _successor_check(values: Values, client: Any) -> Leaving:
    """`--daemonset-selector`: the successor hand-off to run before stopping (`successor.py`), how
    long it may take, and the check at start for a signal lost while starting; `AT_ONCE` without
    the selector, or where it cannot work (said once)."""
    selector, wait = values["daemonset_selector"], values["successor_wait"]
    if selector is None or wait == 0:
        return AT_ONCE
    namespace, pod_name = values["report_namespace"], values["pod_name"]
    missing = [
        what
        for what, have in (
            ("API access (--profile, --dra-driver or --node-config)", client is not None),
            ("$POD_NAMESPACE (or --report-namespace)", namespace),
            ("$POD_NAME (or --pod-name)", pod_name),
        )
        if not have
    ]
    if missing:
        log.warning(
            "--daemonset-selector needs %s: on SIGTERM the agent stops at once", " and ".join(missing)
        )
        return AT_ONCE
    me = Identity(namespace=namespace, pod_name=pod_name, node_name=values["node_name"], selector=selector)

    def before_stop() -> Awaitable[str]:
        return wait_for_successor(client, me, wait)

    def deleted() -> Awaitable[bool]:
        return deleted_already(client, me)

    return Leaving(before_stop, wait, deleted)


async def _run(agent: Any, leaving: Leaving) -> None:
    stop = asyncio.Event()
    _stop_on_signals(stop, agent.options.shutdown_grace, leaving)
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

    leaving = _successor_check(values, client)

    async def run() -> None:
        stop = asyncio.Event()
        _stop_on_signals(stop, args.shutdown_grace, leaving)
        await NodeAgent(entries, options, client, follow=args.watch_config).run(stop)

    asyncio.run(run())
    log.info("Stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    _remember_signals()
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
        # Only now: the API client (http.client, kubeconfig reading) stays out of an agent without reports.
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
        asyncio.run(_run(ResourceAgent(config, options, client), _successor_check(values, client)))
    except (DiscoveryError, SnapshotRefusedError, ValueError) as e:
        print(f"patchbay-agent: {e}", file=sys.stderr)
        return EXIT_NODE
    log.info("Stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
