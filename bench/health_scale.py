"""Explained health at scale: N kwok nodes, one DevicePlugin profile, a writer playing the agents.

The chart is installed without its operator pod (there is no real node here: kwok nodes); the
operator runs as a process with the chart's namespace. kwok "runs" the agent DaemonSet's pods,
one per node, and the writer plays each agent with that agent's OWN credentials: a
ServiceAccount token bound to the node's agent pod (TokenRequest), which carries the node-name
claim the chart's admission policy checks. Every report write is a real server-side apply of a
DeviceReport through that policy.

Printed, with a baseline from the same run where there is one:

- time for all N initial reports to show in the profile's status;
- single health changes, one at a time: the agent's ONE write -> (a) a plain watch of the
  DeviceReports sees it (the API server's own propagation: the baseline) and (b) the profile's
  status shows it; p50/p99 of each and their ratio;
- a burst of changes at once: how many status writes the operator makes for it (debounced);
- writes per health change (the writer's, checked against the DeviceReport watch's events);
- the operator's steady-state request rate when nothing changes (target 0: watches, no polls),
  from its own /metrics; its peak RSS (VmHWM; target <= 250 MiB).

    PATCHBAY_KUBE_BIN=$(hack/kube-binaries.sh --print-bin-dir) \
        .venv/bin/python bench/health_scale.py --nodes 5000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests")]

import urllib3  # noqa: E402
from kubernetes import client, config, watch  # noqa: E402
from support.operator import Operator  # noqa: E402

from patchbay_devcluster import DevCluster, find_bin_dir  # noqa: E402
from patchbay_devcluster.install import helm  # noqa: E402

NS = "patchbay-bench"
GROUP, VERSION = "patchbay.dev", "v1beta1"
PROFILE = "bench-health"
RESOURCE = "bench.patchbay.dev/widget"
DEVICES = 4
LABEL = "patchbay.dev/bench"


def now() -> float:
    return time.monotonic()


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def wait(check: Any, timeout: float, every: float = 0.05, seen: Any = None) -> Any:
    deadline = now() + timeout
    while now() < deadline:
        if got := check():
            return got
        time.sleep(every)
    raise SystemExit(f"bench: timed out; last seen: {seen() if seen else '-'}")


def report(node: str, unhealthy: set[str], agent: str) -> dict[str, Any]:
    ids = [f"widget{i}" for i in range(DEVICES)]
    devices = [
        {
            "id": d,
            "health": "Unhealthy",
            "reason": "ProbeFailed",
            "message": "bench: exit 1",
            "since": "2026-11-23T00:00:00Z",
        }
        if d in unhealthy
        else {"id": d, "health": "Healthy"}
        for d in ids
    ]
    bad = len(unhealthy)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DeviceReport",
        "metadata": {"name": f"{PROFILE}.{node}", "namespace": NS},
        "profile": PROFILE,
        "nodeName": node,
        "agent": agent,  # the admission policy: the pod the token is bound to
        "resourceName": RESOURCE,
        "summary": {"total": DEVICES, "healthy": DEVICES - bad, "unhealthy": bad, "allocated": 0},
        "devices": devices,
    }


class Agents:
    """Plays one agent per node with that agent's pod-bound token: one SSA per write."""

    def __init__(self, server: str, ca: str, tokens: dict[str, str], pods: dict[str, str]) -> None:
        self.server, self.tokens, self.pods = server, tokens, pods
        self.http = urllib3.PoolManager(maxsize=32, ca_certs=ca, cert_reqs="CERT_REQUIRED")
        self.writes = 0
        self._lock = threading.Lock()

    def write(self, node: str, unhealthy: set[str]) -> None:
        body = report(node, unhealthy, self.pods[node])
        url = (
            f"{self.server}/apis/{GROUP}/{VERSION}/namespaces/{NS}/devicereports/{body['metadata']['name']}"
            "?fieldManager=patchbay-agent&force=true"
        )
        r = self.http.request(
            "PATCH",
            url,
            body=json.dumps(body),
            headers={
                "Authorization": f"Bearer {self.tokens[node]}",
                "Content-Type": "application/apply-patch+yaml",
            },
        )
        if r.status >= 300:
            raise SystemExit(f"bench: report of {node} refused: {r.status} {r.data[:300]!r}")
        with self._lock:
            self.writes += 1


