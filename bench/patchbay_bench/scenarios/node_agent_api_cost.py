"""What the shared node agent costs the API server on a big cluster, against an agent DaemonSet per
profile: N kwok nodes, P profiles, the operator as a process. The two designs need different
cluster states (N agent pods, or P x N), so they are measured one after the other, not round by
round:

1. ONE node agent: P DevicePlugin profiles without agent settings, one DaemonSet whose N pods
   kwok runs.
2. an agent DaemonSet per profile: the profiles given agent settings of their own, one DaemonSet
   and N pods each (``own_profiles`` of the P made: P x N pods take long; the pod count beside it
   is P x N).

Either agent follows a ConfigMap live (the node agent's ``patchbay-node-agent``, a profile's own
agent ``patchbay-<profile>``) and its Node, and a profile change rolls no pod in either (the
operator's pod templates carry no config hash). kwok runs no process, so the agents' side is
SIMULATED, and named so: per node, the exact requests its agent's follower makes (a GET, then a
WATCH from its resourceVersion, of that ConfigMap and of its Node, each by ``metadata.name``), held
open from one asyncio process. Per round, one profile change (a patch of ``p0``'s
``plugin.allocation.envs``): the requests and watch events the API server served for the
resources a change can touch during a window, less an idle window of the same length just before
(kwok's heartbeats, the controllers' resyncs), and when the last simulated agent had it. Both
sides measured, none extrapolated.

Until 2026-12-03 the per-profile side was a roll of that profile's DaemonSet, node by node, per
change (its pod template then carried the config's hash), measured over 60 s and extrapolated to
N nodes; the operator no longer has that design, and the roll measured nothing
(docs/benchmarks.md, the scale sitting of 2026-12-03).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from patchbay_bench import kube
from patchbay_bench.apicost import minus, window, writes
from patchbay_bench.harness import Run, wait
from patchbay_bench.kube import PROFILES
from patchbay_bench.setup import Cluster, kwok_cluster, operator, status_mib
from patchbay_bench.simagents import SHARED, Followers, shared_agent_pods

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


@dataclass
class Changes:
    """One design's profile changes, round by round: API writes, watch events, and the seconds from
    the change to the last simulated agent having it."""

    writes: list[float] = field(default_factory=list)
    events: list[float] = field(default_factory=list)
    fanout: list[float] = field(default_factory=list)


def measure_changes(
    r: Run, cluster: Cluster, followers: Followers, n: int, change: Callable[[], None], side: str
) -> Changes:
    """``r.rounds()`` profile changes, each counted over ``window`` seconds less an idle window of the
    same length just before it."""
    out = Changes()
    for _ in range(r.rounds()):
        idle = window(cluster, r.number("window"))
        first, t0 = len(followers.modified), time.monotonic()
        got = minus(window(cluster, r.number("window"), change), idle)
        seen = followers.modified[first:]
        out.writes.append(writes(got["requests"]))
        out.events.append(sum(got["events"].values()))
        out.fanout.append(max(seen) - t0 if len(seen) >= n else float("nan"))
        r.note(f"{side}, a change: {json.dumps(got)}; {len(seen)} of {n} simulated agents saw it")
    return out


def follow(r: Run, cluster: Cluster, n: int, config_map: str) -> tuple[Followers, float]:
    """Every node's simulated agent following ``config_map`` and its Node; the seconds it took."""
    followers = Followers(
        cluster.dev.server,
        yaml.safe_load(cluster.kubeconfig.read_text()),
        r.work,
        NAMESPACE,
        config_map=config_map,
    )
    t0 = time.monotonic()
    followers.start(cluster.nodes)
    wait(
        f"every simulated agent following {config_map}",
        lambda: followers.open + followers.failed >= 2 * n,
        1800,
        0.5,
    )
    return followers, time.monotonic() - t0


def run(r: Run) -> None:
    n, p = r.integer("nodes"), r.integer("profiles")
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
            # --- one node agent ---
            for i in range(p):
                api.create(PROFILES, profile(i, own_agent=False))
            shared_agent_pods(api, NAMESPACE, n)
            rss0 = status_mib(apiserver, "VmRSS")
            followers, opened = follow(r, cluster, n, SHARED)
            time.sleep(r.number("settle"))
            rss1 = status_mib(apiserver, "VmRSS")
            try:
                shared = measure_changes(r, cluster, followers, n, change, "one node agent")
            finally:
                followers.stop()
            r.figure(
                "node agent: the API server's RSS with the agents' watches",
                "MiB",
                {"with 2 watches per node": [rss1], "before the watches": [rss0]},
                note=f"{followers.open} watches opened in {opened:.0f} s ({followers.failed} failed)",
            )
            # --- an agent DaemonSet per profile ---
            for i in range(p):
                api.delete(f"{PROFILES}/p{i}")
            wait("the shared agent gone", lambda: not daemonsets(), 900, 0.5)
            # Its 5,000 pods go after it, deleted by the garbage collector for minutes; the other
            # design measured meanwhile competes with them (2026-11-27: 3,029 pod DELETEs in a 60 s
            # window), so it starts once they are gone.
            wait(
                "the shared agent's pods gone",
                lambda: not api.items(f"/api/v1/namespaces/{NAMESPACE}/pods", limit="1"),
                1800,
                5.0,
            )
            own = r.integer("own_profiles")
            for i in range(own):
                api.create(PROFILES, profile(i, own_agent=True))
            t0 = time.monotonic()
            wait(
                f"{own} DaemonSets ready on every node",
                lambda: (
                    len(ds := daemonsets()) == own
                    and all((d.get("status") or {}).get("numberReady", 0) >= n for d in ds)
                ),
                3600,
                1.0,
            )
            created = time.monotonic() - t0
            followers, opened = follow(r, cluster, n, "patchbay-p0")
            try:
                per_profile = measure_changes(
                    r, cluster, followers, n, change, "an agent DaemonSet per profile"
                )
            finally:
                followers.stop()
        note = (
            f"{n} kwok nodes, {p} profiles; the agents simulated (their followers' requests); per profile: "
            f"{own} of the {p} DaemonSets made ({own * n} pods ready in {created:.0f} s), p0's agents "
            f"following its ConfigMap ({followers.open} watches opened in {opened:.0f} s, "
            f"{followers.failed} failed)"
        )
        sides = {
            "one node agent (measured)": shared,
            "an agent DaemonSet per profile (measured)": per_profile,
        }
        for figure, unit, part, headline in (
            ("node agent: API writes for one profile change", "writes", "writes", True),
            ("node agent: watch events for one profile change", "events", "events", False),
            ("node agent: a profile change -> on every node", "s", "fanout", True),
        ):
            r.figure(
                figure,
                unit,
                {side: getattr(changes, part) for side, changes in sides.items()},
                headline=headline,
                note=note,
            )
        r.figure(
            "node agent: agent pods",
            "pods",
            {"one node agent": [n], "an agent DaemonSet per profile": [p * n]},
        )
