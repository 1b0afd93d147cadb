"""Static mode at scale: how close the operator gets to what the API server allows. N kwok nodes,
every one Ready before anything is timed; then interleaved rounds, each in the same conditions:

- baseline, no operator running: a plain concurrent client (the operator's own HTTP transport,
  ``--concurrency`` threads) sending the operator's one-JSON-patch-per-node payload to every node,
  apply then remove;
- the operator, started afresh as a process: apply (a Static profile created -> every node shows
  the value) and delete (deleted -> every node clean); in the first round also drift (a value
  reset on random nodes, one at a time, until it is back).

"Every node shows X" is seen the same way for both sides: one raw watch on nodes, plain JSON.
Writes per node come from the operator's own counters, CPU from /proc, peak RSS from VmHWM.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from patchbay_bench import kube
from patchbay_bench.harness import Run, interleave, pct
from patchbay_bench.kube import NODES, PROFILES, Api, Stream
from patchbay_bench.setup import kwok_cluster, operator, status_mib
from patchbay_operator.kube import JSON_PATCH, Kube, load_configuration

LABEL = "patchbay.dev/bench"
R_OPERATOR, R_BASELINE = "example.com/bench", "example.com/baseline"
NAMESPACE = "patchbay-bench"


def esc(s: str) -> str:
    return s.replace("~", "~0").replace("/", "~1")


class Observer:
    """A raw watch on the bench's nodes; tells when every one shows a value for a resource."""

    def __init__(self, api: Api, nodes: set[str]) -> None:
        self.api, self.nodes = api, nodes
        self.values: dict[str, dict[str, tuple[str | None, str | None]]] = {}
        self.cond = threading.Condition()
        self.stopped = False
        data = api.call("GET", NODES, query={"labelSelector": f"{LABEL}=1"})
        for n in data["items"]:
            self._fold(n)
        self.rv = data["metadata"]["resourceVersion"]
        self.stream: Stream | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopped = True
        if self.stream is not None:
            self.stream.close()
        self.thread.join(10)

    def _fold(self, node: dict[str, Any]) -> None:
        st = node.get("status") or {}
        cap, alloc = st.get("capacity") or {}, st.get("allocatable") or {}
        self.values[node["metadata"]["name"]] = {
            r: (cap.get(r), alloc.get(r)) for r in (R_OPERATOR, R_BASELINE)
        }

    def _run(self) -> None:
        while not self.stopped:
            self.stream = self.api.watch(
                NODES,
                labelSelector=f"{LABEL}=1",
                resourceVersion=self.rv,
                allowWatchBookmarks="true",
                timeoutSeconds="300",
            )
            for ev in self.stream:
                obj = ev["object"]
                self.rv = obj["metadata"]["resourceVersion"]
                if ev["type"] in ("ADDED", "MODIFIED"):
                    with self.cond:
                        self._fold(obj)
                        self.cond.notify_all()

    def wait(
        self, resource: str, value: str | None, names: set[str] | None = None, timeout: float = 900
    ) -> float:
        """Block until every node in ``names`` shows ``value`` in capacity and allocatable; the
        monotonic time it did."""
        want, names = (value, value), names or self.nodes
        deadline = time.monotonic() + timeout
        with self.cond:
            while not all(self.values.get(n, {}).get(resource) == want for n in names):
                left = deadline - time.monotonic()
                if left <= 0:
                    bad = sum(1 for n in names if self.values.get(n, {}).get(resource) != want)
                    raise TimeoutError(f"{bad} nodes still lack {resource}={value}")
                self.cond.wait(min(left, 1.0))
            return time.monotonic()


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


def profile() -> dict[str, Any]:
    spec = {
        "resourceName": R_OPERATOR,
        "mode": "Static",
        "nodeSelector": {"matchLabels": {LABEL: "1"}},
        "static": {"capacity": 4},
    }
    return kube.profile("bench", spec)


