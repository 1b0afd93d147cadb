"""Label selector semantics and who wins a resource name."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from patchbay_operator.constants import Mode
from patchbay_operator.profiles import Profile, Registry, Selector


def prof(
    name: str, created: str, resource: str = "example.com/x", mode: str = "Static", **meta: Any
) -> Profile:
    spec: dict[str, Any] = {"resourceName": resource, "mode": mode}
    spec["static" if mode == "Static" else "plugin"] = {"capacity": 1} if mode == "Static" else {}
    return Profile.from_body({"metadata": {"name": name, "creationTimestamp": created, **meta}, "spec": spec})


def test_selector_semantics() -> None:
    sel = Selector.parse(
        {
            "matchLabels": {"a": "1"},
            "matchExpressions": [
                {"key": "b", "operator": "In", "values": ["x", "y"]},
                {"key": "c", "operator": "NotIn", "values": ["bad"]},
                {"key": "d", "operator": "Exists"},
                {"key": "e", "operator": "DoesNotExist"},
            ],
        }
    )
    ok = {"a": "1", "b": "x", "d": ""}
    assert sel.matches(ok)
    assert sel.matches({**ok, "c": "fine"})
    assert not sel.matches({**ok, "c": "bad"})
    assert not sel.matches({**ok, "e": "1"})
    assert not sel.matches({**ok, "a": "2"})
    assert not sel.matches({"a": "1", "b": "z", "d": ""})
    assert Selector.parse({}).matches({})  # an absent spec.nodeSelector is read as {}: every node
    assert Selector.parse({}).matches({"any": "thing"})


def test_affinity_terms_keep_every_requirement() -> None:
    sel = Selector.parse(
        {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "d", "operator": "Exists"}]}
    )
    assert sel.as_node_affinity_terms() == [
        {"key": "a", "operator": "In", "values": ["1"]},
        {"key": "d", "operator": "Exists"},
    ]


def test_oldest_profile_wins_and_deleting_ones_never_do() -> None:
    old, new = prof("b-old", "2026-01-01T00:00:00Z"), prof("a-new", "2026-01-02T00:00:00Z")
    reg = Registry([new, old])
    assert reg.winner("example.com/x") == old
    assert reg.is_winner(old) and not reg.is_winner(new)
    reg.upsert(replace(old, deleting=True))
    assert reg.winner("example.com/x") == new
    reg.remove("a-new")
    assert reg.winner("example.com/x") is None


def test_same_creation_second_breaks_ties_by_name() -> None:
    a, b = prof("a", "2026-01-01T00:00:00Z"), prof("b", "2026-01-01T00:00:00Z")
    assert Registry([b, a]).winner("example.com/x") == a


def test_static_winners_excludes_device_plugin_winners() -> None:
    reg = Registry(
        [
            prof("s", "2026-01-01T00:00:00Z", "example.com/s"),
            prof("d", "2026-01-01T00:00:00Z", "example.com/d", mode="DevicePlugin"),
        ]
    )
    assert set(reg.static_winners()) == {"example.com/s"}
    assert reg.get("d") is not None and reg.get("d").mode is Mode.DEVICE_PLUGIN  # type: ignore[union-attr]


def test_deletion_timestamp_marks_deleting() -> None:
    p = prof("x", "2026-01-01T00:00:00Z", deletionTimestamp="2026-01-03T00:00:00Z")
    assert p.deleting
