"""What a profile's discovery would match on a node, read off the node's NodeInventory before the
change is applied (``diff``) or to say why a node serves nothing (``why``). Pure: objects in.

The rules are the agent's own (``patchbay_api.discovery``): a ``paths`` glob against every device
file the inventory lists (character devices of the classes it reads, the files USB devices bring,
the files profiles serve), ``pci`` and ``usb`` filters against its PCI functions and USB devices,
``nvml`` against its GPUs; each match with the device ID the agent would give it. The inventory is
bounded (128 entries of a kind, the rest counted in ``omitted``): where entries of a kind the
discovery reads were left out, the answer says "summarised: not all device nodes listed". A file
the inventory does not list (of no class it reads, made by mknod and served by no profile) can
still match a glob on the node: a glob that matches nothing here says so.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from patchbay_api.discovery import device_id, glob_matches, has_magic, path_id, pci_matches, usb_matches
from patchbay_kubectl.views.objects import Obj, name_of

SUMMARISED = "summarised: not all device nodes listed"
#: The kinds of inventory entry each discovery backend reads.
KINDS = {"paths": ("char", "usb"), "pci": ("pci",), "usb": ("usb",), "nvml": ("gpus",)}
UNLISTED = (
    "the inventory lists tty, video4linux, i2c-dev, spidev, hidraw, drm, accel and vfio files and those "
    "profiles serve: another file is known once the node runs it"
)
NO_GPUS = "the inventory lists GPUs only where the node has the NVIDIA library"
SHOWN = 8
"""Device files named in a line; the rest counted."""


@dataclass(frozen=True)
class Entry:
    """One device the discovery would serve: the agent's ID, its files, and how to name it."""

    id: str
    files: tuple[str, ...] = ()
    text: str = ""

    @property
    def name(self) -> str:
        return self.files[0] if len(self.files) == 1 else self.id


@dataclass
class Match:
    """What ``discovery`` matches in one node's inventory."""

    node: str
    written_at: str
    backend: str
    matched: list[Entry] = field(default_factory=list)
    #: every entry of the kinds the backend reads, by the ID the backend would give it
    listed: dict[str, Entry] = field(default_factory=dict)
    summarised: bool = False
    #: globs (or the filter, as one string) that match nothing the inventory lists
    unmatched: list[str] = field(default_factory=list)
    #: what comes closest to what matched nothing (``closest``)
    closest: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ids(self) -> set[str]:
        return {e.id for e in self.matched}

    def name_of(self, dev: str) -> str:
        """A device ID as the inventory names it (its file), else the ID."""
        entry = self.listed.get(dev)
        return entry.name if entry is not None else dev

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "writtenAt": self.written_at,
            "matches": [e.name for e in self.matched],
            "matchesNothing": not self.matched,
            "summarised": self.summarised,
        }
        if self.unmatched:
            d["unmatched"] = self.unmatched
        if self.closest:
            d["closest"] = self.closest
        if self.notes:
            d["notes"] = self.notes
        return d


def written_at(inventory: Obj) -> str:
    """When the agent last wrote the inventory (it writes only on a change)."""
    meta = inventory.get("metadata") or {}
    return str(inventory.get("observedAt") or meta.get("creationTimestamp") or "?")


def backend_of(discovery: Mapping[str, Any]) -> str:
    return next((k for k in ("paths", "pci", "usb", "nvml", "virtual") if discovery.get(k) is not None), "")


def _ids(entry: Obj) -> str:
    return ":".join(str(entry.get(k)) for k in ("vendor", "product") if entry.get(k))


def _usb_text(u: Obj) -> str:
    words = " ".join(str(w) for w in (u.get("manufacturer"), u.get("productName")) if w)
    return " ".join(w for w in (f"{u.get('vendor', '?')}:{u.get('product', '?')}", words) if w)


def _pci_text(p: Obj) -> str:
    what = f"{p.get('vendor', '?')}:{p.get('device', '?')} class {p.get('class', '?')}"
    return f"{what}, {p['driver']}" if p.get("driver") else what


