"""A DeviceReport LIST page read straight into what the operator keeps (``decode_page``, msgspec)
must keep exactly what the dict reading of the same object keeps (``Report.from_object``, a watch
event's path), and count every device the way the status always has: the two paths meet in one
controller cache, so any difference would show as a report that changes with no event."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.reports import largest_report

from patchbay_operator.devicereports import MAX_KEPT_DEVICES, Report, decode_event, decode_page


def page_of(*items: dict[str, Any], rv: str = "42", cont: str = "") -> bytes:
    meta: dict[str, Any] = {"resourceVersion": rv}
    if cont:
        meta["continue"] = cont
    return json.dumps(
        {
            "kind": "DeviceReportList",
            "apiVersion": "patchbay.dev/v1alpha1",
            "metadata": meta,
            "items": list(items),
        }
    ).encode()


def counted(obj: dict[str, Any]) -> tuple[int, int, int, int, int]:
    """The status's counting of a report, written out plainly (the oracle): every device, healthy,
    held by any pod, withheld, withheld and healthy."""
    devs = obj.get("devices") or []
    healthy = [d.get("health") == "Healthy" for d in devs]
    withheld = [d.get("withheld") is True for d in devs]
    return (
        len(devs),
        sum(healthy),
        sum(bool(d.get("pods")) for d in devs),
        sum(withheld),
        sum(h and w for h, w in zip(healthy, withheld, strict=True)),
    )


def test_a_report_at_the_bounds_is_kept_the_same_from_a_page_and_from_an_event() -> None:
    obj = largest_report("ns", "node-1", "serial")
    (from_page,), rv, cont = decode_page(page_of(obj, rv="981", cont="next-page"))
    assert (rv, cont) == ("981", "next-page")
    assert from_page == Report.from_object(obj)
    c = from_page.all
    assert (
        (c.total, c.healthy, c.allocated, c.withheld, c.withheld_healthy)
        == counted(obj)
        == (2048, 0, 8, 2048, 0)
    )
    assert len(from_page.devices) == MAX_KEPT_DEVICES
    assert from_page.devices[0].message == "m" * 512
    assert from_page.node == "node-1" and from_page.profile == "serial" and from_page.agent == "a" * 253


def test_the_last_page_has_no_continue_and_an_empty_page_no_items() -> None:
    assert decode_page(page_of(rv="7")) == ([], "7", "")
    assert decode_page(b'{"metadata":{},"items":null}'.replace(b"null", b"[]")) == ([], "", "")


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b'{"items": {"a": 1}}',
        b'{"items": [{"devices": "all"}]}',
        b'{"items": [{"devices": [7]}]}',
    ],
)
def test_a_page_that_is_not_a_list_of_reports_is_a_value_error(body: bytes) -> None:
    with pytest.raises(ValueError, match="DeviceReport LIST page"):
        decode_page(body)


holders = st.one_of(
    st.none(),
    st.just([]),
    st.lists(
        st.fixed_dictionaries(
            {"namespace": st.just("ns"), "name": st.text(min_size=1, max_size=5), "container": st.just("c")}
        ),
        min_size=1,
        max_size=3,
    ),
    st.lists(st.text(max_size=3), min_size=1, max_size=2),
)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.text(max_size=6))
devices = st.lists(
    st.builds(
        lambda id_, health, withheld, pods, reason, message, drop: {
            k: v
            for k, v in {
                "id": id_,
                "health": health,
                "withheld": withheld,
                "pods": pods,
                "reason": reason,
                "message": message,
            }.items()
            if k not in drop
        },
        st.text(max_size=4),
        st.sampled_from(["Healthy", "Unhealthy", "", None, 1]),
        st.one_of(st.booleans(), st.none(), st.just("true")),
        holders,
        scalars,
        scalars,
        st.sets(st.sampled_from(["id", "health", "withheld", "pods", "reason", "message"])),
    ),
    max_size=40,
)
reports = st.builds(
    lambda devs, error, failures, group: {
        "metadata": {"name": "r", "namespace": "ns"},
        "profile": "p",
        "nodeName": "n",
        "devices": devs,
        "agentError": error,
        "allocationFailures": failures,
        "nodeGroup": group,
        "summary": {"total": 99},
    },
    devices,
    st.one_of(st.none(), st.just("oops"), st.fixed_dictionaries({"reason": scalars, "message": scalars})),
    st.one_of(
        st.none(),
        st.fixed_dictionaries(
            {
                "count": st.integers(0, 9),
                "last": st.one_of(st.none(), st.fixed_dictionaries({"message": st.text(max_size=5)})),
            }
        ),
    ),
    st.one_of(st.none(), st.text(max_size=4)),
)


@settings(max_examples=300, deadline=None)
@given(reports)
def test_any_report_the_crd_could_hold_is_kept_the_same_both_ways(obj: dict[str, Any]) -> None:
    (from_page,), _, _ = decode_page(page_of(obj))
    from_event = Report.from_object(obj)
    assert from_page == from_event
    c = from_page.all
    assert (c.total, c.healthy, c.allocated, c.withheld, c.withheld_healthy) == counted(obj)
    kept = [d for d in obj["devices"] if d.get("health") != "Healthy"][:MAX_KEPT_DEVICES]
    assert [d.id for d in from_page.devices] == [str(d["id"]) if d.get("id") else "" for d in kept]


def test_a_watch_line_is_read_like_a_page_and_other_events_as_dicts() -> None:
    obj = largest_report("ns", "node-1", "serial")
    obj["metadata"]["resourceVersion"] = "77"
    for kind in ("ADDED", "MODIFIED", "DELETED"):
        got = decode_event(json.dumps({"type": kind, "object": obj}).encode())
        assert got == (kind, "77", Report.from_object(obj))
    bookmark = {"type": "BOOKMARK", "object": {"kind": "DeviceReport", "metadata": {"resourceVersion": "90"}}}
    assert decode_event(json.dumps(bookmark).encode()) == ("BOOKMARK", "90", bookmark["object"])
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}
    assert decode_event(json.dumps(gone).encode()) == ("ERROR", "", gone["object"])


@pytest.mark.parametrize(
    "line", [b"", b"{", b'{"type": "ADDED", "object": {"devices": 3}}', b'{"type": "ADDED", "object": 7}']
)
def test_a_watch_line_that_is_not_an_event_of_a_report_is_a_value_error(line: bytes) -> None:
    with pytest.raises(ValueError, match="DeviceReport WATCH event"):
        decode_event(line)
