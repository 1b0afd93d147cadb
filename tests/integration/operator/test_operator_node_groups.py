"""Node groups on a real control plane (docs/api.md#node-groups): the API server validates each
group as it validates `spec.plugin`, naming the group's field (`spec.nodeGroups[1].plugin...`),
and writes none of the plugin's defaults into a group; the operator renders the groups, merged,
into the shared node agent's config, counts each group's nodes in the profile's status (from the
nodes' labels, and from what the agents report), names a node two groups match, and follows a
label change."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.clusters import GROUP, PLURAL, TEST_LABEL, VERSION, Cluster, wait_for
from support.operator import Operator

SHARED = "patchbay-node-agent"
R = "example.com/grouped"
GROUPS: list[dict[str, Any]] = [
    {
        "name": "shared",
        "nodeSelector": {"matchLabels": {"sharing": "yes"}},
        "plugin": {"sharing": {"replicas": 4}, "health": {"failureThreshold": 5}},
    },
    {
        "name": "many",
        "nodeSelector": {"matchExpressions": [{"key": "many", "operator": "Exists"}]},
        "plugin": {"discovery": {"virtual": {"count": 8}}},
    },
]


def spec(
    mode: str = "DevicePlugin", groups: list[dict[str, Any]] | None = None, tag: str = ""
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "resourceName": R,
        "mode": mode,
        "plugin": {"discovery": {"virtual": {"count": 2}}},
        "nodeGroups": copy.deepcopy(GROUPS if groups is None else groups),
    }
    if tag:
        out["nodeSelector"] = {"matchLabels": {TEST_LABEL: tag}}
    return out


def _with_group(index: int, path: str, value: Any, mode: str = "DevicePlugin") -> dict[str, Any]:
    """`spec()` with the dotted `path` of group `index` set."""
    out = spec(mode)
    node = out["nodeGroups"][index]
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return out


INVALID: list[tuple[str, dict[str, Any], str]] = [
    (
        "replicas 0",
        _with_group(1, "plugin.sharing", {"replicas": 0}),
        "spec.nodeGroups[1].plugin.sharing.replicas",
    ),
    (
        "two backends",
        _with_group(1, "plugin.discovery.usb", {"vendor": "1234"}),
        "spec.nodeGroups[1].plugin.discovery",
    ),
    (
        "permissions",
        _with_group(0, "plugin.allocation", {"permissions": "rx"}),
        "spec.nodeGroups[0].plugin.allocation.permissions",
    ),
    (
        "selector In without values",
        _with_group(0, "nodeSelector", {"matchExpressions": [{"key": "a", "operator": "In"}]}),
        "spec.nodeGroups[0].nodeSelector.matchExpressions",
    ),
    ("name twice", _with_group(1, "name", "shared"), "spec.nodeGroups[1]"),
    ("name default", _with_group(0, "name", "default"), "spec.nodeGroups[0].name"),
    ("name not a label", _with_group(0, "name", "Big_GPUs"), "spec.nodeGroups[0].name"),
    ("no selector", {**spec(), "nodeGroups": [{"name": "x"}]}, "spec.nodeGroups[0].nodeSelector"),
    (
        "Static",
        {"resourceName": R, "mode": "Static", "static": {"capacity": 1}, "nodeGroups": GROUPS},
        "spec.nodeGroups must not be set when spec.mode is Static",
    ),
    ("own agent", {**spec(), "agent": {}}, "spec.nodeGroups needs the shared node agent"),
    (
        "DRA preStart",
        _with_group(0, "plugin.preStart", {"command": ["/x"]}, "DRA"),
        "spec.nodeGroups[].plugin.preStart must not be set when spec.mode is DRA",
    ),
    (
        "DRA cdi",
        _with_group(0, "plugin.allocation", {"cdi": {"kind": "example.com/x"}}, "DRA"),
        "spec.nodeGroups[].plugin.allocation.cdi",
    ),
    # Partitions (docs/dra.md#partitions): DRA only, not shared, sizes that divide the slots.
    (
        "partitions in DevicePlugin mode",
        {**spec(), "plugin": {"discovery": {"virtual": {"count": 2}}, "partitions": {"slots": 4}}},
        "spec.plugin.partitions must not be set unless spec.mode is DRA",
    ),
    (
        "partitions shared",
        {
            **{k: v for k, v in spec("DRA").items() if k != "nodeGroups"},
            "plugin": {
                "discovery": {"virtual": {"count": 2}},
                "partitions": {"slots": 4},
                "sharing": {"replicas": 2},
            },
        },
        "spec.plugin.partitions cannot be combined with spec.plugin.sharing.replicas",
    ),
    (
        "partition sizes",
        _with_group(1, "plugin.partitions", {"slots": 4, "sizes": [1, 3]}, "DRA"),
        "spec.nodeGroups[1].plugin.partitions.sizes",
    ),
    (
        "group partitions in DevicePlugin mode",
        _with_group(1, "plugin.partitions", {"slots": 4}),
        "spec.nodeGroups[].plugin.partitions must not be set unless spec.mode is DRA",
    ),
    (
        "group partitions shared",
        _with_group(0, "plugin.partitions", {"slots": 4}, "DRA"),
        "spec.nodeGroups[].plugin.partitions cannot be combined with sharing.replicas",
    ),
]


def create(api: client.ApiClient, name: str, body_spec: dict[str, Any]) -> dict[str, Any]:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "DevicePluginProfile", "metadata": {"name": name}}
    obj: dict[str, Any] = client.CustomObjectsApi(api).create_cluster_custom_object(
        GROUP, VERSION, PLURAL, {**body, "spec": body_spec}, dry_run="All"
    )
    return obj


@pytest.mark.parametrize(("body_spec", "field"), [(c[1], c[2]) for c in INVALID], ids=[c[0] for c in INVALID])
def test_a_bad_group_is_rejected_naming_its_field(
    api: client.ApiClient, crd: dict[str, Any], name_prefix: str, body_spec: dict[str, Any], field: str
) -> None:
    with pytest.raises(ApiException) as info:
        create(api, f"{name_prefix}bad", body_spec)
    assert info.value.status == 422, info.value.body
    message = str(json.loads(info.value.body)["message"])
    assert field in message, message


def test_a_group_gets_none_of_the_plugins_defaults(
    api: client.ApiClient, crd: dict[str, Any], name_prefix: str
) -> None:
    """A default written into a group would override the profile's own value on its nodes."""
    for mode in ("DevicePlugin", "DRA"):
        obj = create(api, f"{name_prefix}ok", spec(mode))
        plugin, groups = obj["spec"]["plugin"], obj["spec"]["nodeGroups"]
        assert plugin["sharing"] == {"replicas": 1} and plugin["health"]["periodSeconds"] == 5
        assert groups == GROUPS