def device_files(inventory: Obj) -> dict[str, str]:
    """Every device file the inventory lists, with what it is: ``/dev/ttyUSB0`` ->
    ``0403:6001 FTDI FT232R USB UART``, ``/dev/ttyS0`` -> ``tty, serial8250``, a file made by
    mknod -> ``served by serial``."""
    usb = {str(u.get("port")): u for u in inventory.get("usb") or []}
    pci = {str(p.get("address")): p for p in inventory.get("pci") or []}
    files: dict[str, str] = {}
    for u in usb.values():
        for f in u.get("devNodes") or []:
            files[str(f)] = _usb_text(u)
    for c in inventory.get("char") or []:
        path, parent = str(c.get("path")), c.get("parent")
        if parent in usb:
            text = _usb_text(usb[parent])
        elif parent in pci:
            text = f"{c.get('class')}, PCI {_pci_text(pci[parent])}"
        elif c.get("class") == "paths":  # a file no sysfs class lists, that profiles serve
            text = "served by " + ",".join(str(p) for p in c.get("servedBy") or ["a profile"])
        else:
            text = ", ".join(str(w) for w in (c.get("class"), c.get("driver")) if w)
        files.setdefault(path, text)
    return files


def _omitted(inventory: Obj, kinds: Iterable[str]) -> bool:
    return any(
        o.get("kind") in kinds and int(o.get("count") or 0) > 0 for o in inventory.get("omitted") or []
    )


def _paths(m: Match, spec: Mapping[str, Any], inventory: Obj) -> None:
    files = device_files(inventory)
    for f, text in files.items():
        m.listed.setdefault(path_id(f), Entry(path_id(f), (f,), text))
    found: dict[str, Entry] = {}
    for pattern in [str(g) for g in spec.get("globs") or []]:
        hits = [f for f in sorted(files) if glob_matches(pattern, f)]
        if not hits:
            m.unmatched.append(pattern)
            m.closest += [c for c in closest_files(pattern, files) if c not in m.closest]
        for f in hits:
            found.setdefault(path_id(f), m.listed[path_id(f)])  # two globs, one file: one device
    for g in spec.get("groups") or []:
        paths = tuple(str(p) for p in g.get("paths") or [])
        found[str(g.get("id"))] = Entry(str(g.get("id")), paths, "a group: always listed")
        missing = [p for p in paths if p not in files]
        if missing:
            m.notes.append(f"group {g.get('id')}: {', '.join(missing)} not in the inventory")
    m.matched = [found[k] for k in sorted(found)]
    if m.unmatched:
        m.notes.append(UNLISTED)


def _pci(m: Match, spec: Mapping[str, Any], inventory: Obj) -> None:
    vendor = str(spec.get("vendor") or "").lower()
    device = str(spec["device"]).lower() if spec.get("device") is not None else None
    cls = str(spec["class"]).lower() if spec.get("class") is not None else None
    vfio = bool(spec.get("vfio"))
    for p in inventory.get("pci") or []:
        address = str(p.get("address"))
        group = p.get("iommuGroup")
        files = (f"/dev/vfio/{group}",) if vfio and group is not None else ()
        entry = Entry(device_id(address), files, _pci_text(p))
        m.listed[entry.id] = entry
        if not pci_matches(vendor, device, cls, {"vendor": p.get("vendor"), "device": p.get("device"),
                                                 "class": p.get("class")}.get):  # fmt: skip
            continue
        if vfio and group is None:
            m.notes.append(f"{address} matches but has no IOMMU group: vfio cannot pass it through")
            continue
        m.matched.append(entry)
    if not m.matched:
        wanted = ":".join(x for x in (vendor, device) if x) + (f" class {cls}" if cls else "")
        m.unmatched.append(f"pci {wanted}")
        same = [e for e in m.listed.values() if e.text.startswith(f"{vendor}:")]
        m.closest = [f"{e.id} ({e.text})" for e in same[:3]]


def _usb(m: Match, spec: Mapping[str, Any], inventory: Obj) -> None:
    vendor = str(spec.get("vendor") or "").lower()
    product = str(spec["product"]).lower() if spec.get("product") is not None else None
    serial = str(spec["serial"]) if spec.get("serial") is not None else None
    for u in inventory.get("usb") or []:
        files = tuple(str(f) for f in u.get("devNodes") or [])
        entry = Entry(
            device_id(f"usb-{u.get('port')}"), (), _usb_text(u) + (f", {', '.join(files)}" if files else "")
        )
        m.listed[entry.id] = entry
        read = {"idVendor": u.get("vendor"), "idProduct": u.get("product"), "serial": u.get("serial")}.get
        if usb_matches(vendor, product, serial, read):
            m.matched.append(entry)
    if not m.matched:
        wanted = ":".join(x for x in (vendor, product) if x) + (f" serial {serial}" if serial else "")
        m.unmatched.append(f"usb {wanted}")
        same = [e for e in m.listed.values() if e.text.startswith(f"{vendor}:")]
        m.closest = [f"{e.id} ({e.text})" for e in (same or list(m.listed.values()))[:3]]


