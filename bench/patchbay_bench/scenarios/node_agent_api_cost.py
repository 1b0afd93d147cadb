"""What the shared node agent costs the API server on a big cluster: N kwok nodes, P profiles, the
operator as a process. Two designs, each in the cluster state it needs (they cannot alternate
round by round: one needs N pods, the other P x N):

1. after, ONE node agent: P DevicePlugin profiles without agent settings, one DaemonSet whose N
   pods kwok runs. kwok runs no process, so the agents' side is SIMULATED, and named so: per
   node, the exact requests the node agent's follower makes (a GET, then a WATCH from its
   resourceVersion, of its ConfigMap and of its Node, each by ``metadata.name``), held open from
   one asyncio process. Per round, one profile change (a patch of one profile's
   ``plugin.allocation.envs``): the requests and watch events the API server served for the
   resources a change can touch during a window, less an idle window of the same length just
   before (kwok's heartbeats, the controllers' resyncs), and when the last simulated agent had it.
2. before, an agent DaemonSet per profile: P DaemonSets, P x N pods. One change rolls that
   profile's DaemonSet node by node; rolling N nodes takes long, so it is measured over a window
   (less an idle one): nodes rolled and writes served, per rolled node; the figures for N nodes
   are those rates times N (extrapolated, not observed: the record says so).
"""

from __future__ import annotations

import json
import time
from typing import Any

import yaml

from patchbay_bench import kube
from patchbay_bench.apicost import minus, window, writes
from patchbay_bench.harness import Run, wait
from patchbay_bench.kube import PROFILES
from patchbay_bench.setup import kwok_cluster, operator, status_mib
from patchbay_bench.simagents import Followers, shared_agent_pods

NAMESPACE = "patchbay-system"


def profile(i: int, own_agent: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceName": f"bench.patchbay.dev/r{i}",
        "mode": "DevicePlugin",
        "nodeSelector": {"matchLabels": {"type": "kwok"}},
        "plugin": {"discovery": {"virtual": {"count": 2}}},
        # The API cost of a change that reaches every node (staged rollouts move one wave at a time).
        "rollout": {"strategy": "Immediate"},
    }
    if own_agent:  # kwok nodes are tainted; the shared agent tolerates every taint, an own agent what it says
        spec["agent"] = {
            "updateStrategy": {"maxSurge": 1, "maxUnavailable": 0},
            "tolerations": [{"operator": "Exists"}],
        }
    return kube.profile(f"p{i}", spec)


