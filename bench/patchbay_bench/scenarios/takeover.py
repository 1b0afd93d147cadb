"""A standby operator taking over from a leader killed without a clean exit, at N kwok nodes.

Two operators (the real program, host processes) run with kopf peering against a cluster of N
kwok nodes, a DevicePlugin profile selecting them, its N agent pods run by kwok, and a report per
node (served by ``reportproxy``, small by default). The leader (the higher priority) works; the
standby keeps its caches LISTed and WATCHed and writes nothing (peering.py). Each round:

1. both start; the standby holds every node and report, and waits;
2. after a random pause (so the kill lands anywhere in the leader's keep-alive cycle), the leader
   gets SIGKILL (a node crash or an OOM kill: no clean exit, its peering record stays) and, in the
   same instant, one node leaves the profile (its label changed), so the profile's status must
   change;
3. measured from the kill: the standby starts working (its gate opens: the leader's record
   expired, the profiles re-read), and its first status write (the profile's status, with the
   node gone).

Sides, interleaved, fresh operators each round: the peering lifetime the operator runs with by
default (``--peering-lifetime``), and kopf's own default of 60 s (the operator's lifetime before
it had the setting; ``baseline_lifetime``, shorter in the quick run). The figure is the whole
failover a user sees; the part of it that is the lifetime is stated beside it.
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from patchbay_bench import REPO
from patchbay_bench.harness import Run, interleave, wait
from patchbay_bench.setup import Cluster, agents_everywhere, kwok_cluster, operator, report_proxy
from patchbay_operator.config import Settings
from patchbay_operator.timestamps import parse_rfc3339

NS, PROFILE, LABEL, PEERING = "patchbay-bench", "bench-takeover", "patchbay.dev/bench", "bench-takeover"
KOPF_DEFAULT_LIFETIME = 60
PEERING_CRD = REPO / "crds" / "kopf.dev_clusterkopfpeerings.yaml"


def one_takeover(r: Run, cluster: Cluster, size: str, lifetime: int, rnd: random.Random) -> dict[str, float]:
    """Leader and standby with ``lifetime``; the leader killed; seconds to the standby working
    and to its first status write."""
    nodes = len(cluster.nodes)
    start_timeout = max(60, nodes * 0.2)
    common = ("--status-debounce", "1", "--peering", PEERING, "--peering-lifetime", str(lifetime))
    node = cluster.nodes[0]
    with (
        report_proxy(r, cluster, size, namespace=NS, profile=PROFILE, node_label=f"{LABEL}=1") as proxy,
        operator(
            r, proxy.kubeconfig, NS, *common, "--priority", "200", start_timeout=start_timeout
        ) as leader,
    ):
        wait("the leader working", lambda: leader.stats().get("working") == 1, 60 + lifetime, 0.2)
        with operator(
            r, proxy.kubeconfig, NS, *common, "--priority", "100", start_timeout=start_timeout
        ) as standby:
            wait(
                "the standby holding every node and report",
                lambda: _holds(standby.stats(), nodes),
                max(120, nodes * 0.1),
                0.5,
            )
            if standby.stats().get("working") or standby.stats().get("statusWrites"):
                raise AssertionError(f"the standby wrote while the leader lived: {standby.stats()}")
            time.sleep(rnd.uniform(0, 5))
            assert leader.proc is not None
            pid = leader.proc.pid
            leader.proc.kill()
            t0, killed_at = time.monotonic(), datetime.now(UTC)
            cluster.label_node(node, {LABEL: "0"})  # one node leaves the profile
            # read now: the standby's kopf deletes a dead peer's record once it expired
            expiry = _record_expiry(cluster, pid) - killed_at
            wait(
                "the standby's first status write",
                lambda: bool(standby.stats().get("statusWrites", 0)),
                lifetime + 60,
                0.05,
            )
            written = time.monotonic() - t0
            leader.proc.wait(timeout=10)
    cluster.label_node(node, {LABEL: "1"})
    return {"written": written, "expired": expiry.total_seconds()}


def _record_expiry(cluster: Cluster, pid: int) -> datetime:
    """When the dead leader's peering record expires: its last keep-alive plus its lifetime (the
    standby cannot know it is dead sooner). The record is the one whose identity names the
    leader's host and PID (main.py: ``<host>-<pid>-<random>``)."""
    obj = cluster.api.get(f"/apis/kopf.dev/v1/clusterkopfpeerings/{PEERING}") or {}
    prefix = f"{socket.gethostname()}-{pid}-"
    found = [rec for key, rec in (obj.get("status") or {}).items() if key.startswith(prefix)]
    if len(found) != 1:
        raise AssertionError(f"no one record of the dead leader ({prefix}...): {obj.get('status')}")
    record = found[0]
    seen = parse_rfc3339(record["lastseen"])
    assert seen is not None, record
    seen = seen if seen.tzinfo else seen.replace(tzinfo=UTC)
    return seen + timedelta(seconds=int(record["lifetime"]))


def _holds(stats: dict[str, Any], nodes: int) -> bool:
    return bool(stats.get("nodes", 0) >= nodes and stats.get("deviceReports", 0) >= nodes - 1)


def run(r: Run) -> None:
    nodes, size = r.integer("nodes"), r.text("size")
    ours = Settings().peering_lifetime
    rnd = random.Random(r.integer("seed"))
    with kwok_cluster(r, nodes, prefix="to-", labels={LABEL: "1"}, crds=False) as cluster:
        cluster.chart_without_operator(NS)
        cluster.crds([PEERING_CRD])  # the chart renders it with operator.replicas above 1 only
        agents_everywhere(r, cluster, NS, PROFILE, LABEL)

        def side(lifetime: int) -> Callable[[int], dict[str, float]]:
            return lambda _i: one_takeover(r, cluster, size, lifetime, rnd)

        base = r.integer("baseline_lifetime")
        before = " (kopf's default, the operator's before)" if base == KOPF_DEFAULT_LIFETIME else ""
        names = {
            "ours": f"peering lifetime {ours} s (the default)",
            "kopf": f"peering lifetime {base} s{before}",
        }
        got = interleave(r.rounds(), {"ours": side(ours), "kopf": side(base)}, progress=r.log)
        note = f"{nodes} kwok nodes, {size} reports, SIGKILL at a random point of the keep-alive cycle"
        r.figure(
            "operator: leader killed -> the standby's first status write",
            "s",
            {names[k]: [x["written"] for x in v] for k, v in got.items()},
            headline=True,
            note=note + "; the write includes the status debounce (1 s)",
        )
        r.figure(
            "operator: the dead leader's record expiring -> the standby's first status write",
            "s",
            {names[k]: [x["written"] - x["expired"] for x in v] for k, v in got.items()},
            note="the standby's own part of the takeover: the rest is waiting out the lifetime "
            "from the leader's last keep-alive (wall clock: the record's lastseen)",
        )
