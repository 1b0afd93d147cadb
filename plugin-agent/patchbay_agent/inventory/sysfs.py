"""Reading what hardware a node has from the host's /sys (under the host root), read-only.

PCI functions from /sys/bus/pci/devices (the ids, class, bound driver, NUMA node, IOMMU group),
USB devices from /sys/bus/usb/devices (ids, strings, port path, and the device files their
interfaces bring: every class device below them whose `uevent` names a DEVNAME), character
devices of the classes a device plugin serves (/sys/class/<class>/<name>, their /dev path from
`uevent`), and GPUs through the existing NVML discovery where its library loads. Nothing here
writes or opens a device file; a device that vanishes while it is read is skipped.

sysfs sends no inotify events for devices that come or go (docs/facts.md#inotify): the keeper
(`keeper.py`) scans again when /dev changes, and on a slow backstop.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field

from patchbay_agent.discovery.base import DiscoveryError, HostRoot

log = logging.getLogger(__name__)

SYSFS_PCI = "/sys/bus/pci/devices"
SYSFS_USB = "/sys/bus/usb/devices"
#: The character device classes read, and which of their members count (None: all).
CHAR_CLASSES = ("tty", "video4linux", "i2c-dev", "spidev", "hidraw", "drm", "accel", "vfio")
_PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_USB_PORT = re.compile(r"\d+-\d+(\.\d+)*")
#: How deep below a USB device its class devices are looked for (interface/ttyUSB0/tty/ttyUSB0
#: and interface/0003:046D:C52B.0001/hidraw/hidraw0 are 4 levels down).
_USB_WALK_DEPTH = 5


@dataclass(frozen=True)
class PciEntry:
    address: str
    vendor: str | None = None
    device: str | None = None
    device_class: str | None = None
    subsystem_vendor: str | None = None
    subsystem_device: str | None = None
    driver: str | None = None
    numa_node: int | None = None
    iommu_group: int | None = None


@dataclass(frozen=True)
class UsbEntry:
    port: str
    vendor: str | None = None
    product: str | None = None
    serial: str | None = None
    manufacturer: str | None = None
    product_name: str | None = None
    #: the USB device file itself (/dev/bus/usb/BBB/DDD), when busnum/devnum read
    bus_node: str | None = None
    #: the class devices its interfaces bring (/dev/ttyUSB0, /dev/video0, /dev/hidraw0)
    dev_nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class CharEntry:
    path: str
    device_class: str
    driver: str | None = None
    #: the PCI address or USB port of the device behind it
    parent: str | None = None


@dataclass(frozen=True)
class GpuEntry:
    uuid: str
    name: str | None = None
    pci_address: str | None = None
    numa_node: int | None = None
    memory: int | None = None


@dataclass(frozen=True)
class Hardware:
    """Everything read in one scan, each kind sorted by its key."""

    pci: tuple[PciEntry, ...] = ()
    usb: tuple[UsbEntry, ...] = ()
    char: tuple[CharEntry, ...] = ()
    gpus: tuple[GpuEntry, ...] = field(default=())


def _hex(value: str | None) -> str | None:
    if not value:
        return None
    return value.lower().removeprefix("0x")


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _link_name(root: HostRoot, host_path: str) -> str | None:
    try:
        return os.path.basename(os.readlink(root.path(host_path)))
    except OSError:
        return None


def _devname(root: HostRoot, host_dir: str) -> str | None:
    """The /dev path a class device's `uevent` names (DEVNAME=ttyUSB0, DEVNAME=bus/usb/001/002)."""
    text = root.read(f"{host_dir}/uevent")
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith("DEVNAME="):
            return "/dev/" + line.removeprefix("DEVNAME=").strip()
    return None


def scan_pci(root: HostRoot) -> list[PciEntry]:
    out = []
    for base in root.glob(f"{SYSFS_PCI}/*"):
        address = os.path.basename(base)
        vendor = _hex(root.read(f"{base}/vendor"))
        if vendor is None:
            continue  # gone while read
        numa = _int(root.read(f"{base}/numa_node"))
        out.append(
            PciEntry(
                address=address,
                vendor=vendor,
                device=_hex(root.read(f"{base}/device")),
                device_class=_hex(root.read(f"{base}/class")),
                subsystem_vendor=_hex(root.read(f"{base}/subsystem_vendor")),
                subsystem_device=_hex(root.read(f"{base}/subsystem_device")),
                driver=_link_name(root, f"{base}/driver"),
                numa_node=numa if numa is not None and numa >= 0 else None,
                iommu_group=_int(_link_name(root, f"{base}/iommu_group")),
            )
        )
    return sorted(out, key=lambda e: e.address)


