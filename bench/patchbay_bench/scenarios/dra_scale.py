"""DRA at scale, beside the Device Plugin path: N kwok nodes with D devices each, a DRA profile and a
DevicePlugin profile selecting every node, the chart installed without its operator pod (its CRDs,
the agents' RBAC, the admission policies) and the operator as a process. kwok "runs" both agent
DaemonSets (2 N pods); the bench plays each agent with that agent's own pod-bound token, so every
write goes through RBAC and the admission policy as the real agent's does, and writes what the
real agent writes: the DRA agent a ResourceSlice per node, built by the agent's own
`dra.slices.slice_documents`, and its DeviceReport (server-side applies); the device plugin path
its DeviceReport and, for the kubelet (which advertises a device plugin's devices), the node's
capacity and allocatable (a status PATCH). Measured, the two paths interleaved round by round (each
round publishes every node from nothing, then removes it all):

- publish: every node's objects written (16 writers) and counted in the profile's status;
- the API writes and the bytes sent to publish (the API server's request counters, the bodies);
- then, with the DRA profile published: `kubectl patchbay devices` and `nodes` as a user runs
  them, beside `kubectl get resourceslices -o json` (what a user reads without the plugin);
- the operator's peak RSS (VmHWM) with both profiles at N nodes.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import urllib3

from patchbay_agent.dra.slices import SliceDevice, slice_documents
from patchbay_bench.harness import Run, interleave, wait
from patchbay_bench.kube import NODES, PROFILES, profile, reports, writes
from patchbay_bench.scenarios.kubectl_scale import timed
from patchbay_bench.setup import bin_dir, kwok_cluster, operator, status_mib

NS = "patchbay-bench"
LABEL = "patchbay.dev/bench-dra-scale"
DRA, DP = "bench-dra", "bench-dp"
RESOURCE = {DRA: "bench.patchbay.dev/sensor", DP: "bench.patchbay.dev/serial"}
DRIVER = f"{DRA}.patchbay.dev"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
APPLY = "application/apply-patch+yaml"
SIDES = {DRA: "DRA (ResourceSlice + DeviceReport)", DP: "Device Plugin (DeviceReport + node status)"}


def report(name: str, node: str, agent: str, devices: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "patchbay.dev/v1beta1",
        "kind": "DeviceReport",
        "metadata": {"name": f"{name}.{node}", "namespace": NS},
        "profile": name,
        "nodeName": node,
        "agent": agent,
        "resourceName": RESOURCE[name],
        "devices": [{"id": f"dev{i}", "health": "Healthy"} for i in range(devices)],
        "summary": {"total": devices, "healthy": devices, "unhealthy": 0, "allocated": 0},
    }
    if name == DRA:
        body["deviceTaints"] = "Kept"
    return body


def slices(node: str, uid: str, devices: int) -> list[dict[str, Any]]:
    """The node's slices exactly as the DRA agent builds them (its attributes: id and path)."""
    devs = [
        SliceDevice(
            f"dev{i}",
            f"dev{i}",
            {"patchbay.dev/id": {"string": f"dev{i}"}, "patchbay.dev/path": {"string": f"/dev/bench{i}"}},
        )
        for i in range(devices)
    ]
    return slice_documents(DRIVER, node, devs, node_uid=uid)


class Agents:
    """Every node's two agents, each with its own pod-bound token, over one connection pool."""

    def __init__(self, server: str, ca: str) -> None:
        self.server = server
        self.http = urllib3.PoolManager(maxsize=32, ca_certs=ca, cert_reqs="CERT_REQUIRED", timeout=30.0)
        #: (profile, node) -> (token, pod name)
        self.who: dict[tuple[str, str], tuple[str, str]] = {}
        self.sent = 0
        self._lock = threading.Lock()

    def count(self, data: str) -> None:
        with self._lock:
            self.sent += len(data)

    def send(
        self, profile_name: str, node: str, method: str, path: str, body: Any, content_type: str
    ) -> None:
        token = self.who[profile_name, node][0]
        data = json.dumps(body, separators=(",", ":"))
        self.count(data)
        got = self.http.request(
            method,
            f"{self.server}{path}",
            body=data,
            headers={"Authorization": f"Bearer {token}", "Content-Type": content_type},
        )
        if got.status >= 300:
            raise RuntimeError(
                f"{method} {path} as {profile_name}'s agent refused: {got.status} {got.data[:300]!r}"
            )


