"""A staged rollout on the real node (issue 45, step 3): with the real node as the profile's only
node (so its canary), a bad change (a glob that matches nothing) halts after the canary wave, the
node is put back on the previous revision with every device, the pod holding one of them is never
restarted, and the profile is Stalled (RolloutHalted) naming the node; ``kubectl patchbay rollout
status`` exits 1 on it and ``history`` shows both revisions. The shared node agent
serves the profile (the change and the put-back applied live). Devices are FAKE (character
devices the fixture makes under /dev)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from support.clusters import Cluster
from support.realnode import (
    DEVICES,
    SHARED_SELECTOR,
    OnNode,
    busybox_pod,
    kubectl_patchbay,
    limits,
    pod_ready,
    serial_profile,
    served,
    staged_serial,
    wait_for,
)

from patchbay_api.revisions import spec_revision
from patchbay_bench.simagents import Followers, SimAgents, client_files


@contextlib.contextmanager
def holding(cluster: Cluster, namespace: str, node: str, resource: str) -> Iterator[Any]:
    """A pod on ``node`` holding one device of ``resource``, once running; deleted afterwards."""
    cluster.core.create_namespaced_pod(
        namespace, limits(busybox_pod("holder", node, "sleep 86400"), resource, 1)
    )
    try:
        yield wait_for(
            "the holder running",
            lambda: (p := cluster.core.read_namespaced_pod("holder", namespace)) and pod_ready(p) and p,
            120,
        )
    finally:
        cluster.core.delete_namespaced_pod("holder", namespace, grace_period_seconds=0)


def bad_change(cluster: Cluster, name: str, fake_dev: Path) -> str:
    """The bad commit: a glob that matches nothing; its revision."""
    cluster.patch_spec(name, {"plugin": {"discovery": {"paths": {"globs": [f"{fake_dev}/nothing*"]}}}})
    return spec_revision((cluster.profile(name) or {})["spec"])


def halted(cluster: Cluster, name: str) -> dict[str, Any] | None:
    """The profile's status.rollout once Halted."""
    rollout = ((cluster.profile(name) or {}).get("status") or {}).get("rollout") or {}
    return rollout if rollout.get("phase") == "Halted" else None


def test_a_bad_change_halts_after_the_canary_and_the_node_is_put_back(
    on_node: OnNode,
) -> None:
    patchbay, cluster, e2e_cluster, real_node, namespace, fake_dev = on_node
    ns = patchbay.namespace
    # A short gate and deadline (the defaults are 30 s and 600 s); not a revision (not what agents act on).
    rollout_spec = {"healthySeconds": 5, "progressDeadlineSeconds": 120}
    full = (str(DEVICES), str(DEVICES))
    with (
        staged_serial(cluster, fake_dev, real_node, ns, "waves", rollout_spec) as (name, resource, first),
        holding(cluster, namespace, real_node, resource) as pod,
    ):
        started = time.monotonic()
        bad = bad_change(cluster, name, fake_dev)

        def agent_side() -> str:
            pods = cluster.core.list_namespaced_pod(ns, label_selector=SHARED_SELECTOR).items
            logs = [
                str(cluster.core.read_namespaced_pod_log(p.metadata.name, ns, tail_lines=40)) for p in pods
            ]
            return f"entry {cluster.shared_entry(name, ns)}\nagent log:\n" + "\n".join(logs)

        rollout = wait_for("the rollout halted", lambda: halted(cluster, name), 180, detail=agent_side)
        print(agent_side())
        took = time.monotonic() - started
        assert rollout["haltedNodes"] == [real_node] and real_node in rollout["message"], rollout
        assert f"0 healthy devices, {DEVICES} before the change" in rollout["message"], rollout
        stalled = cluster.condition(name, "Stalled") or {}
        assert stalled.get("status") == "True" and stalled.get("reason") == "RolloutHalted", stalled
        assert real_node in stalled["message"]
        # kubectl's verbs on the real halt: status exits 1 with the message, history has both.
        status = kubectl_patchbay(e2e_cluster.kubeconfig, ns, "rollout", "status", name, "--watch=false")
        assert status.returncode == 1 and real_node in status.stderr + status.stdout, status
        history = kubectl_patchbay(e2e_cluster.kubeconfig, ns, "rollout", "history", name)
        assert history.returncode == 0 and "nothing*" in history.stdout, history

        # Put back: the previous revision, every device, the holder never restarted.
        wait_for(
            "the node back on the first revision",
            lambda: served(cluster, ns, name, real_node) == first,
            120,
        )
        wait_for("every device back", lambda: cluster.values(real_node, resource) == full, 120)
        back = time.monotonic() - started
        after = cluster.core.read_namespaced_pod("holder", namespace)
        assert after.metadata.uid == pod.metadata.uid and pod_ready(after)
        assert sum(c.restart_count for c in after.status.container_statuses or []) == 0
        status = (cluster.profile(name) or {})["status"]
        assert status["currentRevision"] == f"{name}-{first}" and status["updateRevision"] == f"{name}-{bad}"
        print(f"halted {took:.1f} s after the bad change; node back with {DEVICES} devices at {back:.1f} s")


