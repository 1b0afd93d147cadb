"""Staged rollouts on the real API server (issue 45, step 3): a change of a shared profile rolls in
waves (the canary, then ``maxNodesPerWave``), each held for its gate; a regression on the canary
halts it (Stalled naming the node, a Warning Event, the metric, the node put back); the revert
settles it; an operator stopped mid-rollout and a new one started resumes it where it was, and so
does a peered standby that knew the profile settled when its leader leaves mid-gate. A
Static profile's change rolls in the same waves, the operator writing each node's capacity as its
wave comes (one Normal ``RolloutWave`` Event per wave); a change its canary cannot take halts it
and puts the canary's previous capacity back.

A profile with an agent of its own rolls in the same waves, through its own ConfigMap (its
DaemonSet's pod template untouched by the change).

No agent runs on kwok nodes: the test writes each node's DeviceReport itself, as the shared node
agent (or the profile's own) would, naming the agent's pod on the node and the revision the
agents' ConfigMap assigns the node (``Rollout.served``, the function the agents use)."""

from __future__ import annotations

import contextlib
import re
import signal
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client import ApiException
from support.clusters import NAMESPACE, TEST_LABEL, Cluster, wait_for
from support.operator import Operator, peered_pair

from patchbay_api.revisions import Rollout, spec_revision


def spec(cluster: Cluster, count: int, **rollout: Any) -> dict[str, Any]:
    return {
        "resourceName": f"example.com/{cluster.prefix}waves",
        "mode": "DevicePlugin",
        "nodeSelector": {"matchLabels": {TEST_LABEL: cluster.tag}},
        "plugin": {"discovery": {"virtual": {"count": count}}},
        "rollout": {"healthySeconds": 1, "maxNodesPerWave": 2, "progressDeadlineSeconds": 120, **rollout},
    }


def own_entry(cluster: Cluster, name: str) -> dict[str, Any] | None:
    """Profile `name`'s entry in its own agent's ConfigMap ``patchbay-<name>`` (a node config of
    one entry)."""
    cm = cluster.core.read_namespaced_config_map(f"patchbay-{name}", NAMESPACE)
    doc = yaml.safe_load((cm.data or {}).get("node.yaml") or "{}") or {}
    return next((e for e in doc.get("profiles") or [] if e.get("profile") == name), None)


def own_agent_pod(cluster: Cluster, name: str, node: str) -> str:
    pods = cluster.core.list_namespaced_pod(
        NAMESPACE, label_selector=f"patchbay.dev/profile={name}", field_selector=f"spec.nodeName={node}"
    ).items
    return str(pods[0].metadata.name) if pods else ""


class Agents:
    """The nodes' shared agents (`own`: the profile's own agents), simulated: each reports the
    revision its node is assigned."""

    def __init__(
        self, cluster: Cluster, name: str, nodes: list[str], resource: str = "waves", *, own: bool = False
    ) -> None:
        self.cluster, self.name, self.nodes = cluster, name, nodes
        self.resource = f"example.com/{cluster.prefix}{resource}"
        pod = (lambda n: own_agent_pod(cluster, name, n)) if own else cluster.shared_agent_pod
        self.entry = (lambda: own_entry(cluster, name)) if own else (lambda: cluster.shared_entry(name))
        self.pods = {n: wait_for(f"the agent pod on {n}", lambda n=n: pod(n)) for n in nodes}
        self.reported: dict[str, tuple[str, int, Any]] = {}
        #: node -> every revision it was assigned, in order
        self.history: dict[str, list[str]] = {n: [] for n in nodes}

    def stanza(self) -> tuple[str, Rollout]:
        entry = wait_for("the profile's entry", self.entry)
        return entry["uid"], Rollout.from_dict(entry["rollout"])

    def report(
        self,
        healthy: Callable[[str, str], int] = lambda _n, _r: 2,
        failures: Callable[[str, str], dict[str, Any] | None] = lambda _n, _r: None,
    ) -> dict[str, str]:
        """Each node's report on the revision it is assigned now, with `failures(node, revision)`
        as its allocationFailures (None: none); node -> that revision."""
        uid, stanza = self.stanza()
        resource = self.resource
        out = {}
        for node in self.nodes:
            revision = stanza.served(uid, node, {TEST_LABEL: self.cluster.tag})
            out[node] = revision
            if not self.history[node] or self.history[node][-1] != revision:
                self.history[node].append(revision)
            count, failed = healthy(node, revision), failures(node, revision)
            if self.reported.get(node) != (revision, count, failed):
                devices = [
                    {"id": f"virtual-{i}", "health": "Healthy" if i < count else "Unhealthy"}
                    for i in range(max(2, count))
                ]
                extra = {"allocationFailures": failed} if failed is not None else {}
                self.cluster.apply_report(
                    self.name, node, self.pods[node], devices, resource, revision=revision, **extra
                )
                self.reported[node] = (revision, count, failed)
        return out


