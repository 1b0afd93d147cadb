"""The opt-in inventory labels: the label of a kind (patchbay_api.inventory, shared with
`kubectl patchbay discover`), the set a node carries, whether a write is due (inventorylabels.py,
pure), and the keeper (nodelabels.py) over a FAKE KubeAPI (fakekube.FakeKube): one apply per
change, none when nothing changed, the option off removes only what it owns."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fakekube import FakeKube

from patchbay_api.inventory import kind_label, node_labels
from patchbay_operator.capacity import NodeState
from patchbay_operator.informer import Event
from patchbay_operator.inventorylabels import (
    INVENTORY_LABELS_MANAGER,
    Inventory,
    NodeLabels,
    apply_body,
    owned_labels,
    plan,
)
from patchbay_operator.nodelabels import InventoryLabels
from patchbay_operator.nodes import NodeSync

FTDI = "inventory.patchbay.dev/usb-0403-6001"
H100 = "inventory.patchbay.dev/pci-10de-2330"


def inventory(node: str, usb: list[tuple[str, str]] = (), pci: list[tuple[str, str]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    return {
        "metadata": {"name": node},
        "nodeName": node,
        "usb": [{"vendor": v, "product": p, "port": f"1-{i}"} for i, (v, p) in enumerate(usb)],
        "pci": [{"vendor": v, "device": d, "address": f"0000:0{i}:00.0"} for i, (v, d) in enumerate(pci)],
        "char": [{"class": "tty", "path": "/dev/ttyS0"}],
    }


def test_a_kinds_label_is_a_valid_label_or_none() -> None:
    assert kind_label("usb", "0403", "6001") == FTDI
    assert kind_label("pci", "10DE", "2330") == H100  # lower case, as sysfs writes ids
    longest = kind_label("usb", "f" * 8, "f" * 8)  # the CRD's bound: 8 characters an id
    assert longest is not None and len(longest.split("/", 1)[1]) == 21
    assert kind_label("usb", "04 03", "6001") is None  # a character a label cannot hold
    assert kind_label("usb", "", "6001") is None
    assert kind_label("pci", "1" * 40, "2" * 40) is None  # past 63 characters


def test_a_node_carries_one_label_per_usb_and_pci_kind_and_none_for_files() -> None:
    inv = inventory("n", usb=[("0403", "6001"), ("0403", "6001")], pci=[("10de", "2330")])
    assert node_labels(inv) == {FTDI: "present", H100: "present"}
    assert node_labels(inventory("n")) == {}


def node(labels: dict[str, str], owned: set[str]) -> dict[str, Any]:
    fields = {"f:metadata": {"f:labels": {f"f:{k}": {} for k in owned}}}
    return {
        "metadata": {
            "name": "n",
            "labels": labels,
            "managedFields": [
                {"manager": "kubectl-label", "operation": "Update", "fieldsV1": {"f:metadata": {}}},
                {"manager": INVENTORY_LABELS_MANAGER, "operation": "Apply", "fieldsV1": fields},
            ],
        }
    }


def test_what_the_manager_owns_is_read_from_managed_fields() -> None:
    n = node({FTDI: "present", "zone": "a"}, {FTDI})
    assert owned_labels(n) == {FTDI}
    assert NodeLabels.from_node(n) == NodeLabels({FTDI: "present"}, frozenset({FTDI}))


@pytest.mark.parametrize(
    ("desired", "labels", "owned", "write"),
    [
        # as it should be: no write
        ({FTDI: "present"}, {FTDI: "present"}, {FTDI}, None),
        ({}, {}, set(), None),
        # a kind came, a kind left
        ({FTDI: "present", H100: "present"}, {FTDI: "present"}, {FTDI}, {FTDI: "present", H100: "present"}),
        ({}, {FTDI: "present"}, {FTDI}, {}),
        # set by hand (not ours): left alone when not desired, co-owned when desired
        ({}, {FTDI: "present"}, set(), None),
        ({FTDI: "present"}, {FTDI: "present"}, set(), {FTDI: "present"}),
        # someone else's value: theirs, not applied (it would conflict), nothing to write
        ({FTDI: "present"}, {FTDI: "mine"}, set(), None),
    ],
    ids=["same", "none", "came", "left", "by-hand", "co-own", "other-value"],
)
def test_the_apply_decision(
    desired: dict[str, str], labels: dict[str, str], owned: set[str], write: dict[str, str] | None
) -> None:
    assert plan(desired, NodeLabels(labels, frozenset(owned))) == write


def test_the_apply_body_names_the_node_and_leaves_labels_out_when_none() -> None:
    assert apply_body("n", {}) == {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}}
    assert apply_body("n", {FTDI: "present"})["metadata"]["labels"] == {FTDI: "present"}


def keeper_of(kube: FakeKube, *, enabled: bool) -> InventoryLabels:
    """The keeper over a node cache of its own, calling the fake in the loop's thread."""

    async def call(fn: Any, *args: Any) -> Any:
        return fn(*args)

    nodes = NodeSync(kube, call, dict, lambda: None)  # type: ignore[arg-type]
    return InventoryLabels(kube, call, nodes, enabled=enabled)  # type: ignore[arg-type]