def run(r: Run) -> None:
    n, p, rounds = r.integer("nodes"), r.integer("profiles"), r.rounds()
    with kwok_cluster(r, n, crds=False) as cluster:
        api = cluster.api
        cluster.chart_without_operator(NAMESPACE)
        apiserver = next(pr.pid for pr in cluster.dev.running() if pr.name == "kube-apiserver")
        stamp = [0]

        def change() -> None:
            stamp[0] += 1
            api.merge(
                f"{PROFILES}/p0", {"spec": {"plugin": {"allocation": {"envs": {"CHANGE": str(stamp[0])}}}}}
            )

        def daemonsets() -> list[dict[str, Any]]:
            return api.items(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets")

        with operator(r, cluster.kubeconfig, NAMESPACE):
            for i in range(p):
                api.create(PROFILES, profile(i, own_agent=False))
            shared_agent_pods(api, NAMESPACE, n)
            rss0 = status_mib(apiserver, "VmRSS")
            followers = Followers(
                cluster.dev.server, yaml.safe_load(cluster.kubeconfig.read_text()), r.work, NAMESPACE
            )
            t0 = time.monotonic()
            followers.start(cluster.nodes)
            wait(
                "every simulated agent following",
                lambda: followers.open + followers.failed >= 2 * n,
                1800,
                0.5,
            )
            opened = time.monotonic() - t0
            time.sleep(r.number("settle"))
            rss1 = status_mib(apiserver, "VmRSS")
            after_writes, after_events, fanout = [], [], []
            try:
                for _ in range(rounds):
                    idle = window(cluster, r.number("window"))
                    first, t0 = len(followers.modified), time.monotonic()
                    got = minus(window(cluster, r.number("window"), change), idle)
                    seen = followers.modified[first:]
                    after_writes.append(writes(got["requests"]))
                    after_events.append(sum(got["events"].values()))
                    fanout.append(max(seen) - t0 if len(seen) >= n else float("nan"))
                    r.note(f"after, a change: {json.dumps(got)}; {len(seen)} of {n} simulated agents saw it")
            finally:
                followers.stop()
            r.figure(
                "node agent: the API server's RSS with the agents' watches",
                "MiB",
                {"with 2 watches per node": [rss1], "before the watches": [rss0]},
                note=f"{followers.open} watches opened in {opened:.0f} s ({followers.failed} failed)",
            )
            # --- before: an agent DaemonSet per profile ---
            for i in range(p):
                api.delete(f"{PROFILES}/p{i}")
            wait("the shared agent gone", lambda: not daemonsets(), 900, 0.5)
            # Its 5,000 pods go after it, deleted by the garbage collector for minutes; a roll
            # measured meanwhile competes with them (2026-11-27: 3,029 pod DELETEs and not one
            # node rolled in the 60 s window), so the before design starts once they are gone.
            wait(
                "the shared agent's pods gone",
                lambda: not api.items(f"/api/v1/namespaces/{NAMESPACE}/pods", limit="1"),
                1800,
                5.0,
            )
            bp = r.integer("before_profiles")
            for i in range(bp):
                api.create(PROFILES, profile(i, own_agent=True))
            t0 = time.monotonic()
            wait(
                f"{bp} DaemonSets ready on every node",
                lambda: (
                    len(ds := daemonsets()) == bp
                    and all((d.get("status") or {}).get("numberReady", 0) >= n for d in ds)
                ),
                3600,
                1.0,
            )
            created = time.monotonic() - t0
            bw = r.number("before_window")
            idle = window(cluster, bw)
            got = minus(window(cluster, bw, change), idle)
            ds0 = api.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/patchbay-p0") or {}
            rolled = int((ds0.get("status") or {}).get("updatedNumberScheduled", 0))
            per_node = writes(got["requests"]) / rolled if rolled else float("nan")
            events_per_node = sum(got["events"].values()) / rolled if rolled else float("nan")
            r.note(f"before, the roll over {bw:g} s: {rolled} nodes rolled; {json.dumps(got)}")
        note = (
            f"{n} kwok nodes, {p} profiles; the node agent's side simulated (its follower's requests); "
            f"before: measured over {bw:g} s ({rolled} nodes rolled), extrapolated to {n} nodes; "
            f"before: {bp} of the {p} DaemonSets made ({bp * n} pods in {created:.0f} s), one rolled"
        )
        r.figure(
            "node agent: API writes for one profile change",
            "writes",
            {
                "one node agent (measured)": after_writes,
                "an agent DaemonSet per profile (extrapolated)": [per_node * n],
            },
            headline=True,
            note=note,
        )
        r.figure(
            "node agent: watch events for one profile change",
            "events",
            {
                "one node agent (measured)": after_events,
                "an agent DaemonSet per profile (extrapolated)": [events_per_node * n],
            },
            note=note,
        )
        r.figure(
            "node agent: a profile change -> on every node",
            "s",
            {
                "one node agent (measured)": fanout,
                "an agent DaemonSet per profile (extrapolated)": [
                    bw / rolled * n if rolled else float("nan")
                ],
            },
            headline=True,
            note=note,
        )
        r.figure(
            "node agent: agent pods",
            "pods",
            {"one node agent": [n], "an agent DaemonSet per profile": [p * n]},
        )