def run(r: Run) -> None:
    n, threads = r.integer("nodes"), r.integer("concurrency")
    with kwok_cluster(r, n, prefix="bench-", labels={LABEL: "1"}) as cluster:
        cluster.namespace(NAMESPACE)
        time.sleep(3)  # the last Ready updates settle
        obs = Observer(cluster.api, set(cluster.nodes))
        kube = Kube(load_configuration(str(cluster.kubeconfig), threads))
        add, remove = baseline_ops()
        drift: list[float] = []
        extra: list[dict[str, float]] = []

        def patch_all(ops: list[dict[str, Any]]) -> None:
            def one(name: str) -> None:
                kube.request("PATCH", f"{NODES}/{name}/status", ops, content_type=JSON_PATCH)

            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(one, cluster.nodes))

        def timed(action: Callable[[], object], until: Callable[[], float]) -> float:
            t0 = time.monotonic()
            action()
            return until() - t0

        def base(_i: int) -> tuple[float, float]:
            return (
                timed(lambda: patch_all(add), lambda: obs.wait(R_BASELINE, "4")),
                timed(lambda: patch_all(remove), lambda: obs.wait(R_BASELINE, None)),
            )

        def ours(i: int) -> tuple[float, float]:
            with operator(r, cluster.kubeconfig, NAMESPACE, "--concurrency", str(threads)) as op:
                while op.stats().get("nodes", 0) < n:
                    time.sleep(0.2)
                quiet = r.number("settle")
                before, cpu0 = op.settled_stats(quiet), op.cpu_seconds()
                apply = timed(
                    lambda: cluster.api.create(PROFILES, profile()), lambda: obs.wait(R_OPERATOR, "4")
                )
                row = {"apply_cpu": op.cpu_seconds() - cpu0}
                after = op.settled_stats(quiet)
                row["apply_writes"] = (after["nodePatches"] - before["nodePatches"]) / n
                if i == 0:  # drift: a value reset behind the operator's back, one node at a time
                    for name in random.sample(cluster.nodes, min(r.integer("drift_samples"), n)):
                        ops = [
                            {"op": "add", "path": f"/status/{k}/{esc(R_OPERATOR)}", "value": "0"}
                            for k in ("capacity", "allocatable")
                        ]
                        t0 = time.monotonic()
                        cluster.api.json_patch(f"{NODES}/{name}/status", ops)
                        drift.append(obs.wait(R_OPERATOR, "4", {name}, 60) - t0)
                    row["drift_writes"] = op.settled_stats(quiet)["nodePatches"] - after["nodePatches"]
                    after = op.settled_stats(quiet)
                cpu0 = op.cpu_seconds()
                delete = timed(
                    lambda: cluster.api.delete(f"{PROFILES}/bench"), lambda: obs.wait(R_OPERATOR, None)
                )
                row["delete_cpu"] = op.cpu_seconds() - cpu0
                t0 = time.monotonic()
                while cluster.api.get(f"{PROFILES}/bench") is not None:
                    time.sleep(0.1)
                row["released"] = delete + time.monotonic() - t0
                done = op.settled_stats(quiet)
                row["delete_writes"] = (done["nodePatches"] - after["nodePatches"]) / n
                row["status_writes"] = done["statusWrites"]
                row["max_per_node"] = done["maxPatchesPerNode"]
                assert op.proc is not None
                row["rss"] = status_mib(op.proc.pid, "VmHWM")
                extra.append(row)
                return apply, delete

        try:
            got = interleave(r.rounds(), {"baseline": base, "operator": ours}, progress=r.log)
        finally:
            obs.stop()
        note = f"{n} kwok nodes, concurrency {threads}; baseline: the operator's transport, no controller"
        for k, what in ((0, "apply (every node shows the value)"), (1, "delete (every node clean)")):
            r.figure(
                f"Static at scale: {what}",
                "s",
                {"operator": [x[k] for x in got["operator"]], "baseline": [x[k] for x in got["baseline"]]},
                headline=True,
                note=note,
            )

        def each(key: str, scale: float = 1.0) -> list[float]:
            return [x[key] * scale for x in extra if key in x]

        r.figure(
            "Static at scale: profile gone (finalizer released) after delete",
            "s",
            {"operator": each("released")},
        )
        r.figure("Static at scale: API writes per node, apply", "writes", {"operator": each("apply_writes")})
        r.figure(
            "Static at scale: API writes per node, delete", "writes", {"operator": each("delete_writes")}
        )
        r.figure(
            "Static at scale: operator CPU per node, apply", "ms", {"operator": each("apply_cpu", 1000 / n)}
        )
        r.figure(
            "Static at scale: operator peak RSS (VmHWM)",
            "MiB",
            {"operator": each("rss")},
            headline=True,
            note=note,
        )
        r.figure(
            "Static at scale: profile status writes per round", "writes", {"operator": each("status_writes")}
        )
        r.figure("Static at scale: most patches on one node", "patches", {"operator": each("max_per_node")})
        if drift:
            r.figure(
                "Static at scale: drift re-assertion p50 / p99 (round 1)",
                "ms",
                {"p50": [statistics.median(drift) * 1000], "p99": [pct(drift, 0.99) * 1000]},
                note=f"{len(drift)} resets, {int(extra[0]['drift_writes'])} writes",
                ratio=False,
            )
