"""Explained health at scale: N kwok nodes, one DevicePlugin profile selecting them, the chart
installed without its operator pod (its CRDs, the agents' Role, the admission policy) and the
operator as a process. kwok "runs" the agent DaemonSet's N pods; a writer plays each agent with
that agent's own credentials (a TokenRequest bound to the node's agent pod, so every write goes
through the admission policy) and makes real server-side applies of DeviceReports. Its writes are
the bench's own, so they are not counted as the agent's (``health_writes`` counts the real
agent's). Measured:

- all N initial reports written, and counted in the profile's status;
- single health changes, one at a time: the write -> a plain watch of DeviceReports sees it (the
  API server's own propagation: the baseline) and -> the profile's status shows it (a GET), pair
  by pair;
- a burst of changes at once: the operator's status writes for it (debounced);
- the operator's requests while nothing changes (its /metrics) and its peak RSS (VmHWM).
"""

from __future__ import annotations

import functools
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import urllib3
from support.reports import device_report

from patchbay_bench.harness import Run, wait
from patchbay_bench.kube import PROFILES, Api, profile, reports
from patchbay_bench.setup import kwok_cluster, operator, status_mib

NS = "patchbay-bench"
PROFILE, RESOURCE, DEVICES, LABEL = "bench-health", "bench.patchbay.dev/widget", 4, "patchbay.dev/bench"


def report(node: str, unhealthy: set[str], agent: str) -> dict[str, Any]:
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
        for d in (f"widget{i}" for i in range(DEVICES))
    ]
    bad = len(unhealthy)
    summary = {"total": DEVICES, "healthy": DEVICES - bad, "unhealthy": bad, "allocated": 0}
    return device_report(NS, node, PROFILE, RESOURCE, devices, summary, agent=agent)


class Writer:
    """Plays one agent per node with that agent's pod-bound token: one server-side apply a write."""

    def __init__(self, server: str, ca: str, tokens: dict[str, str], pods: dict[str, str]) -> None:
        self.server, self.tokens, self.pods = server, tokens, pods
        self.http = urllib3.PoolManager(maxsize=32, ca_certs=ca, cert_reqs="CERT_REQUIRED", timeout=30.0)

    def write(self, node: str, unhealthy: set[str]) -> None:
        body = report(node, unhealthy, self.pods[node])
        url = f"{self.server}{reports(NS)}/{body['metadata']['name']}?fieldManager=patchbay-agent&force=true"
        headers = {
            "Authorization": f"Bearer {self.tokens[node]}",
            "Content-Type": "application/apply-patch+yaml",
        }
        got = self.http.request("PATCH", url, body=json.dumps(body), headers=headers)
        if got.status >= 300:
            raise RuntimeError(f"report of {node} refused: {got.status} {got.data[:300]!r}")


class Watcher(threading.Thread):
    """When each DeviceReport was last seen changed, from a watch."""

    def __init__(self, api: Api) -> None:
        super().__init__(daemon=True)
        self.stream = api.watch(reports(NS), timeoutSeconds="3600")
        self.seen: dict[str, float] = {}

    def run(self) -> None:
        for event in self.stream:
            self.seen[event["object"]["metadata"]["name"]] = time.monotonic()

    def stop(self) -> None:
        self.stream.close()
        self.join(10)


