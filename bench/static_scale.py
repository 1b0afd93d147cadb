"""Static mode at scale: how close the operator gets to what the API server allows.

Starts its own local cluster (real etcd + kube-apiserver + kwok) with N kwok nodes, waits until
every node is Ready (kwok's start-up churn would otherwise load whichever side runs first), then
runs ROUNDS alternating rounds, each in the same conditions:

- baseline apply / remove, with no operator running: a plain concurrent client (the same HTTP
  transport and number of threads as the operator's --concurrency) sending the same
  one-JSON-patch-per-node payload to every node: the floor this API server allows here;
- the operator, started afresh as a subprocess: apply (from creating a Static profile to every
  node showing the value), and delete (from deleting it to every node clean); in the first round
  also drift re-assertion (a value reset on random nodes, until it is back: p50 / p99).

Reported: each round's times and ratios, the medians of each side and their ratio (the
headline), API writes per node per change (the operator's own counters), the operator's CPU
seconds per phase and its peak RSS (VmHWM). "Every node shows X" is observed the same way for
both sides: one raw watch on nodes, decoded as plain JSON. Prints figures; asserts nothing about
timings.

    .venv/bin/python bench/static_scale.py --nodes 1000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests")]

from support.operator import Operator  # noqa: E402

from patchbay_devcluster import DevCluster, find_bin_dir  # noqa: E402
from patchbay_operator.kube import JSON_PATCH, Kube, load_configuration  # noqa: E402

GROUP, VERSION, PLURAL = "patchbay.dev", "v1beta1", "devicepluginprofiles"
BENCH_LABEL = "patchbay.dev/bench"
R_OPERATOR = "example.com/bench"
R_BASELINE = "example.com/baseline"
NAMESPACE = "patchbay-bench"


def esc(s: str) -> str:
    return s.replace("~", "~0").replace("/", "~1")


class Observer:
    """A raw watch on nodes; tells when every bench node shows a given value for a resource."""

    def __init__(self, api: client.ApiClient, nodes: set[str]) -> None:
        self.core = client.CoreV1Api(api)
        self.nodes = nodes
        self.values: dict[str, dict[str, tuple[str | None, str | None]]] = {}
        self.cond = threading.Condition()
        self.events = 0
        self.stopped = False
        raw = self.core.list_node(label_selector=f"{BENCH_LABEL}=1", _preload_content=False)
        data = json.loads(raw.data)
        for n in data["items"]:
            self._fold(n)
        self.rv = data["metadata"]["resourceVersion"]
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _fold(self, node: dict[str, Any]) -> None:
        st = node.get("status") or {}
        cap, alloc = st.get("capacity") or {}, st.get("allocatable") or {}
        self.values[node["metadata"]["name"]] = {
            r: (cap.get(r), alloc.get(r)) for r in (R_OPERATOR, R_BASELINE)
        }

    def _run(self) -> None:
        try:
            self._watch()
        except Exception:
            if not self.stopped:
                raise

    def _watch(self) -> None:
        while not self.stopped:
            resp = self.core.list_node(
                label_selector=f"{BENCH_LABEL}=1",
                watch=True,
                resource_version=self.rv,
                allow_watch_bookmarks=True,
                timeout_seconds=300,
                _preload_content=False,
            )
            buf = b""
            for chunk in resp.stream(65536):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if not line.strip():
                        continue
                    ev = json.loads(line)
                    obj = ev["object"]
                    self.rv = obj["metadata"]["resourceVersion"]
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        with self.cond:
                            self._fold(obj)
                            self.events += 1
                            self.cond.notify_all()

    def wait(
        self, resource: str, value: str | None, names: set[str] | None = None, timeout: float = 900
    ) -> float:
        """Block until every node in ``names`` shows ``value`` in capacity and allocatable."""
        want = (value, value)
        names = names or self.nodes
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                if all(self.values.get(n, {}).get(resource) == want for n in names):
                    return time.monotonic()
                left = deadline - time.monotonic()
                if left <= 0:
                    bad = sum(1 for n in names if self.values.get(n, {}).get(resource) != want)
                    raise TimeoutError(f"{bad} nodes still lack {resource}={value}")
                self.cond.wait(min(left, 1.0))

    def wait_node(self, name: str, resource: str, value: str, timeout: float = 60) -> float:
        return self.wait(resource, value, {name}, timeout)


def timed(what: str, fn: Callable[[], float], t0: float | None = None) -> float:
    start = time.monotonic() if t0 is None else t0
    end = fn()
    took = end - start
    print(f"  {what}: {took:.2f} s", flush=True)
    return took


def baseline(kube: Kube, nodes: list[str], ops: list[dict[str, Any]], threads: int) -> None:
    """The floor: the same HTTP transport and payload as the operator, no controller around it."""
    path = "/api/v1/nodes/{}/status"

    def one(name: str) -> None:
        kube.request("PATCH", path.format(name), ops, content_type=JSON_PATCH)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, nodes))


def profile_body() -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DevicePluginProfile",
        "metadata": {"name": "bench"},
        "spec": {
            "resourceName": R_OPERATOR,
            "mode": "Static",
            "nodeSelector": {"matchLabels": {BENCH_LABEL: "1"}},
            "static": {"capacity": 4},
        },
    }


def baseline_ops() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The baseline's add and remove patches: the operator's payload shape for another resource."""
    key = esc("static.patchbay.dev/example.com_baseline")
    owner = json.dumps({"profile": "baseline", "resource": R_BASELINE})
    add = [
        {"op": "add", "path": f"/metadata/annotations/{key}", "value": owner},
        {"op": "add", "path": f"/status/capacity/{esc(R_BASELINE)}", "value": "4"},
        {"op": "add", "path": f"/status/allocatable/{esc(R_BASELINE)}", "value": "4"},
    ]
    remove = [
        {"op": "remove", "path": f"/status/capacity/{esc(R_BASELINE)}"},
        {"op": "remove", "path": f"/status/allocatable/{esc(R_BASELINE)}"},
        {"op": "remove", "path": f"/metadata/annotations/{key}"},
    ]
    return add, remove


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3, help="alternating baseline/operator rounds")
    ap.add_argument("--concurrency", type=int, default=16, help="operator --concurrency and baseline threads")
    ap.add_argument("--drift-samples", type=int, default=100)
    ap.add_argument("--state-dir", type=Path, default=None, help="cluster state (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = ap.parse_args()

    state = args.state_dir or Path(tempfile.mkdtemp(prefix="patchbay-bench-"))
    cluster = DevCluster(state, find_bin_dir(os.environ.get("PATCHBAY_KUBE_BIN")))
    print(
        f"Static-mode benchmark: {args.nodes} kwok nodes, concurrency {args.concurrency}, "
        f"{args.rounds} rounds, state {state}"
    )
    t = time.monotonic()
    cluster.up(timeout=180)
    names = cluster.add_kwok_nodes(args.nodes, prefix="bench-", labels={BENCH_LABEL: "1"}, workers=16)
    print(f"  cluster + {args.nodes} nodes created in {time.monotonic() - t:.1f} s", flush=True)
    cluster.wait_nodes_ready(args.nodes, label_selector=f"{BENCH_LABEL}=1", timeout=max(300, args.nodes / 5))
    print(f"  every node Ready after {time.monotonic() - t:.1f} s", flush=True)
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    op: Operator | None = None
    observer: Observer | None = None
    try:
        ext = client.ApiextensionsV1Api(api)
        crd = yaml.safe_load((REPO / "crds" / "patchbay.dev_devicepluginprofiles.yaml").read_text())
        ext.create_custom_resource_definition(crd)
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
        time.sleep(5)  # the new API group reaches discovery; the last Ready updates settle
        observer = Observer(api, set(names))
        obs = observer
        kube = Kube(load_configuration(str(cluster.kubeconfig), args.concurrency))
        custom = client.CustomObjectsApi(api)
        add, remove = baseline_ops()
        rows: list[dict[str, float]] = []
        drift: list[float] = []
        drift_writes = 0
        for rnd in range(1, args.rounds + 1):
            row: dict[str, float] = {}
            print(f"Round {rnd}: baseline (no operator running)")
            t0 = time.monotonic()
            baseline(kube, names, add, args.concurrency)
            row["base_apply"] = timed(
                "apply (until every node shows it)", lambda: obs.wait(R_BASELINE, "4"), t0
            )
            t0 = time.monotonic()
            baseline(kube, names, remove, args.concurrency)
            row["base_remove"] = timed(
                "remove (until every node is clean)", lambda: obs.wait(R_BASELINE, None), t0
            )

            print(f"Round {rnd}: operator")
            t = time.monotonic()
            op = Operator(
                cluster.kubeconfig,
                state / f"operator-{rnd}",
                args=("--concurrency", str(args.concurrency)),
                namespace=NAMESPACE,
            )
            op.log_dir.mkdir(exist_ok=True)
            op.start()
            while op.stats().get("nodes", 0) < args.nodes:
                time.sleep(0.2)
            print(f"  started and listed {args.nodes} nodes in {time.monotonic() - t:.1f} s", flush=True)
            before = op.settled_stats()
            cpu0 = op.cpu_seconds()
            t0 = time.monotonic()
            custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, profile_body())
            row["op_apply"] = timed(
                "apply (profile created -> every node shows it)", lambda: obs.wait(R_OPERATOR, "4"), t0
            )
            row["apply_cpu"] = op.cpu_seconds() - cpu0
            after_apply = op.settled_stats()
            row["apply_writes"] = (after_apply["nodePatches"] - before["nodePatches"]) / args.nodes

            after_drift = after_apply
            if rnd == 1:
                # Drift: reset the value on random nodes, one at a time; time the re-assertion.
                for name in random.sample(names, min(args.drift_samples, len(names))):
                    ops = [
                        {"op": "add", "path": f"/status/capacity/{esc(R_OPERATOR)}", "value": "0"},
                        {"op": "add", "path": f"/status/allocatable/{esc(R_OPERATOR)}", "value": "0"},
                    ]
                    t0 = time.monotonic()
                    client.CoreV1Api(api).patch_node_status(
                        name, ops, _content_type="application/json-patch+json"
                    )
                    obs.wait_node(name, R_OPERATOR, "4")
                    drift.append(time.monotonic() - t0)
                after_drift = op.settled_stats()
                drift_writes = after_drift["nodePatches"] - after_apply["nodePatches"]

            cpu0 = op.cpu_seconds()
            t0 = time.monotonic()
            custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, "bench")
            row["op_delete"] = timed(
                "delete (profile deleted -> every node clean)", lambda: obs.wait(R_OPERATOR, None), t0
            )
            row["delete_cpu"] = op.cpu_seconds() - cpu0
            while True:
                try:
                    custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, "bench")
                except client.ApiException as e:
                    if e.status == 404:
                        break
                    raise
                time.sleep(0.1)
            row["released"] = time.monotonic() - t0
            after_delete = op.settled_stats()
            row["delete_writes"] = (after_delete["nodePatches"] - after_drift["nodePatches"]) / args.nodes
            row["status_writes"] = after_delete["statusWrites"]
            row["max_per_node"] = after_delete["maxPatchesPerNode"]
            row["rss"] = op.peak_rss_mib()
            op.stop()
            op = None
            rows.append(row)

        def med(key: str) -> float:
            return statistics.median(r[key] for r in rows)

        def each(key: str, fmt: str = "{:.0f}") -> str:
            return ", ".join(fmt.format(r[key]) for r in rows)

        def ratio(op_key: str, base_key: str, r: dict[str, float]) -> str:
            return f"{r[op_key]:.2f} s | {r[op_key] / r[base_key]:.2f}"

        drift.sort()
        print()
        print(f"Results ({args.nodes} nodes, concurrency {args.concurrency}, {args.rounds} rounds)")
        print(
            "| round | baseline apply | operator apply | ratio | baseline remove | operator delete | ratio |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for i, r in enumerate(rows, 1):
            print(
                f"| {i} | {r['base_apply']:.2f} s | {ratio('op_apply', 'base_apply', r)} "
                f"| {r['base_remove']:.2f} s | {ratio('op_delete', 'base_remove', r)} |"
            )
        medians = {k: med(k) for k in ("base_apply", "op_apply", "base_remove", "op_delete")}
        print(
            f"| median | {medians['base_apply']:.2f} s | {ratio('op_apply', 'base_apply', medians)} "
            f"| {medians['base_remove']:.2f} s | {ratio('op_delete', 'base_remove', medians)} |"
        )
        print()
        print("| measure | operator |")
        print("| --- | --- |")
        print(f"| delete: profile gone (finalizer released), median | {med('released'):.2f} s |")
        print(f"| API writes per node, apply (each round) | {each('apply_writes', '{:.3f}')} |")
        print(f"| API writes per node, delete (each round) | {each('delete_writes', '{:.3f}')} |")
        print(f"| writes for {len(drift)} drift resets | {drift_writes} |")
        if drift:
            p50, p99 = statistics.median(drift), percentile(drift, 0.99)
            print(f"| drift re-assertion p50 / p99 | {p50 * 1000:.0f} ms / {p99 * 1000:.0f} ms |")
        cpu = f"{med('apply_cpu'):.2f} s / {med('delete_cpu'):.2f} s"
        print(f"| operator CPU, apply / delete (median) | {cpu} |")
        print(f"| operator CPU per node, apply (median) | {med('apply_cpu') / args.nodes * 1000:.2f} ms |")
        print(f"| operator peak RSS (each round) | {each('rss')} MiB |")
        print(f"| profile status writes (each round: apply, drift, delete) | {each('status_writes')} |")
        print(f"| most patches on any one node (each round) | {each('max_per_node')} |")
        return 0
    finally:
        if observer is not None:
            observer.stopped = True
        if op is not None:
            op.stop()
        if not args.keep:
            cluster.down(purge=True)


if __name__ == "__main__":
    sys.exit(main())
