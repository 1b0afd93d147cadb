"""Run a real ResourceAgent in-process on the test's event loop, and talk to it over its real socket;
or write the command line of an agent process (``agent_argv``), as the DaemonSet runs it, its
config (``write_agent_config``), and run it on the host (``HostAgent``)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import yaml
from support.agentparts import registrar_of
from support.converge import until as converge
from support.processes import stop_process

from patchbay_agent.api import api_pb2_grpc
from patchbay_agent.config import parse
from patchbay_agent.options import AgentOptions, DraOptions
from patchbay_agent.resourceagent import ResourceAgent

AGENT = (sys.executable, "-m", "patchbay_agent.main")
"""The agent's command, as its image runs it (``patchbay-agent`` is the same entry point)."""


def agent_argv(config: Path, node: str, *extra: str, **flags: str | Path) -> list[str]:
    """The agent process's command line: ``--config``, ``--node-name``, each of ``flags`` as
    ``--flag-name value`` (in the order given; ``_`` becomes ``-``), then ``extra`` as it is."""
    argv = [*AGENT, "--config", str(config), "--node-name", node]
    for flag, value in flags.items():
        argv += [f"--{flag.replace('_', '-')}", str(value)]
    return [*argv, *extra]


def write_agent_config(path: Path, plugin: dict[str, Any], resource: str = "example.com/serial") -> Path:
    """The agent's ``--config`` file at ``path``: ``resource`` served with ``plugin``."""
    path.write_text(yaml.safe_dump({"resourceName": resource, "plugin": plugin}))
    return path


class HostAgent:
    """The real agent process on the host (``argv``: see ``agent_argv``), its output in the file
    ``log``; ``stop`` ends it."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, grace: float = 20) -> int:
        """SIGTERM if it still runs, SIGKILL when it has not ended ``grace`` s later; its exit
        status."""
        stop_process(self.proc, grace)
        self._out.close()
        return self.proc.returncode


async def until(predicate: Callable[[], object], within: float = 10.0) -> None:
    """Poll `predicate` on the event loop until it is true; AssertionError after `within` s."""
    await converge(predicate, within)


def make_config(plugin: dict[str, Any], resource: str = "example.com/serial") -> Any:
    return parse({"resourceName": resource, "plugin": plugin})


def agent_options(plugin_dir: Path, host_root: Path, **over: Any) -> AgentOptions:
    """An agent's options for these tests: node-1, no HTTP endpoint, a 1 s shutdown grace, CDI
    specs under `host_root` (never the machine's own); `over` replaces any of them."""
    base: dict[str, Any] = {
        "node_name": "node-1",
        "plugin_dir": plugin_dir,
        "host_root": host_root,
        "http_address": None,
        "shutdown_grace": 1.0,
        "cdi_spec_dir": host_root / "var" / "run" / "cdi",
    }
    return AgentOptions(**{**base, **over})


def dra_agent(
    short_dir: Path, host_root: Path, client: Any, driver: str, *, poll_interval: float = 10.0
) -> ResourceAgent:
    """A DRA agent of `driver` on node-1 over `/dev/ttyUSB*` (not started): the kubelet's root
    `<short_dir>/k`, CDI specs in `<short_dir>/cdi`, `<short_dir>/dp` (which must exist) as the
    device-plugin directory it never uses; `client` its API (support/draapi.py)."""
    return ResourceAgent(
        make_config({"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}}),
        AgentOptions(
            node_name="node-1",
            plugin_dir=short_dir / "dp",
            host_root=host_root,
            http_address=None,
            shutdown_grace=1.0,
            poll_interval=poll_interval,
            cdi_spec_dir=short_dir / "cdi",
            dra=DraOptions(driver, short_dir / "k"),
        ),
        client=client,
    )


@contextlib.asynccontextmanager
async def running_agent(
    plugin: dict[str, Any],
    plugin_dir: Path,
    host_root: Path,
    *,
    resource: str = "example.com/serial",
    poll_interval: float = 10.0,
    backoff: tuple[float, float] = (0.05, 0.5),
    instance: str | None = None,
    cdi_spec_dir: Path | None = None,
    kubelet_version: str | None = None,
) -> AsyncIterator[ResourceAgent]:
    """Start the agent (first round, serving, registering), yield it, then stop it for real.

    CDI specs go to `cdi_spec_dir`, default `<host_root>/var/run/cdi` (never the machine's own).
    `kubelet_version`: what the agent reads as its Node's kubeletVersion (these agents have no
    API server; the read itself is tested against a real one in tests/integration)."""
    agent = ResourceAgent(
        make_config(plugin, resource),
        agent_options(
            plugin_dir,
            host_root,
            http_address=("127.0.0.1", 0),
            poll_interval=poll_interval,
            backoff_initial=backoff[0],
            backoff_max=backoff[1],
            instance=instance,
            cdi_spec_dir=cdi_spec_dir or host_root / "var" / "run" / "cdi",
        ),
        _NodeInfo(kubelet_version) if kubelet_version is not None else None,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(agent.started.wait(), timeout=10)
        # Serving is the registrar's first step.
        await until(lambda: registrar_of(agent).server is not None and registrar_of(agent).server.serving)
        yield agent
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=15)


class _NodeInfo:
    """Answers the one API read the device-plugin agent makes without reports: its kubelet's version."""

    def __init__(self, version: str) -> None:
        self.version = version

    def kubelet_version(self, node_name: str) -> str:
        return self.version


@contextlib.asynccontextmanager
async def plugin_client(socket: Path) -> AsyncIterator[api_pb2_grpc.DevicePluginStub]:
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        yield api_pb2_grpc.DevicePluginStub(channel)
