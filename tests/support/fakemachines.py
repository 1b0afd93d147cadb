"""FAKE HARDWARE, shaped like real machines: sysfs and /dev trees under a test host root for the
node inventory's tests. Nothing here is a real device: every file is written by these helpers,
copied in shape (paths, attribute names and values, symlinks, `uevent` lines) from what the kernel
shows for the real device named:

* an FTDI FT232R USB serial adapter (0403:6001, driver ftdi_sio) on port 1-2, bringing /dev/ttyUSB0;
* a Logitech HD Pro Webcam C920 (046d:082d, driver uvcvideo) on port 1-3, bringing /dev/video0;
* an NVIDIA H100 SXM5 (10de:2330, class 030200, driver nvidia) at 0000:3b:00.0 on NUMA node 1;
* a Xilinx Alveo U250 FPGA card (10ee:5004, class 120000, driver xclmgmt) at 0000:af:00.0.

Device files are regular files (making character devices needs CAP_MKNOD).
"""

from __future__ import annotations

import os
from pathlib import Path

from support.fakehw import FakeHardware

USB_CONTROLLER = "/sys/devices/pci0000:00/0000:00:14.0"


def _write(base: Path, values: dict[str, object]) -> None:
    base.mkdir(parents=True, exist_ok=True)
    for name, value in values.items():
        (base / name).write_text(f"{value}\n")


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(target, link.parent), link)


def _driver(hw: FakeHardware, device: Path, bus: str, name: str) -> None:
    drv = hw.path(f"/sys/bus/{bus}/drivers/{name}")
    drv.mkdir(parents=True, exist_ok=True)
    _link(device / "driver", drv)


def usb_device(
    hw: FakeHardware,
    port: str,
    *,
    vendor: str,
    product: str,
    bus: int,
    devnum: int,
    manufacturer: str | None = None,
    product_name: str | None = None,
    serial: str | None = None,
) -> Path:
    """A USB device at `port` below the xHCI controller at 0000:00:14.0: its attributes, its
    /dev/bus/usb file and its /sys/bus/usb/devices link; returns its real sysfs directory."""
    base = hw.path(f"{USB_CONTROLLER}/usb{bus}/{port}")
    values: dict[str, object] = {"idVendor": vendor, "idProduct": product, "busnum": bus, "devnum": devnum}
    values |= {
        k: v for k, v in (("manufacturer", manufacturer), ("product", product_name), ("serial", serial)) if v
    }
    _write(base, values)
    (base / "uevent").write_text(
        f"MAJOR=189\nMINOR={(bus - 1) * 128 + devnum - 1}\nDEVNAME=bus/usb/{bus:03d}/{devnum:03d}\n"
        f"DEVTYPE=usb_device\nDRIVER=usb\nPRODUCT={int(vendor, 16):x}/{int(product, 16):x}/600\n"
    )
    _link(hw.path(f"/sys/bus/usb/devices/{port}"), base)
    hw.add_dev(f"/dev/bus/usb/{bus:03d}/{devnum:03d}")
    return base


def ftdi_serial_adapter(hw: FakeHardware, port: str = "1-2", tty: str = "ttyUSB0", devnum: int = 5) -> None:
    """FTDI FT232R USB UART: interface 1.0 bound to ftdi_sio, its usb-serial port ttyUSB0 and
    that port's tty class device, /sys/class/tty/ttyUSB0, /dev/ttyUSB0."""
    base = usb_device(
        hw, port, vendor="0403", product="6001", bus=1, devnum=devnum,
        manufacturer="FTDI", product_name="FT232R USB UART", serial="A50285BI",
    )  # fmt: skip
    iface = base / f"{port}:1.0"
    _write(iface, {"bInterfaceClass": "ff", "bInterfaceNumber": "00"})
    _link(hw.path(f"/sys/bus/usb/devices/{port}:1.0"), iface)
    _driver(hw, iface, "usb", "ftdi_sio")
    serial_port = iface / tty
    _write(serial_port, {"port_number": 0})
    _driver(hw, serial_port, "usb-serial", "ftdi_sio")
    cls = serial_port / "tty" / tty
    _write(cls, {"dev": "188:0"})
    (cls / "uevent").write_text(f"MAJOR=188\nMINOR=0\nDEVNAME={tty}\n")
    _link(cls / "device", serial_port)
    _link(hw.path(f"/sys/class/tty/{tty}"), cls)
    hw.add_dev(f"/dev/{tty}")


