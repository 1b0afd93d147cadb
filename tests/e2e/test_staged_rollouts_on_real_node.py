"""A staged rollout on the real node (issue 45, step 3): with the real node as the profile's only
node (so its canary), a bad change (a glob that matches nothing) halts after the canary wave, the
node is put back on the previous revision with every device, the pod holding one of them is never
restarted, and the profile is Stalled (RolloutHalted) naming the node; ``kubectl patchbay rollout
status`` exits 1 on it and ``history`` shows both revisions. The shared node agent
serves the profile (the change and the put-back applied live). Devices are FAKE (character
devices the fixture makes under /dev)."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from support.clusters import GROUP, VERSION, Cluster
from support.dranode import RESOURCE_GROUP, RESOURCE_VERSION, labelled_dra_profile
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


def slices_all(cluster: Cluster) -> list[dict[str, Any]]:
    """Every ResourceSlice (one LIST)."""
    return list(
        cluster.custom.list_cluster_custom_object(RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices")["items"]
    )


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


Polled = list[tuple[float, float, dict[str, Any]]]
"""A profile's status as polled: (when the read began, when it returned, the status)."""


@dataclasses.dataclass
class Served:
    """When one node was seen serving a revision, as bounds (the polls are not instants: on a
    loaded machine one LIST takes seconds): ``last_not`` when the last read that found it not yet
    serving began, ``first`` when the first read that found it serving returned."""

    last_not: float = float("-inf")
    first: float = float("inf")


