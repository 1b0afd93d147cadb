"""Static mode at scale: how close the operator gets to what the API server allows.

Starts its own local cluster (real etcd + kube-apiserver + kwok) with N kwok nodes and the
operator as a subprocess, then measures, in the same run:

- baseline apply / remove: a plain concurrent client (the official client, the same number of
  threads as the operator's --concurrency) sending the same one-JSON-patch-per-node payload to
  every node: the floor this API server allows here;
- operator apply: from creating a Static profile to every node showing the value;
- operator delete: from deleting the profile to every node clean (finalizer released);
- API writes per node per change (the operator's own counters);
- drift re-assertion: a value reset on random nodes, until it is back (p50 / p99);
- the operator's peak RSS (VmHWM).

"Every node shows X" is observed the same way for the baseline and the operator: one raw watch
on nodes, decoded as plain JSON. Prints figures and ratios; asserts nothing about timings.

    .venv/bin/python bench/static_scale.py --nodes 1000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from patchbay_devcluster import DevCluster, find_bin_dir
from patchbay_devcluster.cluster import free_port
from patchbay_operator.kube import JSON_PATCH, Kube, load_configuration

REPO = Path(__file__).resolve().parents[1]
GROUP, VERSION, PLURAL = "patchbay.dev", "v1alpha1", "devicepluginprofiles"
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


class OperatorProcess:
    def __init__(self, kubeconfig: Path, log: Path, concurrency: int) -> None:
        self.port = free_port()
        argv = [
            sys.executable, "-m", "patchbay_operator.main",
            "--kubeconfig", str(kubeconfig), "--namespace", NAMESPACE,
            "--concurrency", str(concurrency),
            "--liveness", f"http://127.0.0.1:{self.port}/healthz",
        ]  # fmt: skip
        self.log = log
        self.proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(log.read_text()[-3000:]) from None
                time.sleep(0.3)
        raise RuntimeError("operator did not become live")

    def stats(self) -> dict[str, int]:
        for line in reversed(self.log.read_text(errors="replace").splitlines()):
            if "Stats " in line:
                return dict(json.loads(line.split("Stats ", 1)[1]))
        return {}

    def settled_stats(self, quiet: float = 3.0) -> dict[str, int]:
        last: dict[str, int] = {}
        since = time.monotonic()
        while True:
            s = self.stats()
            key = {"nodePatches": s.get("nodePatches"), "queued": s.get("queued")}
            if key != {k: last.get(k) for k in key} or s.get("queued"):
                last, since = s, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return s
            time.sleep(0.25)

    def cpu_seconds(self) -> float:
        """User + system CPU the operator process has used so far (from /proc/<pid>/stat)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def peak_rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=16, help="operator --concurrency and baseline threads")
    ap.add_argument("--drift-samples", type=int, default=100)
    ap.add_argument("--state-dir", type=Path, default=None, help="cluster state (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = ap.parse_args()

    state = args.state_dir or Path(tempfile.mkdtemp(prefix="patchbay-bench-"))
    cluster = DevCluster(state, find_bin_dir(os.environ.get("PATCHBAY_KUBE_BIN")))
    print(f"Static-mode benchmark: {args.nodes} kwok nodes, concurrency {args.concurrency}, state {state}")
    t = time.monotonic()
    cluster.up(timeout=180)
    names = cluster.add_kwok_nodes(args.nodes, prefix="bench-", labels={BENCH_LABEL: "1"}, workers=16)
    print(f"  cluster + {args.nodes} nodes created in {time.monotonic() - t:.1f} s", flush=True)
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    op: OperatorProcess | None = None
    observer: Observer | None = None
    try:
        ext = client.ApiextensionsV1Api(api)
        crd = yaml.safe_load((REPO / "crds" / "patchbay.dev_devicepluginprofiles.yaml").read_text())
        ext.create_custom_resource_definition(crd)
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
        time.sleep(2)  # let the new API group reach discovery
        observer = Observer(api, set(names))

        # --- baseline -----------------------------------------------------------------------
        print("Baseline: plain concurrent client, one JSON patch per node (same payload shape)")
        owner = json.dumps({"profile": "baseline", "resource": R_BASELINE})
        add = [
            {
                "op": "add",
                "path": f"/metadata/annotations/{esc('static.patchbay.dev/example.com_baseline')}",
                "value": owner,
            },
            {"op": "add", "path": f"/status/capacity/{esc(R_BASELINE)}", "value": "4"},
            {"op": "add", "path": f"/status/allocatable/{esc(R_BASELINE)}", "value": "4"},
        ]
        remove = [
            {"op": "remove", "path": f"/status/capacity/{esc(R_BASELINE)}"},
            {"op": "remove", "path": f"/status/allocatable/{esc(R_BASELINE)}"},
            {
                "op": "remove",
                "path": f"/metadata/annotations/{esc('static.patchbay.dev/example.com_baseline')}",
            },
        ]
        kube = Kube(load_configuration(str(cluster.kubeconfig), args.concurrency))

        def run_baseline() -> tuple[float, float]:
            t0 = time.monotonic()
            baseline(kube, names, add, args.concurrency)
            a = timed("apply (until every node shows it)", lambda: observer.wait(R_BASELINE, "4"), t0)
            t0 = time.monotonic()
            baseline(kube, names, remove, args.concurrency)
            r = timed("remove (until every node is clean)", lambda: observer.wait(R_BASELINE, None), t0)
            return a, r

        base1 = run_baseline()

        # --- operator -----------------------------------------------------------------------
        print("Operator")
        log = state / "operator.log"
        t = time.monotonic()
        op = OperatorProcess(cluster.kubeconfig, log, args.concurrency)
        while op.stats().get("nodes", 0) < args.nodes:
            time.sleep(0.2)
        print(f"  started and listed {args.nodes} nodes in {time.monotonic() - t:.1f} s", flush=True)
        before = op.settled_stats()
        custom = client.CustomObjectsApi(api)
        profile = {
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
        cpu0 = op.cpu_seconds()
        t0 = time.monotonic()
        custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, profile)
        op_apply = timed(
            "apply (profile created -> every node shows it)", lambda: observer.wait(R_OPERATOR, "4"), t0
        )
        apply_cpu = op.cpu_seconds() - cpu0
        after_apply = op.settled_stats()
        apply_writes = after_apply["nodePatches"] - before["nodePatches"]

        # Drift: reset the value on random nodes, one at a time, and time the re-assertion.
        samples: list[float] = []
        for name in random.sample(names, min(args.drift_samples, len(names))):
            ops = [
                {"op": "add", "path": f"/status/capacity/{esc(R_OPERATOR)}", "value": "0"},
                {"op": "add", "path": f"/status/allocatable/{esc(R_OPERATOR)}", "value": "0"},
            ]
            t0 = time.monotonic()
            client.CoreV1Api(api).patch_node_status(name, ops, _content_type="application/json-patch+json")
            observer.wait_node(name, R_OPERATOR, "4")
            samples.append(time.monotonic() - t0)
        after_drift = op.settled_stats()
        drift_writes = after_drift["nodePatches"] - after_apply["nodePatches"]

        cpu0 = op.cpu_seconds()
        t0 = time.monotonic()
        custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, "bench")
        op_delete = timed(
            "delete (profile deleted -> every node clean)", lambda: observer.wait(R_OPERATOR, None), t0
        )
        delete_cpu = op.cpu_seconds() - cpu0
        while True:
            try:
                custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, "bench")
            except client.ApiException as e:
                if e.status == 404:
                    break
                raise
            time.sleep(0.1)
        released = time.monotonic() - t0
        after_delete = op.settled_stats()
        delete_writes = after_delete["nodePatches"] - after_drift["nodePatches"]
        rss = op.peak_rss_mib()
        op.stop()
        op = None
        print("Baseline again (after the operator, to bracket the machine's noise)")
        base2 = run_baseline()
        base_apply, base_remove = min(base1[0], base2[0]), min(base1[1], base2[1])

        samples.sort()
        p50 = statistics.median(samples)
        p99 = samples[min(len(samples) - 1, round(0.99 * (len(samples) - 1)))]
        print()
        print(f"Results ({args.nodes} nodes, concurrency {args.concurrency}; baseline = faster of two runs)")
        print("| measure | operator | baseline | ratio |")
        print("| --- | --- | --- | --- |")
        print(
            f"| apply: every node patched | {op_apply:.2f} s | {base_apply:.2f} s "
            f"| {op_apply / base_apply:.2f} |"
        )
        print(
            f"| delete: every node clean | {op_delete:.2f} s | {base_remove:.2f} s "
            f"| {op_delete / base_remove:.2f} |"
        )
        print(f"| delete: profile gone (finalizer released) | {released:.2f} s | | |")
        print(f"| API writes per node, apply | {apply_writes / args.nodes:.3f} | 1 | |")
        print(f"| API writes per node, delete | {delete_writes / args.nodes:.3f} | 1 | |")
        print(f"| writes for {len(samples)} drift resets | {drift_writes} | | |")
        print(f"| drift re-assertion p50 / p99 | {p50 * 1000:.0f} ms / {p99 * 1000:.0f} ms | | |")
        print(f"| operator CPU during apply / delete | {apply_cpu:.2f} s / {delete_cpu:.2f} s | | |")
        print(f"| operator CPU per node, apply | {apply_cpu / args.nodes * 1000:.2f} ms | | |")
        print(f"| operator peak RSS | {rss:.0f} MiB | | |")
        print(f"| status writes (whole run) | {after_delete['statusWrites']} | | |")
        print(f"| max patches on any one node (whole run) | {after_delete['maxPatchesPerNode']} | | |")
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
