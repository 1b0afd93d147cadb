"""The operator's reading of ``spec.plugin`` (pluginspec.py) stays the CRD's and the agent's.

The CRD is the source of truth for the agent's configuration: every field the operator reads must
be in the schema of every served version, with the default the operator assumes when it is
absent. And where the operator and the agent both read a field (the agent's parser is
``patchbay_agent.config``: the tests may import both programs, the programs never each other),
they must read the same value from the same document.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from patchbay_agent import config as agent_config
from patchbay_operator.pluginspec import CDI_KIND, FIELDS, REPLICAS, PluginSpec
from patchbay_operator.profiles import Profile

REPO = Path(__file__).resolve().parents[3]
CRD = REPO / "crds" / "patchbay.dev_devicepluginprofiles.yaml"
DISCOVERY = {"virtual": {"count": 2}}


def plugin_schemas() -> list[tuple[str, dict[str, Any]]]:
    crd = yaml.safe_load(CRD.read_text())
    return [
        (v["name"], v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["plugin"])
        for v in crd["spec"]["versions"]
        if v["served"]
    ]


@pytest.mark.parametrize("path", sorted(FIELDS), ids=".".join)
def test_every_field_the_operator_reads_is_in_the_crd_with_the_default_it_assumes(
    path: tuple[str, ...],
) -> None:
    for version, schema in plugin_schemas():
        node = schema
        for key in path:
            assert key in node.get("properties", {}), f"{version}: plugin.{'.'.join(path)} is not in the CRD"
            node = node["properties"][key]
        assert node.get("default") == FIELDS[path], f"{version}: plugin.{'.'.join(path)}'s default"


def example_plugins() -> list[dict[str, Any]]:
    docs = [yaml.safe_load(p.read_text()) for p in sorted((REPO / "examples").glob("*.yaml"))]
    return [d["spec"]["plugin"] for d in docs if isinstance(d, dict) and "plugin" in (d.get("spec") or {})]


@pytest.mark.parametrize(
    "plugin",
    [
        {"discovery": DISCOVERY},
        {"discovery": DISCOVERY, "sharing": {}},
        {"discovery": DISCOVERY, "sharing": {"replicas": 4}},
        {"discovery": DISCOVERY, "allocation": {"cdi": {"kind": "example.com/serial"}}},
        {"discovery": DISCOVERY, "allocation": {"permissions": "r"}},
        {"discovery": DISCOVERY, "partitions": {"slots": 8, "sizes": [2, 8]}},
        *example_plugins(),
    ],
)
def test_the_operator_reads_what_the_agent_parses(plugin: dict[str, Any]) -> None:
    ours = PluginSpec.parse(plugin)
    theirs = agent_config.parse({"resourceName": "example.com/x", "plugin": plugin})
    assert ours.replicas == theirs.replicas
    assert ours.cdi_kind == theirs.allocation.cdi_kind
    assert ours.partition_slots == (theirs.partitions.slots if theirs.partitions else 0)
    assert ours.document == plugin  # handed to the agents verbatim


def test_a_profile_reads_its_plugin_section_through_pluginspec() -> None:
    spec = {
        "resourceName": "example.com/x",
        "mode": "DRA",
        "plugin": {
            "discovery": DISCOVERY,
            "sharing": {"replicas": 3},
            "allocation": {"cdi": {"kind": "a.b/c"}},
        },
    }
    p = Profile.from_body({"metadata": {"name": "p"}, "spec": spec})
    assert (p.shares, p.cdi_kind) == (3, "a.b/c")
    assert (p.plugin.replicas, p.plugin.cdi_kind) == (3, "a.b/c")
    bare = Profile.from_body(
        {"metadata": {"name": "s"}, "spec": {"resourceName": "example.com/x", "mode": "Static"}}
    )
    assert (bare.shares, bare.cdi_kind, dict(bare.plugin.document)) == (
        FIELDS[REPLICAS],
        FIELDS[CDI_KIND],
        {},
    )
