"""The opt-in inventory labels on a node: what it should carry and whether a write is due (pure).

With ``--inventory-node-labels`` (the chart's ``inventory.nodeLabels``) each node carries exactly
the labels of the device kinds its NodeInventory lists (``patchbay_api.inventory.node_labels``:
``inventory.patchbay.dev/usb-0403-6001: present``), kept by server-side apply under a field
manager of their own, ``INVENTORY_LABELS_MANAGER``. An apply that leaves a label out removes it
only where that manager alone owned it: labels of other owners are never touched, an inventory
label someone set by hand (a kwok node's) included. Which labels it owns is read from the Node's
``managedFields``, so a restarted operator knows them without a record of its own.

``plan`` decides; it says None (no write) when the node already carries what it should, so a
quiet cluster costs no write at all. Off (no inventory read), every node should carry none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from patchbay_api.constants import INVENTORY_LABEL_PREFIX
from patchbay_api.inventory import node_labels

INVENTORY_LABELS_MANAGER = "patchbay-inventory-labels"
"""The server-side-apply field manager of the inventory labels, and of nothing else."""


def owned_labels(node: Mapping[str, Any]) -> frozenset[str]:
    """The label keys ``INVENTORY_LABELS_MANAGER`` owns on ``node`` (its Apply entry's fields)."""
    out: set[str] = set()
    for entry in (node.get("metadata") or {}).get("managedFields") or []:
        if entry.get("manager") != INVENTORY_LABELS_MANAGER or entry.get("operation") != "Apply":
            continue
        labels = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:labels") or {}
        out.update(k[2:] for k in labels if k.startswith("f:"))
    return frozenset(out)


@dataclass(frozen=True)
class NodeLabels:
    """What a node carries that this module looks at: its inventory labels (anyone's) and the
    keys the inventory-label manager owns."""

    labels: Mapping[str, str] = field(default_factory=dict)
    owned: frozenset[str] = frozenset()

    @classmethod
    def from_node(cls, node: Mapping[str, Any]) -> NodeLabels:
        meta = node.get("metadata") or {}
        labels = {
            str(k): str(v)
            for k, v in (meta.get("labels") or {}).items()
            if str(k).startswith(INVENTORY_LABEL_PREFIX)
        }
        return cls(labels, owned_labels(node))


@dataclass(frozen=True)
class Inventory:
    """A NodeInventory as this module keeps it: its node and the labels that node should carry."""

    node: str
    labels: Mapping[str, str]

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Inventory:
        node = str(obj.get("nodeName") or (obj.get("metadata") or {}).get("name") or "")
        return cls(node, node_labels(obj))


def plan(desired: Mapping[str, str], node: NodeLabels) -> dict[str, str] | None:
    """The labels to apply (the manager's whole set) so that ``node`` carries ``desired``; None
    when nothing needs writing. A desired key another owner holds with another value is left to
    it (applying it would conflict, and taking it would touch their label)."""
    want = {k: v for k, v in desired.items() if node.labels.get(k, v) == v}
    if set(want) == node.owned and all(node.labels.get(k) == v for k, v in want.items()):
        return None
    return want


def apply_body(name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """The server-side apply configuration: the Node's name and the labels (none: the key is
    left out, so the manager owns nothing of the Node afterwards)."""
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = dict(sorted(labels.items()))
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta}