class Watcher(threading.Thread):
    """Records when each (kind, name) was last seen changed, from a watch."""

    def __init__(self, list_fn: Any, **kw: Any) -> None:
        super().__init__(daemon=True)
        self.list_fn, self.kw = list_fn, kw
        self.seen: dict[str, tuple[float, dict[str, Any]]] = {}
        self.events = 0
        self.w = watch.Watch()

    def run(self) -> None:
        for ev in self.w.stream(self.list_fn, **self.kw):
            obj = ev["object"]
            self.events += 1
            self.seen[obj["metadata"]["name"]] = (now(), obj)

    def stop(self) -> None:
        self.w.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--changes", type=int, default=50, help="single health changes, one at a time")
    ap.add_argument("--burst", type=int, default=200, help="health changes at once")
    ap.add_argument(
        "--quiet", type=float, default=60.0, help="seconds of nothing happening, for the request rate"
    )
    args = ap.parse_args()
    state = Path(tempfile.mkdtemp(prefix="patchbay-health-bench-"))
    cluster = DevCluster(state / "c", find_bin_dir(os.environ.get("PATCHBAY_KUBE_BIN")))
    t = now()
    cluster.up(timeout=180)
    op: Operator | None = None
    try:
        nodes = cluster.add_kwok_nodes(args.nodes, prefix="hb-", labels={LABEL: "1"}, workers=16)
        cluster.wait_nodes_ready(args.nodes, label_selector=f"{LABEL}=1", timeout=max(300, args.nodes / 4))
        print(f"{args.nodes} kwok nodes Ready after {now() - t:.0f} s", flush=True)
        helm(
            cluster, "install", "patchbay", str(REPO / "charts" / "patchbay"), "-n", NS, "--create-namespace",
            "--set", "operator.replicas=0", "--set", "crds.keep=false",
        )  # fmt: skip
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        core, custom, apps = client.CoreV1Api(api), client.CustomObjectsApi(api), client.AppsV1Api(api)
        time.sleep(3)  # the new API group reaches discovery
        op = Operator(
            cluster.kubeconfig,
            state,
            args=("--status-debounce", "1", *(["--verbose"] if os.environ.get("BENCH_VERBOSE") else [])),
            namespace=NS,
        )
        op.start()
        wait(lambda: op.stats().get("nodes", 0) >= args.nodes, 300)
        spec = {
            "resourceName": RESOURCE,
            "mode": "DevicePlugin",
            "nodeSelector": {"matchLabels": {LABEL: "1"}},
            "plugin": {"discovery": {"virtual": {"count": DEVICES}}},
            "agent": {"tolerations": [{"operator": "Exists"}]},
        }
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "DevicePluginProfile",
            "metadata": {"name": PROFILE},
            "spec": spec,
        }
        custom.create_cluster_custom_object(GROUP, VERSION, "devicepluginprofiles", body)
        t = now()

        def rolled_out() -> bool:
            try:
                st = apps.read_namespaced_daemon_set_status(f"patchbay-{PROFILE}", NS).status
            except client.ApiException:
                return False  # not created yet
            return bool(st.desired_number_scheduled == args.nodes and st.number_available == args.nodes)

        wait(rolled_out, 900, 1.0)
        print(f"agent DaemonSet: {args.nodes} kwok pods available after {now() - t:.0f} s", flush=True)

        # The agents' credentials: a token bound to each node's agent pod (it names the node).
        pods = core.list_namespaced_pod(NS, label_selector=f"patchbay.dev/profile={PROFILE}").items
        by_node = {p.spec.node_name: p for p in pods}

        def token(node: str) -> tuple[str, str]:
            p = by_node[node]
            ref = {"kind": "Pod", "apiVersion": "v1", "name": p.metadata.name, "uid": p.metadata.uid}
            tr = core.create_namespaced_service_account_token(
                "patchbay-agent", NS, {"spec": {"boundObjectRef": ref, "expirationSeconds": 3600}}
            )
            return node, tr.status.token

        t = now()
        with ThreadPoolExecutor(16) as pool:
            tokens = dict(pool.map(token, nodes))
        print(f"{len(tokens)} pod-bound agent tokens in {now() - t:.1f} s", flush=True)
        pod_names = {node: p.metadata.name for node, p in by_node.items()}
        agents = Agents(cluster.server, str(cluster.pki_dir / "ca.crt"), tokens, pod_names)
        reports = Watcher(
            custom.list_namespaced_custom_object,
            group=GROUP,
            version=VERSION,
            namespace=NS,
            plural="devicereports",
        )
        reports.start()

        def devices() -> dict[str, int]:
            """The profile's device counts as written (a GET: what kubectl or a GitOps tool reads)."""
            obj = custom.get_cluster_custom_object(GROUP, VERSION, "devicepluginprofiles", PROFILE)
            return dict((obj.get("status") or {}).get("devices") or {})

        print("\n== Initial reports: every agent writes its node's report ==")
        t = now()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda n: agents.write(n, set()), nodes))
        written = now() - t
        wait(
            lambda: devices().get("healthy") == DEVICES * args.nodes,
            90,
            seen=lambda: (op.stats() if op else {}, devices()),
        )
        print(
            f"{args.nodes} reports written in {written:.1f} s; "
            f"the profile's status counts them all after {now() - t:.1f} s"
        )

        print(f"\n== {args.changes} single health changes, one at a time ==")
        via_watch, via_status = [], []
        writes_before, events_before = agents.writes, reports.events
        for i in range(args.changes):
            node = random.choice(nodes)
            name = f"{PROFILE}.{node}"
            for bad in ({f"widget{i % DEVICES}"}, set()):
                target = devices().get("unhealthy", 0) + (1 if bad else -1)
                t0 = now()
                agents.write(node, bad)
                wait(lambda n=name, t0=t0: n in reports.seen and reports.seen[n][0] >= t0, 60, 0.002)
                via_watch.append(reports.seen[name][0] - t0)
                wait(lambda target=target: devices().get("unhealthy") == target, 60, 0.002)
                via_status.append(now() - t0)
        writes = agents.writes - writes_before
        events = reports.events - events_before
        print(f"report watch (baseline): p50 {ms(pct(via_watch, 0.5))}  p99 {ms(pct(via_watch, 0.99))}")
        print(f"profile status:          p50 {ms(pct(via_status, 0.5))}  p99 {ms(pct(via_status, 0.99))}")
        print(
            "  ratio (status / watch) at p50 "
            f"{statistics.median(via_status) / statistics.median(via_watch):.1f}"
        )
        print(
            f"API writes per health change: {writes / (2 * args.changes):.2f} "
            f"(the report watch saw {events} events)"
        )

        print(f"\n== A burst: {args.burst} agents report a bad device at once ==")
        burst = random.sample(nodes, args.burst)
        writes_before = op.stats().get("statusWrites", 0)
        target = devices().get("unhealthy", 0) + args.burst
        t0 = now()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda n: agents.write(n, {"widget0"}), burst))
        wait(lambda: devices().get("unhealthy") == target, 120, 0.01)
        seen = now() - t0
        # The operator counts a write when its PATCH returns, which can be after a GET already
        # shows it; and a burst split across windows would write again. Let both settle.
        time.sleep(3)
        print(
            f"all {args.burst} in the status after {seen:.2f} s, "
            f"with {op.stats().get('statusWrites', 0) - writes_before} status writes"
        )

        print(f"\n== Nothing changes for {args.quiet:.0f} s: the operator's requests ==")
        time.sleep(5)
        before = op.stats().get("apiRequests", {})
        time.sleep(args.quiet)
        after = op.stats().get("apiRequests", {})
        delta = {verb: after.get(verb, 0) - before.get(verb, 0) for verb in after}
        print(f"requests by verb: {delta} -> {sum(delta.values()) / args.quiet:.3f} per second")
        print("  (a WATCH here is an informer re-opening its watch when the server ends it, every 5 min)")
        print(f"operator peak RSS {op.peak_rss_mib():.0f} MiB (target <= 250 MiB)")
        reports.stop()
    finally:
        if op is not None:
            op.stop()
        cluster.down()
        shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
