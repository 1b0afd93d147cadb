"""``kubectl patchbay discover``: what hardware the nodes have, grouped by kind of device, from the
NodeInventories the shared node agents keep; and, with ``--propose``, a DevicePluginProfile that
serves exactly one kind on exactly the nodes that have it. Pure: objects in, text out.

A kind is a USB vendor:product (with the device files its devices bring, ``/dev/ttyUSB*``), a PCI
vendor:device (named by NVML where it is a GPU, else by its class), or, for a character device
with no USB or PCI device behind it, its class and file pattern (``tty /dev/ttyS*``).

The proposed profile's discovery is the most exact one the agent has: ``usb`` by vendor and
product, ``pci`` by vendor, device and class; a ``paths`` glob only for a kind nothing else
identifies (said so in a comment). Its node selector is the opt-in inventory label
(``inventory.patchbay.dev/usb-0403-6001: present``) when every node that has the kind carries it
(nodes that carry it with no inventory listing the kind, labelled by hand or by another tool, are
selected too: the label says the device is there; the proposal names them in a comment);
otherwise, the fallback, ``kubernetes.io/hostname In [...]``: exact today, but a node that gets the
device later is not selected until the list is edited (said so in a comment).
"""

from __future__ import annotations

import argparse
import json
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from patchbay_api.constants import API_GROUP, API_VERSION, PROFILE_KIND
from patchbay_api.inventory import LABEL_VALUE, kind_label
from patchbay_kubectl.views.objects import Obj, name_of

HOSTNAME_LABEL = "kubernetes.io/hostname"
#: PCI class codes (the first 4 hex digits) as lspci names them, for a kind NVML does not name.
PCI_CLASSES = {
    "0100": "SCSI storage controller",
    "0106": "SATA controller",
    "0108": "Non-Volatile memory controller",
    "0180": "Mass storage controller",
    "0200": "Ethernet controller",
    "0207": "InfiniBand controller",
    "0280": "Network controller",
    "0300": "VGA compatible controller",
    "0302": "3D controller",
    "0380": "Display controller",
    "0403": "Audio device",
    "0600": "Host bridge",
    "0601": "ISA bridge",
    "0604": "PCI bridge",
    "0700": "Serial controller",
    "0c03": "USB controller",
    "1200": "Processing accelerators",
    "ff00": "Unassigned class",
    "ffff": "Unassigned class",
}
#: PCI vendors a kind is often of (lspci's names, shortened); others show their ID only.
PCI_VENDORS = {
    "1002": "AMD",
    "10de": "NVIDIA",
    "10ee": "Xilinx",
    "1172": "Altera",
    "14e4": "Broadcom",
    "15b3": "Mellanox",
    "1af4": "Red Hat virtio",
    "1d0f": "Amazon",
    "8086": "Intel",
}


def labels_of(obj: Obj) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", nargs="?", help="one kind as listed (0403:6001, pci:10de:2330, tty:/dev/ttyS*)")
    p.add_argument("--node", help="only this node's inventory")
    p.add_argument("--unserved", action="store_true", help="only kinds some node has that no profile serves")
    p.add_argument(
        "--propose",
        metavar="NAME",
        help="print a DevicePluginProfile NAME serving exactly KIND on exactly the nodes that have it",
    )
    p.add_argument("--mode", choices=("DevicePlugin", "DRA"), default="DevicePlugin", help="with --propose")