def status(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict((cluster.profile(name) or {}).get("status") or {})


def digest(cluster: Cluster, name: str) -> str:
    return spec_revision(dict((cluster.profile(name) or {})["spec"]))


def settle(cluster: Cluster, agents: Agents, name: str, operator: Operator) -> list[tuple[int, int]]:
    """Report as agents until every node is on the spec's revision and the rollout complete; the
    (wave, nodes on the update) pairs seen, in order."""
    target = f"{name}-{digest(cluster, name)}"
    seen: list[tuple[int, int]] = []

    def done() -> bool:
        served = agents.report()
        st = status(cluster, name)
        rollout = st.get("rollout") or {}
        if rollout.get("phase") == "Progressing":
            step = (
                int(rollout.get("wave") or 0),
                sum(r == target.rpartition("-")[2] for r in served.values()),
            )
            if not seen or seen[-1] != step:
                seen.append(step)
        return st.get("currentRevision") == target and rollout.get("phase") == "Complete"

    wait_for(
        "the rollout complete", done, 120, detail=lambda: f"{status(cluster, name)}\n{operator.log()[-3000:]}"
    )
    return seen


def settled(cluster: Cluster, name: str) -> bool:
    """The rollout complete and nothing stalled (after a revert: the exceptions gone)."""
    complete = (status(cluster, name).get("rollout") or {}).get("phase") == "Complete"
    return complete and (cluster.condition(name, "Stalled") or {}).get("status") == "False"


def bad_change_halts(
    cluster: Cluster, agents: Agents, name: str, operator: Operator
) -> tuple[str, list[str], dict[str, Any]]:
    """A bad change (its nodes' agents serve it with no device, as a glob matching nothing),
    reported until the rollout halts: its revision, the one canary that served it, the rollout."""
    cluster.patch_spec(name, {"plugin": {"discovery": {"virtual": {"count": 3}}}})
    bad = digest(cluster, name)

    def halted() -> dict[str, Any] | None:
        agents.report(lambda _n, r: 0 if r == bad else 2)
        rollout = status(cluster, name).get("rollout") or {}
        return rollout if rollout.get("phase") == "Halted" else None

    rollout = wait_for("the rollout halted", halted, 60, detail=lambda: operator.log()[-3000:])
    canary = [n for n, h in agents.history.items() if bad in h]
    assert len(canary) == 1 and rollout["haltedNodes"] == canary, (canary, rollout)
    return bad, canary, rollout


def events_of(cluster: Cluster, name: str, reason: str) -> list[Any]:
    found = cluster.core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
    return sorted((e for e in found if e.reason == reason), key=lambda e: e.metadata.creation_timestamp)


def applied(operator: Operator, kind: str) -> int:
    """The shared node agent's objects of ``kind`` the operator applied so far (its log says each)."""
    return len(re.findall(rf"Applied {kind} [^/ ]+/patchbay-node-agent\b", operator.log()))


def metrics(operator: Operator) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def test_a_change_rolls_in_waves_a_regression_halts_and_the_revert_settles(
    cluster: Cluster, operator: Operator
) -> None:
    name = f"{cluster.prefix}waves"
    nodes = cluster.add_nodes(4)
    cluster.create_profile(name, spec(cluster, 1))
    agents = Agents(cluster, name, nodes)
    first = digest(cluster, name)
    assert set(agents.report().values()) == {first}, "a new profile: every node at once"
    wait_for("every node counted", lambda: status(cluster, name).get("updatedNumberScheduled") == 4)

    # A good change: the canary, then waves of 2, each held for its gate; then current = update.
    applies = {kind: applied(operator, kind) for kind in ("ConfigMap", "DaemonSet")}
    cluster.patch_spec(name, {"plugin": {"discovery": {"virtual": {"count": 2}}}})
    second = digest(cluster, name)
    entry = wait_for(
        "the rollout begun", lambda: (e := cluster.shared_entry(name)) and e["revision"] == second and e
    )
    assert entry["revisions"][first]["plugin"]["discovery"]["virtual"]["count"] == 1
    seen = settle(cluster, agents, name, operator)
    counts = [n for _, n in seen]
    assert counts == sorted(counts), f"never fewer nodes moved: {seen}"
    moved = {w: n for w, n in seen}
    assert moved.get(0) == 1 and moved.get(1) == 3, f"canary 1, then +2 a wave: {seen}"
    assert all(h == [first, second] for h in agents.history.values()), agents.history
    st = status(cluster, name)
    assert st["rollout"]["phase"] == "Complete" and st["updatedNumberScheduled"] == 4
    # The one-body ConfigMap is written after the status that says Complete: waited for, bounded.
    wait_for(
        "one body once every node moved", lambda: "revisions" not in (cluster.shared_entry(name) or {}), 30
    )
    notes = [e.message for e in events_of(cluster, name, "RolloutWave")]
    assert len(notes) == 3 and notes[-1].endswith("4 of 4 updated"), f"one Normal Event per wave: {notes}"
    # The agents' ConfigMap written for the change, then once per wave (3) and at the end; the
    # shared DaemonSet, which no wave changes, with the change only (as often as the ConfigMap
    # before the fix).
    more = {kind: applied(operator, kind) - n for kind, n in applies.items()}
    assert more["DaemonSet"] >= 1 and more["DaemonSet"] <= more["ConfigMap"] - 4, more

    # A bad change: the canary's agent serves it with no device (as a glob matching nothing).
    bad, canary, rollout = bad_change_halts(cluster, agents, name, operator)
    assert canary[0] in rollout["message"] and "0 healthy devices, 2 before the change" in rollout["message"]
    # The status is written first, the agents' ConfigMap (the put-back) right after it.
    stanza = wait_for(
        "put back on the last good revision",
        lambda: (s := agents.stanza()[1]).exceptions == {canary[0]: second} and s,
        detail=lambda: str(agents.stanza()[1]),
    )
    assert agents.report()[canary[0]] == second
    stalled = wait_for(
        "Stalled", lambda: (c := cluster.condition(name, "Stalled")) and c["status"] == "True" and c
    )
    assert stalled["reason"] == "RolloutHalted" and canary[0] in stalled["message"]
    events = cluster.core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
    assert any(e.reason == "RolloutHalted" and e.type == "Warning" for e in events), [
        e.reason for e in events
    ]
    assert f'patchbay_rollout_halted{{profile="{name}"}} 1.0' in metrics(operator)
    # Frozen: no other node is ever given the bad revision, whatever the time.
    for _ in range(3):
        agents.report(lambda _n, r: 0 if r == bad else 2)
        assert agents.stanza()[1].threshold == stanza.threshold
    assert [n for n, h in agents.history.items() if bad in h] == canary

    # The revert (a new commit): update == current, settled, the exception and Stalled gone.
    cluster.patch_spec(name, {"plugin": {"discovery": {"virtual": {"count": 2}}}})
    wait_for("settled on the revert", lambda: settled(cluster, name), 60)
    assert set(agents.report().values()) == {second}
    assert f'patchbay_rollout_halted{{profile="{name}"}} 0.0' in metrics(operator)

    # Pods fail to start for the resource on the canary during its wave (refused Allocates, which
    # the agent counts in its report's allocationFailures): halted, naming the node and the last
    # failure. Every node counted 2 failures before the change: those do not fail the gate.
    since = "2026-11-29T00:00:00Z"
    old = {"count": 2, "since": since, "last": {"time": since, "message": "Allocate: an old refusal"}}
    refused = "Allocate: unknown device(s) virtual-7"
    agents.report(failures=lambda _n, _r: old)
    cluster.patch_spec(name, {"plugin": {"discovery": {"virtual": {"count": 4}}}})
    failing = digest(cluster, name)

    def failures(_n: str, r: str) -> dict[str, Any]:
        return old if r != failing else {**old, "count": 3, "last": {"time": since, "message": refused}}

    def halted_by_failures() -> dict[str, Any] | None:
        agents.report(failures=failures)
        rollout = status(cluster, name).get("rollout") or {}
        return rollout if rollout.get("phase") == "Halted" else None

    rollout = wait_for(
        "halted by allocation failures", halted_by_failures, 60, detail=lambda: operator.log()[-3000:]
    )
    canary = [n for n, h in agents.history.items() if failing in h]
    assert len(canary) == 1 and rollout["haltedNodes"] == canary, (canary, rollout)
    assert f"node {canary[0]}: " in rollout["message"], rollout["message"]
    assert f"allocation failure(s) during the wave, the last: {refused}" in rollout["message"]
    wait_for(
        "the canary put back on the last good revision",
        lambda: agents.report(failures=failures)[canary[0]] == second,
    )


def test_a_profile_with_an_agent_of_its_own_rolls_in_waves_through_its_own_configmap(
    cluster: Cluster, operator: Operator
) -> None:
    """Its own ConfigMap carries the one entry with both revisions and the stanza, moved a wave at
    a time; its DaemonSet's pod template never changes with the plugin; a regression on the
    canary halts it and puts the canary back, in that ConfigMap."""
    name = f"{cluster.prefix}waves"
    nodes = cluster.add_nodes(3)
    cluster.create_profile(name, {**spec(cluster, 1), "agent": {"tolerations": [{"operator": "Exists"}]}})
    agents = Agents(cluster, name, nodes, own=True)
    first = digest(cluster, name)
    assert set(agents.report().values()) == {first}
    wait_for("every node counted", lambda: status(cluster, name).get("updatedNumberScheduled") == 3)
    template = cluster.apps.read_namespaced_daemon_set(f"patchbay-{name}", NAMESPACE).spec.template.to_dict()

    cluster.patch_spec(name, {"plugin": {"discovery": {"virtual": {"count": 2}}}})
    second = digest(cluster, name)
    entry = wait_for(
        "the rollout begun", lambda: (e := own_entry(cluster, name)) and e["revision"] == second and e
    )
    assert entry["revisions"][first]["plugin"]["discovery"]["virtual"]["count"] == 1
    assert "not staged" not in str((status(cluster, name).get("rollout") or {}).get("message"))
    seen = settle(cluster, agents, name, operator)
    moved = {w: n for w, n in seen}
    assert moved.get(0) == 1 and moved.get(1) == 3, f"canary 1, then +2 a wave: {seen}"
    assert all(h == [first, second] for h in agents.history.values()), agents.history
    # The one-body ConfigMap is written after the status that says Complete: waited for, bounded.
    wait_for(
        "one body once every node moved", lambda: "revisions" not in (own_entry(cluster, name) or {}), 30
    )

    _bad, canary, _rollout = bad_change_halts(cluster, agents, name, operator)
    wait_for(
        "put back on the last good revision", lambda: agents.stanza()[1].exceptions == {canary[0]: second}
    )
    assert agents.report()[canary[0]] == second
    ds = cluster.apps.read_namespaced_daemon_set(f"patchbay-{name}", NAMESPACE)
    assert ds.spec.template.to_dict() == template, "the pod template does not depend on the plugin"


def publish(cluster: Cluster, driver: str, node: str, count: int) -> None:
    """What a DRA agent publishes: its node's pool of ``driver``, ``count`` devices (one slice)."""
    devices = [
        {"name": f"virtual-{i}", "attributes": {"patchbay.dev/id": {"string": f"virtual-{i}"}}}
        for i in range(count)
    ]
    pool = {"name": node, "generation": count, "resourceSliceCount": 1}
    spec = {"driver": driver, "nodeName": node, "pool": pool, "devices": devices}
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
    }
    body["spec"] = spec
    try:
        cluster.custom.replace_cluster_custom_object(
            "resource.k8s.io", "v1", "resourceslices", body["metadata"]["name"], body
        )
    except ApiException as e:
        if e.status != 404:
            raise
        cluster.custom.create_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", body)