KWOK = 7
"""kwok nodes beside the real node, each with a SIMULATED agent (patchbay_bench.simagents)."""
CANARY = "patchbay.dev/e2e-fleet-canary"
HEALTHY = 3
"""The fleet's gate (healthySeconds)."""


def test_a_fleet_rolls_in_waves_and_a_bad_change_stops_at_the_real_canary(
    on_node: OnNode, tmp_path: Path
) -> None:
    """The real node plus KWOK kwok nodes whose simulated agents follow the shared node agent's
    ConfigMap (deciding what they serve with the real agent's function) and write their
    DeviceReports; one DevicePlugin profile selects them all, the real node forced into the canary.
    A good change: the canary first, then waves of at most 3, each wave's nodes moving only once the
    status shows their wave (the previous one through its gate), updatedNumberScheduled counting up
    to every node. A bad change (a glob matching nothing): halted after the canary, the real node
    put back with every device and its holder never restarted, no kwok node ever served it.
    (A kwok node has no device files: its simulated agent finds none for a paths glob, before and
    after either change, so its gate compares 0 with 0.)"""
    patchbay, cluster, e2e_cluster, real_node, namespace, fake_dev = on_node
    ns = patchbay.namespace
    label = "patchbay.dev/e2e-fleet"
    name, resource = serial_profile(cluster, fake_dev, real_node, suffix="fleet", agent=None, label=label)
    cluster.set_labels(real_node, {CANARY: "yes"})
    kwok = cluster.add_nodes(KWOK, labels={label: cluster.tag})
    everyone = sorted([real_node, *kwok])
    rollout_spec = {
        "healthySeconds": HEALTHY,
        "progressDeadlineSeconds": 120,
        "maxNodesPerWave": 3,
        "canary": {"nodeSelector": {"matchLabels": {CANARY: "yes"}}},
    }
    full = (str(DEVICES), str(DEVICES))
    kubeconfig = yaml.safe_load(Path(e2e_cluster.kubeconfig).read_text())
    sims: SimAgents | None = None
    followers: Followers | None = None
    try:
        cluster.patch_spec(name, {"rollout": rollout_spec})
        wait_for("every device on the real node", lambda: cluster.values(real_node, resource) == full, 180)

        # kwok "runs" the shared agent's pods; a report names its node's agent pod (admission).
        def agent_pods() -> dict[str, str] | None:
            pods = cluster.core.list_namespaced_pod(ns, label_selector=SHARED_SELECTOR).items
            on = {p.spec.node_name: p.metadata.name for p in pods if p.spec.node_name and pod_ready(p)}
            return on if set(kwok) <= set(on) else None

        agents = wait_for("the shared agent's pods ready on the kwok nodes", agent_pods, 120)
        sims = SimAgents(e2e_cluster.server, client_files(kubeconfig, tmp_path), ns, agents)
        followers = Followers(e2e_cluster.server, kubeconfig, tmp_path, ns, sims.on_config, sims.on_node)
        followers.start(kwok)
        first = spec_revision((cluster.profile(name) or {})["spec"])

        def on(revision: str) -> bool:
            return all(served(cluster, ns, name, n) == revision for n in everyone)

        wait_for(
            "every node reporting the first revision",
            lambda: on(first),
            120,
            detail=lambda: f"sims {sims.log[-10:] if sims else None} errors {sims.errors if sims else None}",
        )

        # What each node first reported of a revision, and what the status said, polled.
        seen: dict[str, float] = {}
        statuses: list[tuple[float, dict[str, Any]]] = []
        stop = threading.Event()

        def watch(revision: str) -> None:
            while not stop.is_set():
                t = time.monotonic()
                statuses.append((t, dict((cluster.profile(name) or {}).get("status") or {})))
                for n in everyone:
                    if n not in seen and served(cluster, ns, name, n) == revision:
                        seen[n] = t
                time.sleep(0.2)

        # (1) A good change: health checks every 2 s instead of 1 (a real node's agent serves it).
        started = time.monotonic()
        cluster.patch_spec(name, {"plugin": {"health": {"periodSeconds": 2}}})
        good = spec_revision((cluster.profile(name) or {})["spec"])
        poller = threading.Thread(target=watch, args=(good,), daemon=True)
        poller.start()
        try:
            wait_for(
                "the good change complete",
                lambda: (
                    ((cluster.profile(name) or {}).get("status") or {}).get("rollout", {}).get("phase")
                    == "Complete"
                    and on(good)
                ),
                180,
                detail=lambda: f"status {(cluster.profile(name) or {}).get('status')}",
            )
        finally:
            stop.set()
            poller.join(10)
        rolled = time.monotonic() - started
        # The waves as the status named them: wave index -> when first shown, its nodes (the
        # baseline's keys), and how many the status says it has.
        waves: dict[int, tuple[float, list[str], int]] = {}
        counts = []
        for t, st in statuses:
            ro = st.get("rollout") or {}
            if st.get("updateRevision") == f"{name}-{good}":
                counts.append(int(st.get("updatedNumberScheduled") or 0))
                if ro.get("phase") == "Progressing" and "wave" in ro and ro["wave"] not in waves:
                    waves[ro["wave"]] = (t, sorted(ro.get("baseline") or {}), int(ro.get("waveNodes") or 0))
        print(f"waves {waves}\nfirst served {seen}\nupdatedNumberScheduled {counts}")
        assert waves[0][1] == [real_node], waves  # the canary: the real node alone
        assert sorted(n for w in waves if w for n in waves[w][1]) == sorted(kwok), waves
        assert all(len(waves[w][1]) == waves[w][2] <= 3 for w in waves if w), waves
        assert len(waves) == 1 + -(-KWOK // 3), waves
        for w in sorted(waves)[1:]:
            shown, nodes, _ = waves[w]
            previous = waves[w - 1][1]
            # No node of a wave served the change before the status showed its wave (its previous
            # wave through the gate), nor before every node of the previous wave served it.
            assert all(seen[n] >= shown for n in nodes), (w, shown, seen)
            assert min(seen[n] for n in nodes) >= max(seen[n] for n in previous), (w, seen)
        # Nor did any node move before its wave: at every poll, the nodes serving the change are
        # within the waves shown so far.
        for t, _ in statuses:
            allowed = {n for w in waves.values() if w[0] <= t for n in w[1]}
            assert {n for n, at in seen.items() if at <= t} <= allowed, (t, seen, waves)
        assert counts == sorted(counts) and counts[-1] == len(everyone), counts
        final = (cluster.profile(name) or {})["status"]
        assert final["desiredNumberScheduled"] == final["updatedNumberScheduled"] == len(everyone), final
        assert final["currentRevision"] == final["updateRevision"] == f"{name}-{good}", final
        print(f"good change over {len(everyone)} nodes in {len(waves)} waves: {rolled:.1f} s")

        # (2) A bad change with the real node (the canary) holding a device.
        with holding(cluster, namespace, real_node, resource) as pod:
            started = time.monotonic()
            bad = bad_change(cluster, name, fake_dev)
            rollout = wait_for("the rollout halted", lambda: halted(cluster, name), 180)
            took = time.monotonic() - started
            assert rollout["haltedNodes"] == [real_node] and rollout["wave"] == 0, rollout
            stalled = cluster.condition(name, "Stalled") or {}
            assert stalled.get("status") == "True" and stalled.get("reason") == "RolloutHalted", stalled
            assert real_node in stalled["message"]
            wait_for(
                "the real node back on the good revision",
                lambda: served(cluster, ns, name, real_node) == good,
                120,
            )
            wait_for("every device back", lambda: cluster.values(real_node, resource) == full, 120)
            # Longer than a gate: had the halt let a wave through, a kwok node would have moved.
            time.sleep(HEALTHY + 2)
            after = cluster.core.read_namespaced_pod("holder", namespace)
            assert after.metadata.uid == pod.metadata.uid and pod_ready(after)
            assert sum(c.restart_count for c in after.status.container_statuses or []) == 0
            # No kwok node ever decided to serve the bad revision, and each still reports the good one.
            assert not [k for k, nodes in sims.ever.items() if k[1] == bad and nodes], sims.ever
            assert all(served(cluster, ns, name, n) == good for n in kwok)
            assert not sims.errors and not followers.errors and followers.failed == 0
            print(f"halted {took:.1f} s after the bad change, the kwok nodes never served {bad}")
    finally:
        if followers is not None:
            followers.stop()
        if sims is not None:
            sims.close()
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {label: None, CANARY: None})
