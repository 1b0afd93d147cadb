"""Node groups in the node agent's config (nodeconfig.py): the entry a node serves is the first
group whose terms select it, or the profile's own settings (`default`); a refused group names its
field and refuses only its own nodes; the entry's key changes with the group, so a label change
that moves the node reconfigures its unit; and the DeviceReport names the group."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from patchbay_agent.core.inventory import Snapshot
from patchbay_agent.nodeconfig import DEFAULT_NODE_GROUP, parse_node_config, selected
from patchbay_agent.report.devicereport import ReportTarget, build_report, failure_report

PLUGIN = {"discovery": {"virtual": {"count": 2}}, "health": {"periodSeconds": 5}}


def entry(groups: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "profile": "gpus",
        "mode": "DevicePlugin",
        "resourceName": "example.com/gpu",
        "plugin": copy.deepcopy(PLUGIN),
        "nodeGroups": groups,
        **extra,
    }


def group(name: str, key: str, plugin: dict[str, Any]) -> dict[str, Any]:
    merged = {**copy.deepcopy(PLUGIN), **plugin}
    return {"name": name, "nodeSelectorTerms": [[{"key": key, "operator": "Exists"}]], "plugin": merged}


GROUPS = [
    group("shared", "shared", {"sharing": {"replicas": 4}}),
    group("many", "many", {"discovery": {"virtual": {"count": 8}}}),
]


def test_the_first_group_that_selects_the_node_is_served_else_default() -> None:
    (e,) = parse_node_config({"profiles": [entry(GROUPS)]})
    shared = e.for_labels({"shared": ""})
    assert shared.node_group == "shared" and shared.config is not None
    assert shared.config.replicas == 4 and shared.config.node_group == "shared"
    many = e.for_labels({"many": ""})
    assert many.node_group == "many" and many.config is not None and many.config.replicas == 1
    both = e.for_labels({"many": "", "shared": ""})
    assert both.node_group == "shared"  # both select it: the first listed wins
    plain = e.for_labels({})
    assert plain.node_group == DEFAULT_NODE_GROUP and plain.config is not None
    assert plain.config.replicas == 1 and plain.config.health.period_seconds == 5
    assert [x.node_group for x in selected([e], {"many": ""})] == ["many"]


def test_a_profile_without_groups_is_served_as_before() -> None:
    (e,) = parse_node_config({"profiles": [{k: v for k, v in entry([]).items() if k != "nodeGroups"}]})
    assert e.for_labels({"shared": ""}) is e
    assert e.node_group == "" and e.config is not None and e.config.node_group == ""


def test_the_key_changes_with_the_group_even_when_the_settings_are_the_same() -> None:
    same = [group("a", "a", {}), group("b", "b", {})]
    (e,) = parse_node_config({"profiles": [entry(same)]})
    a, b, default = e.for_labels({"a": ""}), e.for_labels({"b": ""}), e.for_labels({})
    assert a.config is not None and b.config is not None
    assert a.key != b.key != default.key
    # A new config with the same entry: the same key, nothing to do.
    (again,) = parse_node_config({"profiles": [entry(copy.deepcopy(same))]})
    assert again.for_labels({"a": ""}).key == a.key


def test_a_refused_group_names_its_field_and_refuses_only_its_nodes() -> None:
    bad = group("bad", "bad", {"sharing": {"replicas": 0}})
    (e,) = parse_node_config({"profiles": [entry([GROUPS[0], bad])]})
    refused = e.for_labels({"bad": ""})
    assert refused.config is None
    assert refused.error.startswith("nodeGroups[1].plugin.sharing.replicas: must be >= 1"), refused.error
    assert refused.node_group == "bad"
    for labels in ({"shared": ""}, {}):
        ok = e.for_labels(labels)
        assert ok.config is not None and ok.error == ""


def test_a_refused_base_plugin_refuses_only_the_nodes_of_no_group() -> None:
    raw = entry(GROUPS)
    raw["plugin"] = {"discovery": {"virtual": {"count": 0}}}
    (e,) = parse_node_config({"profiles": [raw]})
    assert e.for_labels({}).config is None and "plugin.discovery.virtual.count" in e.for_labels({}).error
    assert e.for_labels({"shared": ""}).config is not None


@pytest.mark.parametrize(
    ("groups", "field"),
    [
        ([GROUPS[0], GROUPS[0]], "profiles[0].nodeGroups[1].name"),
        ([{**GROUPS[0], "name": "default"}], "profiles[0].nodeGroups[0].name"),
        ([{**GROUPS[0], "name": "Not_A_Label"}], "profiles[0].nodeGroups[0].name"),
        ([{**GROUPS[0], "nodeSelectorTerms": [[{"key": "k", "operator": "Near"}]]}], "nodeGroups[0]"),
        ({"shared": {}}, "profiles[0].nodeGroups"),
    ],
    ids=["twice", "reserved", "not-a-label", "bad-operator", "not-a-list"],
)
def test_an_unusable_group_list_refuses_the_whole_entry_naming_the_field(groups: Any, field: str) -> None:
    (e,) = parse_node_config({"profiles": [entry(groups)]})
    assert e.config is None and field in e.error, e.error
    assert not e.groups
    assert e.for_labels({"shared": ""}).config is None  # every node is refused, with that error


def test_the_report_names_the_group() -> None:
    target = ReportTarget("gpus", "node-1", "patchbay", "example.com/gpu", "agent-pod")
    assert build_report(target, Snapshot(0), {}, node_group="shared")["nodeGroup"] == "shared"
    assert "nodeGroup" not in build_report(target, Snapshot(0), {})
    failed = failure_report(target, "ConfigInvalid", "bad", 0.0, node_group="bad")
    assert failed["nodeGroup"] == "bad" and failed["agentError"]["reason"] == "ConfigInvalid"
