"""The opt-in inventory labels on the REAL API server: the operator started with
--inventory-node-labels (the chart's inventory.nodeLabels), NodeInventories written by hand as
the node agent writes them, on kwok Nodes.

Checked: a NodeInventory created puts its kinds' labels on its Node; edited (a kind left, another
came), the Node follows; deleted, its labels go; a label under the same prefix that someone else
set (a merge patch, as `kubectl label` sends it) and a label of another prefix stay through all of
it; nothing more is written while nothing changes (the operator's apply counter); the operator
started without the setting removes the labels it set and nothing else. The seconds each change
took are printed (bounded waits, not timing assertions)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.clusters import REPO, Cluster, apply_crd, wait_for
from support.operator import Operator

GROUP, VERSION, PLURAL = "patchbay.dev", "v1beta1", "nodeinventories"
FTDI = "inventory.patchbay.dev/usb-0403-6001"
H100 = "inventory.patchbay.dev/pci-10de-2330"
BY_HAND = "inventory.patchbay.dev/pci-1af4-1000"


@pytest.fixture(scope="module")
def inventory_crd(api: client.ApiClient) -> None:
    apply_crd(api, REPO / "crds" / "patchbay.dev_nodeinventories.yaml")
    custom = client.CustomObjectsApi(api)

    def served() -> bool:
        try:
            custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        except ApiException:
            return False
        return True

    wait_for("the NodeInventory API to be served", served)


def inventory(node: str, usb: list[tuple[str, str]], pci: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "NodeInventory",
        "metadata": {"name": node},
        "nodeName": node,
        "summary": {"pci": len(pci), "usb": len(usb), "char": 0, "gpus": 0},
        "usb": [{"port": f"1-{i + 1}", "vendor": v, "product": p} for i, (v, p) in enumerate(usb)],
        "pci": [{"address": f"0000:0{i}:00.0", "vendor": v, "device": d} for i, (v, d) in enumerate(pci)],
    }


@pytest.fixture
def labelling(operator: Operator) -> Iterator[Operator]:
    operator.stop()
    operator.start("--inventory-node-labels")
    try:
        yield operator
    finally:
        operator.stop()
        operator.start()


def test_node_labels_follow_the_inventory_and_leave_others_alone(
    cluster: Cluster, inventory_crd: None, labelling: Operator
) -> None:
    node, other = cluster.add_nodes(2)
    custom = cluster.custom

    def labels(name: str) -> dict[str, str]:
        got = cluster.node(name)["metadata"].get("labels") or {}
        return {k: v for k, v in got.items() if k.startswith("inventory.patchbay.dev/") or k == "zone"}

    def timed(what: str, want: dict[str, str], name: str = node) -> float:
        t0 = time.monotonic()
        wait_for(what, lambda: labels(name) == want, 30, 0.1)
        return time.monotonic() - t0

    cluster.set_labels(node, {BY_HAND: "present", "zone": "a"})
    cluster.set_labels(other, {FTDI: "present"})  # by hand, no inventory: never touched
    try:
        custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, inventory(node, [("0403", "6001")], []))
        created = timed("the FTDI label", {FTDI: "present", BY_HAND: "present", "zone": "a"})
        writes = labelling.stats()["inventoryLabelWrites"]

        # Nothing changes for a while (the same inventory written again, node heartbeats): no write.
        custom.patch_cluster_custom_object(GROUP, VERSION, PLURAL, node, {"summary": {"char": 1}})
        time.sleep(3)
        assert labelling.stats()["inventoryLabelWrites"] == writes

        # Edited: the adapter left, a GPU came, and the hand-set PCI kind is listed too (co-owned).
        edited = inventory(node, [], [("10de", "2330"), ("1af4", "1000")])
        custom.patch_cluster_custom_object(
            GROUP, VERSION, PLURAL, node, {"usb": [], "pci": edited["pci"], "summary": edited["summary"]}
        )
        changed = timed("the labels follow the edit", {H100: "present", BY_HAND: "present", "zone": "a"})

        # Deleted: its labels go, the hand-set one (also another owner's) stays.
        custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, node)
        deleted = timed("the labels gone with the inventory", {BY_HAND: "present", "zone": "a"})
        assert labels(other) == {FTDI: "present"}
        print(
            f"labels after the inventory's change: created {created:.2f} s, "
            f"edited {changed:.2f} s, deleted {deleted:.2f} s"
        )

        # The setting off: what it set goes, nothing else.
        custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, inventory(node, [("0403", "6001")], []))
        timed("the FTDI label again", {FTDI: "present", BY_HAND: "present", "zone": "a"})
        labelling.stop()
        labelling.start()
        off = timed("the labels gone with the setting", {BY_HAND: "present", "zone": "a"})
        assert labels(other) == {FTDI: "present"}
        print(f"the setting off: labels gone after the operator's start, {off:.2f} s")
    finally:
        try:
            custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, node)
        except ApiException as e:
            if e.status != 404:
                raise