def test_a_dra_node_whose_slices_lack_devices_its_report_says_healthy_halts_the_canary(
    cluster: Cluster, operator: Operator
) -> None:
    """A DRA profile's canary reports every device of the change healthy, but its ResourceSlice
    still publishes fewer: read at the gate's end (and again once SLICES_SETTLE passed, the gate
    being shorter), the rollout halts naming the node and what its slices lack."""
    name = f"{cluster.prefix}drawaves"
    driver = f"{name}.patchbay.dev"
    nodes = cluster.add_nodes(2)
    body = spec(cluster, 2)
    cluster.create_profile(name, {**body, "mode": "DRA", "resourceName": f"example.com/{name}"})
    agents = Agents(cluster, name, nodes, resource="drawaves")
    try:
        for n in nodes:
            publish(cluster, driver, n, 2)
        agents.report()
        wait_for("every node counted", lambda: status(cluster, name).get("updatedNumberScheduled") == 2)
        cluster.patch_spec(name, {"plugin": {"discovery": {"virtual": {"count": 3}}}})
        change = digest(cluster, name)

        def halted() -> dict[str, Any] | None:
            agents.report(lambda _n, r: 3 if r == change else 2)  # the slices stay at 2
            rollout = status(cluster, name).get("rollout") or {}
            return rollout if rollout.get("phase") == "Halted" else None

        rollout = wait_for("the rollout halted", halted, 60, detail=lambda: operator.log()[-3000:])
        canary = [n for n, h in agents.history.items() if change in h]
        assert len(canary) == 1 and rollout["haltedNodes"] == canary, (canary, rollout)
        said = f"node {canary[0]}: its ResourceSlices of {driver} publish 2 of the 3 devices its DeviceReport"
        assert said in rollout["message"], rollout["message"]
    finally:
        for n in nodes:
            with contextlib.suppress(ApiException):
                cluster.custom.delete_cluster_custom_object(
                    "resource.k8s.io", "v1", "resourceslices", f"{n}-{driver}"
                )


