"""Static mode end to end on kwok nodes, against the real API server and a real operator process."""

from __future__ import annotations

import json
import signal
from typing import Any

from support.clusters import TEST_LABEL, Cluster, profile_spec, wait_for
from support.operator import Operator

R = "example.com/dongle"
OWNER_KEY = "static.patchbay.dev/example.com_dongle"


def spec(prefix: str, capacity: int = 3, **extra: Any) -> dict[str, Any]:
    return profile_spec(
        R,
        "Static",
        {TEST_LABEL: prefix.rstrip("-"), "dongle": "yes"},
        static={"capacity": capacity, **extra},
        # What is tested here is the node writes; a change in waves is test_operator_rollouts_*'s.
        rollout={"strategy": "Immediate"},
    )


def three_dongle_nodes(cluster: Cluster, capacity: int) -> tuple[str, list[str]]:
    """Three nodes with dongles and the profile `<prefix>dongles` of `capacity` on them, created;
    its name and theirs once every one is patched."""
    nodes = cluster.add_nodes(3, labels={"dongle": "yes"})
    name = f"{cluster.prefix}dongles"
    cluster.create_profile(name, spec(cluster.prefix, capacity=capacity))
    wait_for("the nodes patched", lambda: all_have(cluster, nodes, str(capacity)))
    return name, nodes


def all_have(cluster: Cluster, nodes: list[str], value: str | None) -> bool:
    return all(cluster.values(n, R) == (value, value) for n in nodes)