def waves_of(
    name: str, good: str, statuses: Polled, seen: dict[str, Served], real_node: str, kwok: list[str]
) -> tuple[int, list[int]]:
    """Check that profile ``name``'s good change rolled in waves, from its statuses and when each
    node was seen serving ``good``, as polled: the real node alone in the canary, then waves of at
    most 3 of the kwok nodes, no node serving the change before the status showed its wave (its
    previous wave through the gate) nor before every node of the previous wave served it; and
    updatedNumberScheduled counting up to every node. Only what the reads prove counts as a
    breach: a node seen serving by a read that returned before a status read began that still
    showed an earlier wave; a node seen serving before a read began that found a node of the
    previous wave not yet serving. Returns (waves, the counts seen, each once)."""
    # wave index -> when first shown, its nodes (the baseline's keys), how many the status says
    waves: dict[int, tuple[float, list[str], int]] = {}
    counts = []
    progressing: list[tuple[float, int]] = []  # (read began, wave shown) while Progressing
    for began, _, st in statuses:
        ro = st.get("rollout") or {}
        if st.get("updateRevision") == f"{name}-{good}":
            counts.append(int(st.get("updatedNumberScheduled") or 0))
            if ro.get("phase") == "Progressing" and "wave" in ro:
                progressing.append((began, int(ro["wave"])))
                if ro["wave"] not in waves:
                    baseline = sorted(ro.get("baseline") or {})
                    waves[ro["wave"]] = (began, baseline, int(ro.get("waveNodes") or 0))
    print(f"{name}: waves {waves}\nserved {seen}\nupdatedNumberScheduled {sorted(set(counts))}")
    assert waves[0][1] == [real_node], waves  # the canary: the real node alone
    assert sorted(n for w in waves if w for n in waves[w][1]) == sorted(kwok), waves
    assert all(len(waves[w][1]) == waves[w][2] <= 3 for w in waves if w), waves
    assert len(waves) == 1 + -(-KWOK // 3), waves
    wave_of = {n: w for w in waves for n in waves[w][1]}
    assert set(seen) == set(wave_of) and all(s.first < float("inf") for s in seen.values()), seen
    for n, w in wave_of.items():
        # No status read begun after the node was seen serving still showed an earlier wave.
        early = [(t, v) for t, v in progressing if v < w and t > seen[n].first]
        assert not early, (n, w, seen[n], early)
        # Nor was any node of the previous wave seen not yet serving after it was.
        behind = [p for p in waves.get(w - 1, (0, [], 0))[1] if w and seen[p].last_not > seen[n].first]
        assert not behind, (n, w, seen[n], {p: seen[p] for p in behind})
    assert counts == sorted(counts) and counts[-1] == 1 + KWOK, counts
    return len(waves), sorted(set(counts))


def test_a_fleet_rolls_in_waves_and_a_bad_change_stops_at_the_real_canary(
    on_node: OnNode, tmp_path: Path
) -> None:
    """The real node plus KWOK kwok nodes whose simulated agents follow the shared node agent's
    ConfigMap (deciding what they serve with the real agent's function) and write their
    DeviceReports, and for a DRA profile the ResourceSlice the real agent would; a DevicePlugin
    and a DRA profile select them all, the real node forced into the canary. A good change of
    both at once: each rolls the canary first, then waves of at most 3, each wave's nodes moving
    only once the status shows their wave (the previous one through its gate, which for DRA reads
    the wave's nodes' ResourceSlices), updatedNumberScheduled counting up to every node, every
    node's slice then publishing the new count. A bad change (a glob matching nothing): halted
    after the canary, the real node put back with every device and its holder never restarted,
    no kwok node ever served it. (A kwok node has no device files: its simulated agent finds none
    for a paths glob, before and after either change, so its gate compares 0 with 0.)"""
    patchbay, cluster, e2e_cluster, real_node, namespace, fake_dev = on_node
    ns = patchbay.namespace
    label = "patchbay.dev/e2e-fleet"
    name, resource = serial_profile(cluster, fake_dev, real_node, suffix="fleet", agent=None, label=label)
    # A DRA profile of 2 virtual tokens (a virtual discovery finds them on a kwok node too).
    dra, driver = labelled_dra_profile(cluster, label, "fleetdra", {"discovery": {"virtual": {"count": 2}}})
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
        cluster.patch_spec(dra, {"rollout": rollout_spec})
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
        dra_first = spec_revision((cluster.profile(dra) or {})["spec"])

        def on(profile: str, revision: str, nodes: list[str] = everyone) -> bool:
            return all(served(cluster, ns, profile, n) == revision for n in nodes)

        def published(count: int) -> bool:
            """Every node's pool of the DRA driver publishes ``count`` devices."""
            slices = [s for s in slices_all(cluster) if s["spec"]["driver"] == driver]
            by_node = {n: 0 for n in everyone}
            for s in slices:
                by_node[s["spec"]["nodeName"]] = by_node.get(s["spec"]["nodeName"], 0) + len(
                    s["spec"].get("devices") or []
                )
            return all(c == count for c in by_node.values())

        wait_for(
            "every node reporting the first revisions, each DRA pool 2 devices",
            lambda: on(name, first) and on(dra, dra_first) and published(2),
            120,
            detail=lambda: f"sims {sims.log[-10:] if sims else None} errors {sims.errors if sims else None}",
        )

        # When each node was seen serving a revision, and what the status said, polled: one LIST
        # of the DeviceReports, then each profile's status, so that a status read always begins
        # after the report read before it returned.
        seen: dict[str, dict[str, Served]] = {p: {n: Served() for n in everyone} for p in (name, dra)}
        statuses: dict[str, Polled] = {name: [], dra: []}
        stop = threading.Event()

        def watch(revisions: dict[str, str]) -> None:
            """Poll until stopped, once more after (so every node is seen serving)."""
            done = False
            while not done:
                done = stop.is_set()
                began = time.monotonic()
                reports = cluster.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "devicereports")
                returned = time.monotonic()
                serving = {(r.get("profile"), r.get("nodeName"), r.get("revision")) for r in reports["items"]}
                for profile, revision in revisions.items():
                    for n, bounds in seen[profile].items():
                        if (profile, n, revision) in serving:
                            bounds.first = min(bounds.first, returned)
                        elif bounds.first == float("inf"):
                            bounds.last_not = began
                for profile in revisions:
                    t = time.monotonic()
                    status = dict((cluster.profile(profile) or {}).get("status") or {})
                    statuses[profile].append((t, time.monotonic(), status))
                time.sleep(0.2)

        def complete(profile: str, revision: str) -> bool:
            status = (cluster.profile(profile) or {}).get("status") or {}
            return (status.get("rollout") or {}).get("phase") == "Complete" and on(profile, revision)

        # (1) A good change of both: health checks every 2 s instead of 1 (a real node's agent
        # serves it); 3 tokens instead of 2 (the DRA pools grow).
        started = time.monotonic()
        cluster.patch_spec(name, {"plugin": {"health": {"periodSeconds": 2}}})
        cluster.patch_spec(dra, {"plugin": {"discovery": {"virtual": {"count": 3}}}})
        good = spec_revision((cluster.profile(name) or {})["spec"])
        dra_good = spec_revision((cluster.profile(dra) or {})["spec"])
        poller = threading.Thread(target=watch, args=({name: good, dra: dra_good},), daemon=True)
        poller.start()
        try:
            wait_for(
                "both good changes complete",
                lambda: complete(name, good) and complete(dra, dra_good),
                180,
                detail=lambda: (
                    f"status {(cluster.profile(name) or {}).get('status')}\n"
                    f"{(cluster.profile(dra) or {}).get('status')}"
                ),
            )
        finally:
            stop.set()
            poller.join(10)
        rolled = time.monotonic() - started
        rolls = {
            p: waves_of(p, r, statuses[p], seen[p], real_node, kwok)
            for p, r in ((name, good), (dra, dra_good))
        }
        for profile, revision in ((name, good), (dra, dra_good)):
            final = (cluster.profile(profile) or {})["status"]
            assert final["desiredNumberScheduled"] == final["updatedNumberScheduled"] == len(everyone), final
            assert final["currentRevision"] == final["updateRevision"] == f"{profile}-{revision}", final
        wait_for("every DRA pool publishing 3 devices", lambda: published(3), 30)
        assert sims.slices >= 2 * KWOK, sims.slices  # each kwok pool written for both revisions
        print(f"good changes over {len(everyone)} nodes ({rolls}): {rolled:.1f} s")

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
            assert on(name, good, kwok)
            assert not sims.errors and not followers.errors and followers.failed == 0
            print(f"halted {took:.1f} s after the bad change, the kwok nodes never served {bad}")
    finally:
        if followers is not None:
            followers.stop()
        if sims is not None:
            sims.close()
        cluster.delete_profile(name)
        cluster.delete_profile(dra)
        cluster.set_labels(real_node, {label: None, CANARY: None})