def test_an_operator_stopped_mid_rollout_and_a_new_one_resume_it(
    cluster: Cluster, operator: Operator
) -> None:
    name = f"{cluster.prefix}waves"
    nodes = cluster.add_nodes(4)
    cluster.create_profile(name, spec(cluster, 1, maxNodesPerWave=1, healthySeconds=2))
    agents = Agents(cluster, name, nodes)
    first = digest(cluster, name)
    agents.report()
    wait_for("every node counted", lambda: status(cluster, name).get("updatedNumberScheduled") == 4)
    cluster.patch_spec(name, {"plugin": {"discovery": {"virtual": {"count": 2}}}})
    second = digest(cluster, name)

    def wave(n: int) -> bool:
        agents.report()
        return int((status(cluster, name).get("rollout") or {}).get("wave") or 0) >= n

    # Seen once timing out on v1.34.4 in a whole test-oldest run (passed alone in 33.8 s): the
    # status and the operator's log said when it fails again.
    wait_for(
        "the second wave",
        lambda: wave(1),
        60,
        detail=lambda: f"{status(cluster, name)}\n{operator.log()[-3000:]}",
    )
    threshold = agents.stanza()[1].threshold
    operator.stop()
    operator.start()
    seen = settle(cluster, agents, name, operator)
    assert seen and min(w for w, _ in seen) >= 1, f"resumed, not started again from the canary: {seen}"
    assert agents.stanza()[1].threshold >= threshold
    assert all(h == [first, second] for h in agents.history.values()), agents.history


