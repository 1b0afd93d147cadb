"""The NodeInventory object: a scan (`sysfs.Hardware`) and what the node's profiles serve, as the
CRD's shape (crds/patchbay.dev_nodeinventories.yaml). Pure: no I/O.

Bounded, never refused: at most `MAX_ENTRIES` entries of each kind (served ones first, then in
their order), the rest counted in `omitted` by kind and group (the class of a character device,
the vendor of a PCI or USB device), at most `MAX_OMITTED` groups (the smallest beyond that folded
into `other`); strings cut to the CRD's lengths. So the largest inventory the CRD admits stays
far below the 1.5 MiB etcd takes in one request (`tests/unit/agent/test_agent_node_inventory.py`
builds it).

`served` maps each profile served on this node to its devices (`PhysicalDevice`s, as discovery
found them): a PCI function is served when a device's check path is its sysfs directory or a
device names its address (`pciAddress`: the PCI and NVML backends); a USB device when a device's
check path is its sysfs directory or a device file of it (its /dev/bus/usb file, its ttyUSB0) is a
device's file; a character device when its file is; a GPU when its UUID is a device's ID or its
address a device's `pciAddress`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from patchbay_agent.constants import (
    FIELD_MANAGER,
    INVENTORY_KIND,
    LABEL_MANAGED_BY,
    REPORT_GROUP,
    REPORT_VERSION,
)
from patchbay_agent.discovery.base import PhysicalDevice
from patchbay_agent.inventory.sysfs import SYSFS_PCI, SYSFS_USB, Hardware
from patchbay_agent.kubeobjects import owner_reference

#: The CRD's bounds.
MAX_ENTRIES = 128
MAX_OMITTED = 64
MAX_SERVED_BY = 4
MAX_DEV_NODES = 16
KINDS = ("pci", "usb", "char", "gpus")
#: Device files that belong to a USB device, a PCI function or a GPU entry (not listed again).
_OWNED = ("/dev/bus/usb/", "/dev/vfio/", "/dev/nvidia")


class Served:
    """Which profiles serve which paths, addresses and IDs (see the module doc)."""

    def __init__(self, served: Mapping[str, Sequence[PhysicalDevice]]) -> None:
        self._paths: dict[str, set[str]] = {}
        self._addresses: dict[str, set[str]] = {}
        self._ids: dict[str, set[str]] = {}
        for profile, devices in served.items():
            for d in devices:
                for p in (*d.dev_paths, *d.check_paths):
                    self._paths.setdefault(p, set()).add(profile)
                self._ids.setdefault(d.id, set()).add(profile)
                address = dict(d.attributes).get("pciAddress")
                if address:
                    self._addresses.setdefault(address, set()).add(profile)

    def files(self) -> dict[str, list[str]]:
        """Every device file a profile serves here (its devices' files under /dev), with the
        profiles: the ones no sysfs entry lists (a `paths` glob's files, mknod-made ones) are
        listed as character devices of class `paths`."""
        return {
            p: sorted(v) for p, v in self._paths.items() if p.startswith("/dev/") and not p.startswith(_OWNED)
        }

    def by(
        self, *, paths: Sequence[str | None] = (), address: str | None = None, ident: str | None = None
    ) -> list[str]:
        found: set[str] = set()
        for p in paths:
            if p is not None:
                found |= self._paths.get(p, set())
        if address is not None:
            found |= self._addresses.get(address, set())
        if ident is not None:
            found |= self._ids.get(ident, set())
        return sorted(found)[:MAX_SERVED_BY]


def _cut(value: str | None, limit: int) -> str | None:
    return None if value is None else value[:limit]


def _clean(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if v is not None and v != []}


def entries(
    hw: Hardware, served: Served, exists: Callable[[str], bool] = lambda _path: True
) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Every entry of each kind with its group (for `omitted`), unbounded, in the CRD's shape."""
    pci = [
        (
            p.vendor or "unknown",
            _clean(
                {
                    "address": _cut(p.address, 16),
                    "vendor": _cut(p.vendor, 8),
                    "device": _cut(p.device, 8),
                    "class": _cut(p.device_class, 8),
                    "subsystemVendor": _cut(p.subsystem_vendor, 8),
                    "subsystemDevice": _cut(p.subsystem_device, 8),
                    "driver": _cut(p.driver, 64),
                    "numaNode": p.numa_node,
                    "iommuGroup": p.iommu_group,
                    "servedBy": served.by(paths=[f"{SYSFS_PCI}/{p.address}"], address=p.address),
                }
            ),
        )
        for p in hw.pci
    ]
    usb = [
        (
            u.vendor or "unknown",
            _clean(
                {
                    "port": _cut(u.port, 32),
                    "vendor": _cut(u.vendor, 8),
                    "product": _cut(u.product, 8),
                    "serial": _cut(u.serial, 128),
                    "manufacturer": _cut(u.manufacturer, 128),
                    "productName": _cut(u.product_name, 128),
                    "devNodes": [n[:128] for n in u.dev_nodes[:MAX_DEV_NODES]],
                    "servedBy": served.by(paths=[f"{SYSFS_USB}/{u.port}", u.bus_node, *u.dev_nodes]),
                }
            ),
        )
        for u in hw.usb
    ]
    char = [
        (
            c.device_class,
            _clean(
                {
                    "path": _cut(c.path, 128),
                    "class": _cut(c.device_class, 32),
                    "driver": _cut(c.driver, 64),
                    "parent": _cut(c.parent, 64),
                    "servedBy": served.by(paths=[c.path]),
                }
            ),
        )
        for c in hw.char
    ]
    listed = {c.path for c in hw.char} | {n for u in hw.usb for n in u.dev_nodes}
    char += [
        ("paths", {"path": path[:128], "class": "paths", "servedBy": profiles[:MAX_SERVED_BY]})
        for path, profiles in sorted(served.files().items())
        if path not in listed and exists(path)
    ]
    gpus = [
        (
            "nvidia",
            _clean(
                {
                    "uuid": _cut(g.uuid, 64),
                    "name": _cut(g.name, 128),
                    "pciAddress": _cut(g.pci_address, 16),
                    "numaNode": g.numa_node,
                    "memory": g.memory,
                    "servedBy": served.by(address=g.pci_address, ident=g.uuid),
                }
            ),
        )
        for g in hw.gpus
    ]
    return {"pci": pci, "usb": usb, "char": char, "gpus": gpus}


def bounded(
    all_entries: Mapping[str, list[tuple[str, dict[str, Any]]]], max_entries: int = MAX_ENTRIES
) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """At most `max_entries` of each kind (served ones first, the order kept otherwise), and the
    rest as counts by kind and group, at most `MAX_OMITTED` of them."""
    kept: dict[str, list[dict[str, Any]]] = {}
    left: Counter[tuple[str, str]] = Counter()
    for kind in KINDS:
        items = all_entries.get(kind, [])
        order = sorted(range(len(items)), key=lambda i: (not items[i][1].get("servedBy"), i))
        keep = sorted(order[:max_entries])
        kept[kind] = [items[i][1] for i in keep]
        for i in order[max_entries:]:
            left[(kind, items[i][0][:32])] += 1
    groups = sorted(left.items(), key=lambda kv: (-kv[1], kv[0]))
    if len(groups) > MAX_OMITTED:
        head, tail = groups[: MAX_OMITTED - len(KINDS)], groups[MAX_OMITTED - len(KINDS) :]
        rest: Counter[tuple[str, str]] = Counter()
        for (kind, _group), n in tail:
            rest[(kind, "other")] += n
        groups = head + sorted(rest.items())
    omitted = [{"kind": k, "group": g, "count": n} for (k, g), n in sorted(groups)]
    return kept, omitted


def build_inventory(
    node_name: str,
    agent: str | None,
    hw: Hardware,
    served: Mapping[str, Sequence[PhysicalDevice]],
    node_uid: str | None = None,
    *,
    max_entries: int = MAX_ENTRIES,
    exists: Callable[[str], bool] = lambda _path: True,
) -> dict[str, Any]:
    """The NodeInventory to write (without observedAt: two are compared without it). `exists`:
    whether a device file is on the host now (a profile keeps a vanished device, Unhealthy, in its
    devices for a while: its file is not listed once it is gone)."""
    all_entries = entries(hw, Served(served), exists)
    kept, omitted = bounded(all_entries, max_entries)
    metadata: dict[str, Any] = {"name": node_name, "labels": {LABEL_MANAGED_BY: FIELD_MANAGER}}
    if node_uid:
        metadata["ownerReferences"] = [owner_reference(node_name, node_uid)]
    doc: dict[str, Any] = {
        "apiVersion": f"{REPORT_GROUP}/{REPORT_VERSION}",
        "kind": INVENTORY_KIND,
        "metadata": metadata,
        "nodeName": node_name,
        "summary": {kind: len(all_entries[kind]) for kind in KINDS},
    }
    if agent:
        doc["agent"] = agent
    for kind in KINDS:
        if kept[kind]:
            doc[kind] = kept[kind]
    if omitted:
        doc["omitted"] = omitted
    return doc