def _nvml(m: Match, inventory: Obj) -> None:
    for g in inventory.get("gpus") or []:
        entry = Entry(
            device_id(str(g.get("uuid"))), (), f"{g.get('name', 'GPU')}, {g.get('pciAddress', '?')}"
        )
        m.listed[entry.id] = entry
        m.matched.append(entry)
    if not m.matched:
        m.unmatched.append("nvml")
        m.notes.append(NO_GPUS)


def match(discovery: Mapping[str, Any], inventory: Obj) -> Match | None:
    """What ``discovery`` (a profile's ``plugin.discovery``, as written) matches in ``inventory``;
    None for ``virtual`` tokens (no device to find) or no discovery."""
    kind = backend_of(discovery)
    if kind not in KINDS:
        return None
    node = str(inventory.get("nodeName") or name_of(inventory))
    m = Match(node, written_at(inventory), kind, summarised=_omitted(inventory, KINDS[kind]))
    spec = discovery.get(kind) or {}
    if kind == "paths":
        _paths(m, spec, inventory)
    elif kind == "pci":
        _pci(m, spec, inventory)
    elif kind == "usb":
        _usb(m, spec, inventory)
    else:
        _nvml(m, inventory)
    return m


def _fixed_prefix(part: str) -> str:
    """The literal start of a pattern component, trailing digits dropped: ``ttyACM*`` -> ``ttyACM``."""
    cut = re.search(r"[*?[]", part)
    return re.sub(r"\d+$", "", part[: cut.start()] if cut else part)


def _common_start(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _rank(text: str) -> int:
    """A USB device's file (its text starts with vendor:product) before a PCI function's, before
    the others."""
    return 0 if re.match(r"[0-9a-f]{4}:", text) else 1 if ", PCI " in text else 2


def closest_files(pattern: str, files: Mapping[str, str], limit: int = 3) -> list[str]:
    """The listed files nearest to a glob that matches none, each with what it is: those in the
    glob's folder whose name starts as the glob's, the longest start in common first
    (``/dev/ttyACM*`` -> ``/dev/ttyUSB0``: ``tty``), those a USB, then a PCI device brings before
    the others; else any file of that folder; where the folder has none, files elsewhere whose
    name starts as the glob's does (3 characters at least)."""
    folder, _, name = pattern.rpartition("/")
    if has_magic(folder):
        return []
    start = _fixed_prefix(name)
    here, elsewhere = [], []
    for f, text in files.items():
        common = _common_start(os.path.basename(f), start)
        key = (-common, _rank(text), f)
        if os.path.dirname(f) == (folder or "/"):
            here.append(key)
        elif common >= 3:
            elsewhere.append(key)
    named = [k for k in here if k[0] < 0]  # named like it: those only
    return [f"{f} ({files[f]})" if files[f] else f for _, _, f in sorted(named or here or elsewhere)[:limit]]


def names(items: Iterable[str], shown: int = SHOWN) -> str:
    """A list cut to ``shown`` names, the rest counted."""
    items = list(items)
    text = ", ".join(items[:shown])
    return text + (f" and {len(items) - shown} more" if len(items) > shown else "")


def nothing_text(m: Match) -> str:
    """Why nothing matches, with what comes closest: ``the glob /dev/ttyACM* matches nothing;
    the node has /dev/ttyUSB0 (0403:6001 FTDI FT232R USB UART)``."""
    parts = []
    for u in m.unmatched:
        what = f"the glob {u}" if m.backend == "paths" else f"the filter {u}"
        parts.append(f"{what} matches nothing")
    text = "; ".join(parts) or "nothing matches"
    if m.closest:
        text += f"; the node has {names(m.closest, 3)}"
    elif m.listed and m.backend == "paths":
        text += "; nothing in its folder, nor a file named like it"
    return text


def inventory_index(inventories: Iterable[Obj]) -> dict[str, Obj]:
    return {str(i.get("nodeName") or name_of(i)): i for i in inventories}
