"""`kubectl patchbay nodes` shows each node's node group (docs/api.md#node-groups): what the
node's agent reports, else the first group whose selector matches the node's labels, else
`default`; `-` for a profile without groups."""

from __future__ import annotations

from typing import Any

from patchbay_kubectl import output
from patchbay_kubectl.views import diagnosis
from patchbay_kubectl.views.nodes import node_group, node_rows
from patchbay_kubectl.views.objects import Inputs, utcnow

GROUPS = [
    {"name": "big", "nodeSelector": {"matchLabels": {"size": "big"}}},
    {"name": "fast", "nodeSelector": {"matchExpressions": [{"key": "fast", "operator": "Exists"}]}},
]


def profile(groups: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = {"resourceName": "example.com/x", "mode": "DevicePlugin", "plugin": {}}
    if groups:
        spec["nodeGroups"] = groups
    return {"metadata": {"name": "p"}, "spec": spec}


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def test_the_group_is_the_agents_word_else_the_first_match_else_default() -> None:
    p = profile(GROUPS)
    assert node_group(p, {"size": "big", "fast": ""}, None) == "big"  # the first listed
    assert node_group(p, {"fast": ""}, None) == "fast"
    assert node_group(p, {}, None) == "default"
    # The agent has not caught up with a label change yet: what it serves is what it says.
    assert node_group(p, {"fast": ""}, {"nodeGroup": "big"}) == "big"
    assert node_group(profile([]), {"size": "big"}, None) == "-"


def test_the_nodes_table_has_a_group_column() -> None:
    data = Inputs(profiles=[profile(GROUPS)], nodes=[node("n1", size="big"), node("n2")])
    rows = node_rows(data)
    assert [(r.node, r.group) for r in rows] == [("n1", "big"), ("n2", "default")]
    table = output.nodes(rows, None).splitlines()
    assert table[0].split()[:3] == ["NODE", "PROFILE", "GROUP"]
    assert table[1].split()[:3] == ["n1", "p", "big"]
    assert output.nodes(rows, "json").count('"group": "big"') == 1


def test_why_says_what_to_do_about_an_overlap() -> None:
    p = profile(GROUPS)
    p["status"] = {
        "problemCount": 1,
        "problems": [{"node": "n1", "reason": "NodeGroupsOverlap", "message": "big, fast all match"}],
    }
    (hint,) = [h for h in diagnosis.why(p, [], [], utcnow())["next"] if h["reason"] == "NodeGroupsOverlap"]
    assert "first listed wins" in hint["do"], hint


def test_the_nodes_table_says_which_revision_each_node_serves() -> None:
    """REVISION: the hash the node's agent reports serving (its DeviceReport's `revision`, the
    ControllerRevision `<profile>-<hash>`); `-` where no report names one."""
    data = Inputs(
        profiles=[profile([])],
        nodes=[node("n1"), node("n2")],
        reports=[{"profile": "p", "nodeName": "n1", "revision": "5d8f0c1a2b", "summary": {"healthy": 1}}],
    )
    rows = node_rows(data)
    assert [(r.node, r.revision) for r in rows] == [("n1", "5d8f0c1a2b"), ("n2", "-")]
    table = output.nodes(rows, None).splitlines()
    assert table[0].split()[-1] == "REVISION"
    assert [line.split()[-1] for line in table[1:]] == ["5d8f0c1a2b", "-"]
    assert output.nodes(rows, "json").count('"revision": "5d8f0c1a2b"') == 1