def remove_ftdi_serial_adapter(
    hw: FakeHardware, port: str = "1-2", tty: str = "ttyUSB0", devnum: int = 5
) -> None:
    """Unplugged: the kernel removes the class device, the links and the device files."""
    import shutil

    for link in (f"/sys/class/tty/{tty}", f"/sys/bus/usb/devices/{port}:1.0", f"/sys/bus/usb/devices/{port}"):
        hw.path(link).unlink()
    shutil.rmtree(hw.path(f"{USB_CONTROLLER}/usb1/{port}"))
    hw.remove_dev(f"/dev/{tty}")
    hw.remove_dev(f"/dev/bus/usb/001/{devnum:03d}")


def usb_camera(hw: FakeHardware, port: str = "1-3", video: str = "video0") -> None:
    """Logitech HD Pro Webcam C920: interface 1.0 bound to uvcvideo with its video4linux device."""
    base = usb_device(
        hw, port, vendor="046d", product="082d", bus=1, devnum=7,
        product_name="HD Pro Webcam C920", serial="8F3A2B1E",
    )  # fmt: skip
    iface = base / f"{port}:1.0"
    _write(iface, {"bInterfaceClass": "0e"})
    _link(hw.path(f"/sys/bus/usb/devices/{port}:1.0"), iface)
    _driver(hw, iface, "usb", "uvcvideo")
    cls = iface / "video4linux" / video
    _write(cls, {"name": "HD Pro Webcam C920", "dev": "81:0"})
    (cls / "uevent").write_text(f"MAJOR=81\nMINOR=0\nDEVNAME={video}\n")
    _link(cls / "device", iface)
    _link(hw.path(f"/sys/class/video4linux/{video}"), cls)
    hw.add_dev(f"/dev/{video}")


def _pci_extras(hw: FakeHardware, address: str, driver: str, subsystem: tuple[str, str]) -> None:
    base = hw.path(f"/sys/bus/pci/devices/{address}").resolve()
    _write(base, {"subsystem_vendor": f"0x{subsystem[0]}", "subsystem_device": f"0x{subsystem[1]}"})
    _driver(hw, base, "pci", driver)


def nvidia_h100(hw: FakeHardware, address: str = "0000:3b:00.0") -> None:
    """NVIDIA H100 SXM5 80GB: 3D controller, driver nvidia, NUMA node 1, IOMMU group 45."""
    hw.add_pci(address, vendor="10de", device="2330", device_class="0x030200", numa_node=1,
               iommu_group=45, vfio_node=False, pcie_root="pci0000:3a")  # fmt: skip
    _pci_extras(hw, address, "nvidia", ("10de", "16c1"))
    hw.add_dev("/dev/nvidia0")


def alveo_u250(hw: FakeHardware, address: str = "0000:af:00.0") -> None:
    """Xilinx Alveo U250: processing accelerator, driver xclmgmt, NUMA node 1."""
    hw.add_pci(address, vendor="10ee", device="5004", device_class="0x120000", numa_node=1,
               pcie_root="pci0000:ae")  # fmt: skip
    _pci_extras(hw, address, "xclmgmt", ("10ee", "000e"))


def virtual_consoles(hw: FakeHardware, count: int = 8) -> None:
    """/sys/class/tty/tty<N>: virtual consoles (no `device` link), which are not hardware."""
    for i in range(count):
        cls = hw.path(f"/sys/devices/virtual/tty/tty{i}")
        _write(cls, {"dev": f"4:{i}"})
        (cls / "uevent").write_text(f"MAJOR=4\nMINOR={i}\nDEVNAME=tty{i}\n")
        _link(hw.path(f"/sys/class/tty/tty{i}"), cls)


def many_ttys(hw: FakeHardware, count: int) -> None:
    """`count` hardware ttys (a serial concentrator's ports, ttyMI<n>) behind one PCI card."""
    hw.add_pci("0000:05:00.0", vendor="13fe", device="1680", device_class="0x070002")
    card = hw.path("/sys/bus/pci/devices/0000:05:00.0").resolve()
    for i in range(count):
        cls = card / "tty" / f"ttyMI{i}"
        cls.mkdir(parents=True)
        (cls / "uevent").write_text(f"MAJOR=240\nMINOR={i}\nDEVNAME=ttyMI{i}\n")
        _link(cls / "device", card)
        _link(hw.path(f"/sys/class/tty/ttyMI{i}"), cls)


def workstation(root: Path) -> FakeHardware:
    """A machine with all four: the serial adapter, the camera, the GPU, the FPGA card, and the
    virtual consoles every Linux machine has."""
    hw = FakeHardware(root)
    ftdi_serial_adapter(hw)
    usb_camera(hw)
    nvidia_h100(hw)
    alveo_u250(hw)
    virtual_consoles(hw)
    return hw
