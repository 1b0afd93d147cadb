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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
from kubernetes import client, config

from patchbay_agent.api import dra_v1_pb2, dra_v1_pb2_grpc
from patchbay_devcluster import DevCluster, find_bin_dir
from patchbay_devcluster.imagebuild import build_all, find_repo
from patchbay_devcluster.install import helm_install
from patchbay_devcluster.node import NODE_NAME

GROUP, VERSION, PLURAL = "patchbay.dev", "v1alpha1", "devicepluginprofiles"
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
    return f"p50 {pct(xs, 0.5) * 1000:6.2f} ms  p99 {pct(xs, 0.99) * 1000:6.2f} ms"


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
        self.custom.patch_namespaced_custom_object_status(
            RG,
            RV,
            NAMESPACE,
            "resourceclaims",
            name,
            {"status": {"allocation": {"devices": {"results": [result]}}}},
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
    ) -> tuple[list[float], list[float], list[float]]:
        """NodePrepareResources and NodeUnprepareResources on ``socket`` for ``claims`` fresh
        claims of ``driver`` (one call per claim, as the kubelet makes one per pod), and a GET of
        each claim from this process."""
        made = [(f"bench-{tag}-{i}", devices[i % len(devices)]) for i in range(claims)]
        uids = {name: self.allocated_claim(name, driver, dev) for name, dev in made}

        get: list[float] = []
        for name, _ in made:
            t0 = time.perf_counter()
            self.custom.get_namespaced_custom_object(RG, RV, NAMESPACE, "resourceclaims", name)
            get.append(time.perf_counter() - t0)

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
        return prep, unprep, get

    @contextlib.contextmanager
    def go_peer(self, tmp: Path) -> Iterator[Path]:
        """bench/drapeer (the upstream kubeletplugin helper) as a process on the node, with the
        admin kubeconfig; never registered with the kubelet. Yields its DRA socket."""
        binary = subprocess.run(
            [str(find_repo() / "bench" / "drapeer" / "build.sh")], check=True, capture_output=True, text=True
        ).stdout.strip()
        proc = subprocess.Popen(
            [
                binary,
                "--kubeconfig",
                str(self.cluster.kubeconfig),
                "--driver",
                PEER_DRIVER,
                "--node",
                NODE_NAME,
                "--dir",
                str(tmp / "peer"),
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
            raise SystemExit(f"bench: timed out waiting for {sorted(pending)}")
        os.mknod(device, 0o666 | 0o020000, rdev)
        wait(lambda: not tainted() and not report_unhealthy())
        return out

    def agent_memory(self, profile: str) -> tuple[float, float]:
        (pod,) = self.core.list_namespaced_pod(
            "patchbay-system", label_selector=f"patchbay.dev/profile={profile}"
        ).items
        root = Path("/sys/fs/cgroup/memory") / self.cluster.real_node().cgroup_root.lstrip("/")
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
                    },
                },
            )
            wait(lambda: len(b.slice_devices()) == DEVICES)
            time.sleep(10)  # start-up settles before memory is read
            rss, pss = b.agent_memory(profile)
            print(f"\n== The DRA agent pod (reports on) ==\nprocess RSS {rss:.1f} MiB, PSS {pss:.1f} MiB")

            print(f"\n== NodePrepareResources, one claim per call, {args.claims} claims ==")
            names = sorted(b.slice_devices())
            prep, unprep, get = b.prepare_figures("agent", driver, b.service_socket(), names, args.claims)
            with b.go_peer(Path(tmp)) as peer_socket:
                files = sorted(p.name for p in FAKE_DEV.iterdir())
                gprep, gunprep, gget = b.prepare_figures("peer", PEER_DRIVER, peer_socket, files, args.claims)
            print(f"Patchbay agent pod: prepare (GET + CDI spec)  {ms(prep)}")
            print(f"Go peer (kubeletplugin), same work            {ms(gprep)}")
            p50, p99 = (pct(prep, q) / pct(gprep, q) for q in (0.5, 0.99))
            print(f"ratio agent / Go peer: p50 {p50:.2f}, p99 {p99:.2f}")
            print(f"a GET of the claim from this process          {ms(get + gget)}")
            print(f"Patchbay agent pod: unprepare                 {ms(unprep)}")
            print(f"Go peer: unprepare                            {ms(gunprep)}")

            print(f"\n== A device vanishes -> its taint in the API (median of {args.runs}) ==")
            runs = [b.vanish_to_taint(profile, FAKE_DEV / "dra1") for _ in range(args.runs)]
            for key, what in (
                ("taint", "ResourceSlice device tainted (or left out)"),
                ("report", "baseline: the DeviceReport says unhealthy"),
            ):
                xs = [r[key] for r in runs]
                print(f"{what:<44} {statistics.median(xs):6.2f} s   runs {[round(x, 2) for x in xs]}")
        finally:
            cluster.down()
            shutil.rmtree(FAKE_DEV, ignore_errors=True)


if __name__ == "__main__":
    main()
