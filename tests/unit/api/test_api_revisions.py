"""A profile's revisions and the assignment (patchbay_api.revisions): what a revision holds, its
hash, and that the operator's "next k nodes" (``threshold_for``) and what each agent computes for
itself (``Rollout.served``, through the agent's own node config parsing) agree for any nodes, k,
canaries and exceptions."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from patchbay_agent.nodeconfig import parse_node_config, selected
from patchbay_api.revisions import (
    EVERYONE,
    NOBODY,
    Rollout,
    node_hash,
    revision_data,
    revision_hash,
    spec_revision,
    threshold_for,
)

SPEC: dict[str, Any] = {
    "resourceName": "example.com/serial",
    "mode": "DevicePlugin",
    "plugin": {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}},
    "nodeSelector": {"matchLabels": {"dev": "yes"}},
}


def test_a_revision_is_what_agents_act_on_and_nothing_else() -> None:
    base = spec_revision(SPEC)
    assert len(base) == 10
    # The agent's pod settings and the history limit are not what a node serves: no new revision.
    assert spec_revision({**SPEC, "agent": {"image": "x"}, "revisionHistoryLimit": 3}) == base
    # Key order is not a change (the canonical JSON sorts keys).
    assert spec_revision(dict(reversed(list(SPEC.items())))) == base
    for change in (
        {"plugin": {"discovery": {"paths": {"globs": ["/dev/ttyACM*"]}}}},
        {"mode": "DRA"},
        {"nodeSelector": {}},
        {"nodeGroups": [{"name": "a", "nodeSelector": {}, "plugin": {}}]},
    ):
        assert spec_revision({**SPEC, **change}) != base, change
    static = {"resourceName": "example.com/dongle", "mode": "Static", "static": {"capacity": 2}}
    assert revision_data(static)["capacity"] == {"capacity": 2}
    assert spec_revision(static) != spec_revision({**static, "static": {"capacity": 3}})


def test_no_rollout_in_progress_serves_the_one_revision_everywhere() -> None:
    r = Rollout.settled("abc")
    assert r.as_dict() == {
        "current": "abc",
        "update": "abc",
        "canarySelector": None,
        "threshold": EVERYONE,
        "exceptions": {},
    }
    assert {r.served("uid", f"n{i}", {}) for i in range(200)} == {"abc"}
    assert Rollout.from_dict(r.as_dict()) == r


def test_a_refused_stanza_names_the_field() -> None:
    for bad, field in (
        ({"update": "b"}, "rollout.current"),
        ({"current": "a", "update": "b", "threshold": -1}, "rollout.threshold"),
        ({"current": "a", "update": "b", "threshold": EVERYONE + 1}, "rollout.threshold"),
        (
            {"current": "a", "update": "b", "canarySelector": {"matchExpressions": [{}]}},
            "rollout.canarySelector",
        ),
        ({"current": "a", "update": "b", "exceptions": {"n": 3}}, "rollout.exceptions"),
    ):
        with pytest.raises(ValueError, match=f"^{field}"):
            Rollout.from_dict(bad)


def test_threshold_ends() -> None:
    assert threshold_for("u", [], 3) == NOBODY
    assert threshold_for("u", ["a", "b"], 0) == NOBODY
    assert threshold_for("u", ["a", "b"], 2) == EVERYONE
    t = threshold_for("u", ["a", "b"], 1)
    first = min(["a", "b"], key=lambda n: node_hash("u", n))
    assert node_hash("u", first) < t <= max(node_hash("u", n) for n in ["a", "b"])


def _body(resource: str) -> dict[str, Any]:
    return {
        "mode": "DevicePlugin",
        "resourceName": resource,
        "plugin": {"discovery": {"paths": {"globs": ["/dev/x*"]}}},
        "nodeSelectorTerms": [[]],
    }


CURRENT, UPDATE = revision_hash({"r": 1}), revision_hash({"r": 2})

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=20)


@settings(max_examples=300, deadline=None)
@given(
    uid=st.uuids().map(str),
    nodes=st.lists(names, min_size=0, max_size=40, unique=True),
    k=st.integers(min_value=-2, max_value=45),
    canaries=st.sets(st.integers(min_value=0, max_value=39), max_size=5),
    held=st.dictionaries(
        st.integers(min_value=0, max_value=39), st.sampled_from([CURRENT, UPDATE]), max_size=5
    ),
)
def test_the_operators_next_k_nodes_are_the_nodes_whose_agents_move(
    uid: str, nodes: list[str], k: int, canaries: set[int], held: dict[int, str]
) -> None:
    """The operator sorts the nodes (all but the exceptions) by h and moves the first k with a
    threshold; the canary label moves those it selects. Each agent, knowing only its own name,
    labels and the profile's uid, parses the entry the operator would write and serves exactly the
    revision the operator meant."""
    canary = {nodes[i] for i in canaries if i < len(nodes)}
    exceptions = {nodes[i]: rev for i, rev in held.items() if i < len(nodes)}
    movable = [n for n in nodes if n not in exceptions]
    threshold = threshold_for(uid, movable, k)
    ordered = sorted(movable, key=lambda n: node_hash(uid, n))
    chosen = set(ordered[: max(0, k)]) | (canary - set(exceptions))
    stanza = Rollout(CURRENT, UPDATE, {"matchLabels": {"canary": "yes"}}, threshold, exceptions).as_dict()
    entry = {
        "profile": "p",
        "uid": uid,
        "revision": UPDATE,
        "rollout": stanza,
        **_body("example.com/update"),
        "revisions": {CURRENT: _body("example.com/current")},
    }
    entries = parse_node_config({"profiles": [entry]})
    for n in nodes:
        labels = {"canary": "yes"} if n in canary else {}
        meant = exceptions.get(n) or (UPDATE if n in chosen else CURRENT)
        (served,) = selected(entries, labels, n)
        assert served.revision == meant, n
        assert served.config is not None and served.config.revision == meant
        assert served.config.resource_name == (
            "example.com/update" if meant == UPDATE else "example.com/current"
        )


def test_an_entry_without_revisions_is_served_as_before() -> None:
    """A node config from an operator older than revisions: no revision named, nothing chosen."""
    entries = parse_node_config({"profiles": [{"profile": "p", **_body("example.com/a")}]})
    (served,) = selected(entries, {}, "n1")
    assert served.revision == "" and served.config is not None and served.config.revision == ""


def test_a_bad_rollout_stanza_refuses_that_entry_only() -> None:
    entries = parse_node_config(
        {
            "profiles": [
                {"profile": "p", "revision": UPDATE, "rollout": {"current": 1}, **_body("example.com/a")},
                {"profile": "q", **_body("example.com/b")},
            ]
        }
    )
    assert entries[0].config is None and "profiles[0].rollout.current" in entries[0].error
    assert entries[1].config is not None
