"""The shared node agent on a real control plane: profiles without agent settings of their own
share ONE DaemonSet (one pod per node, kwok runs them), its config lists each of them with the
nodes it selects, each profile's status counts its own nodes, and the objects follow the profiles
(one leaves the config, the last takes the DaemonSet with it)."""

from __future__ import annotations

from typing import Any

import yaml
from kubernetes.client.rest import ApiException
from support.clusters import NAMESPACE, TEST_LABEL, Cluster, wait_for
from support.operator import Operator

SHARED = "patchbay-node-agent"


def spec(resource: str, label: str, tag: str) -> dict[str, Any]:
    return {
        "resourceName": resource,
        "mode": "DevicePlugin",
        "nodeSelector": {"matchLabels": {TEST_LABEL: tag, label: "yes"}},
        "plugin": {"discovery": {"virtual": {"count": 2}}},
    }


def shared(cluster: Cluster) -> tuple[dict[str, Any] | None, list[str]]:
    """The shared DaemonSet (None when absent) and the profiles its config lists."""
    try:
        ds = cluster.apps.read_namespaced_daemon_set(SHARED, NAMESPACE)
        cm = cluster.core.read_namespaced_config_map(SHARED, NAMESPACE)
    except ApiException as e:
        if e.status == 404:
            return None, []
        raise
    config = yaml.safe_load(cm.data["node.yaml"])
    return dict(cluster.api.sanitize_for_serialization(ds)), [e["profile"] for e in config["profiles"]]


def nodes_ready(cluster: Cluster, name: str) -> str | None:
    return ((cluster.profile(name) or {}).get("status") or {}).get("nodesReady")


def test_profiles_without_agent_settings_share_one_agent_per_node(
    cluster: Cluster, operator: Operator
) -> None:
    cluster.add_nodes(2, labels={"a": "yes"})
    cluster.add_nodes(1, labels={"b": "yes"}, start=2)
    cluster.add_nodes(1, labels={"a": "yes", "b": "yes"}, start=3)
    a, b = f"{cluster.prefix}serial", f"{cluster.prefix}tokens"
    cluster.create_profile(a, spec("example.com/serial", "a", cluster.tag))
    cluster.create_profile(b, spec("example.com/tokens", "b", cluster.tag))

    ds, _listed = wait_for(
        "the shared agent lists both", lambda: (s := shared(cluster)) and {a, b} <= set(s[1]) and s
    )
    assert ds is not None
    # No DaemonSet of their own.
    own = cluster.apps.list_namespaced_daemon_set(NAMESPACE).items
    assert not {f"patchbay-{a}", f"patchbay-{b}"} & {d.metadata.name for d in own}
    owners = {r["name"] for r in ds["metadata"]["ownerReferences"]}
    assert {a, b} <= owners
    assert "--node-config" in ds["spec"]["template"]["spec"]["containers"][0]["command"]

    # One pod per node: 4 nodes carry a or b, the node with both runs ONE pod.
    def pods_by_node() -> dict[str, int]:
        pods = cluster.core.list_namespaced_pod(NAMESPACE, label_selector="patchbay.dev/agent=shared").items
        out: dict[str, int] = {}
        for p in pods:
            if p.spec.node_name and p.spec.node_name.startswith(cluster.prefix):
                out[p.spec.node_name] = out.get(p.spec.node_name, 0) + 1
        return out

    counts = wait_for(
        "a shared agent pod on each of the 4 nodes", lambda: len(pods_by_node()) == 4 and pods_by_node()
    )
    assert set(counts.values()) == {1}

    # Each profile's status counts its own nodes.
    wait_for("serial 3/3", lambda: nodes_ready(cluster, a) == "3/3")
    wait_for("tokens 2/2", lambda: nodes_ready(cluster, b) == "2/2")

    # One profile goes: it leaves the config, the agent stays for the other.
    cluster.delete_profile(a)
    wait_for("serial left the shared config", lambda: a not in shared(cluster)[1] and b in shared(cluster)[1])
    cluster.delete_profile(b)
    wait_for("profiles gone", lambda: cluster.profile(a) is None and cluster.profile(b) is None)
    wait_for("tokens left the shared config", lambda: b not in shared(cluster)[1])


