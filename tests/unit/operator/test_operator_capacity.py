"""Static-mode planning: the exact JSON patch per node, ownership, and what is never touched."""

from __future__ import annotations

import json
from typing import Any

import pytest

from patchbay_operator.capacity import (
    NodeState,
    desired,
    escape_pointer,
    newer,
    owner_annotation_key,
    owner_annotation_value,
    plan,
    quantity_to_int,
    report,
)
from patchbay_operator.constants import OWNER_ANNOTATION_PREFIX, Reason
from patchbay_operator.profiles import Profile

R = "example.com/dongle"


def profile(name: str = "dongles", capacity: int = 4, **spec: Any) -> Profile:
    body = {
        "metadata": {"name": name, "uid": "u1", "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"resourceName": R, "mode": "Static", "static": {"capacity": capacity}, **spec},
    }
    return Profile.from_body(body)


def node(
    labels: dict[str, str] | None = None,
    capacity: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    rv: str = "10",
) -> NodeState:
    return NodeState.from_node(
        {
            "metadata": {
                "name": "n1",
                "resourceVersion": rv,
                "labels": labels or {},
                "annotations": annotations if annotations is not None else {"other": "x"},
            },
            "status": {
                "capacity": {"cpu": "4", **(capacity or {})},
                "allocatable": {"cpu": "4", **(capacity or {})},
            },
        }
    )


def owned(profile_name: str = "dongles") -> dict[str, str]:
    return {owner_annotation_key(R): owner_annotation_value(R, profile_name)}


def test_escape_pointer_follows_rfc6901() -> None:
    assert escape_pointer("example.com/dongle") == "example.com~1dongle"
    assert escape_pointer("a~b/c") == "a~0b~1c"


def test_owner_key_is_valid_annotation_name_even_for_long_resources() -> None:
    assert owner_annotation_key(R) == OWNER_ANNOTATION_PREFIX + "example.com_dongle"
    long = "a" * 60 + ".example.com/" + "b" * 63
    key = owner_annotation_key(long)
    name = key.removeprefix(OWNER_ANNOTATION_PREFIX)
    assert len(name) <= 63
    assert name[0].isalnum() and name[-1].isalnum()
    assert key != owner_annotation_key(long[:-1] + "c")


def test_fresh_node_gets_one_patch_with_capacity_allocatable_and_ownership() -> None:
    ops = plan(node(), {R: profile()})
    assert ops == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "10"},
        {
            "op": "add",
            "path": "/metadata/annotations/static.patchbay.dev~1example.com_dongle",
            "value": owner_annotation_value(R, "dongles"),
        },
        {"op": "add", "path": "/status/capacity/example.com~1dongle", "value": "4"},
        {"op": "add", "path": "/status/allocatable/example.com~1dongle", "value": "4"},
    ]
    assert json.loads(ops[1]["value"]) == {"profile": "dongles", "resource": R}


def test_only_a_free_resource_is_taken_on_condition_of_the_cached_version() -> None:
    """Taking a resource the cache calls free depends on the cache being current (the first op
    tests metadata.resourceVersion); changing a value we own does not: it is ours either way."""
    assert plan(node(rv="42"), {R: profile()})[0] == {
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": "42",
    }
    for owned_node in (
        node(capacity={R: "1"}, annotations=owned()),  # drifted
        node(capacity={R: "4"}, annotations=owned("old")),  # taken over from our other profile
    ):
        ops = plan(owned_node, {R: profile()})
        assert ops and all(o["op"] != "test" for o in ops)


def test_node_already_right_needs_nothing() -> None:
    assert plan(node(capacity={R: "4"}, annotations=owned()), {R: profile()}) == []


def test_drifted_value_is_reasserted() -> None:
    ops = plan(node(capacity={R: "1"}, annotations=owned()), {R: profile()})
    assert {o["path"]: o["value"] for o in ops if "status" in o["path"]} == {
        "/status/capacity/example.com~1dongle": "4",
        "/status/allocatable/example.com~1dongle": "4",
    }


def test_resource_set_by_someone_else_is_never_touched() -> None:
    foreign = node(capacity={R: "7"})
    assert plan(foreign, {R: profile()}) == []
    assert plan(foreign, {}) == []
    rep = report(profile(), foreign)
    assert rep is not None and rep.problem is not None
    assert rep.problem[0] is Reason.OWNED_BY_OTHER


def test_unselected_owned_node_loses_the_resource() -> None:
    p = profile(nodeSelector={"matchLabels": {"dongle": "yes"}})
    ops = plan(node(labels={"dongle": "no"}, capacity={R: "4"}, annotations=owned()), {R: p})
    assert ops == [
        {"op": "remove", "path": "/status/capacity/example.com~1dongle"},
        {"op": "remove", "path": "/status/allocatable/example.com~1dongle"},
        {"op": "remove", "path": "/metadata/annotations/static.patchbay.dev~1example.com_dongle"},
    ]