@dataclass
class Kind:
    """One kind of device across the nodes."""

    key: str
    bus: str  # usb, pci or char
    description: str
    #: the discovery that matches exactly this kind (None: a paths glob)
    discovery: dict[str, Any]
    files: set[str] = field(default_factory=set)
    #: node -> how many of this kind it has
    nodes: dict[str, int] = field(default_factory=dict)
    #: node -> profiles serving its devices of this kind
    served: dict[str, set[str]] = field(default_factory=dict)
    #: nodes with one not served
    unserved_nodes: set[str] = field(default_factory=set)
    label: str | None = None

    @property
    def patterns(self) -> list[str]:
        return sorted({re.sub(r"\d+$", "*", f) for f in self.files})

    @property
    def profiles(self) -> list[str]:
        return sorted(set().union(*self.served.values())) if self.served else []

    def served_text(self) -> str:
        if not self.profiles:
            return "not served"
        text = "served by " + ",".join(self.profiles)
        if self.unserved_nodes:
            text += f" (not on {len(self.unserved_nodes)} node{'s' if len(self.unserved_nodes) != 1 else ''})"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.key,
            "bus": self.bus,
            "description": self.description,
            "nodes": sorted(self.nodes),
            "count": sum(self.nodes.values()),
            "deviceFiles": self.patterns,
            "servedBy": self.profiles,
            "unservedNodes": sorted(self.unserved_nodes),
            "label": self.label,
        }


def _kind(kinds: dict[str, Kind], key: str, **kw: Any) -> Kind:
    if key not in kinds:
        kinds[key] = Kind(key, **kw)
    return kinds[key]


def _count(k: Kind, node: str, entry: Obj, files: Sequence[str] = ()) -> None:
    k.nodes[node] = k.nodes.get(node, 0) + 1
    k.files.update(files)
    by = entry.get("servedBy") or []
    if by:
        k.served.setdefault(node, set()).update(by)
    else:
        k.unserved_nodes.add(node)


def kinds_of(inventories: Sequence[Obj]) -> list[Kind]:
    """Every kind of device in the inventories, USB first, then PCI, then the other files."""
    kinds: dict[str, Kind] = {}
    for inv in inventories:
        node = str(inv.get("nodeName") or name_of(inv))
        gpu_names = {g.get("pciAddress"): g.get("name") for g in inv.get("gpus") or []}
        ports = {str(u.get("port")) for u in inv.get("usb") or []}
        addresses = {str(p.get("address")) for p in inv.get("pci") or []}
        pci_files: dict[str, list[str]] = {}
        for c in inv.get("char") or []:
            parent = c.get("parent")
            if parent in ports:
                continue  # shown with its USB device
            if parent in addresses:
                pci_files.setdefault(str(parent), []).append(str(c.get("path")))
                continue
            path, cls = str(c.get("path")), str(c.get("class"))
            pattern = re.sub(r"\d+$", "*", path)
            what = f"{cls} device files" if cls != "paths" else "files a profile serves (not in sysfs)"
            k = _kind(
                kinds, f"{cls}:{pattern}", bus="char", description=what,
                discovery={"paths": {"globs": [pattern]}},
            )  # fmt: skip
            _count(k, node, c, [path])
        for u in inv.get("usb") or []:
            vendor, product = str(u.get("vendor") or ""), str(u.get("product") or "")
            words = [w for w in (u.get("manufacturer"), u.get("productName")) if w]
            k = _kind(
                kinds, f"{vendor}:{product}", bus="usb", description=" ".join(words) or "USB device",
                discovery={"usb": {"vendor": vendor, "product": product}},
            )  # fmt: skip
            k.label = kind_label("usb", vendor, product)
            _count(k, node, u, u.get("devNodes") or [])
        for p in inv.get("pci") or []:
            vendor, device, cls = str(p.get("vendor")), str(p.get("device")), str(p.get("class") or "")
            name = gpu_names.get(p.get("address")) or " ".join(
                w for w in (PCI_VENDORS.get(vendor), PCI_CLASSES.get(cls[:4], f"class {cls}")) if w
            )
            driver = p.get("driver")
            pci: dict[str, Any] = {"vendor": vendor, "device": device}
            if cls:
                pci["class"] = "0x" + cls[:4]
            k = _kind(
                kinds, f"pci:{vendor}:{device}", bus="pci",
                description=f"{name} ({driver})" if driver else str(name), discovery={"pci": pci},
            )  # fmt: skip
            k.label = kind_label("pci", vendor, device)
            _count(k, node, p, pci_files.get(str(p.get("address")), []))
    order = {"usb": 0, "pci": 1, "char": 2}
    return sorted(kinds.values(), key=lambda k: (order[k.bus], k.key))


