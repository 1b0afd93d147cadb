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
