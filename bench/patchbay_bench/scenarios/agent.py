"""The plugin agent against the upstream Go stub device plugin, on the upstream kubelet device
manager, on FAKE hardware (a temporary /dev tree). The kubelet side is the conformance peer
(tests/conformance/peer, built from k8s.io/kubernetes at the newest release of the matrix): its
device manager registers both plugins, its GetCapacity is what "the kubelet sees" (polled every
200 us), and it times Allocate with the kubelet's own generated client. Sides, interleaved:

- Allocate latency, ``allocates`` sequential calls per side per round: the agent, the Go stub
  (``pkg/kubelet/cm/devicemanager/plugin/v1beta1.Stub``) and a bare ``grpc.aio`` server with a
  constant Allocate (``patchbay_bench.floor``: Python's gRPC floor without any agent code);
- exec -> the kubelet sees every device: the agent process and the Go stub process, each round a
  fresh start of both;
- the agent's RSS after start and after ``rss_allocates`` Allocates, beside the Go stub's.

Given its binary (``squat=PATH``), squat/generic-device-plugin is a side of the start, Allocate
and RSS figures too: a device plugin in the field, written in Go, serving the same fake device
files (its own resource, ``squat.example.com/serial``); the issue's targets name it.

And the agent's own: a kubelet restart -> its devices back; a device node removed -> allocatable
drops, and back (health period 5 s: what is timed is the agent's file watch; back includes the
recovery hold, ``recovery_hold`` seconds: the profile's default 10, 1 in a quick run).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from patchbay_agent.kubelet.sockets import socket_name
from patchbay_bench.harness import Run, interleave
from patchbay_bench.peers import (
    AgentProcess,
    FakeHardware,
    KubeletPeer,
    Process,
    binary_provenance,
    build_peer,
)
from patchbay_bench.setup import bytecode_ahead, status_mib

INSTANCE = "bench"
"""A fixed instance name, so the bench knows the agent's socket."""
RESOURCE, STUB_RESOURCE, DEVICES = "example.com/serial", "example.com/gostub", 8
FLOOR_RESOURCE = "example.com/pyfloor"
SQUAT_DOMAIN, SQUAT_NAME = "squat.example.com", "serial"
SQUAT_RESOURCE = f"{SQUAT_DOMAIN}/{SQUAT_NAME}"
#: What a Python process costs before it does anything, step by step: exec -> exit of each.
IMPORTS = {
    "python -c pass": "pass",
    "+ import asyncio, grpc and the device plugin API": (
        "import asyncio, grpc; from patchbay_agent.api import api_pb2, api_pb2_grpc"
    ),
    "+ import the agent (patchbay_agent.main)": (
        "import asyncio, grpc; from patchbay_agent.api import api_pb2, api_pb2_grpc; "
        "import patchbay_agent.main"
    ),
}


