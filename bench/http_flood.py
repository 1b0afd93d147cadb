"""The agent's HTTP port under a flood of idle connections: a real `patchbay-agent` process (a fake
device tree, no kubelet: it serves and keeps trying to register) and a client on this machine that
opens N connections from 10 loopback addresses, each sending half a request and then nothing, and
keeps reopening what the agent closes for the whole hold. Meanwhile `/healthz` is asked every
200 ms from another address (what the kubelet's probe does), and the agent's RSS is sampled.

Run twice in one go: with the default cap (128 connections, half per address) and with the cap
lifted (`--http-max-connections 1000000`: what the agent did before it had one), so the ratio is
measured on the same machine in the same minute. Both have the 5 s request deadline.

    .venv/bin/python bench/http_flood.py [--connections 2000 20000] [--hold 20]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import resource
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

SOURCES = [f"127.0.0.{i}" for i in range(10, 20)]
PROBE_SOURCE = "127.0.0.2"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_agent(work: Path, port: int, cap: int) -> subprocess.Popen[bytes]:
    host = work / "host"
    (host / "dev").mkdir(parents=True, exist_ok=True)
    for i in range(8):
        (host / "dev" / f"ttyUSB{i}").touch()
    plugins = work / "plugins"
    plugins.mkdir(exist_ok=True)
    config = work / "agent.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "resourceName": "example.com/serial",
                "plugin": {
                    "discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}},
                    "health": {"periodSeconds": 10},
                },
            }
        )
    )
    argv = [sys.executable, "-m", "patchbay_agent.main", "--config", str(config), "--node-name", "bench"]
    argv += ["--device-plugin-dir", str(plugins), "--host-root", str(host)]
    argv += ["--http-address", f"127.0.0.1:{port}", "--http-max-connections", str(cap)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=(work / f"agent-{cap}.log").open("wb"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        url = f"http://127.0.0.1:{port}/healthz"
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                return proc
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the agent did not serve within 30 s; see {work}/agent-{cap}.log")


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
    """Keeps up to `n` half-sent requests open, reopening those the agent closes.

    In a process of its own: in a thread of the bench's process it would hold the GIL the
    `/healthz` probe needs, and the probe's latency would measure the bench, not the agent."""

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
                else:  # the agent answered (408) or closed it: reopen another
                    with contextlib.suppress(OSError):
                        s.recv(4096)
                    sel.unregister(s)
                    s.close()
        for key in list(sel.get_map().values()):
            sel.unregister(key.fileobj)
            key.fileobj.close()  # type: ignore[union-attr]


def run(work: Path, n: int, cap: int, hold: float) -> dict[str, float]:
    port = free_port()
    agent = start_agent(work, port, cap)
    try:
        time.sleep(2)
        idle = rss_mib(agent.pid)
        probes: list[float] = []
        failed = 0
        peak = idle
        with Flood(port, n) as flood:
            end = time.monotonic() + hold
            while time.monotonic() < end:
                try:
                    probes.append(healthz_ms(port))
                except OSError:  # refused, reset or not connected within 10 s
                    failed += 1
                peak = max(peak, rss_mib(agent.pid))
                time.sleep(0.2)
            attempts = flood.attempts
        time.sleep(3)
        after = rss_mib(agent.pid)
        return {
            "idle": idle,
            "peak": peak,
            "after": after,
            "attempts": attempts,
            "p50": statistics.median(probes),
            "max": max(probes),
            "alive": agent.poll() is None,
            "failed": failed,
        }
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connections", type=int, nargs="+", default=[2000, 20000])
    p.add_argument("--hold", type=float, default=20.0, help="seconds the flood is held (default 20)")
    args = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(args.connections) * 2 + 1024
    if soft < want:
        try:  # root may raise the hard limit too; the agent inherits both
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(hard, want)))
        except (ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            print(f"open files limited to {hard} here: floods above {hard - 1024} connections are cut to it")
    print(
        "agent pid RSS (MiB), /healthz from another address every 200 ms; "
        f"hold {args.hold:g} s; cpus {os.cpu_count()}"
    )
    print(
        f"{'idle conns':>10} {'cap':>8} {'attempts':>9} {'RSS idle':>9} {'peak':>7} {'after':>7} "
        f"{'healthz p50':>12} {'max':>7} {'failed':>6} alive"
    )
    with tempfile.TemporaryDirectory(prefix="pbflood") as tmp:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 1024
        for n in (min(c, limit) for c in args.connections):
            for cap in (128, 1_000_000):
                r = run(Path(tmp), n, cap, args.hold)
                print(
                    f"{n:>10,} {cap:>8,} {r['attempts']:>9,.0f} {r['idle']:>9.1f} {r['peak']:>7.1f} "
                    f"{r['after']:>7.1f} {r['p50']:>10.1f}ms {r['max']:>5.0f}ms {r['failed']:>6.0f} "
                    f"{bool(r['alive'])}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
