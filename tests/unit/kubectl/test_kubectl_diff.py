"""``kubectl patchbay diff``'s pure part (views/plan.py): per node, from report fixtures written as
agents write them, what a new profile would take away, who holds it, and what only the node knows."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
import yaml

from patchbay_kubectl import output
from patchbay_kubectl.views.objects import merged, pod_request
from patchbay_kubectl.views.plan import (
    lowered_static_nodes,
    node_plan,
    profile_plan,
    static_holders,
)


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def prof(spec: dict[str, Any], name: str = "serial") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"resourceName": "example.com/serial", **spec}}


def report(node_name: str, devices: list[tuple[str, list[str]]], group: str = "") -> dict[str, Any]:
    r: dict[str, Any] = {
        "profile": "serial",
        "nodeName": node_name,
        "devices": [
            {
                "id": dev,
                "health": "Healthy",
                "pods": [{"namespace": h.split("/")[0], "name": h.split("/")[1]} for h in holders],
            }
            for dev, holders in devices
        ],
    }
    if group:
        r["nodeGroup"] = group
    return r


def globs(*g: str) -> dict[str, Any]:
    return {"discovery": {"paths": {"globs": list(g)}}}


SERIAL = {"mode": "DevicePlugin", "plugin": globs("/dev/ttyUSB*", "/dev/serial/by-id/*")}


def test_a_glob_that_no_longer_matches_names_the_devices_and_their_holders() -> None:
    before = prof(SERIAL)
    after = prof({**SERIAL, "plugin": globs("/dev/ttyACM*", "/dev/serial/by-id/*")})
    r = report(
        "n1", [("ttyUSB0", ["apps/modem"]), ("ttyUSB1", []), ("serial_by-id_usb-FTDI-if00", ["apps/gps"])]
    )
    plan = node_plan(before, after, node("n1"), r)
    assert [(lo.device, lo.holders) for lo in plan.lost] == [("ttyUSB0", ["apps/modem"]), ("ttyUSB1", [])]
    assert plan.holders == ["apps/modem"] and plan.loses
    # The new glob may find files the report cannot show: said, not guessed.
    assert plan.unknown == ["files /dev/ttyACM* may match beyond the report: known once the node runs it"]


def test_an_unchanged_discovery_loses_nothing_and_knows_everything() -> None:
    before = prof(SERIAL)
    after = prof({**SERIAL, "plugin": {**SERIAL["plugin"], "health": {"periodSeconds": 9}}})
    plan = node_plan(before, after, node("n1"), report("n1", [("ttyUSB0", ["apps/modem"])]))
    assert not plan.loses and plan.lost == [] and plan.unknown == [] and not plan.changed()


def test_a_node_no_longer_selected_loses_every_device() -> None:
    before = prof(SERIAL)
    after = prof({**SERIAL, "nodeSelector": {"matchLabels": {"zone": "a"}}})
    r = report("n2", [("ttyUSB0", ["apps/modem"])])
    plan = node_plan(before, after, node("n2", zone="b"), r)
    assert (plan.selected_before, plan.selected_after) == (True, False)
    assert [(lo.device, lo.reason) for lo in plan.lost] == [("ttyUSB0", "the node is no longer selected")]
    kept = node_plan(before, after, node("n1", zone="a"), report("n1", [("ttyUSB0", [])]))
    assert kept.selected_after and not kept.loses


def test_node_groups_move_a_node_and_their_discovery_replaces_whole() -> None:
    groups = [
        {"name": "acm", "nodeSelector": {"matchLabels": {"kind": "acm"}}, "plugin": globs("/dev/ttyACM*")}
    ]
    before = prof(SERIAL)
    after = prof({**SERIAL, "nodeGroups": groups})
    plan = node_plan(before, after, node("n1", kind="acm"), report("n1", [("ttyUSB0", ["apps/modem"])]))
    assert (plan.group_before, plan.group_after) == ("-", "acm")
    assert [lo.device for lo in plan.lost] == ["ttyUSB0"]
    other = node_plan(before, after, node("n2"), report("n2", [("ttyUSB0", [])]))
    assert (other.group_after, other.loses) == ("default", False)
    # The merge of docs/api.md#node-groups: maps key by key, discovery whole.
    base = {"discovery": {"paths": {"globs": ["a"], "groups": []}}, "health": {"periodSeconds": 5, "x": 1}}
    over = {"discovery": {"paths": {"globs": ["b"]}}, "health": {"x": 2}}
    assert merged(base, over) == {
        "discovery": {"paths": {"globs": ["b"]}},
        "health": {"periodSeconds": 5, "x": 2},
    }


def test_a_lower_virtual_count_and_a_group_removed() -> None:
    before = prof({"mode": "DRA", "plugin": {"discovery": {"virtual": {"count": 4}}}})
    after = prof({"mode": "DRA", "plugin": {"discovery": {"virtual": {"count": 2}}}})
    r = report("n1", [(f"virtual-{i}", ["apps/job"] if i == 3 else []) for i in range(4)])
    plan = node_plan(before, after, node("n1"), r)
    assert [(lo.device, lo.reason) for lo in plan.lost] == [
        ("virtual-2", "virtual.count 4 -> 2"),
        ("virtual-3", "virtual.count 4 -> 2"),
    ]
    assert plan.holders == ["apps/job"] and plan.unknown == []
    grouped = {
        "mode": "DevicePlugin",
        "plugin": {"discovery": {"paths": {"groups": [{"id": "a"}, {"id": "b"}]}}},
    }
    fewer = {"mode": "DevicePlugin", "plugin": {"discovery": {"paths": {"groups": [{"id": "a"}]}}}}
    plan = node_plan(prof(grouped), prof(fewer), node("n1"), report("n1", [("a", []), ("b", ["x/y"])]))
    assert [lo.device for lo in plan.lost] == ["b"]


def test_what_only_the_node_knows_is_not_counted_as_lost() -> None:
    before = prof({"mode": "DevicePlugin", "plugin": {"discovery": {"pci": {"vendor": "10de"}}}})
    after = prof(
        {"mode": "DevicePlugin", "plugin": {"discovery": {"pci": {"vendor": "10de", "device": "20b0"}}}}
    )
    plan = node_plan(before, after, node("n1"), report("n1", [("0000:3b:00.0", ["ml/train"])]))
    assert not plan.loses and plan.unknown == ["what the new pci filter finds: known once the node runs it"]
    # A backend switch: every device gets another ID, so all are lost.
    switched = node_plan(before, prof(SERIAL), node("n1"), report("n1", [("0000:3b:00.0", ["ml/train"])]))
    assert switched.loses and switched.lost[0].reason.startswith("discovery pci -> paths")
    # No report (an agent that never wrote one): nothing known, nothing claimed.
    blind = node_plan(prof(SERIAL), prof({**SERIAL, "plugin": globs("/dev/x*")}), node("n1"), None)
    assert not blind.loses and blind.unknown == [
        "no DeviceReport from this node: what it serves now is not known"
    ]


def test_static_capacity_before_and_after_and_a_new_profile() -> None:
    before = prof({"mode": "Static", "static": {"capacity": 4}})
    after = prof({"mode": "Static", "static": {"capacity": 4, "capacityFromLabel": "dongles"}})
    plan = node_plan(before, after, node("n1", dongles="1"), None)
    assert (plan.capacity_before, plan.capacity_after, plan.loses) == (4, 1, True)
    assert not node_plan(before, after, node("n2"), None).loses
    fresh = node_plan(None, prof(SERIAL), node("n1"), None)
    assert (fresh.selected_before, fresh.selected_after, fresh.loses) == (False, True, False)
    assert fresh.unknown == ["newly selected: what it finds is known once its agent runs"]


def pod(name: str, limits: list[int], init: tuple[int, ...] = (), phase: str = "Running") -> dict[str, Any]:
    def c(n: int) -> dict[str, Any]:
        return {"name": "c", "resources": {"limits": {"example.com/dongle": str(n)}}}

    return {
        "metadata": {"name": name, "namespace": "apps"},
        "spec": {"containers": [c(n) for n in limits], "initContainers": [c(n) for n in init]},
        "status": {"phase": phase},
    }


def test_a_pod_holds_its_containers_sum_or_its_largest_init_container() -> None:
    assert pod_request(pod("a", [1, 2]), "example.com/dongle") == 3
    assert pod_request(pod("b", [1], init=[4, 2]), "example.com/dongle") == 4
    assert pod_request(pod("c", [3], phase="Succeeded"), "example.com/dongle") == 0
    assert pod_request(pod("d", [3]), "example.com/other") == 0
    asks = {"spec": {"containers": [{"resources": {"requests": {"example.com/dongle": "2"}}}]}}
    assert pod_request(asks, "example.com/dongle") == 2


def test_a_lowered_static_capacity_names_the_pods_over_it() -> None:
    before = prof({"mode": "Static", "static": {"capacity": 4}})
    after = prof({"mode": "Static", "static": {"capacity": 2}})
    gone = prof({"mode": "Static", "nodeSelector": {"matchLabels": {"x": "y"}}, "static": {"capacity": 4}})
    plans = profile_plan(before, after, "configured", [node("n1"), node("n2")], [])
    assert lowered_static_nodes(plans) == ["n1", "n2"]
    over, under = plans.nodes
    static_holders(over, "example.com/dongle", [pod("a", [2]), pod("b", [1]), pod("c", [5], phase="Failed")])
    static_holders(under, "example.com/dongle", [pod("d", [2])])
    assert [(lo.device, lo.holders) for lo in over.lost] == [("example.com/dongle", ["apps/a", "apps/b"])]
    assert over.lost[0].reason.startswith("capacity 4 -> 2: 3 in use")
    assert under.lost == [] and under.loses  # capacity lowered, no pod over it
    # A node no longer selected keeps nothing: every pod using the resource is over it.
    off = profile_plan(before, gone, "configured", [node("n1")], []).nodes[0]
    static_holders(off, "example.com/dongle", [pod("a", [1])])
    assert off.holders == ["apps/a"] and off.lost[0].reason.startswith("capacity 4 -> 0: 1 in use")


def test_profile_plan_and_its_outputs() -> None:
    before = prof({**SERIAL, "nodeSelector": {"matchLabels": {"serial": "yes"}}})
    after = prof({**before["spec"], "plugin": globs("/dev/ttyACM*")})
    nodes = [node("n2", serial="yes"), node("n1", serial="yes"), node("n3")]
    reports = [report("n1", [("ttyUSB0", ["apps/modem"])]), report("n2", [("ttyACM0", [])])]
    plan = profile_plan(before, after, "configured", nodes, reports)
    assert [n.node for n in plan.nodes] == ["n1", "n2"] and plan.loses
    text = output.plan([plan], None)
    lines = text.splitlines()
    assert lines[0] == (
        "devicepluginprofile.patchbay.dev/serial: configured (server dry run); 2 nodes selected before "
        "or after, 1 would lose devices, held by 1 pods"
    )
    assert lines[1].split() == ["NODE", "SELECTED", "GROUP", "LOSES", "HOLDERS", "NOTE"]
    assert lines[2].split()[:5] == ["n1", "yes", "-", "ttyUSB0", "apps/modem"]
    doc = json.loads(output.plan([plan], "json"))
    assert doc["items"][0]["loses"] is True
    assert doc["items"][0]["nodes"][0]["lost"] == [
        {
            "device": "ttyUSB0",
            "reason": "no glob or group of the new settings matches it",
            "holders": ["apps/modem"],
        }
    ]
    assert yaml.safe_load(output.plan([plan], "yaml")) == doc


def test_fewer_replicas_lose_a_device_with_more_holders_than_the_new_count() -> None:
    def shared(replicas: int) -> dict[str, Any]:
        return prof({**SERIAL, "plugin": {**SERIAL["plugin"], "sharing": {"replicas": replicas}}})

    r = report("n1", [("ttyUSB0", ["a/p1", "a/p2", "a/p3"]), ("ttyUSB1", ["a/p4"]), ("ttyUSB2", [])])
    plan = node_plan(shared(4), shared(2), node("n1"), r)
    assert [(lo.device, lo.reason) for lo in plan.lost] == [
        ("ttyUSB0", "sharing.replicas 4 -> 2: 3 pods hold it")
    ]
    assert plan.unknown and plan.unknown[0].startswith("sharing.replicas 4 -> 2: whether a holder's share")
    assert not node_plan(shared(2), shared(4), node("n1"), r).loses


def test_a_file_is_dry_run_in_its_own_api_version() -> None:
    from patchbay_kubectl.diff import diff_collection

    old = {"apiVersion": "patchbay.dev/v1alpha1", "kind": "DevicePluginProfile"}
    assert diff_collection(old) == "/apis/patchbay.dev/v1alpha1/devicepluginprofiles"
    assert (
        diff_collection({"kind": "DevicePluginProfile"}) == "/apis/patchbay.dev/v1beta1/devicepluginprofiles"
    )


def test_a_profile_written_between_the_read_and_the_dry_run_is_read_again() -> None:
    """The operator's status write between diff's GET and its dry-run replace (pinned to the GET's
    resourceVersion) is the server's 409; diff reads the profile again and dry-runs against it
    (seen on a v1.34.4 node: `diff -f` failed with "the object has been modified")."""
    from patchbay_kubectl import diff
    from patchbay_kubectl.kube import ConflictError, _api_error

    class Api:
        def __init__(self) -> None:
            self.version, self.replaced = 1, []  # type: ignore[var-annotated]

        def get(self, path: str) -> dict[str, Any]:
            return {"metadata": {"name": "p", "resourceVersion": str(self.version)}, "spec": {}}

        def replace(self, path: str, doc: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
            pinned = doc["metadata"]["resourceVersion"]
            self.replaced.append(pinned)
            if self.version < 3:  # the operator writes the status twice meanwhile
                self.version += 1
                raise _api_error(409, b'{"reason": "Conflict", "message": "the object has been modified"}')
            return doc

    api = Api()
    args = argparse.Namespace(server_side=False)
    doc = {"apiVersion": "patchbay.dev/v1beta1", "kind": "DevicePluginProfile", "metadata": {"name": "p"}}
    live, after = diff._live_and_after(api, args, doc, "/p")  # type: ignore[arg-type]
    assert api.replaced == ["1", "2", "3"]
    assert (
        live is not None
        and live["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"] == "3"
    )
    with pytest.raises(ConflictError):  # server-side apply's conflicts are another manager's: as they are
        diff._live_and_after(
            _Applies(),
            argparse.Namespace(server_side=True, field_manager="m", force_conflicts=False),
            doc,
            "/p",
        )  # type: ignore[arg-type]


class _Applies:
    def get(self, path: str) -> dict[str, Any]:
        return {"metadata": {"name": "p", "resourceVersion": "1"}}

    def apply(self, *a: Any, **kw: Any) -> dict[str, Any]:
        from patchbay_kubectl.kube import _api_error

        raise _api_error(409, b'{"reason": "Conflict", "message": "conflict with m2"}')
