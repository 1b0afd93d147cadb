"""FAKE HARDWARE: /dev and /sys trees under a temporary directory, shaped like the kernel's.

This is the only fake the agent's tests use: discovery and health read under a host root, so a
directory with the right files stands in for devices. Device "nodes" are regular files (creating
real character devices needs CAP_MKNOD); the agent treats both alike except for the open check.
Everything else the tests touch (sockets, gRPC, processes, the kubelet code) is real.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


class FakeHardware:
    """A fake host root: `root/dev/...` and `root/sys/...`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "dev").mkdir(parents=True, exist_ok=True)
        (root / "sys").mkdir(parents=True, exist_ok=True)

    def path(self, host_path: str) -> Path:
        return self.root / host_path.lstrip("/")

    # -- /dev ------------------------------------------------------------------------------
    def add_dev(self, host_path: str) -> Path:
        """A fake device node (a regular file) at a host path like /dev/ttyUSB0."""
        p = self.path(host_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"")
        return p

    def add_serials(self, count: int) -> list[Path]:
        """``count`` USB serial adapters' device nodes: /dev/ttyUSB0, /dev/ttyUSB1, ..."""
        return [self.add_dev(f"/dev/ttyUSB{i}") for i in range(count)]

    def remove_dev(self, host_path: str) -> None:
        self.path(host_path).unlink()

    def add_symlink(self, host_path: str, target: str) -> None:
        p = self.path(host_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, p)

    # -- /sys/bus/pci ------------------------------------------------------------------------
    def add_pci(
        self,
        address: str,
        *,
        vendor: str,
        device: str,
        device_class: str = "0x030200",
        numa_node: int = -1,
        iommu_group: int | None = None,
        vfio_node: bool = True,
        pcie_root: str = "pci0000:00",
        bridge: str | None = None,
    ) -> None:
        """A fake PCI function under `pcie_root` (behind a `bridge` function when given, as a
        GPU behind a PCIe switch is); with an IOMMU group, also its /dev/vfio/<group> file."""
        under = f"{pcie_root}/{bridge}" if bridge else pcie_root
        base = self.path(f"/sys/devices/{under}/{address}")
        base.mkdir(parents=True, exist_ok=True)
        _attributes(
            base,
            {"vendor": f"0x{vendor}", "device": f"0x{device}", "class": device_class, "numa_node": numa_node},
        )
        if iommu_group is not None:
            group = self.path(f"/sys/kernel/iommu_groups/{iommu_group}")
            group.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(group, base), base / "iommu_group")
            if vfio_node:
                self.add_dev(f"/dev/vfio/{iommu_group}")
                self.add_dev("/dev/vfio/vfio")
        link_dir = self.path("/sys/bus/pci/devices")
        link_dir.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(base, link_dir), link_dir / address)

    # -- /sys/bus/usb ------------------------------------------------------------------------
    def add_usb(
        self,
        name: str,
        *,
        vendor: str,
        product: str,
        bus: int,
        devnum: int,
        serial: str | None = None,
        with_interface: bool = True,
        pcie_root: str = "pci0000:00",
    ) -> str:
        """A fake USB device behind a PCI USB controller under `pcie_root` (and one interface,
        which discovery must ignore); returns /dev path."""
        controller = f"{pcie_root[3:]}:14.0"
        base = self.path(f"/sys/devices/{pcie_root}/{controller}/usb{bus}/{name}")
        base.mkdir(parents=True, exist_ok=True)
        _attributes(base, {"idVendor": vendor, "idProduct": product, "busnum": bus, "devnum": devnum})
        if serial is not None:
            _attributes(base, {"serial": serial})
        link_dir = self.path("/sys/bus/usb/devices")
        link_dir.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(base, link_dir), link_dir / name)
        if with_interface:
            iface = base / f"{name}:1.0"
            iface.mkdir()
            os.symlink(os.path.relpath(iface, link_dir), link_dir / f"{name}:1.0")
        node = f"/dev/bus/usb/{bus:03d}/{devnum:03d}"
        self.add_dev(node)
        return node


def stale_socket(path: Path) -> None:
    """What a killed agent leaves: a Unix socket file bound once, nobody listening any more."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen()
    s.close()


def live_socket(path: Path) -> socket.socket:
    """A Unix socket somebody listens on (close it, or use it as a context manager)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen()
    return s


def _attributes(base: Path, values: dict[str, object]) -> None:
    """sysfs attribute files under ``base``, one a value, each a line as the kernel writes it."""
    for name, value in values.items():
        (base / name).write_text(f"{value}\n")
