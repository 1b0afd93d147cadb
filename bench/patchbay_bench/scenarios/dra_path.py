"""DRA mode on the real node: NodePrepareResources against the Go kubeletplugin peer, a vanished
device -> its taint, the DRA agent pod's memory.

A ``mode: DRA`` profile with agent settings of its own (one agent pod serves it) over 4 FAKE
devices (mknod 1:3, named dra0..dra3: the Go peer uses file names as device names). The peer
(bench/drapeer, built by hack/go-peer.sh from the upstream helper library
k8s.io/dynamic-resource-allocation/kubeletplugin at the newest release of the matrix) does the
same prepare work as a process on the node: its helper GETs the claim and checks its UID, it
writes one CDI spec per claim, and its helper writes each request's device metadata file and the
CDI spec that mounts it (KEP-5304, the same two versions as the agent). It runs twice: reaching
the API server through the same relay as the agent pod, and over loopback. Sides, interleaved
round by round, the order reversed every other round (no side always runs after the same one):
``claims`` fresh claims per side, created and allocated here as the scheduler would (results and
the node selector), each prepared with one call on the side's DRA socket as the kubelet calls it,
then unprepared. The calls are timed by the same binary's Go client (``drapeer call``: grpc-go,
one connection, a deadline per call, as the kubelet's DRA client), so no side's figure carries a
Python client's cost; without the Go peer (peer=cached, not built) Python's grpc.aio times them.
Both sides get the same CPU weight: the agent pod requests ``agent_cpu`` CPUs (1: cgroup cpu
shares 1024, what the Go peer has as a process outside any pod; the chart's default request, 10m,
is 10 shares, which loses to everything else when the CPUs are busy). Neither has a CPU limit.

A fifth side is Python's floor: a bare grpc.aio DRA server (``patchbay_bench.floor --dra``, a
process on the node like the Go peer) that answers each claim at once, with no GET and no file:
what a call costs any Python DRA driver.

Also: where the agent's prepare time goes (its own histograms on its /metrics) and the Go peer's
(its own sums, read on its stdin: bench/drapeer/timings.go), their gRPC-and-socket parts beside
Python's floor, the GET of a
claim from this process as yardsticks (the official client over loopback and the relay, the
agent's own client directly, through a worker thread and on the event loop), and a device file
removed -> the taint on its ResourceSlice device (baseline: the same agent's DeviceReport saying
Unhealthy), and back (the 10 s recovery hold). Removals are spaced by the flap window.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml

from patchbay_agent.api import dra_v1_pb2, dra_v1_pb2_grpc
from patchbay_agent.core.health import FLAP_WINDOW
from patchbay_agent.kubeclient import KubeClient
from patchbay_bench.harness import Run, interleave, pct, wait
from patchbay_bench.kube import PROFILES, Api, Metrics, profile, reports
from patchbay_bench.peers import Process, drapeer
from patchbay_bench.setup import (
    AGENTS_NS,
    NODE,
    SESSION,
    Cluster,
    agent_pods,
    fake_devices,
    pod_memory,
    restore,
    vanish,
)

FAKE_DEV, DEVICES, NAMESPACE, LABEL = Path("/dev/patchbay-bench-dra"), 4, "default", "patchbay.dev/bench-dra"
PROFILE = "bench-dra"
FLOOR = "Python floor: a bare grpc.aio server (no GET, no files)"
DRIVER, PEER_DRIVER = f"{PROFILE}.patchbay.dev", "peer.patchbay.dev"
CLAIMS, SLICES = (
    f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims",
    "/apis/resource.k8s.io/v1/resourceslices",
)


class Dra:
    def __init__(self, r: Run, cluster: Cluster) -> None:
        self.r, self.c, self.api = r, cluster, cluster.api
        self.made = 0

    def slice_devices(self) -> dict[str, dict[str, Any]]:
        return {
            d["name"]: d
            for s in self.api.items(SLICES)
            if s["spec"]["driver"] == DRIVER and s["spec"].get("nodeName") == NODE
            for d in s["spec"].get("devices", [])
        }

    def allocated_claim(self, name: str, driver: str, device: str) -> str:
        """A claim allocated to ``device`` of ``driver``'s pool on the node, as the scheduler
        writes it (with the node selector: the agent may then write its status.devices)."""
        request = {"name": "serial", "exactly": {"deviceClassName": DRIVER}}
        obj = self.api.create(
            CLAIMS, {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}
        )
        result = {"request": "serial", "driver": driver, "pool": NODE, "device": device}
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
        allocation = {"devices": {"results": [result]}, "nodeSelector": {"nodeSelectorTerms": [term]}}
        self.api.merge(f"{CLAIMS}/{name}/status", {"status": {"allocation": allocation}})
        return str(obj["metadata"]["uid"])

    def prepare(
        self, driver: str, socket: Path, devices: list[str], client: Path | None
    ) -> tuple[list[float], list[float]]:
        """``claims`` fresh claims of ``driver`` prepared on ``socket``, one call each as the
        kubelet makes one per pod, then unprepared; seconds per call. The calls are timed by
        ``client`` (the Go peer's ``call``: grpc-go as the kubelet's DRA client uses it), or,
        without the Go peer, by Python's grpc.aio, whose own cost then lands on every side."""
        n = self.r.integer("claims")
        self.made += 1
        made = [(f"bench-{self.made}-{i}", devices[i % len(devices)]) for i in range(n)]
        uids = {name: self.allocated_claim(name, driver, dev) for name, dev in made}
        try:
            if client is not None:
                return self.go_calls(client, socket, [(name, uids[name]) for name, _ in made])
            return asyncio.run(self.aio_calls(socket, [(name, uids[name]) for name, _ in made]))
        finally:
            for name, _ in made:
                self.api.delete(f"{CLAIMS}/{name}")

    @staticmethod
    def go_calls(
        client: Path, socket: Path, claims: list[tuple[str, str]]
    ) -> tuple[list[float], list[float]]:
        lines = "".join(f"{NAMESPACE} {name} {uid}\n" for name, uid in claims)
        done = subprocess.run(
            [str(client), "call", "--socket", str(socket)],
            input=lines,
            capture_output=True,
            text=True,
            timeout=120 + 2 * len(claims),
        )
        if done.returncode:
            raise RuntimeError(f"the Go client failed on {socket}: {done.stderr.strip()}")
        got = json.loads(done.stdout)
        return [float(x) for x in got["prepare"]], [float(x) for x in got["unprepare"]]

    @staticmethod
    async def aio_calls(socket: Path, claims: list[tuple[str, str]]) -> tuple[list[float], list[float]]:
        prep: list[float] = []
        unprep: list[float] = []
        async with grpc.aio.insecure_channel(f"unix://{socket}") as ch:
            stub = dra_v1_pb2_grpc.DRAPluginStub(ch)  # type: ignore[no-untyped-call]
            for name, uid in claims:
                claim = dra_v1_pb2.Claim(namespace=NAMESPACE, uid=uid, name=name)
                t0 = time.perf_counter()
                resp = await stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim]))
                prep.append(time.perf_counter() - t0)
                answer = resp.claims[uid]
                if answer.error or len(answer.devices) != 1:
                    raise RuntimeError(f"prepare of {name} on {socket} failed: {answer}")
            for name, uid in claims:
                claim = dra_v1_pb2.Claim(namespace=NAMESPACE, uid=uid, name=name)
                t0 = time.perf_counter()
                await stub.NodeUnprepareResources(dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[claim]))
                unprep.append(time.perf_counter() - t0)
        return prep, unprep

    def service_socket(self) -> Path:
        socks = sorted((self.c.dev.real_node().paths.kubelet_root / "plugins").glob("*/dra-*.sock"))
        if len(socks) != 1:
            raise RuntimeError(f"expected one DRA service socket, found {socks}")
        return socks[0]

    def relay_kubeconfig(self) -> Path:
        """The admin kubeconfig with the API server at the relay on the pod network's bridge: the
        way the agent pod reaches it."""
        host, port = self.c.dev.pod_api_server
        doc = yaml.safe_load(self.c.kubeconfig.read_text())
        for c in doc["clusters"]:
            c["cluster"]["server"] = f"https://{host}:{port}"
        path = self.r.work / "relay.kubeconfig"
        path.write_text(yaml.safe_dump(doc))
        return path

    @contextlib.contextmanager
    def go_peer(self, binary: Path, kubeconfig: Path, *, metadata: bool = True) -> Iterator[GoPeer]:
        """The Go peer as a process on the node (never registered with the kubelet).
        ``metadata=False``: its helper writes no device metadata files (what they cost it)."""
        work = self.r.work / f"peer-{kubeconfig.stem}{'' if metadata else '-nometa'}"
        argv = [
            str(binary),
            "--kubeconfig",
            str(kubeconfig),
            "--driver",
            PEER_DRIVER,
            "--node",
            NODE,
            "--dir",
            str(work),
            "--cdi-dir",
            str(self.r.work / "peer-cdi"),
            "--dev-dir",
            str(FAKE_DEV),
            f"--metadata={str(metadata).lower()}",
        ]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            socket = Path(proc.stdout.readline().strip())
            if not socket.name:
                raise RuntimeError("the Go peer did not start")
            yield GoPeer(socket, proc)
        finally:
            assert proc.stdin is not None
            proc.stdin.close()  # it runs until stdin closes
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    @contextlib.contextmanager
    def python_floor(self) -> Iterator[Path]:
        """Python's floor as a process on the node: a bare grpc.aio DRA server answering every
        claim at once (patchbay_bench.floor --dra); its socket."""
        socket = self.r.work / "floor-dra.sock"
        argv = [sys.executable, "-m", "patchbay_bench.floor", str(socket), "--dra", NODE, "dra0"]
        proc = Process(argv, self.r.work / "floor-dra.log")
        try:
            if "ready" not in proc.next_line(30):
                raise RuntimeError(f"Python's DRA floor did not start: {proc.log_tail()}")
            yield socket
        finally:
            proc.stop()

    def agent_metrics(self) -> Metrics:
        (pod,) = agent_pods(self.c, f"patchbay.dev/profile={PROFILE}")
        with urllib.request.urlopen(f"http://{pod['status']['podIP']}:9464/metrics", timeout=5) as resp:
            return Metrics.parse(resp.read().decode())

    def vanish_to_taint(self, device: Path) -> dict[str, float]:
        name_of = {d["attributes"]["patchbay.dev/id"]["string"]: n for n, d in self.slice_devices().items()}
        (dev_id,) = [i for i in name_of if i.endswith(device.name)]

        def tainted() -> bool:
            """Out of the scheduler's reach: tainted, or left out where the API server drops
            device taints (before 1.36)."""
            devices = self.slice_devices()
            dev = devices.get(name_of[dev_id])
            return bool(devices) and (
                dev is None or any(t["key"] == "patchbay.dev/vanished" for t in dev.get("taints") or [])
            )

        def report_unhealthy() -> bool:
            rep = self.api.get(f"{reports(AGENTS_NS)}/{PROFILE}.{NODE}") or {}
            return any(d["id"] == dev_id and d["health"] != "Healthy" for d in rep.get("devices", []))

        out: dict[str, float] = {}

        def until(checks: dict[str, Callable[[], bool]]) -> None:
            t0 = time.monotonic()
            while checks and time.monotonic() < t0 + 120:
                for key, check in list(checks.items()):
                    if check():
                        out[key] = time.monotonic() - t0
                        del checks[key]
                time.sleep(0.02)
            if checks:
                raise TimeoutError(f"waiting for {sorted(checks)}")

        rdev = vanish(device)
        try:
            until({"taint": tainted, "report": report_unhealthy})
        finally:
            restore(device, rdev)
        until({"untaint": lambda: not tainted(), "report_back": lambda: not report_unhealthy()})
        return out