def test_a_standby_that_knew_the_profile_settled_finishes_the_rollout_its_leader_left(
    cluster: Cluster, operator_process: Operator, peering_crd: None, tmp_path: Path
) -> None:
    """Two peered replicas; the standby starts once the profile is settled on its first revision
    (so its own copy says settled), then the spec changes and the leader moves the canary. The
    leader goes (SIGTERM) while the canary is held for its gate: kopf in the standby resumes its
    handlers on its own reading of the peering object, before the standby's gate has taken over.
    The rollout must go on from the status (the canary stays on the update, the other nodes
    follow), never begin again from the standby's stale copy (the canary put back, the rollout
    then waiting for it until its deadline; seen in the e2e takeover test on v1.34.4)."""
    nodes = cluster.add_nodes(3)
    peering, high, low = peered_pair(cluster, operator_process, tmp_path)
    name = f"{cluster.prefix}takeover"
    try:
        high.start("--peering", peering, "--priority", "200")
        wait_for("the high replica works", lambda: "Working: no live peer" in high.log())
        cluster.create_profile(name, spec(cluster, 1, maxNodesPerWave=1, healthySeconds=8))
        agents = Agents(cluster, name, nodes)
        first = digest(cluster, name)
        agents.report()
        wait_for("every node counted", lambda: status(cluster, name).get("updatedNumberScheduled") == 3)
        low.start("--peering", peering, "--priority", "100")
        wait_for("the low replica waits", lambda: "Waiting: live peers with priority >= 100" in low.log())
        assert "Loaded 1 DevicePluginProfiles" in low.log()
        cluster.patch_spec(name, {"plugin": {"discovery": {"virtual": {"count": 2}}}})
        second = digest(cluster, name)

        def canary_moved() -> bool:
            rollout = status(cluster, name).get("rollout") or {}
            return second in agents.report().values() and rollout.get("phase") == "Progressing"

        wait_for("the canary on the update, held for its gate", canary_moved, 60)
        high.stop(signal.SIGTERM)
        wait_for("the low replica works", lambda: "Working: no live peer" in low.log(), timeout=60)
        settle(cluster, agents, name, low)
        assert all(h == [first, second] for h in agents.history.values()), agents.history
        assert (status(cluster, name).get("rollout") or {}).get("phase") == "Complete"
        # Deleted while the working replica runs, which takes its finalizer off: with no operator
        # left, the cluster's cleanup waited 60 s for it before taking the finalizer off itself.
        cluster.delete_profile(name)
        wait_for("the profile gone", lambda: cluster.profile(name) is None, timeout=30)
    finally:
        high.stop()
        low.stop()
        client.CustomObjectsApi(cluster.api).delete_cluster_custom_object(
            "kopf.dev", "v1", "clusterkopfpeerings", peering
        )