def select(kinds: Sequence[Kind], *, unserved: bool = False, kind: str | None = None) -> list[Kind]:
    out = [k for k in kinds if not unserved or k.unserved_nodes]
    if kind is not None:
        out = [k for k in out if k.key in (kind, f"pci:{kind}")]
    return out


def render(kinds: Sequence[Kind], omitted: int, fmt: str | None) -> str:
    if fmt in ("json", "yaml"):
        doc = {"kind": "DeviceKindList", "items": [k.as_dict() for k in kinds]}
        return (
            json.dumps(doc, indent=2) + "\n" if fmt == "json" else str(yaml.safe_dump(doc, sort_keys=False))
        )
    rows = [
        [
            k.key,
            k.description,
            f"{len(k.nodes)} node{'s' if len(k.nodes) != 1 else ''}",
            ",".join(k.patterns) or "<none>",
            k.served_text(),
        ]
        for k in kinds
    ]
    header = ["KIND", "DESCRIPTION", "NODES", "DEVICE FILES", "SERVED"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = [
        "   ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
        for cells in (header, *rows)
    ]
    if omitted:
        lines.append(
            f"and {omitted:,} more devices the inventories only count (kubectl get nodeinventories -o yaml)"
        )
    return "\n".join(lines) + "\n" if rows else ""


def omitted_count(inventories: Sequence[Obj]) -> int:
    return sum(int(o.get("count") or 0) for inv in inventories for o in inv.get("omitted") or [])


def propose(k: Kind, name: str, mode: str, nodes: Sequence[Obj]) -> str:
    """A DevicePluginProfile serving exactly kind `k` on exactly the nodes that have it."""
    has = set(k.nodes)
    labelled = {name_of(n) for n in nodes if k.label and labels_of(n).get(k.label) == LABEL_VALUE}
    comments = [f"# Proposed by `kubectl patchbay discover --propose {name}` for {k.key} ({k.description})."]
    selector: dict[str, Any]
    if k.label and has and labelled >= has:
        selector = {"matchLabels": {k.label: LABEL_VALUE}}
        if extra := sorted(labelled - has):
            shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
            comments.append(
                f"# Node selector: the inventory label; {len(extra)} node(s) carry it with no inventory "
                f"listing {k.key} (labelled by hand or by another tool), selected too: {shown}."
            )
    else:
        hostnames = sorted(
            labels_of(n).get(HOSTNAME_LABEL, name_of(n)) for n in nodes if name_of(n) in has
        ) or sorted(has)
        selector = {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": hostnames}]}
        comments.append(
            f"# Node selector: the fallback, these {len(hostnames)} nodes by name (not every one of them "
            f"carries the inventory label {k.label or '(none for this kind)'}). A node that gets the "
            "device later is not selected until this list is edited."
        )
    if "paths" in k.discovery:
        comments.append(
            "# Discovery: a glob, since nothing better (no USB or PCI device) identifies these files."
        )
    elif "usb" in k.discovery:
        comments.append(
            "# Discovery: USB vendor and product; each device is handed over as its /dev/bus/usb file"
            + (f" (its {', '.join(k.patterns)} files: a paths glob instead)" if k.patterns else "")
            + "."
        )
    if mode == "DRA":
        comments.append(
            "# DRA: the agent publishes each device with the standard attributes (pciBusID, pcieRoot) "
            "and its patchbay.dev/ attributes (usbVendor, pciVendor, ...)."
        )
    doc = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": PROFILE_KIND,
        "metadata": {"name": name},
        "spec": {
            "resourceName": f"{API_GROUP}/{name}",
            "mode": mode,
            "nodeSelector": selector,
            "plugin": {"discovery": k.discovery},
        },
    }
    wrapped = [line for c in comments for line in textwrap.wrap(c, 100, subsequent_indent="# ")]
    return "\n".join(wrapped) + "\n" + str(yaml.safe_dump(doc, sort_keys=False))
