"""Bad input, tried: the agent's config files (the profile's rendered config and the node agent's
list of profiles), as YAML documents shaped at random and as a valid config with one value
replaced at random. Each is either accepted or refused with `ConfigError` naming a field; nothing
else escapes (no KeyError, TypeError, AttributeError: the agent would crash instead of reporting
`ConfigInvalid`)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from support.fuzzing import tally

from patchbay_agent.config import ConfigError, parse
from patchbay_agent.nodeconfig import parse_node_config, selected

VALID: dict[str, Any] = {
    "resourceName": "example.com/serial",
    "plugin": {
        "discovery": {
            "paths": {"globs": ["/dev/ttyUSB*"], "groups": [{"id": "pair", "paths": ["/dev/a", "/dev/b"]}]}
        },
        "sharing": {"replicas": 2},
        "health": {
            "periodSeconds": 10,
            "failureThreshold": 3,
            "exec": {"command": ["/bin/true"], "timeoutSeconds": 2},
        },
        "allocation": {
            "permissions": "rw",
            "devicesEnvName": "SERIALS",
            "envs": {"A": "b"},
            "mounts": [{"hostPath": "/opt/x", "containerPath": "/x", "readOnly": True}],
            "annotations": {"example.com/a": "b"},
        },
        "preferredAllocation": {"policy": "Pack"},
        "preStart": {"command": ["/bin/true"], "timeoutSeconds": 5},
    },
}
FIELDS = ("config", "resourceName", "plugin", "profiles")

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=15), inner, max_size=4),
    max_leaves=20,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def _judge(surface: str, call: Any) -> None:
    try:
        call()
    except ConfigError as e:
        text = str(e)
        assert text and any(f in text for f in FIELDS), text
        tally(surface, "ConfigError")
        return
    tally(surface, "accepted")


@settings(max_examples=500, deadline=None)
@given(doc=_json)
def test_random_documents(doc: Any) -> None:
    _judge("config (profile)", lambda: parse(doc))
    _judge("config (node agent)", lambda: parse_node_config(doc))


PATHS = _paths(VALID)


@settings(max_examples=1000, deadline=None)
@given(where=st.sampled_from(PATHS), value=_json)
def test_one_value_replaced(where: tuple[Any, ...], value: Any) -> None:
    doc = _replace(VALID, where, value)
    _judge("config (profile)", lambda: parse(doc))
    # The node agent's file: each entry carries its resourceName and plugin; a bad one is refused
    # on its own (its `error` names the field), the file and the other entries stay usable.
    body = doc if isinstance(doc, dict) else {}
    good = {
        "profile": "good",
        "resourceName": "example.com/good",
        "plugin": {"discovery": {"virtual": {"count": 1}}},
    }
    node = {"profiles": [{"profile": "serial", "mode": "DevicePlugin", **body}, good]}
    serial, other = parse_node_config(node)
    assert other.config is not None and other.error == ""
    if serial.config is None:
        assert (serial.error and "profiles[0]" in serial.error) or any(f in serial.error for f in FIELDS), (
            serial.error
        )
        tally("config (node agent entry)", "refused")
    else:
        tally("config (node agent entry)", "accepted")


def test_the_valid_config_is_valid() -> None:
    assert parse(VALID).resource_name == "example.com/serial"


GROUPED = {
    "profile": "serial",
    "mode": "DevicePlugin",
    **VALID,
    "nodeGroups": [
        {
            "name": "fast",
            "nodeSelectorTerms": [[{"key": "fast", "operator": "Exists"}]],
            "plugin": copy.deepcopy(VALID["plugin"]),
        }
    ],
}
GROUP_PATHS = [p for p in _paths(GROUPED) if p[:1] == ("nodeGroups",)]


@settings(max_examples=500, deadline=None)
@given(where=st.sampled_from(GROUP_PATHS), value=_json)
def test_one_value_of_a_node_group_replaced(where: tuple[Any, ...], value: Any) -> None:
    """A bad node group never spoils the file nor the other entries; the node it concerns is
    refused with an error naming the field (`nodeGroups[0].plugin...`, or the entry's path when
    the list itself is unusable); a node of no group is served whenever only the group is bad."""
    entry = _replace(GROUPED, where, value)
    grouped, other = parse_node_config({"profiles": [entry, {**GROUPED, "profile": "other"}]})
    assert other.for_labels({"fast": ""}).config is not None
    for labels in ({}, {"fast": ""}):
        chosen = grouped.for_labels(labels)
        if chosen.config is None:
            assert chosen.error.startswith(("nodeGroups[0].", "profiles[0].nodeGroups")), chosen.error
            tally("config (node group)", "refused")
        else:
            tally("config (node group)", "accepted")


ROLLED = {
    "profile": "serial",
    "uid": "0b6c7a52-1f7e-4c4e-9d7a-7d1f1c0f2a11",
    "revision": "bbbbbbbbbb",
    "mode": "DevicePlugin",
    **VALID,
    "rollout": {
        "current": "aaaaaaaaaa",
        "update": "bbbbbbbbbb",
        "canarySelector": {
            "matchLabels": {"canary": "yes"},
            "matchExpressions": [{"key": "a", "operator": "Exists"}],
        },
        "threshold": 1 << 63,
        "exceptions": {"n3": "aaaaaaaaaa"},
    },
    "revisions": {"aaaaaaaaaa": {"mode": "DevicePlugin", **copy.deepcopy(VALID)}},
}
ROLLOUT_PATHS = [
    p for p in _paths(ROLLED) if p[:1] in (("rollout",), ("revisions",), ("uid",), ("revision",))
]


@settings(max_examples=500, deadline=None)
@given(where=st.sampled_from(ROLLOUT_PATHS), value=_json)
def test_one_value_of_the_rollout_replaced(where: tuple[Any, ...], value: Any) -> None:
    """A bad rollout stanza or revision body refuses its entry alone, naming the field; choosing
    a node's revision never fails, whatever the node's name and labels."""
    entry = _replace(ROLLED, where, value)
    entries = parse_node_config({"profiles": [entry, {**ROLLED, "profile": "other"}]})
    assert entries[1].config is not None
    if entries[0].config is None and entries[0].rollout is None:
        assert entries[0].error.startswith("profiles[0]") or any(f in entries[0].error for f in FIELDS)
        tally("config (rollout)", "refused")
    else:
        tally("config (rollout)", "accepted")
    for node, labels in (("n1", {}), ("n3", {}), ("n2", {"canary": "yes", "a": ""})):
        for chosen in selected(entries, labels, node):
            assert chosen.config is not None or chosen.error
