"""Patchbay on the user's path, measured: images, apply -> allocatable, agent pod memory, rollout.

Starts a cluster of its own (control plane + the real node with its pod network), installs the
chart with the images built here, and prints:

- images: size of each OCI archive and of each image as podman stores it; a warm build (cache
  hit), a rebuild of each program on a cached base, and with ``--cold`` also the base itself;
- ``kubectl apply`` of a profile -> allocatable on the real node, median of ``--runs`` (5):
  Static (baseline: this script patching the node's status itself, the floor for putting a
  value there) and DevicePlugin (baseline: the same agent with the same config started as a
  process on the node, what a bare device plugin costs without the operator, DaemonSet, image
  and pod around it);
- the agent pod's memory from its cgroup, beside the requests of Intel's plugins (15-45 Mi)
  and squat/generic-device-plugin (10-20 Mi);
- a device file removed on the node -> the kubelet counts it out (baseline), the agent's
  DeviceReport says Unhealthy, the profile's status names it, median of ``--runs``;
- one rollout of the agent DaemonSet (tests/e2e/rollout.py): minimum allocatable seen from the
  API server and from the kubelet, registrations, time to complete.

Run (root; one real node per machine, so no demo cluster at the same time):
    PATCHBAY_KUBE_BIN=$(hack/kube-binaries.sh --print-bin-dir) .venv/bin/python bench/cluster_path.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests")]

import yaml  # noqa: E402
from kubernetes import client, config  # noqa: E402
from support.rollout import run_rollout  # noqa: E402

from patchbay_agent.kubelet.podresources import get_allocatable_resources  # noqa: E402
from patchbay_devcluster import DevCluster, find_bin_dir  # noqa: E402
from patchbay_devcluster.imagebuild import PROGRAMS, base_image, build_all, build_program, find_repo  # noqa: E402
from patchbay_devcluster.install import helm_install  # noqa: E402
from patchbay_devcluster.node import NODE_NAME  # noqa: E402

GROUP, VERSION, PLURAL = "patchbay.dev", "v1beta1", "devicepluginprofiles"
FAKE_DEV = Path("/dev/patchbay-bench")
DEVICES = 4


def now() -> float:
    return time.monotonic()


def wait(check: Callable[[], Any], timeout: float = 180, every: float = 0.02) -> Any:
    deadline = now() + timeout
    while now() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every)
    raise SystemExit("bench: timed out")


def podman_size(ref: str) -> str:
    out = subprocess.run(
        ["podman", "image", "inspect", ref, "--format", "{{.Size}}"], capture_output=True, text=True
    )
    return f"{int(out.stdout.strip()) / 1e6:.0f} MB" if out.returncode == 0 else "?"


def images_figures(cold: bool) -> None:
    print("\n== Images (podman, local Debian base) ==")
    repo = find_repo(REPO)
    if cold:
        base = base_image()
        subprocess.run(["podman", "rmi", "--force", base], capture_output=True)
        t0 = now()
        base_image()
        print(f"cold base (mmdebstrap bookworm + python3, podman import): {now() - t0:6.1f} s")
    base = base_image()
    for program in PROGRAMS:
        built = build_program(repo, program, base, force=True)
        print(
            f"{program.name:<9} rebuild on a cached base: {built.seconds:6.1f} s   "
            f"archive {built.size_bytes / 1e6:4.0f} MB   image {podman_size(built.ref)}   {built.ref}"
        )
    t0 = now()
    build_all(repo)
    print(f"warm (both cached, inputs hashed):  {now() - t0:6.2f} s")


class Bench:
    def __init__(self, cluster: DevCluster, runs: int) -> None:
        self.cluster, self.runs = cluster, runs
        self.api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        self.core, self.custom = client.CoreV1Api(self.api), client.CustomObjectsApi(self.api)
        self.kubectl = [str(find_bin_dir() / "kubectl"), "--kubeconfig", str(cluster.kubeconfig)]

    def allocatable(self, resource: str) -> str | None:
        raw = self.core.read_node_status(NODE_NAME, _preload_content=False)
        return (json.loads(raw.data)["status"].get("allocatable") or {}).get(resource)

    def apply(self, body: dict[str, Any]) -> None:
        subprocess.run(
            [*self.kubectl, "apply", "-f", "-"],
            input=json.dumps(body),
            text=True,
            check=True,
            capture_output=True,
        )

    def delete(self, name: str, resource: str) -> None:
        subprocess.run([*self.kubectl, "delete", "dpp", name, "--wait=true"], check=True, capture_output=True)
        wait(lambda: self.allocatable(resource) in (None, "0"))

    def profile(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "DevicePluginProfile",
            "metadata": {"name": name},
            "spec": spec,
        }

    def kubelet_count(self, resource: str) -> int:
        """The kubelet device manager's allocatable count (PodResources), before any status sync."""
        socket = self.cluster.real_node().paths.pod_resources_socket
        try:
            return asyncio.run(get_allocatable_resources(socket, rpc_timeout=2)).count(resource)
        except Exception:
            return 0

    def apply_to_allocatable(
        self, name: str, resource: str, spec: dict[str, Any], want: str, kubelet: list[float] | None = None
    ) -> list[float]:
        """Seconds from ``kubectl apply`` to the node's allocatable; with ``kubelet``, also to the
        kubelet's own count (appended there)."""
        out = []
        for i in range(self.runs):
            body = self.profile(f"{name}-{i}", spec)
            t0 = now()
            self.apply(body)
            if kubelet is not None:
                wait(lambda: self.kubelet_count(resource) == int(want))
                kubelet.append(now() - t0)
            wait(lambda: self.allocatable(resource) == want)
            out.append(now() - t0)
            self.delete(f"{name}-{i}", resource)
        return out

    def static_baseline(self, resource: str) -> list[float]:
        """``kubectl patch`` of the node's status: one command, like the ``kubectl apply``."""
        esc = resource.replace("/", "~1")
        out = []
        for _ in range(self.runs):
            ops = [
                {"op": "add", "path": f"/status/capacity/{esc}", "value": "4"},
                {"op": "add", "path": f"/status/allocatable/{esc}", "value": "4"},
            ]
            patch = [*self.kubectl, "patch", "node", NODE_NAME, "--subresource=status", "--type=json"]
            t0 = now()
            subprocess.run([*patch, "-p", json.dumps(ops)], check=True, capture_output=True)
            wait(lambda: self.allocatable(resource) == "4")
            out.append(now() - t0)
            rm = [{"op": "remove", "path": f"/status/{k}/{esc}"} for k in ("capacity", "allocatable")]
            self.core.patch_node_status(NODE_NAME, rm, _content_type="application/json-patch+json")
            wait(lambda: self.allocatable(resource) is None)
        return out

    def plugin_baseline(
        self, resource: str, plugin: dict[str, Any], tmp: Path, kubelet: list[float]
    ) -> list[float]:
        """The same agent and config as a process on the node: a bare device plugin's cost."""
        cfg = tmp / "agent.yaml"
        cfg.write_text(yaml.safe_dump({"resourceName": resource, "plugin": plugin}))
        out = []
        for _ in range(self.runs):
            t0 = now()
            proc = subprocess.Popen(
                [sys.executable, "-m", "patchbay_agent.main", "--config", str(cfg), "--node-name", NODE_NAME,
                 "--http-address", "off"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            try:
                wait(lambda: self.kubelet_count(resource) == DEVICES)
                kubelet.append(now() - t0)
                wait(lambda: self.allocatable(resource) == str(DEVICES))
                out.append(now() - t0)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(15)
            # The kubelet keeps a vanished plugin's resource at 0; the next run starts from there.
            wait(lambda: self.allocatable(resource) in (None, "0"))
        return out

    def vanish_to_status(self, profile: str, resource: str, device: Path) -> dict[str, float]:
        """Seconds from a device file's removal to: the kubelet's device manager counting one
        fewer (the baseline: what the kubelet itself learns from the agent's ListAndWatch), the
        agent's DeviceReport calling it unhealthy, and the profile's status naming it; then the
        device comes back and everything is waited healthy again."""
        report_name = f"{profile}.{NODE_NAME}"

        def report_unhealthy() -> bool:
            rep = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, "patchbay-system", "devicereports", report_name
            )
            return any(d["id"].endswith(device.name) and d["health"] != "Healthy" for d in rep["devices"])

        def status_names() -> bool:
            prof = self.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, profile)
            problems = (prof.get("status") or {}).get("problems") or []
            return any(p.get("device", "").endswith(device.name) for p in problems)

        rdev = device.stat().st_rdev
        t0 = now()
        device.unlink()
        out: dict[str, float] = {}
        pending = {
            "kubelet": lambda: self.kubelet_count(resource) == DEVICES - 1,
            "report": report_unhealthy,
            "status": status_names,
        }
        deadline = t0 + 120
        while pending and now() < deadline:
            for key, check in list(pending.items()):
                if check():
                    out[key] = now() - t0
                    del pending[key]
            time.sleep(0.02)
        if pending:
            raise SystemExit(f"bench: timed out waiting for {sorted(pending)} after a device vanished")
        os.mknod(device, 0o666 | 0o020000, rdev)

        def healthy_again() -> bool:
            # The Node's allocatable too: it lags the kubelet by its 10 s status sync, and the
            # rollout measured next would otherwise start from a stale 3.
            full = self.allocatable(resource) == str(DEVICES)
            return (
                full
                and self.kubelet_count(resource) == DEVICES
                and not report_unhealthy()
                and not status_names()
            )

        wait(healthy_again)
        return out

    def agent_memory(self, profile: str) -> dict[str, float]:
        """The agent pod's memory in MiB, three ways (they answer different questions):

        - ``rss``/``pss``: the agent process's resident set and proportional set (smaps_rollup),
          shared libraries included: what the process really holds;
        - ``cgroup_rss``/``cgroup_usage``: what the pod's memory cgroup is charged (v1:
          ``total_rss`` and ``memory.usage_in_bytes``; v2: ``anon`` and ``memory.current``), which
          is what limits and evictions see. Pages of the image's files that another cgroup touched
          first (containerd unpacking the image) are not charged here, so this reads lower.
        """
        pods = self.core.list_namespaced_pod(
            "patchbay-system",
            label_selector=f"app.kubernetes.io/name=patchbay-agent,patchbay.dev/profile={profile}",
        ).items
        uid = pods[0].metadata.uid
        root = self.cluster.real_node().cgroup_dir()
        (pod_dir,) = [d for d in root.rglob(f"pod{uid}") if d.is_dir()]
        stat = dict(line.split() for line in (pod_dir / "memory.stat").read_text().splitlines())
        v2 = (pod_dir / "memory.current").exists()
        usage = int((pod_dir / ("memory.current" if v2 else "memory.usage_in_bytes")).read_text())
        out = {
            "cgroup_rss": int(stat["anon" if v2 else "total_rss"]) / 2**20,
            "cgroup_usage": usage / 2**20,
            "rss": 0.0,
            "pss": 0.0,
        }
        for procs in pod_dir.rglob("cgroup.procs"):
            for pid in procs.read_text().split():
                if Path(f"/proc/{pid}/comm").read_text().strip() == "pause":
                    continue
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    key, _, rest = line.partition(":")
                    if key in ("Rss", "Pss"):
                        out[key.lower()] += int(rest.split()[0]) / 1024
        return out


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def report(what: str, ours: list[float], baseline_name: str, baseline: list[float]) -> None:
    print(
        f"{what:<38} {median(ours):6.2f} s   baseline ({baseline_name}) {median(baseline):6.2f} s   "
        f"ratio {median(ours) / median(baseline):5.1f}   runs {[round(x, 2) for x in ours]}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cold", action="store_true", help="also rebuild the base image from nothing")
    ap.add_argument("--settle", type=float, default=60.0, help="seconds sampled after the rollout")
    args = ap.parse_args()
    images_figures(args.cold)
    images = build_all(REPO)
    with tempfile.TemporaryDirectory(prefix="pb-bench-") as tmp_str:
        tmp = Path(tmp_str)
        cluster = DevCluster(tmp / "c", find_bin_dir())
        cluster.up()
        try:
            cluster.start_real_node()
            helm_install(
                cluster, REPO / "charts" / "patchbay", images, {"operator": {"statusDebounceSeconds": 0.3}}
            )
            b = Bench(cluster, args.runs)
            b.core.patch_node(NODE_NAME, {"metadata": {"labels": {"patchbay.dev/bench": "yes"}}})
            selector = {"matchLabels": {"patchbay.dev/bench": "yes"}}
            FAKE_DEV.mkdir(exist_ok=True)
            for i in range(DEVICES):
                os.mknod(FAKE_DEV / f"ttyB{i}", 0o666 | 0o020000, os.makedev(1, 3))
            plugin = {
                "discovery": {"paths": {"globs": [f"{FAKE_DEV}/ttyB*"]}},
                "health": {"periodSeconds": 5},
            }

            print(f"\n== kubectl apply -> allocatable on the real node (median of {args.runs}) ==")
            static_spec = {
                "resourceName": "bench.patchbay.dev/dongle",
                "mode": "Static",
                "nodeSelector": selector,
                "static": {"capacity": 4},
            }
            static_base = b.static_baseline("bench.patchbay.dev/direct")
            static = b.apply_to_allocatable("bench-static", "bench.patchbay.dev/dongle", static_spec, "4")
            report("Static, node allocatable", static, "kubectl patch of the node's status", static_base)
            plugin_spec = {
                "resourceName": "bench.patchbay.dev/serial",
                "mode": "DevicePlugin",
                "nodeSelector": selector,
                "plugin": plugin,
            }
            kubelet_base: list[float] = []
            kubelet_dp: list[float] = []
            plugin_base = b.plugin_baseline("bench.patchbay.dev/bare", plugin, tmp, kubelet_base)
            dp = b.apply_to_allocatable(
                "bench-serial", "bench.patchbay.dev/serial", plugin_spec, str(DEVICES), kubelet_dp
            )
            report("DevicePlugin, kubelet (PodResources)", kubelet_dp, "the agent as a process", kubelet_base)
            report("DevicePlugin, node allocatable", dp, "the agent as a process", plugin_base)

            print("\n== The agent pod's memory (cgroup) and the rollout ==")
            name, resource = "bench-roll", "bench.patchbay.dev/roll"
            b.apply(b.profile(name, {**plugin_spec, "resourceName": resource}))
            wait(lambda: b.allocatable(resource) == str(DEVICES))
            time.sleep(10)  # let start-up garbage settle before reading memory
            mem = b.agent_memory(name)
            print(
                f"agent pod: process RSS {mem['rss']:.1f} MiB, PSS {mem['pss']:.1f} MiB; "
                f"pod cgroup rss {mem['cgroup_rss']:.1f} MiB, usage {mem['cgroup_usage']:.1f} MiB"
            )
            print("  (requests seen: Intel's plugins 15-45 Mi, squat/generic-device-plugin 10-20 Mi)")

            print(f"\n== A device vanishes -> the profile's status names it (median of {args.runs}) ==")
            runs = [b.vanish_to_status(name, resource, FAKE_DEV / "ttyB1") for _ in range(args.runs)]
            for key, what in (
                ("kubelet", "the kubelet's device manager counts it out (baseline)"),
                ("report", "the agent's DeviceReport says Unhealthy"),
                ("status", "the profile's status names node, device, reason"),
            ):
                xs = [r[key] for r in runs]
                print(f"{what:<56} {median(xs):6.2f} s   runs {[round(x, 2) for x in xs]}")
            ratio = median([r["status"] for r in runs]) / median([r["kubelet"] for r in runs])
            print(f"status / kubelet: {ratio:.1f}")
            result = run_rollout(
                api=b.api,
                namespace="patchbay-system",
                daemonset=f"patchbay-{name}",
                agent_pods=lambda: (
                    b.core.list_namespaced_pod(
                        "patchbay-system", label_selector=f"patchbay.dev/profile={name}"
                    ).items
                ),
                change=lambda: b.custom.patch_cluster_custom_object(
                    GROUP, VERSION, PLURAL, name, {"spec": {"plugin": {"health": {"periodSeconds": 4}}}}
                ),
                node=NODE_NAME,
                resource=resource,
                pod_resources=cluster.real_node().paths.pod_resources_socket,
                kubelet_log=cluster.log_dir / "kubelet.log",
                settle=args.settle,
            )
            f = result.figures()
            print(
                f"rollout: {f['rolloutSeconds']} s to complete, {f['registrations']} registration(s), "
                f"min allocatable {f['minAllocatableApi']} (API) / {f['minAllocatableKubelet']} (kubelet) "
                f"of {DEVICES}, {f['samples']} samples (max gap {f['maxSampleGapMs']} ms)"
            )
        finally:
            cluster.down()
            shutil.rmtree(FAKE_DEV, ignore_errors=True)


if __name__ == "__main__":
    main()