def groups_status(cluster: Cluster, name: str) -> dict[str, tuple[int, int]]:
    st = (cluster.profile(name) or {}).get("status") or {}
    return {g["name"]: (g.get("nodes", 0), g.get("matching", 0)) for g in st.get("nodeGroups") or []}


def test_the_groups_reach_the_node_agent_merged_and_the_status_counts_their_nodes(
    cluster: Cluster, operator: Operator
) -> None:
    shared = cluster.add_nodes(1, labels={"sharing": "yes"})
    both = cluster.add_nodes(1, labels={"sharing": "yes", "many": ""}, start=1)
    plain = cluster.add_nodes(1, start=2)
    name = f"{cluster.prefix}grouped"
    cluster.create_profile(name, spec(tag=cluster.tag))

    entry = wait_for("the node agent's config lists the profile", lambda: cluster.shared_entry(name))
    first, second = entry["nodeGroups"]
    assert first["name"] == "shared" and second["name"] == "many"
    assert first["nodeSelectorTerms"] == [[{"key": "sharing", "operator": "In", "values": ["yes"]}]]
    # Merged over spec.plugin as the API server defaulted it: the group's values, the rest the profile's.
    assert first["plugin"]["sharing"] == {"replicas": 4}
    assert (
        first["plugin"]["health"]["failureThreshold"] == 5 and first["plugin"]["health"]["periodSeconds"] == 5
    )
    assert first["plugin"]["discovery"] == {"virtual": {"count": 2}}
    assert second["plugin"]["discovery"] == {"virtual": {"count": 8}}

    wait_for(
        "matching counts from the labels",
        lambda: groups_status(cluster, name) == {"shared": (0, 2), "many": (0, 0), "default": (0, 1)},
    )

    def overlaps() -> list[dict[str, Any]]:
        st = (cluster.profile(name) or {}).get("status") or {}
        return [p for p in st.get("problems") or [] if p["reason"] == "NodeGroupsOverlap"]

    (overlap,) = wait_for("the node both groups match is named", overlaps)
    assert overlap["node"] == both[0] and "uses shared" in overlap["message"], overlap

    # The agents report which group they serve (as the node agent on each node would).
    for node, group in ((shared[0], "shared"), (plain[0], "default")):
        pod = wait_for(f"the shared agent pod on {node}", lambda node=node: cluster.shared_agent_pod(node))
        cluster.apply_report(name, node, pod, [{"id": "d0", "health": "Healthy"}], R, nodeGroup=group)
    wait_for(
        "the agents' groups counted",
        lambda: groups_status(cluster, name) == {"shared": (1, 2), "many": (0, 0), "default": (1, 1)},
    )

    # A label change moves a node to another group; the overlap goes with it.
    cluster.set_labels(both[0], {"sharing": None})
    wait_for(
        "the node moved to many",
        lambda: groups_status(cluster, name) == {"shared": (1, 1), "many": (0, 1), "default": (1, 1)},
    )
    wait_for("no overlap left", lambda: not overlaps())

    # Without groups the status list goes, and the node agent's entry has none.
    cluster.custom.patch_cluster_custom_object(
        GROUP,
        VERSION,
        PLURAL,
        name,
        [{"op": "remove", "path": "/spec/nodeGroups"}],
        _content_type="application/json-patch+json",
    )
    wait_for("groups gone from the status", lambda: groups_status(cluster, name) == {})
    wait_for(
        "groups gone from the config", lambda: "nodeGroups" not in (cluster.shared_entry(name) or {"x": 1})
    )
    cluster.delete_profile(name)


def test_a_dra_profiles_groups_reach_the_node_agent_and_its_status(
    cluster: Cluster, operator: Operator
) -> None:
    """DRA mode: the same entry (with its driver), the same counts; a group's sharing is the
    group's alone."""
    cluster.add_nodes(1, labels={"sharing": "yes"})
    cluster.add_nodes(1, start=1)
    name = f"{cluster.prefix}dra"
    cluster.create_profile(name, spec("DRA", tag=cluster.tag))
    entry = wait_for("the node agent's config lists the profile", lambda: cluster.shared_entry(name))
    assert entry["mode"] == "DRA" and entry["driver"] == f"{name}.patchbay.dev"
    assert [g["name"] for g in entry["nodeGroups"]] == ["shared", "many"]
    assert entry["nodeGroups"][0]["plugin"]["sharing"] == {"replicas": 4}
    assert entry["plugin"]["sharing"] == {"replicas": 1}
    wait_for(
        "matching counts from the labels",
        lambda: groups_status(cluster, name) == {"shared": (0, 1), "many": (0, 0), "default": (0, 1)},
    )
    cluster.delete_profile(name)