def test_owned_resource_without_winner_is_removed_only_where_present() -> None:
    # The capacity was already reset by someone: remove only what exists, or the patch fails.
    n = NodeState.from_node(
        {
            "metadata": {"name": "n1", "annotations": owned()},
            "status": {"capacity": {"cpu": "1"}, "allocatable": {"cpu": "1", R: "4"}},
        }
    )
    ops = plan(n, {})
    assert [o["path"] for o in ops] == [
        "/status/allocatable/example.com~1dongle",
        "/metadata/annotations/static.patchbay.dev~1example.com_dongle",
    ]


def test_new_winner_takes_over_in_place() -> None:
    ops = plan(node(capacity={R: "4"}, annotations=owned("old")), {R: profile("new", capacity=2)})
    assert [o["op"] for o in ops] == ["add", "add", "add"]
    assert json.loads(ops[0]["value"])["profile"] == "new"


def test_missing_annotation_map_is_created_once() -> None:
    p2 = Profile.from_body(
        {
            "metadata": {"name": "other", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"resourceName": "example.com/other", "mode": "Static", "static": {"capacity": 1}},
        }
    )
    n = NodeState.from_node({"metadata": {"name": "n1"}, "status": {"capacity": {}, "allocatable": {}}})
    ops = plan(n, {R: profile(), "example.com/other": p2})
    creating = [o for o in ops if o["path"] == "/metadata/annotations"]
    assert len(creating) == 1
    assert sum(1 for o in ops if o["path"].startswith("/metadata/annotations/")) == 1


def test_capacity_from_label_overrides_and_invalid_label_is_reported() -> None:
    p = profile(static={"capacity": 4, "capacityFromLabel": "example.com/dongles"})
    assert desired(p, node(labels={"example.com/dongles": "9"})).value == 9
    assert desired(p, node()).value == 4
    bad = desired(p, node(labels={"example.com/dongles": "lots"}))
    assert bad.value is None and bad.problem is not None and "lots" in bad.problem
    rep = report(p, node(labels={"example.com/dongles": "lots"}))
    assert rep is not None and rep.problem is not None and rep.problem[0] is Reason.INVALID_CAPACITY_LABEL
    # An owned value on a node whose label went bad is withdrawn rather than left wrong.
    n = node(labels={"example.com/dongles": "lots"}, capacity={R: "4"}, annotations=owned())
    assert [o["op"] for o in plan(n, {R: p})] == ["remove", "remove", "remove"]


def test_zero_capacity_is_advertised() -> None:
    ops = plan(node(), {R: profile(capacity=0)})
    assert {"op": "add", "path": "/status/capacity/example.com~1dongle", "value": "0"} in ops


def test_malformed_ownership_annotation_is_not_trusted() -> None:
    n = node(capacity={R: "4"}, annotations={owner_annotation_key(R): "not json"})
    assert n.owners == {}
    assert plan(n, {}) == []


def test_resource_version_ordering() -> None:
    assert newer("11", "10") and newer("10", "10") and not newer("9", "10")
    assert newer("abc", "10")


@pytest.mark.parametrize(
    ("quantity", "count"),
    [
        (None, 0),
        ("0", 0),
        ("4", 4),
        ("2k", 2000),
        ("3M", 3 * 10**6),
        ("1G", 10**9),
        ("1T", 10**12),
        ("2P", 2 * 10**15),
        ("1E", 10**18),
        ("1Ki", 1024),
        ("1Mi", 2**20),
        ("1Gi", 2**30),
        ("1Ti", 2**40),
        ("1Pi", 2**50),
        ("1Ei", 2**60),
        ("1e3", 1000),
        ("1E3", 1000),
        ("1000m", 1),
        # Not integers: rounded UP, as Quantity.Value() does where the scheduler counts.
        ("1500m", 2),
        ("1.5", 2),
        ("1n", 1),
    ],
)
def test_every_quantity_suffix(quantity: str | None, count: int) -> None:
    assert quantity_to_int(quantity) == count


@pytest.mark.parametrize("junk", ["", "four", "1x", "--1", "1Kib"])
def test_a_value_that_is_no_quantity_is_an_error_that_says_so(junk: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        quantity_to_int(junk)


def test_report_ready_only_when_owned_and_equal() -> None:
    p = profile()
    rep = report(p, node(capacity={R: "4"}, annotations=owned()))
    assert rep is not None and rep.ready and rep.problem is None
    rep = report(p, node(capacity={R: "3"}, annotations=owned()))
    assert rep is not None and not rep.ready and rep.problem is not None
    assert rep.problem[0] is Reason.VALUE_MISMATCH
    rep = report(p, node())
    assert rep is not None and rep.problem is not None and rep.problem[0] is Reason.NOT_ADVERTISED
    assert report(profile(nodeSelector={"matchLabels": {"x": "y"}}), node()) is None
