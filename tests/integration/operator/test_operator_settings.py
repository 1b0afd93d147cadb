"""Settings that change how the operator runs: JSON logs and kopf peering between replicas."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from kubernetes import client
from support.clusters import TEST_LABEL, Cluster, wait_for
from support.operator import Operator, peered_pair

R = "example.com/peered"


def test_json_log_format(operator_process: Operator) -> None:
    operator_process.stop()
    operator_process.start("--log-format", "json")
    try:
        wait_for("the operator's /metrics", lambda: "nodes" in operator_process.stats())
        lines = [ln for ln in operator_process.log().splitlines() if ln.strip()]
        records = [json.loads(ln) for ln in lines]  # every line is one JSON object
        assert any("Loaded" in r["message"] for r in records)
        assert all({"message", "timestamp", "severity"} <= r.keys() for r in records), records[:3]
    finally:
        operator_process.stop()


def test_bad_setting_fails_fast_naming_it(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "patchbay_operator.main", "--log-format", "xml"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert "--log-format" in out.stderr


def peered_spec(cluster: Cluster) -> dict[str, Any]:
    return {
        "resourceName": R,
        "mode": "Static",
        "nodeSelector": {"matchLabels": {TEST_LABEL: cluster.tag}},
        "static": {"capacity": 1},
        # Changes here test which replica writes, not waves (test_operator_rollouts_*): at once.
        "rollout": {"strategy": "Immediate"},
    }


def test_two_peered_replicas_only_the_higher_priority_one_works(
    cluster: Cluster, operator_process: Operator, peering_crd: None, tmp_path: Path
) -> None:
    nodes = cluster.add_nodes(2)
    peering, high, low = peered_pair(cluster, operator_process, tmp_path)
    spec = peered_spec(cluster)
    try:
        high.start("--peering", peering, "--priority", "200")
        low.start("--peering", peering, "--priority", "100")
        # kopf starts every peered replica paused; only the highest-priority one resumes.
        wait_for("the high replica works", lambda: "Resuming operations" in high.log())
        name = f"{cluster.prefix}peered"
        cluster.create_profile(name, spec)
        wait_for("nodes patched", lambda: all(cluster.values(n, R) == ("1", "1") for n in nodes))
        wait_for("the high replica counted its patches", lambda: high.stats().get("nodePatches", 0) >= 2)
        assert low.stats().get("nodePatches", 0) == 0
        assert "Resuming operations" not in low.log()

        # The working replica goes away cleanly: the other one takes over.
        high.stop(signal.SIGTERM)
        wait_for("the low replica resumes", lambda: "Resuming operations" in low.log(), timeout=90)
        cluster.patch_spec(name, {"static": {"capacity": 3}})
        wait_for(
            "nodes updated by the other replica",
            lambda: all(cluster.values(n, R) == ("3", "3") for n in nodes),
        )
        cluster.delete_profile(name)
        wait_for("profile released", lambda: cluster.profile(name) is None)
    finally:
        high.stop()
        low.stop()
        client.CustomObjectsApi(cluster.api).delete_cluster_custom_object(
            "kopf.dev", "v1", "clusterkopfpeerings", peering
        )


def test_a_waiting_replica_writes_nothing_and_takes_over_with_fresh_profiles(
    cluster: Cluster, operator_process: Operator, peering_crd: None, tmp_path: Path
) -> None:
    """The node informer runs outside kopf, so kopf's pause does not stop it: the controller
    must pause itself. A waiting replica that knew the profile at capacity 1 (from its startup
    LIST) sees the active one change it to 3 and a drift on a node, and must write nothing;
    when it takes over it must plan from the profiles as they are NOW, not push 1 back."""
    nodes = cluster.add_nodes(2)
    peering, high, low = peered_pair(cluster, operator_process, tmp_path)
    name = f"{cluster.prefix}stale"
    spec = peered_spec(cluster)

    def all_at(value: str) -> bool:
        return all(cluster.values(n, R) == (value, value) for n in nodes)

    try:
        high.start("--peering", peering, "--priority", "200")
        wait_for("the high replica works", lambda: "Resuming operations" in high.log())
        cluster.create_profile(name, spec)
        wait_for("nodes at 1", lambda: all_at("1"))
        low.start("--peering", peering, "--priority", "100")
        wait_for("the low replica waits", lambda: "Waiting: live peers with priority >= 100" in low.log())
        assert "Loaded 1 DevicePluginProfiles" in low.log()

        cluster.patch_spec(name, {"static": {"capacity": 3}})
        wait_for("nodes at 3", lambda: all_at("3"))
        marker = low.stats().get("nodeEvents", 0)
        cluster.set_status_value(nodes[0], R, "7")
        wait_for("the drift re-asserted by the high replica", lambda: all_at("3"))
        wait_for("the low replica saw the drift", lambda: low.stats().get("nodeEvents", 0) >= marker + 2)
        assert low.stats().get("nodePatches", 0) == 0
        assert low.stats().get("statusWrites", 0) == 0
        assert low.stats().get("working") == 0

        high.stop(signal.SIGTERM)
        wait_for("the low replica works", lambda: "Working: no live peer" in low.log(), timeout=90)
        wait_for("its stats say so", lambda: low.stats().get("working") == 1, timeout=15)
        # Nodes already show what the profile says: a replica planning from its stale copy
        # (capacity 1) would patch every node here.
        assert low.settled_patches() == 0
        assert all_at("3")
        cluster.patch_spec(name, {"static": {"capacity": 5}})
        wait_for("nodes updated by the low replica", lambda: all_at("5"))
        cluster.delete_profile(name)
        wait_for("profile released", lambda: cluster.profile(name) is None)
        assert all(cluster.values(n, R) == (None, None) for n in nodes)
    finally:
        high.stop()
        low.stop()
        client.CustomObjectsApi(cluster.api).delete_cluster_custom_object(
            "kopf.dev", "v1", "clusterkopfpeerings", peering
        )


def test_a_leader_killed_without_a_clean_exit_is_taken_over_once_its_record_expires(
    cluster: Cluster, operator_process: Operator, peering_crd: None, tmp_path: Path
) -> None:
    """SIGKILL (an OOM kill, a node lost) leaves the leader's peering record behind: the standby
    must wait for it to expire, and the record's lifetime is the operator's ``--peering-lifetime``
    (kopf's own default, 60 s, made failover a minute). Each replica's record carries the lifetime
    it was given; the standby works once the dead leader's expired, and applies a change made
    while nobody worked. (How long it took: bench scenario ``takeover``, never asserted here.)"""
    nodes = cluster.add_nodes(2)
    peering, high, low = peered_pair(cluster, operator_process, tmp_path)
    name = f"{cluster.prefix}killed"
    peerings = client.CustomObjectsApi(cluster.api)

    def records() -> dict[str, Any]:
        obj = peerings.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", peering)
        return dict(obj.get("status") or {})

    try:
        high.start("--peering", peering, "--priority", "200", "--peering-lifetime", "7")
        wait_for("the high replica works", lambda: "Working: no live peer" in high.log())
        low.start("--peering", peering, "--priority", "100", "--peering-lifetime", "7")
        wait_for("the low replica waits", lambda: "Waiting: live peers with priority >= 100" in low.log())
        wait_for("both records", lambda: len(records()) == 2)
        assert {r.get("lifetime") for r in records().values()} == {7}, records()
        cluster.create_profile(name, peered_spec(cluster))
        wait_for("nodes at 1", lambda: all(cluster.values(n, R) == ("1", "1") for n in nodes))

        assert high.proc is not None
        high.proc.kill()  # no clean exit: its record stays until it expires
        high.proc.wait(timeout=10)
        assert len(records()) == 2
        cluster.patch_spec(name, {"static": {"capacity": 4}})
        wait_for("the low replica works", lambda: "Working: no live peer" in low.log(), timeout=60)
        wait_for(
            "nodes updated by the low replica", lambda: all(cluster.values(n, R) == ("4", "4") for n in nodes)
        )
        wait_for("its status written", lambda: low.stats().get("statusWrites", 0) > 0)
        cluster.delete_profile(name)
        wait_for("profile released", lambda: cluster.profile(name) is None)
    finally:
        high.stop()
        low.stop()
        peerings.delete_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", peering)
