"""Benchmark the plugin agent against the upstream kubelet device manager and the upstream Go stub
device plugin, in the same run, on FAKE hardware (a temporary /dev tree).

    .venv/bin/python bench/agent.py [--allocates 20000] [--rounds 30] [--rss-allocates 100000]

Peers: the conformance peer (tests/conformance/peer, built from k8s.io/kubernetes at the pinned
release) plays the kubelet: its device manager registers both plugins, its GetCapacity is what
"the kubelet sees", and it times Allocate with the kubelet's own generated v1beta1 client.

Prints figures and ratios; never fails on timing (targets are printed next to the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests")]

import yaml  # noqa: E402
from support.fakehw import FakeHardware  # noqa: E402
from support.kubeletpeer import AgentProcess, KubeletPeer, _Process, build_peer  # noqa: E402

from patchbay_agent.kubelet.sockets import socket_name  # noqa: E402

AGENT_INSTANCE = "bench"
"""A fixed instance name, so the benchmark knows the agent's socket."""

RESOURCE = "example.com/serial"
STUB_RESOURCE = "example.com/gostub"
DEVICES = 8


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p * (len(s) - 1)))]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def ms(ns: float) -> str:
    return f"{ns / 1e6:.3f} ms"


class Bench:
    def __init__(self, root: Path, peer: Path, args: argparse.Namespace) -> None:
        self.root = root
        self.args = args
        self.plugin_dir = root / "dp"
        self.plugin_dir.mkdir()
        self.hw = FakeHardware(root / "host")
        for n in range(DEVICES):
            self.hw.add_dev(f"/dev/ttyUSB{n}")
        self.peer_bin = peer
        self.kubelet = KubeletPeer(peer, self.plugin_dir, root / "kubelet.log")
        self.config = root / "agent.yaml"
        self.config.write_text(
            yaml.safe_dump(
                {
                    "resourceName": RESOURCE,
                    "plugin": {
                        "discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}},
                        "allocation": {"envs": {"BAUD": "115200"}},
                    },
                }
            )
        )
        self.agent: AgentProcess | None = None
        self.stub: _Process | None = None
        self.floor: _Process | None = None
        self.results: dict[str, Any] = {}

    # -- processes ------------------------------------------------------------------------------
    def start_agent(self) -> float:
        """Start the agent process; seconds from exec to the kubelet seeing all devices."""
        t0 = time.perf_counter()
        self.agent = AgentProcess(
            self.config, self.plugin_dir, self.hw.root, self.root / "agent.log", "--instance", AGENT_INSTANCE
        )
        self.kubelet.wait(RESOURCE, capacity=DEVICES, allocatable=DEVICES, timeout_ms=20000)
        return time.perf_counter() - t0

    def stop_agent(self) -> None:
        if self.agent is not None:
            self.agent.stop()
            self.agent = None
            # The kubelet marks the resource unhealthy when the plugin goes; wait for that so the
            # next start is measured from a clean "0 allocatable".
            self.kubelet.wait(RESOURCE, allocatable=0, timeout_ms=20000)

    def start_stub(self) -> float:
        t0 = time.perf_counter()
        self.stub = _Process(
            [
                str(self.peer_bin),
                "stub",
                "--dir",
                str(self.plugin_dir),
                "--resource",
                STUB_RESOURCE,
                "--devices",
                str(DEVICES),
            ],
            self.root / "stub.log",
        )
        self.kubelet.wait(STUB_RESOURCE, capacity=DEVICES, allocatable=DEVICES, timeout_ms=20000)
        return time.perf_counter() - t0

    def start_floor(self) -> None:
        self.floor = _Process(
            [sys.executable, str(REPO / "bench" / "agent_floor.py"), str(self.root / "floor.sock")],
            self.root / "floor.log",
        )
        self.floor.next_line(30)

    def stop_stub(self) -> None:
        if self.stub is not None:
            self.stub.stop()
            self.stub = None

    def close(self) -> None:
        if self.agent is not None:
            self.agent.stop()
        self.stop_stub()
        if self.floor is not None:
            self.floor.stop()
        self.kubelet.quit()

    # -- measurements -------------------------------------------------------------------------
    def allocate_latency(self) -> None:
        n = self.args.allocates
        agent_sock = str(self.plugin_dir / socket_name("example.com/serial", AGENT_INSTANCE))
        stub_sock = str(self.plugin_dir / "go-stub.sock")
        floor_sock = str(self.root / "floor.sock")
        runs: dict[str, list[dict[str, Any]]] = {"agent": [], "stub": [], "floor": []}
        # Alternate the three in quarters, so drift in the machine's load hits them alike.
        for _ in range(4):
            for name, sock, dev in (
                ("stub", stub_sock, "dev-0"),
                ("floor", floor_sock, "ttyUSB0"),
                ("agent", agent_sock, "ttyUSB0"),
            ):
                r = self.kubelet.ok("bench_allocate", timeout=600, socket=sock, n=n // 4, devices=[dev])
                runs[name].append(r)
        out = {}
        for name, rs in runs.items():
            out[name] = {k: statistics.mean(r[f"{k}_ns"] for r in rs) for k in ("p50", "p99", "p999", "max")}
            out[name]["errors"] = sum(r["errors"] for r in rs)
            out[name]["per_second"] = n / sum(r["total_ns"] / 1e9 for r in rs)
        self.results["allocate"] = out
        a, s, f = out["agent"], out["stub"], out["floor"]
        print(f"\nAllocate latency, {n} sequential calls each through the kubelet's Go client")
        print("(mean of the percentiles of 4 alternating quarters):")
        print(f"  {'':8} {'p50':>10} {'p99':>10} {'p99.9':>10} {'calls/s':>9}")
        for name, r in (("Go stub", s), ("py floor", f), ("agent", a)):
            row = f"{ms(r['p50']):>10} {ms(r['p99']):>10} {ms(r['p999']):>10}"
            print(f"  {name:8} {row} {r['per_second']:>9.0f}")
        ratios = [f"{a[k] / s[k]:>9.2f}x" for k in ("p50", "p99", "p999")]
        print(f"  agent/Go {' '.join(ratios)}   (target: p99 <= 2x)")
        floor = [f"{f[k] / s[k]:>9.2f}x" for k in ("p50", "p99", "p999")]
        print(f"  floor/Go {' '.join(floor)}   (bare grpc.aio server, no agent code: the Python floor)")

    def reregistration(self) -> None:
        lat = []
        for _ in range(self.args.rounds):
            restarted = self.kubelet.ok("restart")
            seen = self.kubelet.wait(RESOURCE, capacity=DEVICES, allocatable=DEVICES, timeout_ms=20000)
            lat.append(seen["t_ns"] - restarted["t_ns"])
        self.results["reregistration_ns"] = {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "max": max(lat)}
        print(
            f"\nKubelet restart (new manager, sockets wiped, kubelet.sock created) -> devices back, "
            f"{len(lat)} restarts:"
        )
        figures = f"p50 {ms(pct(lat, 0.5))}  p99 {ms(pct(lat, 0.99))}  max {ms(max(lat))}"
        print(f"  {figures}   (target: p99 <= 250 ms)")

    def health_propagation(self) -> None:
        down, up = [], []
        for i in range(self.args.rounds):
            dev = f"/dev/ttyUSB{i % DEVICES}"
            t0 = time.perf_counter()
            self.hw.remove_dev(dev)
            self.kubelet.wait(RESOURCE, allocatable=DEVICES - 1, timeout_ms=20000)
            down.append((time.perf_counter() - t0) * 1e9)
            t0 = time.perf_counter()
            self.hw.add_dev(dev)
            self.kubelet.wait(RESOURCE, allocatable=DEVICES, timeout_ms=20000)
            up.append((time.perf_counter() - t0) * 1e9)
        self.results["health_ns"] = {
            "removed_p50": pct(down, 0.5),
            "removed_p99": pct(down, 0.99),
            "added_p50": pct(up, 0.5),
            "added_p99": pct(up, 0.99),
        }
        print(f"\nDevice node removed -> kubelet allocatable drops ({len(down)} rounds, health period 5 s):")
        figures = f"p50 {ms(pct(down, 0.5))}  p99 {ms(pct(down, 0.99))}  max {ms(max(down))}"
        print(f"  {figures}   (target: p99 <= 100 ms)")
        print(f"  node added back -> allocatable back: p50 {ms(pct(up, 0.5))}  p99 {ms(pct(up, 0.99))}")

    def rss(self) -> None:
        assert self.agent is not None
        assert self.stub is not None
        pid = self.agent.proc.pid
        after_start = rss_mib(pid)
        stub_rss = rss_mib(self.stub.proc.pid)
        sock = str(self.plugin_dir / socket_name("example.com/serial", AGENT_INSTANCE))
        n = self.args.rss_allocates
        self.kubelet.ok("bench_allocate", timeout=1800, socket=sock, n=n, devices=["ttyUSB1"])
        after_n = rss_mib(pid)
        self.kubelet.ok("bench_allocate", timeout=1800, socket=sock, n=n, devices=["ttyUSB1"])
        after_2n = rss_mib(pid)
        self.results["rss_mib"] = {
            "start": after_start,
            f"after_{n}": after_n,
            f"after_{2 * n}": after_2n,
            "go_stub": stub_rss,
        }
        print(
            f"\nAgent RSS: after start {after_start:.1f} MiB, after {n} Allocates {after_n:.1f} MiB, "
            f"after {2 * n} {after_2n:.1f} MiB   (target: <= 45 MiB, no growth)"
        )
        print(f"  (Go stub plugin process for comparison: {stub_rss:.1f} MiB)")

    def start_to_registered(self, first: float, stub_first: float) -> None:
        times = [first]
        for _ in range(self.args.starts - 1):
            self.stop_agent()
            times.append(self.start_agent())
        self.results["start_to_registered_s"] = {"all": times, "max": max(times), "go_stub": stub_first}
        print(
            f"\nAgent exec -> kubelet sees its devices, {len(times)} starts: "
            f"median {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms"
            "   (target: <= 1.5 s)"
        )
        print(f"  (Go stub process, same measure: {stub_first * 1000:.0f} ms)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--allocates", type=int, default=20000, help="Allocate calls per plugin for latency")
    p.add_argument("--rounds", type=int, default=30, help="restarts / device removals measured")
    p.add_argument("--rss-allocates", type=int, default=100000, help="Allocates between RSS readings")
    p.add_argument("--starts", type=int, default=5, help="agent starts measured")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()

    print(
        f"patchbay-agent benchmark: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{platform.machine()}"
    )
    print(
        f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (other work skews the tails)"
    )
    peer = build_peer()
    root = Path(tempfile.mkdtemp(prefix="pbb", dir="/tmp"))
    bench = Bench(root, peer, args)
    try:
        first = bench.start_agent()
        stub_first = bench.start_stub()
        bench.start_floor()
        bench.allocate_latency()
        bench.reregistration()
        # The stub plugin does not survive kubelet restarts the way the agent must; re-register it.
        bench.stop_stub()
        bench.start_stub()
        bench.health_propagation()
        bench.rss()
        bench.start_to_registered(first, stub_first)
    finally:
        bench.close()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        args.json.write_text(json.dumps(bench.results, indent=2))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
