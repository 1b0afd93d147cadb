"""The agent's HTTP port under a flood of idle connections: a real agent process (fake devices,
no kubelet) and, in a process of its own, a client that keeps N half-sent requests open from 10
loopback addresses and reopens whatever the agent closes, for the hold; meanwhile ``/healthz`` is
asked every 200 ms from another address (what the kubelet's probe does) and the agent's RSS is
sampled. Sides, interleaved round by round: the default cap (128 connections, half per address)
and the cap lifted (``--http-max-connections 1000000``: the agent before it had one)."""

from __future__ import annotations

import contextlib
import multiprocessing
import resource
import selectors
import socket
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml

from patchbay_bench.harness import Run, interleave
from patchbay_bench.setup import Child, status_mib
from patchbay_devcluster.procs import free_port

SOURCES = [f"127.0.0.{i}" for i in range(10, 20)]
PROBE_SOURCE = "127.0.0.2"
CAPS = {"cap 128 (default)": 128, "no cap": 1_000_000}


def start_agent(work: Path, port: int, cap: int) -> Child:
    host = work / "host"
    (host / "dev").mkdir(parents=True, exist_ok=True)
    for i in range(8):
        (host / "dev" / f"ttyUSB{i}").touch()
    (work / "plugins").mkdir(exist_ok=True)
    config = work / "agent.yaml"
    plugin = {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}, "health": {"periodSeconds": 10}}
    config.write_text(yaml.safe_dump({"resourceName": "example.com/serial", "plugin": plugin}))
    argv = [
        sys.executable,
        "-m",
        "patchbay_agent.main",
        "--config",
        str(config),
        "--node-name",
        "bench",
        "--device-plugin-dir",
        str(work / "plugins"),
        "--host-root",
        str(host),
        "--http-address",
        f"127.0.0.1:{port}",
        "--http-max-connections",
        str(cap),
    ]
    agent = Child(argv, work / f"agent-{cap}.log")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r,
        ):
            if r.status == 200:
                return agent
        time.sleep(0.1)
    agent.stop()
    raise RuntimeError(f"the agent did not serve within 30 s; see {agent.log}")


def healthz_ms(port: int) -> float:
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(PROBE_SOURCE, 0)) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    if not data.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"/healthz answered {data[:40]!r}")
    return (time.perf_counter() - started) * 1000


class Flood:
    """Keeps up to ``n`` half-sent requests open, reopening those the agent closes. In a process
    of its own: in a thread here it would hold the GIL the probe needs (the probe would measure
    the bench, not the agent)."""

    def __init__(self, port: int, n: int) -> None:
        self.port, self.n = port, n
        self._attempts = multiprocessing.Value("q", 0)
        self._stop = multiprocessing.Event()
        self._proc = multiprocessing.Process(target=self._run, daemon=True)

    @property
    def attempts(self) -> int:
        return int(self._attempts.value)

    def __enter__(self) -> Flood:
        self._proc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._proc.join(30)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()

    def _open(self, sel: selectors.DefaultSelector, i: int) -> None:
        try:
            s = socket.socket()
        except OSError:  # out of file descriptors: hold what is open
            return
        s.setblocking(False)
        try:
            s.bind((SOURCES[i % len(SOURCES)], 0))
            s.connect_ex(("127.0.0.1", self.port))
        except OSError:
            s.close()
            return
        with self._attempts.get_lock():
            self._attempts.value += 1
        sel.register(s, selectors.EVENT_WRITE, "connecting")

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        i = 0
        while not self._stop.is_set():
            while len(sel.get_map()) < self.n and not self._stop.is_set():
                self._open(sel, i)
                i += 1
                if i % 500 == 0:
                    break
            for key, _ in sel.select(timeout=0.05):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                if key.data == "connecting":
                    try:
                        s.send(b"GET /metrics HTTP/1.1\r\n")  # half a request, then nothing
                        sel.modify(s, selectors.EVENT_READ, "held")
                    except OSError:
                        sel.unregister(s)
                        s.close()
                else:  # the agent answered (408) or closed it: open another
                    with contextlib.suppress(OSError):
                        s.recv(4096)
                    sel.unregister(s)
                    s.close()
        for key in list(sel.get_map().values()):
            sel.unregister(key.fileobj)
            key.fileobj.close()  # type: ignore[union-attr]


def one(work: Path, n: int, cap: int, hold: float, settle: float) -> dict[str, float]:
    port = free_port()
    with start_agent(work, port, cap) as agent:
        time.sleep(settle)
        idle = peak = status_mib(agent.pid, "VmRSS")
        probes: list[float] = []
        failed = 0
        with Flood(port, n) as flood:
            end = time.monotonic() + hold
            while time.monotonic() < end:
                try:
                    probes.append(healthz_ms(port))
                except OSError:  # refused, reset or not connected within 10 s
                    failed += 1
                peak = max(peak, status_mib(agent.pid, "VmRSS"))
                time.sleep(0.2)
            attempts = flood.attempts
        time.sleep(settle)
        return {
            "growth": peak - idle,
            "after": status_mib(agent.pid, "VmRSS") - idle,
            "attempts": attempts,
            "p50": statistics.median(probes) if probes else float("nan"),
            "max": max(probes, default=float("nan")),
            "failed": failed,
            "alive": float(agent.alive()),
        }


def run(r: Run) -> None:
    sizes = {"small": r.integer("small"), "large": r.integer("large")}
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(sizes.values()) * 2 + 1024
    if soft < want:
        try:  # root may raise the hard limit too; the agent inherits both
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(hard, want)))
        except (ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 1024
    hold, settle = r.number("hold"), r.number("settle")
    for size, wanted in sizes.items():
        n = min(wanted, limit)
        note = f"{n:,} idle connections held {hold:g} s" + (
            f" (open files limit: {wanted:,} asked)" if n < wanted else ""
        )

        def side(n: int, cap: int) -> Callable[[int], dict[str, float]]:
            return lambda _i: one(r.work, n, cap, hold, settle)

        got = interleave(r.rounds(), {name: side(n, cap) for name, cap in CAPS.items()})

        def series(key: str, got: dict[str, list[dict[str, float]]] = got) -> dict[str, list[float]]:
            return {side: [x[key] for x in rows] for side, rows in got.items()}

        name = f"HTTP flood ({size})"
        r.figure(
            f"{name}: agent RSS growth at peak", "MiB", series("growth"), headline=size == "large", note=note
        )
        r.figure(f"{name}: agent RSS growth 3 s after", "MiB", series("after"), note=note)
        r.figure(
            f"{name}: /healthz p50 under the flood", "ms", series("p50"), headline=size == "large", note=note
        )
        r.figure(f"{name}: /healthz max", "ms", series("max"), note=note)
        r.figure(f"{name}: connections the client opened", "count", series("attempts"), note=note)
        r.figure(f"{name}: probes unanswered", "count", series("failed"), note=note)
        r.figure(f"{name}: agent alive after", "bool", series("alive"), note=note)