class World:
    """The kubelet peer, the agent, the Go stub and the floor in one short temporary directory."""

    def __init__(self, root: Path, peer: Path, squat: str = "", recovery_hold: int = 10) -> None:
        self.root, self.peer, self.squat_bin = root, peer, squat
        self.plugin_dir = root / "dp"
        self.plugin_dir.mkdir()
        self.hw = FakeHardware(root / "host")
        for n in range(DEVICES):
            self.hw.add_dev(f"/dev/ttyUSB{n}")
        self.kubelet = KubeletPeer(peer, self.plugin_dir, root / "kubelet.log")
        self.config = root / "agent.json"
        plugin = {
            "discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}},
            "allocation": {"envs": {"BAUD": "115200"}},
            "health": {"recoveryHoldSeconds": recovery_hold},
        }
        # JSON, as the operator writes every agent's config (render.node_config).
        self.config.write_text(json.dumps({"resourceName": RESOURCE, "plugin": plugin}, indent=2))
        self.agent: AgentProcess | None = None
        self.stub: Process | None = None
        self.floor: Process | None = None
        self.registered_floor: Process | None = None
        self.squat: Process | None = None
        self.socket = {
            "agent": str(self.plugin_dir / socket_name(RESOURCE, INSTANCE)),
            "Go stub": str(self.plugin_dir / "go-stub.sock"),
            "Python gRPC floor": str(root / "floor.sock"),
        }
        self.device = {"agent": "ttyUSB0", "Go stub": "dev-0", "Python gRPC floor": "ttyUSB0"}
        if squat:
            # squat's device ID: sha1 of the count index ("0") and the device's path (its path.go).
            self.device["squat"] = hashlib.sha1(f"0{self.hw.path('/dev/ttyUSB0')}".encode()).hexdigest()

    def start_squat(self) -> float:
        """Start squat/generic-device-plugin on the same fake device files; seconds from exec to
        the kubelet seeing every device. Its socket's name carries its start time, so it is
        found again after each start."""
        t0 = time.perf_counter()
        group = {"paths": [{"path": f"{self.hw.root}/dev/ttyUSB*"}]}
        argv = [
            self.squat_bin,
            "--plugin-directory",
            str(self.plugin_dir),
            "--domain",
            SQUAT_DOMAIN,
            "--listen",
            "127.0.0.1:0",
            "--device",
            json.dumps({"name": SQUAT_NAME, "groups": [group]}),
        ]
        self.squat = Process(argv, self.root / "squat.log")
        self.kubelet.wait(SQUAT_RESOURCE, capacity=DEVICES, allocatable=DEVICES, timeout_ms=20000)
        took = time.perf_counter() - t0
        newest = max(self.plugin_dir.glob("gdp-*.sock"), key=lambda p: p.stat().st_mtime_ns)
        self.socket["squat"] = str(newest)
        return took

    def stop_squat(self) -> None:
        if self.squat is not None:
            self.squat.stop()
            self.squat = None
            self.kubelet.wait(SQUAT_RESOURCE, allocatable=0, timeout_ms=20000)

    def start_agent(self) -> float:
        """Start the agent process; seconds from exec to the kubelet seeing every device."""
        t0 = time.perf_counter()
        self.agent = AgentProcess(
            self.config, self.plugin_dir, self.hw.root, self.root / "agent.log", "--instance", INSTANCE
        )
        self.kubelet.wait(RESOURCE, capacity=DEVICES, allocatable=DEVICES, timeout_ms=20000)
        return time.perf_counter() - t0

    def stop_agent(self) -> None:
        if self.agent is not None:
            self.agent.stop()
            self.agent = None
            # The kubelet marks the resource unhealthy when the plugin goes: the next start is
            # measured from a clean "0 allocatable".
            self.kubelet.wait(RESOURCE, allocatable=0, timeout_ms=20000)

    def start_stub(self) -> float:
        t0 = time.perf_counter()
        argv = [
            str(self.peer),
            "stub",
            "--dir",
            str(self.plugin_dir),
            "--resource",
            STUB_RESOURCE,
            "--devices",
            str(DEVICES),
        ]
        self.stub = Process(argv, self.root / "stub.log")
        self.kubelet.wait(STUB_RESOURCE, capacity=DEVICES, allocatable=DEVICES, timeout_ms=20000)
        return time.perf_counter() - t0

    def stop_stub(self) -> None:
        if self.stub is not None:
            self.stub.stop()
            self.stub = None
            self.kubelet.wait(STUB_RESOURCE, allocatable=0, timeout_ms=20000)

    def start_registered_floor(self) -> float:
        """Start the Python floor that registers (patchbay_bench.floor --register); seconds from exec
        to the kubelet seeing its devices."""
        t0 = time.perf_counter()
        self.registered_floor = Process(
            [
                sys.executable,
                "-m",
                "patchbay_bench.floor",
                str(self.plugin_dir / "py-floor.sock"),
                "--register",
                str(self.plugin_dir / "kubelet.sock"),
                FLOOR_RESOURCE,
                str(DEVICES),
            ],
            self.root / "floor-registered.log",
        )
        self.kubelet.wait(FLOOR_RESOURCE, capacity=DEVICES, allocatable=DEVICES, timeout_ms=20000)
        return time.perf_counter() - t0

    def stop_registered_floor(self) -> None:
        if self.registered_floor is not None:
            self.registered_floor.stop()
            self.registered_floor = None
            self.kubelet.wait(FLOOR_RESOURCE, allocatable=0, timeout_ms=20000)

    def start_floor(self) -> None:
        self.floor = Process(
            [sys.executable, "-m", "patchbay_bench.floor", self.socket["Python gRPC floor"]],
            self.root / "floor.log",
        )
        self.floor.next_line(30)

    def allocate(self, side: str, n: int) -> dict[str, Any]:
        return self.kubelet.ok(
            "bench_allocate", timeout=1800, socket=self.socket[side], n=n, devices=[self.device[side]]
        )

    def close(self) -> None:
        for p in (self.agent, self.stub, self.floor, self.registered_floor, self.squat):
            if p is not None:
                p.stop()
        self.kubelet.quit()