@dataclass(frozen=True)
class GoPeer:
    """A running Go peer: its DRA socket, and where its prepare time went so far."""

    socket: Path
    proc: subprocess.Popen[str]

    def timings(self) -> dict[str, dict[str, float]]:
        """Its sums since its start (bench/drapeer/timings.go): per phase, seconds and count."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write("timings\n")
        self.proc.stdin.flush()
        doc: dict[str, dict[str, float]] = json.loads(self.proc.stdout.readline())
        return doc


def ms(xs: list[float], q: float) -> float:
    return pct(xs, q) * 1000


def run(r: Run) -> None:
    cluster = SESSION.chart_cluster(r)
    binary = drapeer(build=r.text("peer") == "build")
    d = Dra(r, cluster)
    cluster.label_node(NODE, {LABEL: "yes"})
    rounds = r.rounds()
    try:
        with fake_devices(FAKE_DEV, [f"dra{i}" for i in range(DEVICES)]):
            spec = {
                "resourceName": "bench.patchbay.dev/dra",
                "mode": "DRA",
                "nodeSelector": {"matchLabels": {LABEL: "yes"}},
                "plugin": {
                    "discovery": {"paths": {"globs": [f"{FAKE_DEV}/dra*"]}},
                    # the users' default period unless told (health_period): a periodic round is a
                    # thread hop and a scan on the agent's loop, which the Go peer has no part of;
                    # a vanished device file is seen at once either way (inotify)
                    "health": {
                        "periodSeconds": r.integer("health_period"),
                        "failureThreshold": 1,
                        "recoveryHoldSeconds": r.integer("recovery_hold"),
                    },
                },
                # agent settings of its own: one agent pod to measure, given the CPU weight the Go
                # peer has as a process outside any pod (agent_cpu=1: cgroup cpu shares 1024)
                "agent": {
                    "updateStrategy": {"maxSurge": 1, "maxUnavailable": 0},
                    "resources": {
                        "requests": {"cpu": r.text("agent_cpu"), "memory": "64Mi"},
                        "limits": {"memory": "128Mi"},
                    },
                },
            }
            cluster.api.create(PROFILES, profile(PROFILE, spec))
            wait(
                "the DRA profile's devices in its slices", lambda: len(d.slice_devices()) == DEVICES, 300, 0.2
            )
            time.sleep(r.number("settle"))
            (pod,) = agent_pods(cluster, f"patchbay.dev/profile={PROFILE}")
            mem = pod_memory(cluster, pod["metadata"]["uid"])
            r.figure(
                "DRA agent pod memory: process RSS / PSS (reports on)",
                "MiB",
                {"RSS": [mem["rss"]], "PSS": [mem["pss"]]},
                ratio=False,
            )
            names, files = sorted(d.slice_devices()), sorted(p.name for p in FAKE_DEV.iterdir())
            relay = d.relay_kubeconfig()
            before = d.agent_metrics()
            with contextlib.ExitStack() as peers:
                sides: dict[str, Callable[[int], tuple[list[float], list[float]]]] = {
                    "Patchbay agent pod (via the relay)": lambda _i: d.prepare(
                        DRIVER, d.service_socket(), names, binary
                    )
                }
                floor = peers.enter_context(d.python_floor())
                sides[FLOOR] = lambda _i: d.prepare(PEER_DRIVER, floor, files, binary)
                via_relay: GoPeer | None = None
                if binary is not None:
                    via_relay = peers.enter_context(d.go_peer(binary, relay))
                    via_loopback = peers.enter_context(d.go_peer(binary, cluster.kubeconfig))
                    sides["Go peer via the relay"] = lambda _i: d.prepare(
                        PEER_DRIVER, via_relay.socket, files, binary
                    )
                    sides["Go peer over loopback"] = lambda _i: d.prepare(
                        PEER_DRIVER, via_loopback.socket, files, binary
                    )
                    # what the metadata files cost the Go side (the agent always writes them)
                    bare = peers.enter_context(d.go_peer(binary, relay, metadata=False))
                    sides["Go peer via the relay, no metadata files"] = lambda _i: d.prepare(
                        PEER_DRIVER, bare.socket, files, binary
                    )
                    peer_before = via_relay.timings()
                else:
                    r.note(
                        "Go peer left out: bench/drapeer not built (peer=cached; a cold build takes minutes)"
                    )
                got = interleave(rounds, sides, alternate=True)
                go_grpc = None
                if via_relay is not None:
                    peer_calls = [t for x in got["Go peer via the relay"] for t in x[0]]
                    go_grpc = go_breakdown(r, peer_before, via_relay.timings(), peer_calls)
            after = d.agent_metrics()
            client = "the Go client (grpc-go, as the kubelet)" if binary else "Python grpc.aio"
            note = f"{r.integer('claims')} claims per side per round, one per call, timed by {client}"
            for q, what in ((0.5, "p50"), (0.99, "p99")):
                r.figure(
                    f"DRA NodePrepareResources {what}",
                    "ms",
                    {k: [ms(x[0], q) for x in v] for k, v in got.items()},
                    headline=True,
                    note=note,
                )
            r.figure(
                "DRA NodeUnprepareResources p50",
                "ms",
                {k: [ms(x[1], 0.5) for x in v] for k, v in got.items()},
                note=note,
            )
            agent_grpc = breakdown(
                r, before, after, [t for x in got["Patchbay agent pod (via the relay)"] for t in x[0]]
            )
            grpc_parts(r, agent_grpc, [t for x in got[FLOOR] for t in x[0]], go_grpc)
            yardsticks(r, d, names, relay)
            runs = []
            for i in range(rounds):
                if i:
                    # removals closer together are a flapping device (held, by design)
                    time.sleep(FLAP_WINDOW + 1)
                runs.append(d.vanish_to_taint(FAKE_DEV / "dra1"))
            r.figure(
                "DRA: a device vanishes -> its ResourceSlice device tainted",
                "s",
                {
                    "the taint in the API": [x["taint"] for x in runs],
                    "the DeviceReport says Unhealthy (baseline)": [x["report"] for x in runs],
                },
                headline=True,
            )
            r.figure(
                "DRA: the device back -> the taint gone",
                "s",
                {
                    "the taint gone": [x["untaint"] for x in runs],
                    "the DeviceReport says Healthy (baseline)": [x["report_back"] for x in runs],
                },
                note=f"{r.integer('recovery_hold')} s of it is the recovery hold (recoveryHoldSeconds)",
            )
    finally:
        cluster.api.delete(f"{PROFILES}/{PROFILE}")
        cluster.label_node(NODE, {LABEL: None})


def breakdown(r: Run, before: Metrics, after: Metrics, calls: list[float]) -> float:
    """Where the agent's prepare time goes: its own histograms' means over the rounds. Returns
    its gRPC-and-socket part (ms)."""

    def mean(phase: str) -> float:
        family = f"patchbay_agent_dra_{phase}_seconds"
        total = after.sum(f"{family}_sum") - before.sum(f"{family}_sum")
        count = after.sum(f"{family}_count") - before.sum(f"{family}_count")
        return total / count * 1000 if count else float("nan")

    read, cdi, handler = mean("claim_read"), mean("cdi_write"), mean("prepare")
    call = statistics.mean(calls) * 1000
    r.figure(
        "DRA prepare: where the agent's time goes (means per call)",
        "ms",
        {
            "the call as the kubelet's side times it": [call],
            "the claim's GET as prepare waits for it": [read],
            "the CDI spec write": [cdi],
            "the rest of the handler": [handler - read - cdi],
            "gRPC and the socket, both ends (the call minus the handler)": [call - handler],
        },
        ratio=False,
        headline=True,  # where Python's gRPC or the API read is the floor (issue 31)
    )
    return call - handler


def go_breakdown(
    r: Run, before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], calls: list[float]
) -> float:
    """Where the Go peer's prepare time goes (via the relay, with its metadata files), the same
    parts as the agent's: its own sums' means over the rounds (bench/drapeer/timings.go). Returns
    its gRPC-and-socket part (ms)."""

    def mean(phase: str) -> float:
        seconds = after[phase]["seconds"] - before[phase]["seconds"]
        count = after[phase]["count"] - before[phase]["count"]
        return seconds / count * 1000 if count else float("nan")

    read, cdi, handler = mean("claim_get"), mean("driver"), mean("handler")
    call = statistics.mean(calls) * 1000
    r.figure(
        "DRA prepare: where the Go peer's time goes (means per call)",
        "ms",
        {
            "the call as the kubelet's side times it": [call],
            "the claim's GET as prepare waits for it": [read],
            "the CDI spec write (the plugin's part)": [cdi],
            "the rest of the handler (the helper: metadata files, their CDI spec, its lock)": [
                handler - read - cdi
            ],
            "gRPC and the socket, both ends (the call minus the handler)": [call - handler],
        },
        ratio=False,
        headline=True,
        note="the Go peer via the relay, with its metadata files: the side the targets are set against",
    )
    return call - handler


def grpc_parts(r: Run, agent: float, floor_calls: list[float], go: float | None) -> None:
    """gRPC and the socket per prepare call: the agent's (its call minus its handler), Python's
    floor (a bare grpc.aio server's whole call) and the Go peer's: how much of the agent's
    difference from the Go peer is Python's floor rather than the agent's own work."""
    parts = {
        "the agent (its call minus its handler)": [agent],
        "Python's floor (a bare grpc.aio server's whole call)": [statistics.mean(floor_calls) * 1000],
    }
    if go is not None:
        parts["the Go peer (its call minus its handler)"] = [go]
    r.figure(
        "DRA prepare: gRPC and the socket, the agent against Python's floor and Go (means per call)",
        "ms",
        parts,
        headline=True,
    )


def yardsticks(r: Run, d: Dra, names: list[str], relay: Path) -> None:
    """A GET of a claim from this process: the official client over loopback and via the relay,
    the agent's own client (directly, through a worker thread, and apiget on the event loop)."""
    n = r.integer("claims")
    claims = [f"bench-gets-{i}" for i in range(n)]
    for i, name in enumerate(claims):
        d.allocated_claim(name, DRIVER, names[i % len(names)])
    try:
        out: dict[str, list[float]] = {}
        for way, kubeconfig in (
            ("official client, loopback", d.c.kubeconfig),
            ("official client, relay", relay),
        ):
            api = Api(kubeconfig)
            api.get(f"{CLAIMS}/{claims[0]}")
            out[way] = []
            for name in claims:
                t0 = time.perf_counter()
                api.get(f"{CLAIMS}/{name}")
                out[way].append((time.perf_counter() - t0) * 1000)
            api.close()
        kube = KubeClient(relay)
        kube.resource_claim(NAMESPACE, claims[0])
        out["the agent's client, relay"] = []
        for name in claims:
            t0 = time.perf_counter()
            kube.resource_claim(NAMESPACE, name)
            out["the agent's client, relay"].append((time.perf_counter() - t0) * 1000)

        async def on_loop() -> list[float]:
            getter = kube.getter()
            assert getter is not None, "the bench's kubeconfig needs only what apiget handles"
            await kube.resource_claim_async(getter, NAMESPACE, claims[0], seconds=10)
            took = []
            for name in claims:
                t0 = time.perf_counter()
                await kube.resource_claim_async(getter, NAMESPACE, name, seconds=10)
                took.append((time.perf_counter() - t0) * 1000)
            getter.close()
            return took

        out["apiget on the event loop, relay"] = asyncio.run(on_loop())
        r.figure(
            "DRA yardstick: a GET of a claim from this process, p50",
            "ms",
            {k: [statistics.median(v)] for k, v in out.items()},
            ratio=False,
            headline=True,
            note=f"{n} GETs each",
        )
    finally:
        for name in claims:
            d.api.delete(f"{CLAIMS}/{name}")