def status(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict((cluster.profile(name) or {}).get("status") or {})


def test_static_profile_patches_every_selected_node_and_reports(cluster: Cluster, operator: Operator) -> None:
    p = cluster.prefix
    nodes = cluster.add_nodes(4, labels={"dongle": "yes"})
    other = cluster.add_nodes(1, labels={"dongle": "no"}, start=10)
    cluster.set_labels(nodes[0], {"example.com/dongles": "7"})
    name = f"{p}dongles"
    cluster.create_profile(name, spec(p, capacity=3, capacityFromLabel="example.com/dongles"))

    wait_for(
        "selected nodes patched",
        lambda: all_have(cluster, nodes[1:], "3") and cluster.values(nodes[0], R) == ("7", "7"),
    )
    assert cluster.values(other[0], R) == (None, None)
    owner = json.loads(cluster.annotations(nodes[1])[OWNER_KEY])
    assert owner == {"profile": name, "resource": R}
    assert OWNER_KEY not in cluster.annotations(other[0])

    st = wait_for("Ready status", lambda: (s := status(cluster, name)).get("nodesReady") == "4/4" and s)
    assert st["observedGeneration"] == 1
    assert st["nodes"] == {"desired": 4, "ready": 4}
    assert st["devices"] == {"capacity": 16, "allocatable": 16}
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Ready"]["status"] == "True" and conds["Ready"]["reason"] == "AllNodesReady"
    assert conds["Reconciling"]["status"] == "False"
    assert conds["Stalled"]["status"] == "False"
    assert conds["Degraded"]["status"] == "False"
    assert st["problemCount"] == 0

    # The finalizer is on the profile, never on nodes; kopf writes nothing to nodes.
    assert "patchbay.dev/cleanup" in (cluster.profile(name) or {})["metadata"]["finalizers"]
    node = cluster.node(nodes[1])
    assert not node["metadata"].get("finalizers")
    assert not [k for k in node["metadata"].get("annotations", {}) if "kopf" in k]


def test_nodes_joining_leaving_drifting_and_capacity_change(cluster: Cluster, operator: Operator) -> None:
    name, nodes = three_dongle_nodes(cluster, capacity=2)

    # A new matching node is patched.
    late = cluster.add_nodes(1, labels={"dongle": "yes"}, start=3)
    wait_for("late node patched", lambda: all_have(cluster, late, "2"))

    # A node that stops matching loses the resource and the ownership record.
    cluster.set_labels(nodes[0], {"dongle": "no"})
    wait_for("unselected node cleaned", lambda: all_have(cluster, nodes[:1], None))
    assert OWNER_KEY not in cluster.annotations(nodes[0])

    # Drift: something resets the value (a changed value, then a removed one): re-asserted, and
    # counted for the drift alert (a capacity change below is not drift).
    drift = operator.stats()["driftReassertions"]
    cluster.set_status_value(nodes[1], R, "99")
    wait_for("changed value re-asserted", lambda: all_have(cluster, nodes[1:2], "2"), timeout=15)
    cluster.set_status_value(nodes[2], R, None)
    wait_for("removed value re-asserted", lambda: all_have(cluster, nodes[2:3], "2"), timeout=15)
    wait_for("2 re-assertions counted", lambda: operator.stats()["driftReassertions"] == drift + 2)

    # A capacity change reaches every selected node, and status follows the generation.
    cluster.patch_spec(name, {"static": {"capacity": 5}})
    wait_for("new capacity everywhere", lambda: all_have(cluster, [*nodes[1:], *late], "5"))
    assert cluster.values(nodes[0], R) == (None, None)
    st = wait_for(
        "status of generation 2",
        lambda: (
            (s := status(cluster, name)).get("observedGeneration") == 2 and s.get("nodesReady") == "3/3" and s
        ),
    )
    assert st["devices"] == {"capacity": 15, "allocatable": 15}
    assert operator.stats()["driftReassertions"] == drift + 2
    assert operator.stats()["profileConditions"][(name, "Ready")] == 1


def test_resource_set_by_someone_else_is_never_touched(cluster: Cluster, operator: Operator) -> None:
    p = cluster.prefix
    nodes = cluster.add_nodes(2, labels={"dongle": "yes"})
    cluster.set_status_value(nodes[0], R, "7")  # e.g. a real device plugin already advertises it
    name = f"{p}dongles"
    cluster.create_profile(name, spec(p, capacity=3))
    wait_for("the free node patched", lambda: all_have(cluster, nodes[1:], "3"))
    st = wait_for(
        "the foreign node reported", lambda: (s := status(cluster, name)).get("problemCount") == 1 and s
    )
    assert st["problems"] == [
        {"node": nodes[0], "reason": "ResourceSetByOther", "message": st["problems"][0]["message"]}
    ]
    assert {c["type"]: c["status"] for c in st["conditions"]}["Degraded"] == "True"
    assert cluster.values(nodes[0], R) == ("7", "7")

    cluster.delete_profile(name)
    wait_for("profile gone", lambda: cluster.profile(name) is None)
    assert cluster.values(nodes[0], R) == ("7", "7")
    assert all_have(cluster, nodes[1:], None)


def test_delete_removes_the_resource_from_every_node_with_one_write_each(
    cluster: Cluster, operator: Operator
) -> None:
    p = cluster.prefix
    nodes = cluster.add_nodes(6, labels={"dongle": "yes"})
    name = f"{p}dongles"
    before = operator.settled_patches()
    cluster.create_profile(name, spec(p, capacity=1))
    wait_for("all nodes patched", lambda: all_have(cluster, nodes, "1"))
    cluster.delete_profile(name)
    wait_for("profile gone", lambda: cluster.profile(name) is None)
    assert all_have(cluster, nodes, None)
    assert not any(OWNER_KEY in cluster.annotations(n) for n in nodes)
    # One JSON patch per node to add, one to remove: nothing else wrote to these nodes.
    assert operator.settled_patches() - before == 12


def test_delete_while_the_operator_is_down(cluster: Cluster, operator: Operator) -> None:
    name, nodes = three_dongle_nodes(cluster, capacity=2)

    operator.stop(signal.SIGKILL)
    cluster.delete_profile(name)
    # The finalizer holds the profile while nobody can clean up.
    obj = cluster.profile(name)
    assert obj is not None and obj["metadata"].get("deletionTimestamp")
    assert all_have(cluster, nodes, "2")

    operator.start()
    wait_for("profile released", lambda: cluster.profile(name) is None)
    assert all_have(cluster, nodes, None)
    assert not any(OWNER_KEY in cluster.annotations(n) for n in nodes)


def test_operator_killed_mid_rollout_converges(cluster: Cluster, operator: Operator) -> None:
    p = cluster.prefix
    nodes = cluster.add_nodes(40, labels={"dongle": "yes"})
    # One patch at a time, so the kill lands in the middle of the rollout.
    operator.stop()
    operator.start("--concurrency", "1")
    name = f"{p}dongles"
    cluster.create_profile(name, spec(p, capacity=4))
    wait_for(
        "some nodes patched", lambda: any(cluster.values(n, R)[0] == "4" for n in nodes[::4]), every=0.05
    )
    operator.stop(signal.SIGKILL)
    operator.start()
    wait_for("every node patched after restart", lambda: all_have(cluster, nodes, "4"))
    st = wait_for(
        "Ready after restart", lambda: (s := status(cluster, name)).get("nodesReady") == "40/40" and s
    )
    assert {c["type"]: c["status"] for c in st["conditions"]}["Ready"] == "True"


def test_status_is_written_only_when_it_changes(cluster: Cluster, operator: Operator) -> None:
    p = cluster.prefix
    nodes = cluster.add_nodes(2, labels={"dongle": "yes"})
    name = f"{p}dongles"
    cluster.create_profile(name, spec(p, capacity=1))
    wait_for("Ready", lambda: status(cluster, name).get("nodesReady") == "2/2")
    rv = (cluster.profile(name) or {})["metadata"]["resourceVersion"]
    # Node events that change nothing we report (labels elsewhere) must not rewrite status.
    before = operator.stats()
    for i in range(5):
        cluster.set_labels(nodes[0], {"unrelated": str(i)})

    def recomputed_after_every_event() -> bool:
        s = operator.stats()
        return (
            s.get("nodeEvents", 0) >= before.get("nodeEvents", 0) + 5
            and s.get("statusComputes", 0) > before.get("statusComputes", 0)
            and s.get("statusPending", 1) == 0
        )

    # The status writer has seen every event (nothing left pending) and recomputed: a write, had
    # there been one, has happened by now.
    wait_for("the operator to recompute the status after the events", recomputed_after_every_event, 30)
    assert (cluster.profile(name) or {})["metadata"]["resourceVersion"] == rv


def test_problem_list_is_capped_and_deleted_nodes_leave_the_counts(
    cluster: Cluster, operator: Operator
) -> None:
    p = cluster.prefix
    foreign = cluster.add_nodes(11, labels={"dongle": "yes"})
    for n in foreign:
        cluster.set_status_value(n, R, "7")
    bad = cluster.add_nodes(1, labels={"dongle": "yes", "example.com/dongles": "lots"}, start=20)
    good = cluster.add_nodes(2, labels={"dongle": "yes"}, start=30)
    name = f"{p}dongles"
    cluster.create_profile(name, spec(p, capacity=2, capacityFromLabel="example.com/dongles"))
    wait_for("good nodes patched", lambda: all_have(cluster, good, "2"))
    st = wait_for("problems reported", lambda: (s := status(cluster, name)).get("problemCount") == 12 and s)
    assert len(st["problems"]) == 10  # capped; problemCount has the full number
    assert st["nodes"] == {"desired": 14, "ready": 2}
    reasons = {pr["reason"] for pr in st["problems"]}
    assert reasons <= {"ResourceSetByOther", "InvalidCapacityLabel"}
    assert cluster.values(bad[0], R) == (None, None)

    # The label becomes valid: that node is patched with its own count.
    cluster.set_labels(bad[0], {"example.com/dongles": "6"})
    wait_for("labelled count", lambda: cluster.values(bad[0], R) == ("6", "6"))

    # Deleted nodes leave the counts.
    for n in foreign:
        cluster.core.delete_node(n)
    st = wait_for(
        "counts without the deleted nodes",
        lambda: (s := status(cluster, name)).get("nodesReady") == "3/3" and s,
    )
    assert st["devices"] == {"capacity": 10, "allocatable": 10}
    assert st["problemCount"] == 0 and st["problems"] == []
    assert {c["type"]: c["status"] for c in st["conditions"]}["Ready"] == "True"


def test_a_patch_planned_from_a_stale_cache_never_takes_a_value_set_meanwhile(cluster: Cluster) -> None:
    """The race behind a flake of the test above: the operator's node cache is one watch event
    behind, another writer has just set the resource, and the plan (from the cache) says the node
    is free. The patch's resourceVersion test makes the API server refuse it (422); the worker
    reads the node again and, re-planning, leaves the foreign value alone. No operator process:
    the node worker itself, on a real API server, with its cache made stale on purpose."""
    import asyncio

    from patchbay_operator.capacity import NodeState
    from patchbay_operator.kube import Kube, load_configuration
    from patchbay_operator.nodes import NodeSync
    from patchbay_operator.profiles import Profile

    p = cluster.prefix
    name = cluster.add_nodes(1, labels={"dongle": "yes"})[0]
    profile = Profile.from_body(
        {
            "metadata": {
                "name": f"{p}stale",
                "uid": "u1",
                "generation": 1,
                "creationTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": spec(p, capacity=3),
        }
    )
    kube = Kube(load_configuration(str(cluster.devcluster.kubeconfig), 4))
    try:
        stale = NodeState.from_node(kube.get_node(name) or {})
        cluster.set_status_value(name, R, "7")  # after the cache's copy: the cache never saw it
        sync = NodeSync(kube, asyncio.to_thread, lambda: {R: profile}, lambda: None)
        sync.states[name] = stale
        asyncio.run(sync.sync(name))
        assert cluster.values(name, R) == ("7", "7")
        assert OWNER_KEY not in cluster.annotations(name)
        assert (sync.patches, sync.patch_failures, sync.failures) == (0, 1, {})
        # The worker re-read the node: its cache now holds the foreign value, and the next run
        # (queued by the re-read) has nothing to do.
        assert sync.states[name].capacity.get(R) == "7"
        asyncio.run(sync.sync(name))
        assert (sync.patches, sync.patch_failures) == (0, 1)
        assert cluster.values(name, R) == ("7", "7")
    finally:
        kube.close()
