"""``kubectl patchbay`` at scale: how long each command takes on a cluster of N kwok nodes.

Starts its own local cluster (real etcd + kube-apiserver + controllers + kwok) with N kwok nodes
and fills it with what a real cluster of Patchbay holds at that size: a DevicePlugin profile and a
Static profile selecting every node; the DevicePlugin profile's agent DaemonSet (kwok runs its N
pods; no operator, so nothing else writes meanwhile); N DeviceReports of 4 devices each, 1% of
the devices Unhealthy with a reason, a quarter held by a pod; the Static count in each node's
capacity and allocatable. Then runs each command ROUNDS times, as a user does (a fresh
``kubectl-patchbay`` process), and prints the median and worst wall time, the rows printed and the
process's CPU time (user + system); beside them, the baseline of reading the same objects with kubectl itself
(``kubectl get devicereports -o json`` and ``kubectl get nodes -o json``), which still leaves the
joining to the reader. Prints figures; asserts nothing.

    export PATCHBAY_KUBE_BIN=$(hack/kube-binaries.sh --print-bin-dir)
    .venv/bin/python bench/kubectl_scale.py --nodes 5000
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from patchbay_devcluster import DevCluster, find_bin_dir

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "patchbay-system"
LABEL = "bench.patchbay.dev/kubectl"
DP, STATIC = "serial", "dongle"
R_DP, R_STATIC = "example.com/serial", "example.com/dongle"
DEVICES = 4


def report(node: str, i: int) -> dict[str, Any]:
    devices = []
    for d in range(DEVICES):
        dev: dict[str, Any] = {"id": f"ttyUSB{d}", "health": "Healthy", "since": "2026-11-01T00:00:00Z"}
        if (i * DEVICES + d) % 100 == 0:
            dev.update(health="Unhealthy", reason="Vanished", message=f"/dev/ttyUSB{d} is gone")
        if d == 0 and i % 4 == 0:
            dev["pods"] = [{"namespace": "apps", "name": f"modem-{i}", "container": "c"}]
        devices.append(dev)
    healthy = sum(1 for d in devices if d["health"] == "Healthy")
    return {
        "apiVersion": "patchbay.dev/v1beta1",
        "kind": "DeviceReport",
        "metadata": {"name": f"{DP}.{node}", "namespace": NAMESPACE, "labels": {"patchbay.dev/profile": DP}},
        "profile": DP,
        "nodeName": node,
        "resourceName": R_DP,
        "observedAt": "2026-11-01T00:00:00Z",
        "summary": {
            "total": DEVICES,
            "healthy": healthy,
            "unhealthy": DEVICES - healthy,
            "allocated": sum(1 for d in devices if d.get("pods")),
        },
        "devices": devices,
    }


def daemonset() -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": "patchbay-agent", "patchbay.dev/profile": DP}
    return {
        "metadata": {"name": f"patchbay-{DP}", "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {LABEL: "1"},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "agent", "image": "example.invalid/patchbay-agent:bench"}],
                },
            },
        },
    }


def profile(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "patchbay.dev/v1beta1",
        "kind": "DevicePluginProfile",
        "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {LABEL: "1"}}, **spec},
    }


def run(argv: list[str], env: dict[str, str]) -> tuple[float, int, float, int]:
    """(wall seconds, exit code, CPU seconds (user + system), lines printed) of one command. CPU
    time is the figure to compare on a loaded machine: wall time there includes waiting for a core."""
    with tempfile.TemporaryFile() as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        lines = sum(1 for _ in out)
    return wall, proc.returncode, usage.ru_utime + usage.ru_stime, lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--state-dir", type=Path, default=None)
    args = ap.parse_args()

    bin_dir = find_bin_dir(os.environ.get("PATCHBAY_KUBE_BIN"))
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="patchbay-bench-kubectl-"))
    cluster = DevCluster(state, bin_dir)
    print(
        f"kubectl patchbay benchmark: {args.nodes} kwok nodes, {args.rounds} rounds, state {state}",
        flush=True,
    )
    t = time.monotonic()
    cluster.up(timeout=180)
    try:
        names = cluster.add_kwok_nodes(args.nodes, prefix="kb-", labels={LABEL: "1"}, workers=16)
        cluster.wait_nodes_ready(args.nodes, label_selector=f"{LABEL}=1", timeout=max(300, args.nodes / 5))
        print(f"  cluster + {args.nodes} Ready nodes in {time.monotonic() - t:.1f} s", flush=True)
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        ext, core = client.ApiextensionsV1Api(api), client.CoreV1Api(api)
        custom, apps = client.CustomObjectsApi(api), client.AppsV1Api(api)
        for crd in ("patchbay.dev_devicepluginprofiles.yaml", "patchbay.dev_devicereports.yaml"):
            ext.create_custom_resource_definition(yaml.safe_load((REPO / "crds" / crd).read_text()))
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        time.sleep(5)  # the new API group reaches discovery
        custom.create_cluster_custom_object(
            "patchbay.dev",
            "v1beta1",
            "devicepluginprofiles",
            profile(
                DP,
                {
                    "resourceName": R_DP,
                    "mode": "DevicePlugin",
                    "plugin": {"discovery": {"virtual": {"count": 4}}},
                },
            ),
        )
        custom.create_cluster_custom_object(
            "patchbay.dev",
            "v1beta1",
            "devicepluginprofiles",
            profile(STATIC, {"resourceName": R_STATIC, "mode": "Static", "static": {"capacity": 3}}),
        )
        apps.create_namespaced_daemon_set(NAMESPACE, daemonset())

        t = time.monotonic()
        esc = R_STATIC.replace("/", "~1")

        def fill(item: tuple[int, str]) -> None:
            i, node = item
            custom.create_namespaced_custom_object(
                "patchbay.dev", "v1beta1", NAMESPACE, "devicereports", report(node, i)
            )
            ops = [
                {"op": "add", "path": f"/status/capacity/{esc}", "value": "3"},
                {"op": "add", "path": f"/status/allocatable/{esc}", "value": "3"},
            ]
            core.patch_node_status(node, ops, _content_type="application/json-patch+json")

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(fill, enumerate(names)))
        print(
            f"  {args.nodes} DeviceReports + static capacity written in {time.monotonic() - t:.1f} s",
            flush=True,
        )
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            ds = apps.read_namespaced_daemon_set(f"patchbay-{DP}", NAMESPACE)
            if (ds.status.number_ready or 0) >= args.nodes:
                break
            time.sleep(2)
        print(f"  agent pods ready: {ds.status.number_ready}/{args.nodes}", flush=True)

        env = {**os.environ, "PATH": f"{REPO / '.venv' / 'bin'}:{bin_dir}:{os.environ['PATH']}"}
        env["KUBECONFIG"] = str(cluster.kubeconfig)
        plugin = str(REPO / ".venv" / "bin" / "kubectl-patchbay")
        kubectl = str(bin_dir / "kubectl")
        commands = {
            "devices (every device, 3 profiles' worth)": [plugin, "devices"],
            "devices --unhealthy": [plugin, "devices", "--unhealthy"],
            "devices --node N": [plugin, "devices", "--node", names[len(names) // 2]],
            "nodes": [plugin, "nodes"],
            "nodes --node N": [plugin, "nodes", "--node", names[len(names) // 2]],
            f"why {DP}": [plugin, "why", DP],
            "baseline: kubectl get devicereports -o json": [
                kubectl,
                "get",
                "devicereports",
                "-n",
                NAMESPACE,
                "-o",
                "json",
            ],
            "baseline: kubectl get nodes -o json": [kubectl, "get", "nodes", "-o", "json"],
        }
        print(
            f"\n| command ({args.nodes} nodes, {args.rounds} runs) "
            "| median s | worst s | median CPU s | lines |"
        )
        print("| --- | --- | --- | --- | --- |")
        medians: dict[str, float] = {}
        for label, argv in commands.items():
            runs = [run(argv, env) for _ in range(args.rounds)]
            bad = [r[1] for r in runs if r[1] != 0]
            walls = [r[0] for r in runs]
            medians[label] = statistics.median(walls)
            print(
                f"| {label} | {statistics.median(walls):.2f} | {max(walls):.2f} | "
                f"{statistics.median(r[2] for r in runs):.2f} | {runs[-1][3]}"
                f"{' EXIT ' + str(bad) if bad else ''} |",
                flush=True,
            )
        load = os.getloadavg()[0]
        print(f"\nload average: {load:.2f} (2-core machine shared with others)")
        sys.path.insert(0, str(Path(__file__).parent))
        import plots

        path = plots.bars(
            plots.IMG / f"kubectl-patchbay-{args.nodes}.png",
            f"kubectl patchbay at {args.nodes:,} kwok nodes: median wall time",
            medians,
            note=f"bench/kubectl_scale.py --nodes {args.nodes}, {args.rounds} runs each, "
            f"load average {load:.1f}",
        )
        print(f"wrote {path.relative_to(REPO)}")
    finally:
        cluster.down(purge=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