def run(r: Run) -> None:
    n = r.integer("nodes")
    with kwok_cluster(r, n, prefix="hb-", labels={LABEL: "1"}, crds=False) as cluster:
        api = cluster.api
        cluster.chart_without_operator(NS)
        with operator(r, cluster.kubeconfig, NS, "--status-debounce", "1") as op:
            wait("the operator to list every node", lambda: op.stats().get("nodes", 0) >= n, 300, 0.5)
            spec = {
                "resourceName": RESOURCE,
                "mode": "DevicePlugin",
                "nodeSelector": {"matchLabels": {LABEL: "1"}},
                "plugin": {"discovery": {"virtual": {"count": DEVICES}}},
                "agent": {"tolerations": [{"operator": "Exists"}]},
            }
            api.create(PROFILES, profile(PROFILE, spec))
            ds = f"/apis/apps/v1/namespaces/{NS}/daemonsets/patchbay-{PROFILE}"
            wait(
                "the agent DaemonSet's pods available",
                lambda: ((api.get(ds) or {}).get("status") or {}).get("numberAvailable", 0) >= n,
                900,
                1.0,
            )
            pods = api.items(f"/api/v1/namespaces/{NS}/pods", labelSelector=f"patchbay.dev/profile={PROFILE}")
            by_node = {p["spec"]["nodeName"]: p for p in pods}

            def token(node: str) -> tuple[str, str]:
                p = by_node[node]["metadata"]
                ref = {"kind": "Pod", "apiVersion": "v1", "name": p["name"], "uid": p["uid"]}
                got = api.create(
                    f"/api/v1/namespaces/{NS}/serviceaccounts/patchbay-agent/token",
                    {"spec": {"boundObjectRef": ref, "expirationSeconds": 3600}},
                )
                return node, str(got["status"]["token"])

            with ThreadPoolExecutor(16) as pool:
                tokens = dict(pool.map(token, cluster.nodes))
            pod_names = {node: p["metadata"]["name"] for node, p in by_node.items()}
            writer = Writer(cluster.dev.server, str(cluster.dev.pki_dir / "ca.crt"), tokens, pod_names)
            watcher = Watcher(api)
            watcher.start()

            def devices() -> dict[str, int]:
                """The profile's device counts as written (a GET: what kubectl or a GitOps tool reads)."""
                return dict(
                    ((api.get(f"{PROFILES}/{PROFILE}") or {}).get("status") or {}).get("devices") or {}
                )

            def seen_since(name: str, t0: float) -> bool:
                return watcher.seen.get(name, 0) >= t0

            def unhealthy_is(target: int) -> bool:
                return devices().get("unhealthy") == target

            try:
                t0 = time.monotonic()
                with ThreadPoolExecutor(16) as pool:
                    list(pool.map(lambda node: writer.write(node, set()), cluster.nodes))
                written = time.monotonic() - t0
                wait(
                    "every initial report in the status",
                    lambda: devices().get("healthy") == DEVICES * n,
                    120,
                    0.05,
                )
                counted = time.monotonic() - t0
                note = f"{n} kwok nodes, {DEVICES} devices each, --status-debounce 1"
                r.figure(
                    "health at scale: initial reports written / counted in the status",
                    "s",
                    {"written (16 writers)": [written], "counted in the profile's status": [counted]},
                    note=note,
                    ratio=False,
                )
                via_watch, via_status = [], []
                for i in range(r.rounds("changes")):
                    node = random.choice(cluster.nodes)
                    name = f"{PROFILE}.{node}"
                    for bad in ({f"widget{i % DEVICES}"}, set()):
                        target = devices().get("unhealthy", 0) + (1 if bad else -1)
                        t0 = time.monotonic()
                        writer.write(node, bad)
                        wait(
                            "the watch to see it",
                            functools.partial(seen_since, name, t0),
                            60,
                            0.002,
                        )
                        via_watch.append(watcher.seen[name] - t0)
                        wait(
                            "the status to show it",
                            functools.partial(unhealthy_is, target),
                            60,
                            0.002,
                        )
                        via_status.append(time.monotonic() - t0)
                r.figure(
                    "health at scale: one health change -> the profile's status shows it",
                    "s",
                    {"profile status (GET)": via_status, "a plain watch of DeviceReports": via_watch},
                    headline=True,
                    note=note + "; 1 s of it is the status debounce window",
                )
                burst = random.sample(cluster.nodes, min(r.integer("burst"), n))
                before = op.stats().get("statusWrites", 0)
                target = devices().get("unhealthy", 0) + len(burst)
                t0 = time.monotonic()
                with ThreadPoolExecutor(16) as pool:
                    list(pool.map(lambda node: writer.write(node, {"widget0"}), burst))
                wait("the burst in the status", lambda: devices().get("unhealthy") == target, 120, 0.01)
                seen = time.monotonic() - t0
                time.sleep(3)  # a write counted when its PATCH returns can follow a GET that shows it
                r.figure(
                    "health at scale: a burst of changes -> in the status",
                    "s",
                    {"operator": [seen]},
                    note=f"{len(burst)} changes at once",
                )
                r.figure(
                    "health at scale: status writes for the burst",
                    "writes",
                    {"operator": [op.stats().get("statusWrites", 0) - before]},
                    note=f"{len(burst)} changes at once",
                )
                time.sleep(5)
                quiet = r.number("quiet")
                a = op.stats().get("apiRequests", {})
                time.sleep(quiet)
                b = op.stats().get("apiRequests", {})
                polls = sum(b.get(v, 0) - a.get(v, 0) for v in b if v != "WATCH")
                r.figure(
                    "health at scale: operator requests per second while nothing changes",
                    "req/s",
                    {
                        "GET, PATCH, POST...": [polls / quiet],
                        "WATCH (re-opened)": [(b.get("WATCH", 0) - a.get("WATCH", 0)) / quiet],
                    },
                    note=f"over {quiet:g} s; informers re-open watches the server ends every 5 min",
                    ratio=False,
                )
                assert op.proc is not None
                r.figure(
                    "health at scale: operator peak RSS (VmHWM)",
                    "MiB",
                    {"operator": [status_mib(op.proc.pid, "VmHWM")]},
                    headline=True,
                    note=note,
                )
            finally:
                watcher.stop()