def _usb_nodes(root: HostRoot, base: str) -> tuple[str, ...]:
    """The class devices below a USB device's interfaces, as /dev paths: walked in its real
    directory, never into a child USB device (a hub's) nor along symlinks."""
    real = root.host_target(base)
    top = root.path(real)
    nodes: set[str] = set()
    start_depth = str(top).count(os.sep)
    for dirpath, dirnames, _files in os.walk(top, followlinks=False):
        depth = dirpath.count(os.sep) - start_depth
        # A child USB device (1-1.2 under hub 1-1) is an entry of its own.
        dirnames[:] = [d for d in dirnames if not _USB_PORT.fullmatch(d)] if depth < _USB_WALK_DEPTH else []
        if dirpath == str(top):
            continue
        host_dir = real + dirpath[len(str(top)) :]
        devname = _devname(root, host_dir)
        if devname is not None and not devname.startswith("/dev/bus/usb/"):
            nodes.add(devname)
    return tuple(sorted(nodes))


def scan_usb(root: HostRoot) -> list[UsbEntry]:
    out = []
    for base in root.glob(f"{SYSFS_USB}/*"):
        port = os.path.basename(base)
        if ":" in port or not _USB_PORT.fullmatch(port):
            continue  # an interface (1-1:1.0) or a root hub (usb1)
        vendor = _hex(root.read(f"{base}/idVendor"))
        if vendor is None:
            continue
        bus, dev = _int(root.read(f"{base}/busnum")), _int(root.read(f"{base}/devnum"))
        out.append(
            UsbEntry(
                port=port,
                vendor=vendor,
                product=_hex(root.read(f"{base}/idProduct")),
                serial=root.read(f"{base}/serial") or None,
                manufacturer=root.read(f"{base}/manufacturer") or None,
                product_name=root.read(f"{base}/product") or None,
                bus_node=f"/dev/bus/usb/{bus:03d}/{dev:03d}" if bus is not None and dev is not None else None,
                dev_nodes=_usb_nodes(root, base),
            )
        )
    return sorted(out, key=lambda e: [int(p) for p in re.split(r"[-.]", e.port)])


def _parent(root: HostRoot, host_dir: str) -> tuple[str | None, str | None]:
    """The driver and the PCI address or USB port of the device a class device belongs to."""
    # Links are relative to the class device's real directory, not to /sys/class/<class>/.
    device = f"{root.host_target(host_dir)}/device"
    if not root.path(device).exists():
        return None, None
    driver = _link_name(root, f"{device}/driver")
    for part in reversed(root.host_target(device).split("/")):
        # ttyUSB0's device is .../0000:00:14.0/usb1/1-1/1-1:1.0/ttyUSB0: the port, 1-1.
        if _PCI_ADDRESS.fullmatch(part) or _USB_PORT.fullmatch(part):
            return driver, part
    return driver, None


def _wanted(root: HostRoot, device_class: str, name: str, host_dir: str) -> bool:
    if device_class == "drm":
        return name.startswith("renderD")  # render nodes: what a compute container gets
    if device_class == "tty":
        # Hardware ttys only (not the 64 virtual consoles, ptmx, console), and of the 8250 ports a
        # kernel always makes, only the ones with a UART behind them (type 0: none).
        if not root.path(f"{host_dir}/device").exists():
            return False
        return not (name.startswith("ttyS") and root.read(f"{host_dir}/type") == "0")
    return True


def scan_char(root: HostRoot, classes: tuple[str, ...] = CHAR_CLASSES) -> list[CharEntry]:
    out = []
    for device_class in classes:
        for host_dir in root.glob(f"/sys/class/{device_class}/*"):
            name = os.path.basename(host_dir)
            if not _wanted(root, device_class, name, host_dir):
                continue
            path = _devname(root, host_dir) or f"/dev/{name}"
            driver, parent = _parent(root, host_dir)
            out.append(CharEntry(path=path, device_class=device_class, driver=driver, parent=parent))
    return sorted(out, key=lambda e: (e.device_class, e.path))


def scan_gpus(root: HostRoot) -> list[GpuEntry]:
    """GPUs through the NVML discovery backend; none where its library or the driver is missing."""
    try:
        from patchbay_agent.discovery.nvml import NvmlBackend

        backend = NvmlBackend(root)
    except DiscoveryError as e:
        log.debug("No GPUs through NVML: %s", e)
        return []
    out = []
    for d in backend.scan():
        attrs = dict(d.attributes)
        cap = dict(d.capacity)
        out.append(
            GpuEntry(
                uuid=attrs.get("uuid", d.id),
                name=attrs.get("productName"),
                pci_address=attrs.get("pciAddress"),
                numa_node=d.numa_nodes[0] if d.numa_nodes else None,
                memory=cap.get("memory"),
            )
        )
    return out


def scan(root: HostRoot, *, gpus: bool = True) -> Hardware:
    """One scan of everything (synchronous: run it off the event loop)."""
    return Hardware(
        pci=tuple(scan_pci(root)),
        usb=tuple(scan_usb(root)),
        char=tuple(scan_char(root)),
        gpus=tuple(scan_gpus(root)) if gpus else (),
    )