def static_spec(cluster: Cluster, count: int) -> dict[str, Any]:
    return {
        "resourceName": f"example.com/{cluster.prefix}slots",
        "mode": "Static",
        "nodeSelector": {"matchLabels": {TEST_LABEL: cluster.tag}},
        "static": {"capacity": count},
        "rollout": {"healthySeconds": 1, "maxNodesPerWave": 2, "progressDeadlineSeconds": 120},
    }


def test_a_static_change_rolls_in_waves_with_an_event_each_and_a_bad_label_halts_the_canary(
    cluster: Cluster, operator: Operator
) -> None:
    name = f"{cluster.prefix}slots"
    resource = f"example.com/{cluster.prefix}slots"
    nodes = cluster.add_nodes(4)
    cluster.create_profile(name, static_spec(cluster, 1))

    def values() -> dict[str, tuple[str | None, str | None]]:
        return {n: cluster.values(n, resource) for n in nodes}

    wait_for("every node at 1 (a new profile: at once)", lambda: set(values().values()) == {("1", "1")})
    wait_for("every node counted", lambda: status(cluster, name).get("updatedNumberScheduled") == 4)

    # A good change: the node status shows 2 on the canary, then on 2 more, then on all.
    cluster.patch_spec(name, {"static": {"capacity": 2}})
    target = f"{name}-{digest(cluster, name)}"
    counts: list[int] = []

    def done() -> bool:
        at_two = sum(v == ("2", "2") for v in values().values())
        if not counts or counts[-1] != at_two:
            counts.append(at_two)
        st = status(cluster, name)
        complete = (st.get("rollout") or {}).get("phase") == "Complete"
        return complete and st.get("currentRevision") == target and at_two == 4

    wait_for(
        "the rollout complete", done, 120, detail=lambda: f"{status(cluster, name)}\n{operator.log()[-3000:]}"
    )
    assert counts == sorted(counts) and 1 in counts and 3 in counts, f"canary 1, then +2 a wave: {counts}"
    st = status(cluster, name)
    assert (st["desiredNumberScheduled"], st["updatedNumberScheduled"], st["updatedNumberReady"]) == (4, 4, 4)
    notes = [e.message for e in events_of(cluster, name, "RolloutWave")]
    revision = target.rpartition("-")[2]
    assert notes == [
        f"canary wave: 1 node(s) moved to revision {revision}, 1 of 4 updated",
        f"wave 1: 2 node(s) moved to revision {revision}, 3 of 4 updated",
        f"wave 2: 1 node(s) moved to revision {revision}, 4 of 4 updated",
    ], "one Normal Event per wave"

    # A change the nodes cannot take: the count from a label whose value is no integer. The canary
    # halts at once (not at the deadline) and gets its 2 back; no other node is ever touched.
    label = f"example.com/{cluster.prefix}count"
    for n in nodes:
        cluster.set_labels(n, {label: "many"})
    cluster.patch_spec(name, {"static": {"capacityFromLabel": label}})

    def halted() -> dict[str, Any] | None:
        rollout = status(cluster, name).get("rollout") or {}
        return rollout if rollout.get("phase") == "Halted" else None

    rollout = wait_for("the rollout halted", halted, 60, detail=lambda: operator.log()[-3000:])
    assert len(rollout["haltedNodes"]) == 1 and "is not a non-negative integer" in rollout["message"], rollout
    assert rollout["wave"] == 0, "the canary"
    stalled = wait_for(
        "Stalled", lambda: (c := cluster.condition(name, "Stalled")) and c["status"] == "True" and c
    )
    assert stalled["reason"] == "RolloutHalted" and rollout["haltedNodes"][0] in stalled["message"]
    wait_for("the canary's 2 back", lambda: set(values().values()) == {("2", "2")})
    assert any(e.type == "Warning" for e in events_of(cluster, name, "RolloutHalted"))

    # The revert settles it.
    cluster.patch_spec(name, {"static": {"capacityFromLabel": None}})
    wait_for("settled on the revert", lambda: settled(cluster, name), 60)
    assert set(values().values()) == {("2", "2")}
