"""DRA mode on the real node, measured: NodePrepareResources, a vanished device -> its taint, memory.

Starts a cluster of its own with the real node, installs the chart with the images built here,
applies a `mode: DRA` profile over FAKE devices (mknod 1:3, named dra0..dra3: the Go peer uses
file names as device names, which must be DNS labels) and prints, each against a baseline in the
same run:

- NodePrepareResources on the agent pod's DRA socket, called as the kubelet calls it, for
  ``--claims`` claims that this script created and allocated (status written as the scheduler
  would), p50/p99; baseline: the Go peer below doing the same work, and a bare GET of a claim
  from this process (the one API call prepare cannot avoid). Then NodeUnprepareResources.
- a device file removed on the node -> the taint on its ResourceSlice device visible in the API
  (where the API server drops taints, before 1.36: the device gone from the slice), median of
  ``--runs``; baseline: the same agent's DeviceReport calling the device unhealthy (the
  same detection, the other write path).
- the DRA agent pod's process RSS / PSS (reports on), beside the DevicePlugin agent's figure in
  docs/benchmarks.md.

The side-by-side Go peer (bench/drapeer, built by its build.sh from the upstream helper library
k8s.io/dynamic-resource-allocation/kubeletplugin at the pinned release) does the same prepare
work as a process on the node: its helper GETs the claim (admin kubeconfig, over loopback; the
agent pod goes through the pod-network relay), it writes one CDI spec per claim; it is not
registered with the kubelet, and this script calls both sockets the same way.

Run (root; one real node per machine, so no demo cluster at the same time):
    PATCHBAY_KUBE_BIN=$(hack/kube-binaries.sh --print-bin-dir) .venv/bin/python bench/dra_path.py
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import yaml
from kubernetes import client, config

from patchbay_agent.api import dra_v1_pb2, dra_v1_pb2_grpc
from patchbay_agent.core.health import FLAP_WINDOW
from patchbay_agent.kubeclient import KubeClient
from patchbay_devcluster import DevCluster, find_bin_dir
from patchbay_devcluster.imagebuild import build_all, find_repo
from patchbay_devcluster.install import helm_install
from patchbay_devcluster.node import NODE_NAME

GROUP, VERSION, PLURAL = "patchbay.dev", "v1beta1", "devicepluginprofiles"
RG, RV = "resource.k8s.io", "v1"
FAKE_DEV = Path("/dev/patchbay-bench-dra")
DEVICES = 4
NAMESPACE = "default"
PEER_DRIVER = "peer.patchbay.dev"


def wait(check: Callable[[], Any], timeout: float = 180, every: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every)
    raise SystemExit(f"bench: timed out waiting for {getattr(check, '__name__', check)}")


def pct(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, round(q * (len(ys) - 1)))]


def ms(xs: list[float]) -> str:
    return (
        f"p50 {pct(xs, 0.5) * 1000:6.2f} ms  p99 {pct(xs, 0.99) * 1000:6.2f} ms"
        f"  mean {statistics.mean(xs) * 1000:6.2f} ms"
    )


class Bench:
    def __init__(self, cluster: DevCluster, driver: str) -> None:
        self.cluster, self.driver = cluster, driver
        self.api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        self.core, self.custom = client.CoreV1Api(self.api), client.CustomObjectsApi(self.api)

    def slice_devices(self) -> dict[str, dict[str, Any]]:
        items = self.custom.list_cluster_custom_object(RG, RV, "resourceslices")["items"]
        return {
            d["name"]: d
            for s in items
            if s["spec"]["driver"] == self.driver and s["spec"].get("nodeName") == NODE_NAME
            for d in s["spec"].get("devices", [])
        }

    def allocated_claim(self, name: str, driver: str, device: str) -> str:
        """A claim for one device of ``driver``'s pool on the node, allocated to ``device`` (as the
        scheduler would)."""
        body = {
            "apiVersion": f"{RG}/{RV}",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {
                "devices": {"requests": [{"name": "serial", "exactly": {"deviceClassName": self.driver}}]}
            },
        }
        obj = self.custom.create_namespaced_custom_object(RG, RV, NAMESPACE, "resourceclaims", body)
        result = {"request": "serial", "driver": driver, "pool": NODE_NAME, "device": device}
        # The node, as the scheduler writes it for a node-local device: the agent may then write
        # the claim's status.devices (the API server checks associated-node:patch against it).
        on_node = {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE_NAME]}]}
            ]
        }
        self.custom.patch_namespaced_custom_object_status(
            RG,
            RV,
            NAMESPACE,
            "resourceclaims",
            name,
            {"status": {"allocation": {"devices": {"results": [result]}, "nodeSelector": on_node}}},
        )
        return str(obj["metadata"]["uid"])

    def service_socket(self) -> Path:
        root = self.cluster.real_node().paths.kubelet_root / "plugins"
        socks = sorted(root.glob("*/dra-*.sock"))
        if len(socks) != 1:
            raise SystemExit(f"bench: expected one DRA service socket under {root}, found {socks}")
        return socks[0]

    def prepare_figures(
        self, tag: str, driver: str, socket: Path, devices: list[str], claims: int
    ) -> tuple[list[float], list[float]]:
        """NodePrepareResources and NodeUnprepareResources on ``socket`` for ``claims`` fresh
        claims of ``driver`` (one call per claim, as the kubelet makes one per pod)."""
        made = [(f"bench-{tag}-{i}", devices[i % len(devices)]) for i in range(claims)]
        uids = {name: self.allocated_claim(name, driver, dev) for name, dev in made}

        async def calls() -> tuple[list[float], list[float]]:
            prep: list[float] = []
            unprep: list[float] = []
            async with grpc.aio.insecure_channel(f"unix://{socket}") as ch:
                stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
                for name, _ in made:
                    claim = dra_v1_pb2.Claim(namespace=NAMESPACE, uid=uids[name], name=name)
                    t0 = time.perf_counter()
                    resp = await stub.NodePrepareResources(
                        dra_v1_pb2.NodePrepareResourcesRequest(claims=[claim])
                    )
                    prep.append(time.perf_counter() - t0)
                    answer = resp.claims[uids[name]]
                    if answer.error or len(answer.devices) != 1:
                        raise SystemExit(f"bench: prepare of {name} on {socket} failed: {answer}")
                for name, _ in made:
                    claim = dra_v1_pb2.Claim(namespace=NAMESPACE, uid=uids[name], name=name)
                    t0 = time.perf_counter()
                    await stub.NodeUnprepareResources(
                        dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[claim])
                    )
                    unprep.append(time.perf_counter() - t0)
            return prep, unprep

        prep, unprep = asyncio.run(calls())
        for name, _ in made:
            self.custom.delete_namespaced_custom_object(RG, RV, NAMESPACE, "resourceclaims", name)
        return prep, unprep

    def relay_kubeconfig(self, tmp: Path) -> Path:
        """The admin kubeconfig with the API server at the relay's address on the pod network's
        bridge: the way the agent pod reaches it (the certificate names that address too)."""
        host, port = self.cluster.pod_api_server
        doc = yaml.safe_load(self.cluster.kubeconfig.read_text())
        for c in doc["clusters"]:
            c["cluster"]["server"] = f"https://{host}:{port}"
        path = tmp / "relay.kubeconfig"
        path.write_text(yaml.safe_dump(doc))
        return path

    def claim_gets(self, kubeconfig: Path, names: list[str]) -> list[float]:
        """A GET of each claim from this process with the official client, over ``kubeconfig``'s
        way to the API server (one warm-up call first: the connection is set up once)."""
        custom = client.CustomObjectsApi(config.new_client_from_config(config_file=str(kubeconfig)))
        custom.get_namespaced_custom_object(RG, RV, NAMESPACE, "resourceclaims", names[0])
        out = []
        for name in names:
            t0 = time.perf_counter()
            custom.get_namespaced_custom_object(RG, RV, NAMESPACE, "resourceclaims", name)
            out.append(time.perf_counter() - t0)
        return out

    def agent_client_gets(self, kubeconfig: Path, names: list[str]) -> dict[str, list[float]]:
        """The agent's own API client (patchbay_agent.kubeclient, pykube-ng over requests) in this
        process, GETting each claim: called directly, and from an event loop through a worker
        thread as the agent's prepare calls it."""
        kube = KubeClient(kubeconfig)
        kube.resource_claim(NAMESPACE, names[0])
        direct = []
        for name in names:
            t0 = time.perf_counter()
            kube.resource_claim(NAMESPACE, name)
            direct.append(time.perf_counter() - t0)

        async def hopped() -> list[float]:
            out = []
            for name in names:
                t0 = time.perf_counter()
                await asyncio.to_thread(kube.resource_claim, NAMESPACE, name)
                out.append(time.perf_counter() - t0)
            return out

        async def on_loop() -> list[float]:
            getter = kube.getter()
            assert getter is not None, "the bench's kubeconfig needs only what apiget handles"
            await kube.resource_claim_async(getter, NAMESPACE, names[0], seconds=10)
            out = []
            for name in names:
                t0 = time.perf_counter()
                await kube.resource_claim_async(getter, NAMESPACE, name, seconds=10)
                out.append(time.perf_counter() - t0)
            getter.close()
            return out

        return {"direct": direct, "thread": asyncio.run(hopped()), "loop": asyncio.run(on_loop())}

    def set_agent_cpu(self, profile: str, cpu: str) -> None:
        """Give the profile's agent pod a CPU request of ``cpu`` and wait until the new pod alone
        serves the driver (the spec change rolls the profile's DaemonSet)."""
        resources = {"requests": {"cpu": cpu, "memory": "64Mi"}, "limits": {"memory": "128Mi"}}
        self.custom.patch_cluster_custom_object(
            GROUP, VERSION, PLURAL, profile, {"spec": {"agent": {"resources": resources}}}
        )

        def rolled() -> bool:
            pods = self.core.list_namespaced_pod(
                "patchbay-system", label_selector=f"patchbay.dev/profile={profile}"
            ).items
            if len(pods) != 1 or pods[0].metadata.deletion_timestamp:
                return False
            pod = pods[0]
            requests = (pod.spec.containers[0].resources.requests or {}).get("cpu")
            ready = [c for c in pod.status.conditions or [] if c.type == "Ready" and c.status == "True"]
            root = self.cluster.real_node().paths.kubelet_root / "plugins"
            return requests == cpu and bool(ready) and len(list(root.glob("*/dra-*.sock"))) == 1

        wait(rolled, 180, 0.5)
        wait(lambda: len(self.slice_devices()) == DEVICES)

    def agent_phase_sums(self, profile: str) -> dict[str, tuple[float, int]]:
        """(sum in seconds, count) of the agent pod's prepare histograms, from its /metrics on the
        pod network (the node reaches its pods)."""
        (pod,) = self.core.list_namespaced_pod(
            "patchbay-system", label_selector=f"patchbay.dev/profile={profile}"
        ).items
        with urllib.request.urlopen(f"http://{pod.status.pod_ip}:9464/metrics", timeout=5) as r:
            text = r.read().decode()
        out: dict[str, tuple[float, int]] = {}
        for phase in ("prepare", "claim_read", "cdi_write"):
            family = f"patchbay_agent_dra_{phase}_seconds"
            values = dict(
                line.split(" ", 1)
                for line in text.splitlines()
                if line.startswith((f"{family}_sum", f"{family}_count"))
            )
            out[phase] = (float(values[f"{family}_sum"]), int(float(values[f"{family}_count"])))
        written = 0.0
        for line in text.splitlines():
            if line.startswith('patchbay_agent_dra_claim_status_writes_total{result="success"}'):
                written = float(line.rsplit(" ", 1)[1])
        out["status_writes"] = (written, 0)
        return out

    @contextlib.contextmanager
    def go_peer(self, tmp: Path, kubeconfig: Path) -> Iterator[Path]:
        """bench/drapeer (the upstream kubeletplugin helper) as a process on the node, talking to
        the API server through ``kubeconfig`` (admin); never registered with the kubelet. Yields
        its DRA socket."""
        binary = subprocess.run(
            [str(find_repo() / "bench" / "drapeer" / "build.sh")], check=True, capture_output=True, text=True
        ).stdout.strip()
        proc = subprocess.Popen(
            [
                binary,
                "--kubeconfig",
                str(kubeconfig),
                "--driver",
                PEER_DRIVER,
                "--node",
                NODE_NAME,
                "--dir",
                str(tmp / f"peer-{kubeconfig.stem}"),
                "--cdi-dir",
                str(tmp / "peer-cdi"),
                "--dev-dir",
                str(FAKE_DEV),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            socket = Path(proc.stdout.readline().strip())
            if not socket.name:
                raise SystemExit("bench: the Go peer did not start")
            yield socket
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def vanish_to_taint(self, profile: str, device: Path) -> dict[str, float]:
        name_of = {d["attributes"]["patchbay.dev/id"]["string"]: n for n, d in self.slice_devices().items()}
        (dev_id,) = [i for i in name_of if i.endswith(device.name)]

        def tainted() -> bool:
            """Out of the scheduler's reach: tainted, or left out of the slice where the API server
            drops device taints (before 1.36, docs/dra.md#releases)."""
            devices = self.slice_devices()
            if not devices:
                return False
            dev = devices.get(name_of[dev_id])
            return dev is None or any(t["key"] == "patchbay.dev/vanished" for t in dev.get("taints") or [])

        def report_unhealthy() -> bool:
            rep = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, "patchbay-system", "devicereports", f"{profile}.{NODE_NAME}"
            )
            return any(d["id"] == dev_id and d["health"] != "Healthy" for d in rep["devices"])

        rdev = device.stat().st_rdev
        t0 = time.monotonic()
        device.unlink()
        pending = {"taint": tainted, "report": report_unhealthy}
        out: dict[str, float] = {}
        while pending and time.monotonic() < t0 + 120:
            for key, check in list(pending.items()):
                if check():
                    out[key] = time.monotonic() - t0
                    del pending[key]
            time.sleep(0.02)
        if pending:
            (pod,) = self.core.list_namespaced_pod(
                "patchbay-system", label_selector=f"patchbay.dev/profile={profile}"
            ).items
            logs = self.core.read_namespaced_pod_log(pod.metadata.name, "patchbay-system", tail_lines=30)
            raise SystemExit(
                f"bench: timed out waiting for {sorted(pending)}; the device in the slice: "
                f"{self.slice_devices().get(name_of[dev_id])}\nthe agent's last log lines:\n{logs}"
            )
        # Back: the taint goes once the device's checks kept passing for the profile's recovery
        # hold (recoveryHoldSeconds, 10 s by default: docs/dra.md#resourceslices).
        os.mknod(device, 0o666 | 0o020000, rdev)
        t1 = time.monotonic()
        back = {"untaint": lambda: not tainted(), "report_back": lambda: not report_unhealthy()}
        while back and time.monotonic() < t1 + 120:
            for key, check in list(back.items()):
                if check():
                    out[key] = time.monotonic() - t1
                    del back[key]
            time.sleep(0.02)
        if back:
            raise SystemExit(f"bench: timed out waiting for {sorted(back)} after the device came back")
        return out

    def agent_memory(self, profile: str) -> tuple[float, float]:
        (pod,) = self.core.list_namespaced_pod(
            "patchbay-system", label_selector=f"patchbay.dev/profile={profile}"
        ).items
        root = self.cluster.real_node().cgroup_dir()
        (pod_dir,) = [d for d in root.rglob(f"pod{pod.metadata.uid}") if d.is_dir()]
        rss = pss = 0.0
        for procs in pod_dir.rglob("cgroup.procs"):
            for pid in procs.read_text().split():
                if Path(f"/proc/{pid}/comm").read_text().strip() == "pause":
                    continue
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    key, _, rest = line.partition(":")
                    if key == "Rss":
                        rss += int(rest.split()[0]) / 1024
                    elif key == "Pss":
                        pss += int(rest.split()[0]) / 1024
        return rss, pss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="device removals (default: %(default)s)")
    ap.add_argument("--claims", type=int, default=100, help="claims prepared (default: %(default)s)")
    ap.add_argument(
        "--agent-cpu",
        default="",
        help="then measure prepare again with the agent pod requesting this much CPU, e.g. 250m "
        "(default: not measured; the agent asks for 10m)",
    )
    args = ap.parse_args()
    repo = find_repo()
    images = build_all(repo)
    profile = "bench-dra"
    driver = f"{profile}.patchbay.dev"
    with tempfile.TemporaryDirectory(prefix="pb-bench-dra-") as tmp:
        cluster = DevCluster(Path(tmp) / "c", find_bin_dir())
        cluster.up()
        try:
            cluster.start_real_node()
            helm_install(
                cluster, repo / "charts" / "patchbay", images, {"operator": {"statusDebounceSeconds": 0.3}}
            )
            b = Bench(cluster, driver)
            b.core.patch_node(NODE_NAME, {"metadata": {"labels": {"patchbay.dev/bench-dra": "yes"}}})
            FAKE_DEV.mkdir(exist_ok=True)
            for i in range(DEVICES):
                os.mknod(FAKE_DEV / f"dra{i}", 0o666 | 0o020000, os.makedev(1, 3))
            b.custom.create_cluster_custom_object(
                GROUP,
                VERSION,
                PLURAL,
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "DevicePluginProfile",
                    "metadata": {"name": profile},
                    "spec": {
                        "resourceName": "bench.patchbay.dev/dra",
                        "mode": "DRA",
                        "nodeSelector": {"matchLabels": {"patchbay.dev/bench-dra": "yes"}},
                        "plugin": {
                            "discovery": {"paths": {"globs": [f"{FAKE_DEV}/dra*"]}},
                            "health": {"periodSeconds": 1, "failureThreshold": 1},
                        },
                        # Agent settings of its own: a DaemonSet of its own (one agent pod to
                        # measure), as before profiles without them shared the node agent.
                        "agent": {"updateStrategy": {"maxSurge": 1, "maxUnavailable": 0}},
                    },
                },
            )
            wait(lambda: len(b.slice_devices()) == DEVICES)
            time.sleep(10)  # start-up settles before memory is read
            rss, pss = b.agent_memory(profile)
            print(f"\n== The DRA agent pod (reports on) ==\nprocess RSS {rss:.1f} MiB, PSS {pss:.1f} MiB")

            print(f"\n== NodePrepareResources, one claim per call, {args.claims} claims ==")
            names = sorted(b.slice_devices())
            before = b.agent_phase_sums(profile)
            prep, unprep = b.prepare_figures("agent", driver, b.service_socket(), names, args.claims)
            after = b.agent_phase_sums(profile)
            files = sorted(p.name for p in FAKE_DEV.iterdir())
            relay = b.relay_kubeconfig(Path(tmp))
            peers: dict[str, tuple[list[float], list[float]]] = {}
            for way, kubeconfig in (("loopback", cluster.kubeconfig), ("relay", relay)):
                with b.go_peer(Path(tmp), kubeconfig) as peer_socket:
                    peers[way] = b.prepare_figures(
                        f"peer-{way}", PEER_DRIVER, peer_socket, files, args.claims
                    )
            claim_names = [f"bench-gets-{i}" for i in range(args.claims)]
            for i, name in enumerate(claim_names):
                b.allocated_claim(name, driver, names[i % len(names)])
            gets = {
                way: b.claim_gets(k, claim_names)
                for way, k in (("loopback", cluster.kubeconfig), ("relay", relay))
            }
            agent_client = b.agent_client_gets(relay, claim_names)
            for name in claim_names:
                b.custom.delete_namespaced_custom_object(RG, RV, NAMESPACE, "resourceclaims", name)

            print(f"Patchbay agent pod (API server via the relay)      {ms(prep)}")
            for way in ("relay", "loopback"):
                print(f"Go peer (kubeletplugin), same work, via {way:<9}  {ms(peers[way][0])}")
            for way in ("relay", "loopback"):
                p50, p99 = (pct(prep, q) / pct(peers[way][0], q) for q in (0.5, 0.99))
                print(f"ratio agent / Go peer via {way:<9}: p50 {p50:.2f}, p99 {p99:.2f}")
            for way in ("loopback", "relay"):
                print(f"a GET of a claim from this process via {way:<9}  {ms(gets[way])}")
            print(f"the agent's client from this process via relay    {ms(agent_client['direct'])}")
            print(f"  the same, called through a worker thread         {ms(agent_client['thread'])}")
            print(f"  apiget on the event loop (what prepare uses)     {ms(agent_client['loop'])}")
            print(f"Patchbay agent pod: unprepare                      {ms(unprep)}")
            for way in ("relay", "loopback"):
                print(f"Go peer via {way:<9}: unprepare                  {ms(peers[way][1])}")

            print("\n== Where the agent's prepare time goes (its own histograms, means per call) ==")
            writes = after.pop("status_writes")[0] - before.pop("status_writes")[0]
            print(f"(claims' status.devices written meanwhile, in the background: {writes:.0f})")
            means = {
                phase: (after[phase][0] - before[phase][0]) / max(1, after[phase][1] - before[phase][1])
                for phase in after
            }
            rpc = statistics.mean(prep)
            parts = [
                ("the claim's GET, as prepare waits for it", means["claim_read"]),
                ("the CDI spec write", means["cdi_write"]),
                (
                    "the rest of the handler (lock, decode, checks, answer)",
                    means["prepare"] - means["claim_read"] - means["cdi_write"],
                ),
                ("gRPC and the Unix socket, both ends (the call minus the handler)", rpc - means["prepare"]),
            ]
            for what, value in parts:
                print(f"{what:<66} {value * 1000:6.2f} ms  {value / rpc:6.1%}")
            print(f"{'the call as this process times it (mean)':<66} {rpc * 1000:6.2f} ms")

            if args.agent_cpu:
                print(f"\n== The same, the agent pod requesting cpu {args.agent_cpu} (default 10m) ==")
                b.set_agent_cpu(profile, args.agent_cpu)
                cprep, cunprep = b.prepare_figures(
                    "agent-cpu", driver, b.service_socket(), names, args.claims
                )
                print(f"Patchbay agent pod, cpu {args.agent_cpu:<6} prepare      {ms(cprep)}")
                p50, p99 = (pct(cprep, q) / pct(peers["relay"][0], q) for q in (0.5, 0.99))
                print(f"ratio agent / Go peer via relay (its run above): p50 {p50:.2f}, p99 {p99:.2f}")
                print(f"Patchbay agent pod, cpu {args.agent_cpu:<6} unprepare    {ms(cunprep)}")

            print(f"\n== A device vanishes -> its taint in the API, and back (median of {args.runs}) ==")
            runs = []
            for i in range(args.runs):
                if i:
                    # Quiet for the flap window first: removals closer together are a flapping
                    # device, held Unhealthy with the patchbay.dev/flapping taint (by design).
                    time.sleep(FLAP_WINDOW + 1)
                runs.append(b.vanish_to_taint(profile, FAKE_DEV / "dra1"))
            for key, what in (
                ("taint", "ResourceSlice device tainted (or left out)"),
                ("report", "baseline: the DeviceReport says unhealthy"),
                ("untaint", "back -> the taint gone (10 s recovery hold)"),
                ("report_back", "back -> the DeviceReport says Healthy"),
            ):
                xs = [r[key] for r in runs]
                print(f"{what:<44} {statistics.median(xs):6.2f} s   runs {[round(x, 2) for x in xs]}")
        finally:
            cluster.down()
            shutil.rmtree(FAKE_DEV, ignore_errors=True)


if __name__ == "__main__":
    main()
