"""`pci` discovery: PCI functions from /sys/bus/pci/devices, filtered by vendor/device/class.

The ID is the PCI address (`0000:3b:00.0`): stable across reboots and what people look up in
lspci. NUMA affinity comes from `numa_node` (-1 means none). With `vfio: true` the device file is
the function's IOMMU group, `/dev/vfio/<group>`, plus the shared container file `/dev/vfio/vfio`;
a function with no IOMMU group cannot be passed through and is skipped.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from patchbay_agent.config import PciDiscovery
from patchbay_agent.discovery.base import HostRoot, PhysicalDevice, make_device_id
from patchbay_api.discovery import hex_value, pci_matches

log = logging.getLogger(__name__)

SYSFS_PCI = "/sys/bus/pci/devices"


class PciBackend:
    name = "pci"

    def __init__(self, spec: PciDiscovery, host_root: HostRoot) -> None:
        self._spec = spec
        self._root = host_root
        self._warned: set[str] = set()

    def _matches(self, base: str) -> bool:
        spec = self._spec
        return pci_matches(spec.vendor, spec.device, spec.device_class, self._root.reader(base))

    def _numa(self, base: str) -> tuple[int, ...]:
        raw = self._root.read(f"{base}/numa_node")
        try:
            node = int(raw) if raw is not None else -1
        except ValueError:
            return ()
        return (node,) if node >= 0 else ()

    def _attributes(self, base: str) -> tuple[tuple[str, str], ...]:
        """Vendor, device and class as lspci shows them, and the address (DRA attributes)."""
        out = [("pciAddress", os.path.basename(base))]
        if root := self._root.pcie_root(base):
            out.append(("pcieRoot", root))
        for name, attr in (("pciVendor", "vendor"), ("pciDevice", "device"), ("pciClass", "class")):
            value = hex_value(self._root.read(f"{base}/{attr}"))
            if value:
                out.append((name, value))
        return tuple(out)

    def scan(self) -> list[PhysicalDevice]:
        devices = []
        for base in self._root.glob(f"{SYSFS_PCI}/*"):
            if not self._matches(base):
                continue
            address = os.path.basename(base)
            dev_paths: tuple[str, ...] = ()
            check_paths: tuple[str, ...] = (base,)
            if self._spec.vfio:
                try:
                    group = os.path.basename(os.readlink(self._root.path(f"{base}/iommu_group")))
                except OSError:
                    if address not in self._warned:
                        self._warned.add(address)
                        log.warning(
                            "Skipping PCI device %s: vfio requested but it has no IOMMU group", address
                        )
                    continue
                dev_paths = ("/dev/vfio/vfio", f"/dev/vfio/{group}")
                check_paths = (base, f"/dev/vfio/{group}")
            devices.append(
                PhysicalDevice(
                    make_device_id(address), dev_paths, check_paths, self._numa(base), self._attributes(base)
                )
            )
        return sorted(devices, key=lambda d: d.id)

    def watch_dirs(self) -> list[Path]:
        # sysfs sends no inotify events; /dev/vfio does when a function is (un)bound to vfio-pci.
        return [self._root.path("/dev/vfio")] if self._spec.vfio else []
