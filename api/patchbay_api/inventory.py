"""The opt-in inventory labels: which node label says a kind of device is on a node (pure, shared).

One definition for the operator, which keeps the labels on the nodes (the chart's
``inventory.nodeLabels``), and the kubectl plugin, whose ``discover --propose`` selects nodes by
them. A USB kind is ``inventory.patchbay.dev/usb-<vendor>-<product>``, a PCI kind
``inventory.patchbay.dev/pci-<vendor>-<device>``, value ``present``. Character devices with no USB
or PCI device behind them get none (their kind is a file pattern, not an identity).

A label's name part must be a valid label name of at most 63 characters. The NodeInventory CRD
bounds each id to 8 characters, so the longest name is 21; an id holding a character a label
cannot (only a hand-written inventory could) makes its kind unlabelled: ``None``, and
``discover --propose`` then falls back to the nodes' hostnames.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from patchbay_api.constants import INVENTORY_LABEL_PREFIX

LABEL_VALUE = "present"
"""The value of every inventory label."""
NAME_MAX = 63
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$")
_ID = re.compile(r"^[0-9a-z]+$")


def kind_label(bus: str, vendor: str, device: str) -> str | None:
    """The label of one USB (``bus`` usb: vendor, product) or PCI (pci: vendor, device) kind;
    None when the ids make no valid label name."""
    vendor, device = vendor.lower(), device.lower()
    if not (_ID.match(vendor) and _ID.match(device)):
        return None
    name = f"{bus}-{vendor}-{device}"
    if len(name) > NAME_MAX or not _NAME.match(name):
        return None
    return INVENTORY_LABEL_PREFIX + name


def node_labels(inventory: Mapping[str, Any]) -> dict[str, str]:
    """The labels a node with this NodeInventory carries: one per USB and PCI kind it lists
    (entries the inventory only counts, past its bound, bring none)."""
    out: dict[str, str] = {}
    for u in inventory.get("usb") or []:
        label = kind_label("usb", str(u.get("vendor") or ""), str(u.get("product") or ""))
        if label:
            out[label] = LABEL_VALUE
    for p in inventory.get("pci") or []:
        label = kind_label("pci", str(p.get("vendor") or ""), str(p.get("device") or ""))
        if label:
            out[label] = LABEL_VALUE
    return out