def run(r: Run) -> None:
    n, per = r.integer("nodes"), r.integer("devices")
    with kwok_cluster(r, n, prefix="ds-", labels={LABEL: "1"}, crds=False) as cluster:
        api = cluster.api
        cluster.chart_without_operator(NS)
        with operator(r, cluster.kubeconfig, NS, "--status-debounce", "1") as op:
            wait("the operator to list every node", lambda: op.stats().get("nodes", 0) >= n, 300, 0.5)
            for name, mode in ((DRA, "DRA"), (DP, "DevicePlugin")):
                spec = {
                    "resourceName": RESOURCE[name],
                    "mode": mode,
                    "nodeSelector": {"matchLabels": {LABEL: "1"}},
                    "plugin": {"discovery": {"virtual": {"count": per}}},
                    "agent": {"tolerations": [{"operator": "Exists"}]},
                }
                api.create(PROFILES, profile(name, spec))

            def scheduled(ds: str) -> bool:
                # Scheduled, not Ready: a token bound to a pod carries the pod's node as soon as
                # the pod is bound, which is all the played agents need; waiting for kwok to mark
                # 2 N pods Ready took longer than 33 minutes at 5,000 nodes on this machine.
                status = (api.get(ds) or {}).get("status") or {}
                return bool(status.get("currentNumberScheduled", 0) >= n)

            for name in (DRA, DP):
                ds = f"/apis/apps/v1/namespaces/{NS}/daemonsets/patchbay-{name}"
                wait(
                    f"{name}'s agent pods scheduled",
                    functools.partial(scheduled, ds),
                    max(900, n * 0.4),
                    1.0,
                )
            agents = Agents(cluster.dev.server, str(cluster.dev.pki_dir / "ca.crt"))
            uids = {node["metadata"]["name"]: node["metadata"]["uid"] for node in api.items(NODES)}
            pods = []
            for name in (DRA, DP):
                pods += [
                    (name, p)
                    for p in api.items(
                        f"/api/v1/namespaces/{NS}/pods", labelSelector=f"patchbay.dev/profile={name}"
                    )
                ]

            def token(item: tuple[str, dict[str, Any]]) -> None:
                name, pod = item
                meta, spec = pod["metadata"], pod["spec"]
                ref = {"kind": "Pod", "apiVersion": "v1", "name": meta["name"], "uid": meta["uid"]}
                account = spec.get("serviceAccountName", "default")
                got = api.create(
                    f"/api/v1/namespaces/{NS}/serviceaccounts/{account}/token",
                    {"spec": {"boundObjectRef": ref, "expirationSeconds": 7200}},
                )
                agents.who[name, spec["nodeName"]] = (str(got["status"]["token"]), meta["name"])

            r.log(f"{len(pods)} agent tokens")
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(token, pods))

            def total(name: str) -> int:
                """The healthy devices the profile's status counts (every device here is healthy)."""
                st = (api.get(f"{PROFILES}/{name}") or {}).get("status") or {}
                return int((st.get("devices") or {}).get("healthy") or 0)

            def until_counted(name: str, devices: int, what: str) -> None:
                """Wait until the profile's status counts ``devices``; on a timeout, say what it counts."""
                try:
                    wait(what, lambda: total(name) == devices, 60 if r.quick else 600, 0.05)
                except TimeoutError as e:
                    status = (api.get(f"{PROFILES}/{name}") or {}).get("status")
                    raise TimeoutError(f"{e}; the profile's status: {json.dumps(status)[:3000]}") from None

            def publish_dra(node: str) -> None:
                for doc in slices(node, uids[node], per):
                    agents.send(
                        DRA,
                        node,
                        "PATCH",
                        f"{SLICES}/{doc['metadata']['name']}?fieldManager=patchbay-agent&force=true",
                        doc,
                        APPLY,
                    )
                body = report(DRA, node, agents.who[DRA, node][1], per)
                agents.send(
                    DRA,
                    node,
                    "PATCH",
                    f"{reports(NS)}/{body['metadata']['name']}?fieldManager=patchbay-agent&force=true",
                    body,
                    APPLY,
                )

            def publish_dp(node: str) -> None:
                body = report(DP, node, agents.who[DP, node][1], per)
                agents.send(
                    DP,
                    node,
                    "PATCH",
                    f"{reports(NS)}/{body['metadata']['name']}?fieldManager=patchbay-agent&force=true",
                    body,
                    APPLY,
                )
                esc = RESOURCE[DP].replace("/", "~1")
                # The kubelet's write, played with the admin's credentials (an agent may not).
                ops = [
                    {"op": "add", "path": f"/status/{k}/{esc}", "value": str(per)}
                    for k in ("capacity", "allocatable")
                ]
                agents.count(json.dumps(ops, separators=(",", ":")))
                api.json_patch(f"{NODES}/{node}/status", ops)

            def clear(name: str) -> None:
                with ThreadPoolExecutor(16) as pool:
                    list(pool.map(lambda node: api.delete(f"{reports(NS)}/{name}.{node}"), cluster.nodes))
                if name == DRA:
                    # One DELETE per slice, 16 at a time, as for the reports: a DELETE of the
                    # collection is served one object at a time (the API server's
                    # --delete-collection-workers is 1); 5,000 slices took over 330 s that way.
                    names = [
                        doc["metadata"]["name"]
                        for node in cluster.nodes
                        for doc in slices(node, uids[node], per)
                    ]
                    with ThreadPoolExecutor(16) as pool:
                        list(pool.map(lambda s: api.delete(f"{SLICES}/{s}"), names))
                    wait(
                        "the slices gone",
                        lambda: not api.items(SLICES, fieldSelector=f"spec.driver={DRIVER}", limit="1"),
                        300,
                        0.5,
                    )
                else:
                    esc = RESOURCE[DP].replace("/", "~1")
                    ops = [
                        {"op": "remove", "path": f"/status/{k}/{esc}"} for k in ("capacity", "allocatable")
                    ]
                    with ThreadPoolExecutor(16) as pool:
                        list(
                            pool.map(
                                lambda node: api.json_patch(f"{NODES}/{node}/status", ops), cluster.nodes
                            )
                        )
                until_counted(name, 0, f"{name}'s status back to no device")

            def side(
                name: str, publish: Callable[[str], None]
            ) -> Callable[[int], tuple[float, float, int, int]]:
                resources = ("resourceslices", "devicereports") if name == DRA else ("devicereports", "nodes")

                def one(_i: int) -> tuple[float, float, int, int]:
                    before, sent = api.metrics(), agents.sent
                    t0 = time.monotonic()
                    with ThreadPoolExecutor(16) as pool:
                        list(pool.map(publish, cluster.nodes))
                    written = time.monotonic() - t0
                    until_counted(name, n * per, f"{name}: every device in the status")
                    counted = time.monotonic() - t0
                    after = api.metrics()
                    count = sum(
                        writes(before, after, res, ("POST", "PUT", "PATCH", "APPLY")) for res in resources
                    )
                    got = (written, counted, count, agents.sent - sent)
                    clear(name)
                    return got

                return one

            results = interleave(
                r.rounds(), {DRA: side(DRA, publish_dra), DP: side(DP, publish_dp)}, progress=r.log
            )
            note = f"{n} kwok nodes x {per} devices; 16 writers; --status-debounce 1"
            r.figure(
                "DRA at scale: publish every node -> counted in the profile's status",
                "s",
                {SIDES[k]: [x[1] for x in v] for k, v in results.items()},
                headline=True,
                note=note,
            )
            r.figure(
                "DRA at scale: publish every node -> every object written",
                "s",
                {SIDES[k]: [x[0] for x in v] for k, v in results.items()},
                note=note,
            )
            r.figure(
                "DRA at scale: API writes to publish every node",
                "writes",
                {SIDES[k]: [x[2] for x in v] for k, v in results.items()},
                headline=True,
                note=note
                + "; the API server's counters of the path's resources (not the operator's status writes)",
            )
            r.figure(
                "DRA at scale: bytes sent to publish every node",
                "MiB",
                {SIDES[k]: [x[3] / 2**20 for x in v] for k, v in results.items()},
                note=note + "; the request bodies as sent (compact JSON)",
            )

            # Published once more, left standing: what a user reads at this size.
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(publish_dra, cluster.nodes))
            until_counted(DRA, n * per, "DRA: every device in the status")
            venv = Path(sys.executable).parent
            env = {
                **os.environ,
                "KUBECONFIG": str(cluster.kubeconfig),
                "PATH": f"{venv}:{bin_dir()}:{os.environ['PATH']}",
            }
            plugin, kubectl = str(venv / "kubectl-patchbay"), str(bin_dir() / "kubectl")
            argv = {
                "kubectl patchbay devices": [plugin, "devices"],
                "kubectl patchbay nodes": [plugin, "nodes"],
                "kubectl get resourceslices -o json": [kubectl, "get", "resourceslices", "-o", "json"],
            }

            def command(a: list[str]) -> Callable[[int], tuple[float, float]]:
                return lambda _i: timed(a, env)

            got = interleave(r.rounds(), {k: command(a) for k, a in argv.items()})
            for cmd in ("kubectl patchbay devices", "kubectl patchbay nodes"):
                r.figure(
                    f"DRA at scale: {cmd}, wall time",
                    "s",
                    {
                        cmd: [x[0] for x in got[cmd]],
                        "kubectl get resourceslices -o json": [
                            x[0] for x in got["kubectl get resourceslices -o json"]
                        ],
                    },
                    headline=True,
                    note=f"{n} nodes: {n} ResourceSlices and {2 * n} DeviceReports of {per} devices",
                )
            assert op.proc is not None
            r.figure(
                "DRA at scale: operator peak RSS (VmHWM)",
                "MiB",
                {"operator": [status_mib(op.proc.pid, "VmHWM")]},
                note=f"{n} nodes, a DRA and a DevicePlugin profile of {per} devices each",
            )