def run(r: Run) -> None:
    peer = build_peer()
    bytecode_ahead()  # every side starts as a node runs it: from compiled bytecode
    rounds = r.rounds()
    world = World(Path(r.work), peer, r.text("squat"), r.integer("recovery_hold"))
    try:
        starters: dict[str, Callable[[int], float]] = {
            "agent": lambda _i: restart(world.stop_agent, world.start_agent),
            "Go stub": lambda _i: restart(world.stop_stub, world.start_stub),
            "Python gRPC floor": lambda _i: restart(
                world.stop_registered_floor, world.start_registered_floor
            ),
        }
        r.note(f"Go stub (the conformance peer): {binary_provenance(peer)}")
        if world.squat_bin:
            starters["squat"] = lambda _i: restart(world.stop_squat, world.start_squat)
            r.note(f"squat: {binary_provenance(world.squat_bin)}")
        else:
            r.notes.append("squat not measured (its binary not given: squat=PATH)")
        starts = interleave(rounds, starters, alternate=True)
        world.stop_registered_floor()
        r.figure(
            "agent: exec -> the kubelet sees its devices",
            "ms",
            {k: [x * 1000 for x in v] for k, v in starts.items()},
            headline=True,
            note="each round a fresh process of each; the kubelet's GetCapacity polled every 200 us; the "
            "Python floor registers and lists its devices with no agent code (patchbay_bench.floor)",
        )

        def importing(code: str) -> Callable[[int], float]:
            return lambda _i: exec_exit(code)

        imports = interleave(rounds, {name: importing(code) for name, code in IMPORTS.items()})
        r.figure(
            "agent: Python start, exec -> exit",
            "ms",
            {k: [x * 1000 for x in v] for k, v in imports.items()},
            ratio=False,
            headline=True,  # why the start cannot come near a Go plugin's: the interpreter's own
            note="where the start time goes before the agent does anything: the interpreter, gRPC, "
            "the agent's modules",
        )
        world.start_floor()
        n = r.integer("allocates")

        def side(name: str) -> Callable[[int], dict[str, Any]]:
            return lambda _i: world.allocate(name, n)

        got = interleave(rounds, {name: side(name) for name in world.socket})
        note = f"{n} sequential Allocate calls per side per round, through the kubelet's Go client"
        for key, what in (("p50_ns", "p50"), ("p99_ns", "p99"), ("p999_ns", "p99.9")):
            r.figure(
                f"agent: Allocate {what}",
                "ms",
                {k: [x[key] / 1e6 for x in v] for k, v in got.items()},
                headline=what != "p99.9",
                note=note,
            )
        r.figure(
            "agent: Allocate calls per second, one caller",
            "calls/s",
            {k: [n / (x["total_ns"] / 1e9) for x in v] for k, v in got.items()},
            note=note,
        )
        r.figure(
            "agent: Allocate errors",
            "errors",
            {k: [x["errors"] for x in v] for k, v in got.items()},
            ratio=False,
        )
        rereg = []
        for _ in range(rounds):
            restarted = world.kubelet.ok("restart")
            seen = world.kubelet.wait(RESOURCE, capacity=DEVICES, allocatable=DEVICES, timeout_ms=20000)
            rereg.append((seen["t_ns"] - restarted["t_ns"]) / 1e6)
        r.figure(
            "agent: kubelet restart -> devices back",
            "ms",
            {"agent": rereg},
            headline=True,
            note="new manager, sockets wiped, kubelet.sock created; the Go stub does not re-register",
        )
        down, up = [], []
        for i in range(rounds):
            dev = f"/dev/ttyUSB{i % DEVICES}"
            t0 = time.perf_counter()
            world.hw.remove_dev(dev)
            world.kubelet.wait(RESOURCE, allocatable=DEVICES - 1, timeout_ms=20000)
            down.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            world.hw.add_dev(dev)
            world.kubelet.wait(RESOURCE, allocatable=DEVICES, timeout_ms=20000)
            up.append((time.perf_counter() - t0) * 1000)
        r.figure("agent: device node removed -> allocatable drops", "ms", {"agent": down}, headline=True)
        r.figure(
            "agent: device node back -> allocatable back",
            "ms",
            {"agent": up},
            note=f"of which the recovery hold (health.recoveryHoldSeconds): {r.integer('recovery_hold')} s",
        )
        assert world.agent is not None
        assert world.stub is not None
        rss = [status_mib(world.agent.proc.pid, "VmRSS")]
        stub = status_mib(world.stub.proc.pid, "VmRSS")
        peers = {"Go stub": [stub]}
        if world.squat is not None:
            peers["squat"] = [status_mib(world.squat.proc.pid, "VmRSS")]
        for _ in range(2):
            world.allocate("agent", r.integer("rss_allocates"))
            rss.append(status_mib(world.agent.proc.pid, "VmRSS"))
        r.figure(
            "agent: RSS",
            "MiB",
            {"agent": rss[:1], **peers},
            headline=True,
            note="after the rounds above (the process has served every measure)",
        )
        r.figure(
            "agent: RSS after more Allocates, twice",
            "MiB",
            {"agent": rss[1:]},
            note=f"{r.integer('rss_allocates')} Allocates before each reading: growth shows as a rise",
        )
    finally:
        world.close()


def exec_exit(code: str) -> float:
    """Seconds from exec to exit of `python -c code` (this interpreter, the bench's path)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ})
    return time.perf_counter() - t0


def restart(stop: Callable[[], None], start: Callable[[], float]) -> float:
    stop()
    return start()