def test_the_node_agent_kept_to_labelled_nodes_and_a_profile_that_selects_others_says_so(
    cluster: Cluster, operator: Operator
) -> None:
    """--node-agent-node-selector (the chart's agent.nodeSelector): the shared DaemonSet runs only
    on nodes with the labels (kwok creates no pod elsewhere), and a profile that selects a node
    without them is Stalled with reason NodeAgentExcluded naming that node; once the node gets the
    label the agent runs there and the profile is Ready on every node."""
    devices = "patchbay.dev/devices"
    inside = cluster.add_nodes(1, labels={"a": "yes", devices: "true"})
    outside = cluster.add_nodes(1, labels={"a": "yes"}, start=1)
    operator.stop()
    operator.start("--node-agent-node-selector", f"{devices}=true")
    try:
        name = f"{cluster.prefix}kept"
        cluster.create_profile(name, spec("example.com/kept", "a", cluster.tag))
        ds, _ = wait_for(
            "the shared agent lists the profile", lambda: (s := shared(cluster)) and name in s[1] and s
        )
        assert ds is not None
        affinity = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        terms = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [{"key": devices, "operator": "In", "values": ["true"]}]}]

        def excluded() -> list[dict[str, Any]]:
            st = (cluster.profile(name) or {}).get("status") or {}
            return [p for p in st.get("problems") or [] if p.get("reason") == "NodeAgentExcluded"]

        (problem,) = wait_for("the profile names the node the agent skips", excluded)
        assert problem["node"] == outside[0], problem
        assert f"{devices}=true" in problem["message"], problem
        st = cluster.profile(name)["status"]
        assert {c["type"]: c["status"] for c in st["conditions"]}["Stalled"] == "True", st

        def pod_nodes() -> set[str]:
            pods = cluster.core.list_namespaced_pod(
                NAMESPACE, label_selector="patchbay.dev/agent=shared"
            ).items
            return {p.spec.node_name for p in pods if (p.spec.node_name or "").startswith(cluster.prefix)}

        wait_for("an agent pod on the labelled node only", lambda: pod_nodes() == set(inside))
        cluster.core.patch_node(outside[0], {"metadata": {"labels": {devices: "true"}}})
        wait_for("the agent on both nodes", lambda: pod_nodes() == {*inside, *outside})
        wait_for("Ready on both nodes", lambda: nodes_ready(cluster, name) == "2/2" and not excluded())
        cluster.delete_profile(name)
        wait_for("profile gone", lambda: cluster.profile(name) is None)
    finally:
        operator.stop()
        operator.start()


def test_the_node_agent_kept_with_no_profile_for_the_inventory(cluster: Cluster, operator: Operator) -> None:
    """--node-agent-always-on (the chart's inventory.alwaysOn): with no profile the shared
    DaemonSet runs (a pod per node, kwok runs them) with a config of no profile and NO owner, so
    the garbage collector does not take it with the last profile; deleted, the operator puts it
    back; an operator started without the setting deletes it."""
    node = cluster.add_nodes(1, labels={"a": "yes"})
    operator.stop()
    operator.start("--node-agent-always-on")
    try:
        ds, listed = wait_for("the shared agent with no profile", lambda: (s := shared(cluster))[0] and s)
        assert listed == [] and not ds["metadata"].get("ownerReferences"), ds["metadata"]
        pods = lambda: {  # noqa: E731
            p.spec.node_name
            for p in cluster.core.list_namespaced_pod(
                NAMESPACE, label_selector="patchbay.dev/agent=shared"
            ).items
        }
        wait_for("an agent pod on the node", lambda: set(node) <= pods())

        # A profile comes (it owns the objects) and goes: the agent stays, owned by nobody.
        name = f"{cluster.prefix}first"
        cluster.create_profile(name, spec("example.com/first", "a", cluster.tag))
        ds, _ = wait_for(
            "the shared agent lists the profile", lambda: (s := shared(cluster)) and name in s[1] and s
        )
        assert [r["name"] for r in ds["metadata"]["ownerReferences"]] == [name]
        cluster.delete_profile(name)
        wait_for("profile gone", lambda: cluster.profile(name) is None)
        ds, listed = wait_for(
            "the shared agent with no profile again", lambda: (s := shared(cluster))[0] and s[1] == [] and s
        )
        assert not ds["metadata"].get("ownerReferences"), ds["metadata"]

        # Deleted by someone: the operator's repair puts it back (a new object).
        cluster.apps.delete_namespaced_daemon_set(SHARED, NAMESPACE)
        wait_for(
            "the shared agent recreated",
            lambda: (s := shared(cluster))[0] and s[0]["metadata"]["uid"] != ds["metadata"]["uid"],
        )
    finally:
        operator.stop()
        operator.start()
    # The setting off: the operator's start deletes what nothing uses.
    wait_for("the shared agent gone", lambda: shared(cluster)[0] is None)
