"""Node groups in the operator (docs/api.md#node-groups): the merge of a group's partial `plugin`
over `spec.plugin`, the group each node uses (the first that matches), what the node agent's
config carries, the status (`status.nodeGroups`, `NodeGroupsOverlap`), and the CRD's group schema
(generated from `spec.plugin`: its rules, none of its defaults)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from patchbay_agent import config as agent_config
from patchbay_agent import nodeconfig
from patchbay_operator import constants, render
from patchbay_operator.capacity import NodeState
from patchbay_operator.devicereports import AgentError, Device, Report
from patchbay_operator.evaluation import Inputs, evaluate
from patchbay_operator.pluginspec import merge
from patchbay_operator.profiles import Profile, Registry

REPO = Path(__file__).resolve().parents[3]
CRD = REPO / "crds" / "patchbay.dev_devicepluginprofiles.yaml"
R = "example.com/gpu"
BASE: dict[str, Any] = {
    "discovery": {"paths": {"globs": ["/dev/nvidia*"]}},
    "sharing": {"replicas": 1},
    "health": {"periodSeconds": 5, "failureThreshold": 3, "successThreshold": 1},
    "allocation": {"envs": {"A": "1"}, "mounts": [{"hostPath": "/a", "containerPath": "/a"}]},
}
GROUPS: list[dict[str, Any]] = [
    {
        "name": "shared-a100",
        "nodeSelector": {"matchLabels": {"gpu": "a100"}},
        "plugin": {"sharing": {"replicas": 4}, "health": {"failureThreshold": 5}},
    },
    {
        "name": "tokens",
        "nodeSelector": {"matchExpressions": [{"key": "tokens", "operator": "Exists"}]},
        "plugin": {"discovery": {"virtual": {"count": 8}}},
    },
]


def profile(mode: str = "DevicePlugin", groups: list[dict[str, Any]] | None = None, **spec: Any) -> Profile:
    body = {
        "metadata": {"name": "p", "generation": 3},
        "spec": {
            "resourceName": R,
            "mode": mode,
            "plugin": copy.deepcopy(BASE),
            "nodeGroups": copy.deepcopy(GROUPS if groups is None else groups),
            **spec,
        },
    }
    return Profile.from_body(body)


def node(name: str, **labels: str) -> NodeState:
    return NodeState(name, labels=labels)


# --- merge ------------------------------------------------------------------------------------


def test_a_group_is_deep_merged_over_the_plugin_and_neither_input_changes() -> None:
    base, override = copy.deepcopy(BASE), {"sharing": {"replicas": 4}, "health": {"failureThreshold": 5}}
    merged = merge(base, override)
    assert merged["sharing"] == {"replicas": 4}
    # Mappings merge key by key: what the group leaves out is the profile's.
    assert merged["health"] == {"periodSeconds": 5, "failureThreshold": 5, "successThreshold": 1}
    assert merged["discovery"] == BASE["discovery"]
    assert base == BASE and override == {"sharing": {"replicas": 4}, "health": {"failureThreshold": 5}}
    merged["health"]["periodSeconds"] = 99  # a copy, never the profile's own document
    assert base["health"]["periodSeconds"] == 5


def test_discovery_and_lists_replace_whole_and_a_null_changes_nothing() -> None:
    merged = merge(
        BASE,
        {
            "discovery": {"virtual": {"count": 8}},
            "allocation": {"mounts": [{"hostPath": "/b", "containerPath": "/b"}], "envs": {"B": "2"}},
            "sharing": None,
        },
    )
    # Two backends would be refused: a group's discovery is a new choice, not a merge.
    assert merged["discovery"] == {"virtual": {"count": 8}}
    assert merged["allocation"]["mounts"] == [{"hostPath": "/b", "containerPath": "/b"}]
    assert merged["allocation"]["envs"] == {"A": "1", "B": "2"}
    assert merged["sharing"] == {"replicas": 1}


def test_every_merged_group_parses_with_the_agents_parser() -> None:
    p = profile()
    for g in p.node_groups:
        parsed = agent_config.parse({"resourceName": R, "plugin": dict(g.plugin.document)})
        assert parsed.replicas == g.plugin.replicas
    assert agent_config.parse(
        {"resourceName": R, "plugin": dict(p.node_groups[1].plugin.document)}
    ).discovery == (agent_config.VirtualDiscovery(8))


# --- the group of a node ------------------------------------------------------------------------


def test_the_first_matching_group_wins_else_default() -> None:
    p = profile()
    assert p.group_of({"gpu": "a100"}) == "shared-a100"
    assert p.group_of({"tokens": ""}) == "tokens"
    assert p.group_of({"gpu": "a100", "tokens": "x"}) == "shared-a100"  # both match: the first listed
    assert p.group_of({"gpu": "h100"}) == constants.DEFAULT_NODE_GROUP == nodeconfig.DEFAULT_NODE_GROUP
    assert p.plugin_for({"gpu": "a100"}).replicas == 4
    assert p.plugin_for({}).replicas == 1
    assert p.shares == 4  # the most any group allows (a DRA profile's sharing is then checked)


def test_the_order_of_the_list_decides_an_overlap() -> None:
    reordered = profile(groups=list(reversed(GROUPS)))
    assert reordered.group_of({"gpu": "a100", "tokens": "x"}) == "tokens"


def test_a_groups_cdi_kind_is_one_of_the_profiles_kinds_in_a_conflict() -> None:
    older = Profile.from_body(
        {
            "metadata": {"name": "a", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {
                "resourceName": "example.com/a",
                "mode": "DevicePlugin",
                "plugin": {
                    "discovery": {"virtual": {"count": 1}},
                    "allocation": {"cdi": {"kind": "x.com/k"}},
                },
            },
        }
    )
    groups = [{"name": "g", "nodeSelector": {}, "plugin": {"allocation": {"cdi": {"kind": "x.com/k"}}}}]
    newer = Profile.from_body(
        {
            "metadata": {"name": "b", "creationTimestamp": "2026-02-01T00:00:00Z"},
            "spec": {
                "resourceName": R,
                "mode": "DevicePlugin",
                "plugin": copy.deepcopy(BASE),
                "nodeGroups": groups,
            },
        }
    )
    assert newer.cdi_kind is None and newer.cdi_kinds == {"x.com/k"}
    registry = Registry([older, newer])
    assert registry.conflict(newer) is older


# --- the node agent's config --------------------------------------------------------------------


def test_the_node_entry_carries_each_group_merged_with_its_selector_as_one_term() -> None:
    entry = render.node_entry(profile())
    assert [g["name"] for g in entry["nodeGroups"]] == ["shared-a100", "tokens"]
    first, second = entry["nodeGroups"]
    assert first["nodeSelectorTerms"] == [[{"key": "gpu", "operator": "In", "values": ["a100"]}]]
    assert second["nodeSelectorTerms"] == [[{"key": "tokens", "operator": "Exists"}]]
    assert first["plugin"]["sharing"] == {"replicas": 4}
    assert first["plugin"]["health"]["periodSeconds"] == 5
    assert second["plugin"]["discovery"] == {"virtual": {"count": 8}}
    assert entry["plugin"] == BASE
    # The agent reads it back and makes the same choice as the operator.
    text = render.node_config([(profile(), None)])
    (parsed,) = nodeconfig.parse_node_config(yaml.safe_load(text))
    for labels in ({"gpu": "a100"}, {"tokens": "1"}, {"gpu": "a100", "tokens": "1"}, {}):
        chosen = parsed.for_labels(labels)
        assert chosen.node_group == profile().group_of(labels)
        assert chosen.config is not None and chosen.config.replicas == profile().plugin_for(labels).replicas


def test_a_profile_without_groups_renders_as_before() -> None:
    assert "nodeGroups" not in render.node_entry(profile(groups=[]))


# --- status -------------------------------------------------------------------------------------


def report(node_name: str, group: str, error: AgentError | None = None) -> Report:
    return Report(f"p.{node_name}", "p", node_name, (Device("d0", True),), error=error, node_group=group)


def test_the_status_counts_each_groups_nodes_and_names_nodes_two_groups_match() -> None:
    p = profile()
    nodes = [node("a", gpu="a100"), node("b", gpu="a100", tokens="1"), node("c", tokens="1"), node("d")]
    # c's agent has not caught up yet (still default); d's config is refused.
    reports = [
        report("a", "shared-a100"),
        report("b", "shared-a100"),
        report("c", "default"),
        report("d", "default", AgentError("ConfigInvalid", "bad", "")),
    ]
    result = evaluate(Inputs(p, {}, "2026-11-26T12:00:00Z", nodes, reports=reports))
    assert result.status is not None
    assert result.status["nodeGroups"] == [
        {"name": "shared-a100", "nodes": 2, "matching": 2},
        {"name": "tokens", "nodes": 0, "matching": 1},
        {"name": "default", "nodes": 1, "matching": 1},
    ]
    (overlap,) = [x for x in result.problems if x.reason == "NodeGroupsOverlap"]
    assert overlap.node == "b"
    assert "shared-a100, tokens" in overlap.message and "uses shared-a100" in overlap.message
    assert any(x["reason"] == "NodeGroupsOverlap" and x["node"] == "b" for x in result.status["problems"])


def test_a_dra_profile_counts_its_groups_the_same_way() -> None:
    p = profile("DRA")
    result = evaluate(Inputs(p, {}, "T", [node("a", gpu="a100")], reports=[report("a", "shared-a100")]))
    assert result.status is not None
    assert result.status["nodeGroups"][0] == {"name": "shared-a100", "nodes": 1, "matching": 1}


def test_a_profile_that_drops_its_groups_drops_the_status_list() -> None:
    p = profile(groups=[])
    assert "nodeGroups" not in (evaluate(Inputs(p, {}, "T", [node("a")])).status or {})
    previous = {"nodeGroups": [{"name": "default", "nodes": 1, "matching": 1}]}
    assert (evaluate(Inputs(p, previous, "T", [node("a")])).status or {})["nodeGroups"] is None


def test_a_nodes_short_count_uses_its_groups_replicas() -> None:
    p = profile()
    shared = NodeState("a", labels={"gpu": "a100"}, capacity={R: "4"}, allocatable={R: "4"})
    plain = NodeState("b", capacity={R: "1"}, allocatable={R: "1"})
    reports = [report("a", "shared-a100"), report("b", "default")]
    assert (
        evaluate(Inputs(p, {}, "2026-11-26T12:00:00Z", [shared, plain], reports=reports)).short_nodes == set()
    )


# --- the CRD ------------------------------------------------------------------------------------


def _versions() -> list[dict[str, Any]]:
    crd = yaml.safe_load(CRD.read_text())
    return [v["schema"]["openAPIV3Schema"]["properties"]["spec"] for v in crd["spec"]["versions"]]


def _walk(node: Any) -> list[Any]:
    out = [node]
    if isinstance(node, dict):
        for v in node.values():
            out += _walk(v)
    elif isinstance(node, list):
        for v in node:
            out += _walk(v)
    return out


@pytest.mark.parametrize("index", [0, 1], ids=["v1beta1", "v1alpha1"])
def test_the_group_schema_is_the_plugin_schema_without_defaults_and_with_its_own_field_names(
    index: int,
) -> None:
    spec = _versions()[index]
    groups = spec["properties"]["nodeGroups"]
    assert groups["x-kubernetes-list-type"] == "map" and groups["x-kubernetes-list-map-keys"] == ["name"]
    item = groups["items"]
    plugin = item["properties"]["plugin"]
    assert "required" not in plugin  # partial: discovery may be left out
    assert not [n for n in _walk(plugin) if isinstance(n, dict) and "default" in n]
    assert set(plugin["properties"]) == set(spec["properties"]["plugin"]["properties"])
    messages = [n["message"] for n in _walk(item) if isinstance(n, dict) and "rule" in n and "message" in n]
    assert messages and all(m.startswith("spec.nodeGroups[]") for m in messages), messages
    replicas = plugin["properties"]["sharing"]["properties"]["replicas"]
    assert (replicas["minimum"], replicas["maximum"]) == (1, 1024)
