"""`usb` discovery: USB devices from /sys/bus/usb/devices by idVendor[/idProduct[/serial]].

The device file is `/dev/bus/usb/BBB/DDD` from sysfs `busnum`/`devnum`. The ID is `usb-<port
path>` (e.g. `usb-1-1.2`): it stays the same when the device is unplugged and plugged back into the
same port, while devnum changes on every plug. Interfaces (names with ':') are not devices.
"""

from __future__ import annotations

import os
from pathlib import Path

from patchbay_agent.config import UsbDiscovery
from patchbay_agent.discovery.base import HostRoot, PhysicalDevice
from patchbay_api.discovery import usb_id, usb_matches

SYSFS_USB = "/sys/bus/usb/devices"


class UsbBackend:
    name = "usb"

    def __init__(self, spec: UsbDiscovery, host_root: HostRoot) -> None:
        self._spec = spec
        self._root = host_root

    def scan(self) -> list[PhysicalDevice]:
        devices = []
        for base in self._root.glob(f"{SYSFS_USB}/*"):
            name = os.path.basename(base)
            if ":" in name:
                continue
            spec = self._spec
            if not usb_matches(spec.vendor, spec.product, spec.serial, self._root.reader(base)):
                continue
            try:
                bus = int(self._root.read(f"{base}/busnum") or "")
                dev = int(self._root.read(f"{base}/devnum") or "")
            except ValueError:
                continue  # half-enumerated: the next scan will see it whole
            node = f"/dev/bus/usb/{bus:03d}/{dev:03d}"
            attributes = [("usbVendor", spec.vendor)]
            if root := self._root.pcie_root(base):
                attributes.append(("pcieRoot", root))  # the USB controller's
            for attr, key in (("idProduct", "usbProduct"), ("serial", "usbSerial")):
                value = self._root.read(f"{base}/{attr}")
                if value:
                    attributes.append((key, value))
            devices.append(PhysicalDevice(usb_id(name), (node,), (base, node), attributes=tuple(attributes)))
        return sorted(devices, key=lambda d: d.id)

    def watch_dirs(self) -> list[Path]:
        root = self._root.path("/dev/bus/usb")
        try:
            buses = sorted(p for p in root.iterdir() if p.is_dir())
        except OSError:
            buses = []
        return [root, *buses]