async def keep(kube: FakeKube, keeper: InventoryLabels) -> None:
    """Fold the fake's nodes in (as the node informer does: the node cache first) and run the
    worker until the queue is idle."""
    events = [Event("ADDED", NodeState.from_node(n)) for n in kube.nodes.values()]
    keeper.node_sync.observe(events)
    keeper.observe(events)
    worker = asyncio.create_task(keeper.run_worker())
    try:
        await asyncio.wait_for(keeper.queue.wait_idle(), 5)
    finally:
        worker.cancel()


async def test_one_apply_per_change_and_none_while_nothing_changes() -> None:
    kube = FakeKube()
    kube.add_node("n1", {"zone": "a"})
    kube.add_node("n2", {FTDI: "present"})  # by hand, no inventory: never touched
    keeper = keeper_of(kube, enabled=True)
    keeper.inventories.observe(
        [Event("ADDED", Inventory.from_object(inventory("n1", usb=[("0403", "6001")])))]
    )
    await keep(kube, keeper)
    assert kube.nodes["n1"]["metadata"]["labels"] == {"zone": "a", FTDI: "present"}
    assert keeper.writes == 1 and kube.calls.count("apply_node_labels") == 1

    # The same inventory again (a device file came, a profile serves it), a node event: no write.
    keeper.inventories.observe(
        [Event("MODIFIED", Inventory.from_object(inventory("n1", usb=[("0403", "6001")])))]
    )
    await keep(kube, keeper)
    assert keeper.writes == 1

    # The adapter leaves, a GPU comes: one apply with the new set; the other node untouched.
    keeper.inventories.observe(
        [Event("MODIFIED", Inventory.from_object(inventory("n1", pci=[("10de", "2330")])))]
    )
    await keep(kube, keeper)
    assert kube.nodes["n1"]["metadata"]["labels"] == {"zone": "a", H100: "present"}
    assert kube.nodes["n2"]["metadata"]["labels"] == {FTDI: "present"}
    assert keeper.writes == 2

    # The inventory deleted: its labels go.
    keeper.inventories.observe([Event("DELETED", Inventory("n1", {}))])
    await keep(kube, keeper)
    assert kube.nodes["n1"]["metadata"]["labels"] == {"zone": "a"} and keeper.writes == 3


async def test_off_reads_no_inventory_and_removes_only_what_it_owns() -> None:
    kube = FakeKube()
    kube.add_node("n1", {"zone": "a"})
    kube.add_node("n2", {FTDI: "present"})
    on = keeper_of(kube, enabled=True)
    on.inventories.observe([Event("ADDED", Inventory.from_object(inventory("n1", usb=[("0403", "6001")])))])
    await keep(kube, on)
    off = keeper_of(kube, enabled=False)
    off.inventories.observe([Event("ADDED", Inventory.from_object(inventory("n1", usb=[("0403", "6001")])))])
    await keep(kube, off)
    assert kube.nodes["n1"]["metadata"]["labels"] == {"zone": "a"}
    assert kube.nodes["n2"]["metadata"]["labels"] == {FTDI: "present"}  # not its own
    assert off.writes == 1
    await keep(kube, off)
    assert off.writes == 1  # nothing more


async def test_a_conflict_reads_the_node_again_and_a_gone_node_is_forgotten() -> None:
    kube = FakeKube()
    kube.add_node("n1")
    kube.add_node("n2")
    keeper = keeper_of(kube, enabled=True)
    kube.fail_next("apply_node_labels", 409)
    keeper.inventories.observe(
        [Event("ADDED", Inventory.from_object(inventory("n1", usb=[("0403", "6001")])))]
    )
    await keep(kube, keeper)
    assert kube.calls.count("get_node") == 1 and kube.nodes["n1"]["metadata"]["labels"] == {FTDI: "present"}
    del kube.nodes["n2"]  # gone before its write
    keeper.inventories.observe(
        [Event("ADDED", Inventory.from_object(inventory("n2", usb=[("0403", "6001")])))]
    )
    await keep(kube, keeper)
    assert "n2" not in keeper.node_sync.states and keeper.stats() == {
        "inventoryLabelWrites": 1,
        "inventoryLabelFailures": 2,
    }
