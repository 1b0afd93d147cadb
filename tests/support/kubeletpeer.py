"""Helpers for the conformance tests: the kubelet peer process (the upstream device manager),
the agent process, and the per-test harness. Imported by conftest.py and the tests (a module of
its own, because several conftest.py files in the suite share that module name)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import yaml
from support import gopeer
from support.agentrun import agent_argv
from support.fakehw import FakeHardware

from patchbay_agent.kubelet.sockets import is_same_resource


def build_peer() -> Path:
    """The upstream kubelet device manager as a process (tests/conformance/peer)."""
    return gopeer.build("conformance-peer")


class PeerError(RuntimeError):
    pass


class _Process:
    """A child process with its stdout lines on a queue (read by a thread, so reads can time out)."""

    def __init__(self, argv: list[str], log: Path, stdin: bool = True) -> None:
        self.log_path = log
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next_line(self, timeout: float) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise PeerError(f"no output within {timeout}s; log: {self.log_tail()}") from None
        if line is None:
            raise PeerError(f"process exited ({self.proc.poll()}); log: {self.log_tail()}")
        return line

    def log_tail(self, n: int = 3000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-n:]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        """Stop by PID: the signal, then SIGKILL if it does not exit in time."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout)
        self._log.close()
        return self.proc.returncode


class KubeletPeer(_Process):
    """The upstream devicemanager, driven over JSON lines (ops documented in peer/main.go)."""

    def __init__(self, binary: Path, plugin_dir: Path, log: Path, numa: int = 2) -> None:
        super().__init__([str(binary), "kubelet", "--dir", str(plugin_dir), "--numa", str(numa)], log)
        ready = json.loads(self.next_line(30))
        assert ready.get("ready"), ready
        self._id = 0

    def op(self, op: str, timeout: float = 30, **kw: Any) -> dict[str, Any]:
        self._id += 1
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"id": self._id, "op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        reply: dict[str, Any] = json.loads(self.next_line(timeout))
        assert reply.get("id") == self._id, reply
        return reply

    def ok(self, op: str, timeout: float = 30, **kw: Any) -> dict[str, Any]:
        reply = self.op(op, timeout=timeout, **kw)
        if not reply.get("ok"):
            raise PeerError(f"{op} failed: {reply.get('error')}\npeer log:\n{self.log_tail()}")
        return reply

    def wait(
        self,
        resource: str,
        *,
        capacity: int | None = None,
        allocatable: int | None = None,
        timeout_ms: int = 15000,
    ) -> dict[str, Any]:
        """Until the kubelet's GetCapacity shows these numbers (bounded)."""
        kw: dict[str, Any] = {"resource": resource, "timeout_ms": timeout_ms}
        if capacity is not None:
            kw["capacity"] = capacity
        if allocatable is not None:
            kw["allocatable"] = allocatable
        return self.ok("wait", timeout=timeout_ms / 1000 + 10, **kw)

    def endpoints(self, resource: str) -> tuple[list[str], str]:
        """The socket paths of the endpoints the device manager holds for `resource` (one per
        registered plugin socket), and the primary one's (where Allocate goes; "" for none)."""
        reply = self.ok("endpoints", resource=resource)
        return list(reply["endpoints"]), str(reply["primary"])

    def sample_start(self, resource: str, interval_us: int = 200) -> None:
        """Sample GetCapacity and the endpoints of `resource` in the peer, in the background,
        every `interval_us`, until sample_stop (the other ops keep working meanwhile)."""
        self.ok("sample_start", resource=resource, interval_us=interval_us)

    def sample_stop(self) -> dict[str, Any]:
        """Stop sampling: samples, min/max capacity, allocatable and endpoints (-1: the resource
        was absent), and every change seen with its peer time `t_ns`."""
        return self.ok("sample_stop")

    def quit(self) -> int:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write('{"op": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(15)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                pass
        return self.stop()


class AgentProcess(_Process):
    """`python -m patchbay_agent.main` exactly as the DaemonSet runs it (plus test paths). Each
    process serves its own socket, `patchbay-<resource>-<random instance>.sock`."""

    def __init__(self, config: Path, plugin_dir: Path, host_root: Path, log: Path, *extra: str) -> None:
        super().__init__(conformance_agent_argv(config, plugin_dir, host_root, *extra), log, stdin=False)


def conformance_agent_argv(config: Path, plugin_dir: Path, host_root: Path, *extra: str) -> list[str]:
    """`AgentProcess`'s command line (the bench starts the same one in the agent image)."""
    return agent_argv(
        config,
        "conformance",
        *extra,
        device_plugin_dir=plugin_dir,
        host_root=host_root,
        cdi_spec_dir=host_root / "var" / "run" / "cdi",
        http_address="off",
    )


class Harness:
    """One test's world: a short temp dir with a plugin dir, fake hardware, a kubelet peer."""

    def __init__(self, root: Path, binary: Path) -> None:
        self.root = root
        self.binary = binary
        self.plugin_dir = root / "dp"
        self.plugin_dir.mkdir()
        self.hw = FakeHardware(root / "host")
        self.kubelet = KubeletPeer(binary, self.plugin_dir, root / "kubelet.log")
        self.agents: list[AgentProcess] = []
        self.extra: list[_Process] = []

    def start_agent(self, resource: str, plugin: dict[str, Any], *extra: str) -> AgentProcess:
        n = len(self.agents)
        cfg = self.root / f"agent{n}.yaml"
        cfg.write_text(yaml.safe_dump({"resourceName": resource, "plugin": plugin}))
        agent = AgentProcess(cfg, self.plugin_dir, self.hw.root, self.root / f"agent{n}.log", *extra)
        self.agents.append(agent)
        return agent

    def sockets(self, resource: str) -> list[Path]:
        """The plugin sockets of `resource` in the plugin directory now (any agent process)."""
        return sorted(p for p in self.plugin_dir.iterdir() if is_same_resource(p.name, resource))

    def close(self) -> None:
        for a in self.agents:
            a.stop()
        for p in self.extra:
            p.stop()
        self.kubelet.quit()
