"""Every discovery backend over a FAKE hardware tree (tests/fakehw.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.fakehw import FakeHardware

from patchbay_agent.config import (
    MAX_DEVICE_ID_LENGTH,
    NvmlDiscovery,
    PathGroup,
    PathsDiscovery,
    PciDiscovery,
    UsbDiscovery,
    VirtualDiscovery,
)
from patchbay_agent.discovery import DiscoveryError, HostRoot, PhysicalDevice, make_backend, make_device_id


@pytest.fixture
def hw(tmp_path: Path) -> FakeHardware:
    return FakeHardware(tmp_path / "host")


def test_paths_globs_and_groups(hw: FakeHardware) -> None:
    for n in (1, 0):
        hw.add_dev(f"/dev/ttyUSB{n}")
    hw.add_dev("/dev/ttyS0")
    hw.add_dev("/dev/dri/card0")
    backend = make_backend(
        PathsDiscovery(
            globs=("/dev/ttyUSB*", "/dev/ttyUSB0"),
            groups=(PathGroup("card0", ("/dev/dri/card0", "/dev/dri/renderD128")),),
        ),
        HostRoot(hw.root),
    )
    assert backend.scan() == [
        PhysicalDevice(
            "card0", ("/dev/dri/card0", "/dev/dri/renderD128"), ("/dev/dri/card0", "/dev/dri/renderD128")
        ),
        PhysicalDevice("ttyUSB0", ("/dev/ttyUSB0",), ("/dev/ttyUSB0",)),
        PhysicalDevice("ttyUSB1", ("/dev/ttyUSB1",), ("/dev/ttyUSB1",)),
    ]
    assert backend.watch_dirs() == [hw.path("/dev"), hw.path("/dev/dri")]
    hw.remove_dev("/dev/ttyUSB1")
    assert [d.id for d in backend.scan()] == ["card0", "ttyUSB0"]


def test_paths_nested_glob_ids_and_symlinks(hw: FakeHardware) -> None:
    hw.add_dev("/dev/ttyUSB0")
    hw.add_symlink("/dev/serial/by-id/usb-FTDI_FT232R_A1-if00-port0", "../../ttyUSB0")
    backend = make_backend(PathsDiscovery(globs=("/dev/serial/by-id/*",)), HostRoot(hw.root))
    (dev,) = backend.scan()
    assert dev.id == "serial_by-id_usb-FTDI_FT232R_A1-if00-port0"
    assert dev.dev_paths == ("/dev/serial/by-id/usb-FTDI_FT232R_A1-if00-port0",)
    assert backend.watch_dirs() == [hw.path("/dev/serial/by-id")]


def test_host_root_resolves_absolute_symlinks_inside_the_root(hw: FakeHardware) -> None:
    hw.add_dev("/dev/ttyACM0")
    hw.add_symlink("/dev/modem", "/dev/ttyACM0")
    assert HostRoot(hw.root).resolve("/dev/modem") == hw.path("/dev/ttyACM0")


def test_device_ids_are_kubelet_safe() -> None:
    long = "x" * 100
    a, b = make_device_id(long + "a"), make_device_id(long + "b")
    assert len(a) == len(b) == MAX_DEVICE_ID_LENGTH
    assert a != b
    assert make_device_id("weird name/é") == "weird_name"


def test_pci_filters_numa_and_vfio(hw: FakeHardware) -> None:
    hw.add_pci("0000:3b:00.0", vendor="10de", device="2330", numa_node=1, iommu_group=17)
    hw.add_pci(
        "0000:af:00.0", vendor="10de", device="2330", device_class="0x030000", numa_node=-1, iommu_group=18
    )
    hw.add_pci(
        "0000:5e:00.0", vendor="10de", device="1eb8", numa_node=0, iommu_group=19, pcie_root="pci0000:5d"
    )
    hw.add_pci("0000:00:1f.6", vendor="8086", device="15bb")
    root = HostRoot(hw.root)

    plain = make_backend(PciDiscovery(vendor="10de", device="2330"), root).scan()
    assert [(d.id, d.numa_nodes, d.dev_paths) for d in plain] == [
        ("0000:3b:00.0", (1,), ()),
        ("0000:af:00.0", (), ()),
    ]
    assert plain[0].check_paths == ("/sys/bus/pci/devices/0000:3b:00.0",)

    by_class = make_backend(PciDiscovery(vendor="10de", device_class="0x0302"), root).scan()
    assert [d.id for d in by_class] == ["0000:3b:00.0", "0000:5e:00.0"]
    # The root complex each hangs under (its real sysfs path), for resource.kubernetes.io/pcieRoot.
    assert [dict(d.attributes)["pcieRoot"] for d in by_class] == ["pci0000:00", "pci0000:5d"]

    vfio = make_backend(PciDiscovery(vendor="10de", device="2330", vfio=True), root)
    (first, second) = vfio.scan()
    assert first.dev_paths == ("/dev/vfio/vfio", "/dev/vfio/17")
    assert first.check_paths == ("/sys/bus/pci/devices/0000:3b:00.0", "/dev/vfio/17")
    assert second.dev_paths == ("/dev/vfio/vfio", "/dev/vfio/18")
    assert vfio.watch_dirs() == [hw.path("/dev/vfio")]


def test_pcie_root_behind_a_bridge_and_none_outside_pci(hw: FakeHardware) -> None:
    hw.add_pci("0000:3c:00.0", vendor="10de", device="2330", pcie_root="pci0000:3a", bridge="0000:3a:00.0")
    root = HostRoot(hw.root)
    (gpu,) = make_backend(PciDiscovery(vendor="10de"), root).scan()
    assert dict(gpu.attributes)["pcieRoot"] == "pci0000:3a"
    hw.add_symlink("/sys/bus/platform/devices/serial8250", "../../../devices/platform/serial8250")
    assert root.pcie_root("/sys/bus/platform/devices/serial8250") is None
    assert root.pcie_root("/sys/bus/pci/devices/nope") is None


def test_pci_vfio_without_iommu_group_is_skipped(hw: FakeHardware) -> None:
    hw.add_pci("0000:3b:00.0", vendor="10de", device="2330")
    assert make_backend(PciDiscovery(vendor="10de", vfio=True), HostRoot(hw.root)).scan() == []


def test_usb_by_vendor_product_serial(hw: FakeHardware) -> None:
    node = hw.add_usb("1-1.2", vendor="1234", product="5678", bus=1, devnum=7, serial="A1B2")
    hw.add_usb("1-1.3", vendor="1234", product="5678", bus=1, devnum=9, serial="C3D4")
    hw.add_usb("2-1", vendor="1234", product="9999", bus=2, devnum=3)
    hw.add_usb("2-2", vendor="abcd", product="5678", bus=2, devnum=4)
    root = HostRoot(hw.root)

    by_vendor = make_backend(UsbDiscovery(vendor="1234"), root).scan()
    assert [d.id for d in by_vendor] == ["usb-1-1.2", "usb-1-1.3", "usb-2-1"]
    # The USB controller's root complex.
    assert {dict(d.attributes)["pcieRoot"] for d in by_vendor} == {"pci0000:00"}
    by_product = make_backend(UsbDiscovery(vendor="1234", product="5678"), root).scan()
    assert [d.dev_paths for d in by_product] == [("/dev/bus/usb/001/007",), ("/dev/bus/usb/001/009",)]
    (only,) = make_backend(UsbDiscovery(vendor="1234", product="5678", serial="A1B2"), root).scan()
    assert only.dev_paths == (node,)
    assert only.check_paths[1] == node
    assert make_backend(UsbDiscovery(vendor="1234"), root).watch_dirs() == [
        hw.path("/dev/bus/usb"),
        hw.path("/dev/bus/usb/001"),
        hw.path("/dev/bus/usb/002"),
    ]


def test_virtual_tokens_sort_numerically() -> None:
    devices = make_backend(VirtualDiscovery(count=12), HostRoot("/nonexistent")).scan()
    assert [d.id for d in devices][:3] == ["virtual-00", "virtual-01", "virtual-02"]
    assert len(devices) == 12
    assert all(d.dev_paths == () and d.check_paths == () for d in devices)


def test_nvml_without_driver_or_package_is_a_clear_error(hw: FakeHardware) -> None:
    """This machine has no NVIDIA driver: the backend must refuse clearly, never crash.

    With the `nvml` extra installed the message is about the driver; without it, about the
    extra. Either is a DiscoveryError with a way forward.
    """
    with pytest.raises(DiscoveryError, match=r"nvidia-ml-py|NVIDIA driver"):
        make_backend(NvmlDiscovery(), HostRoot(hw.root))


#: Two GPUs as a FAKE `pynvml` (`_ReplayedNvml`, below) answers for them: the second will not tell
#: its name or its memory.
TWO_GPUS: dict[str, Any] = {
    "gpus": [
        {
            "uuid": "GPU-8d0a1c2e-1111-2222-3333-444455556666",
            "minor": 0,
            "numaNode": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "busId": "00000000:3B:00.0",
            "memoryTotal": 85_520_809_984,
        },
        {
            "uuid": "GPU-0b1c2d3e-7777-8888-9999-aaaabbbbcccc",
            "minor": 1,
            "numaNode": 1,
            "name": {"error": "NVMLError_NotSupported: Not Supported"},
            "busId": "00000000:AF:00.0",
            "memoryTotal": {"error": "NVMLError_NotSupported: Not Supported"},
        },
    ]
}


def test_nvml_gpus_carry_uuid_name_pci_root_and_memory(
    hw: FakeHardware, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a FAKE `pynvml` (`TWO_GPUS`) and a fake sysfs tree: each GPU's UUID, product name, PCI
    address as sysfs writes it, its root complex, and memory as capacity, each read on its own;
    in a ResourceSlice also under the standard names."""
    import sys

    from patchbay_agent.core.health import CheckResult, DeviceHealthTracker
    from patchbay_agent.core.inventory import Inventory
    from patchbay_agent.discovery.nvml import pci_address
    from patchbay_agent.dra.slices import slice_devices

    monkeypatch.setitem(sys.modules, "pynvml", _ReplayedNvml(TWO_GPUS))
    hw.add_pci("0000:3b:00.0", vendor="10de", device="2330", pcie_root="pci0000:3a", bridge="0000:3a:00.0")
    hw.add_pci("0000:af:00.0", vendor="10de", device="2330", pcie_root="pci0000:ae")
    second, first = make_backend(NvmlDiscovery(), HostRoot(hw.root)).scan()  # sorted by UUID
    assert dict(first.attributes) == {
        "uuid": "GPU-8d0a1c2e-1111-2222-3333-444455556666",
        "productName": "NVIDIA H100 80GB HBM3",
        "pciAddress": "0000:3b:00.0",
        "pcieRoot": "pci0000:3a",
    }
    assert first.capacity == (("memory", 85_520_809_984),)
    assert dict(second.attributes) == {
        "uuid": "GPU-0b1c2d3e-7777-8888-9999-aaaabbbbcccc",
        "pciAddress": "0000:af:00.0",
        "pcieRoot": "pci0000:ae",
    }
    assert second.capacity == ()

    inventory = Inventory(1, "rw")
    tracker = DeviceHealthTracker(1, 1)
    tracker.observe({d.id: CheckResult(True) for d in (first, second)})
    inventory.update([first, second], tracker)
    doc = next(d for d in slice_devices(inventory.current) if d.physical_id == first.id).document()
    assert doc["capacity"] == {"patchbay.dev/memory": {"value": "85520809984"}}
    assert doc["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": "0000:3b:00.0"}
    assert doc["attributes"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:3a"}
    assert doc["attributes"]["patchbay.dev/productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert pci_address("00000000:3B:00.0") == "0000:3b:00.0"
    assert pci_address("0001:02:1f.7") == "0001:02:1f.7"
    assert pci_address("100000000:3B:00.0") is None and pci_address("3B:00.0") is None


#: What `hack/nvml_check.py` read on a REAL NVIDIA H100 (driver 580.159.04, in a VM: NVML will
#: not tell its NUMA node) and what the agent's code made of it there.
H100_RECORD = Path(__file__).parents[2] / "data" / "nvml" / "h100-vm-2026-11-27.json"


class _ReplayedNvml:
    """A FAKE `pynvml` that replays, call by call, the values a real H100 gave (`H100_RECORD`'s
    `raw`), its errors included: the backend's code runs here as it ran on the GPU machine."""

    class NVMLError(Exception):
        pass

    class _Value:
        def __init__(self, **fields: Any) -> None:
            self.__dict__.update(fields)

    def __init__(self, raw: dict[str, Any]) -> None:
        self._gpus = raw["gpus"]

    def _get(self, h: int, key: str) -> Any:
        value = self._gpus[h][key]
        if isinstance(value, dict) and "error" in value:
            # the recorded "NVMLError_NotSupported: Not Supported": that subclass, that message
            name, _, message = value["error"].partition(": ")
            raise type(name, (self.NVMLError,), {})(message)
        return value

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return str(self._get(h, "uuid"))

    def nvmlDeviceGetMinorNumber(self, h: int) -> int:
        return int(self._get(h, "minor"))

    def nvmlDeviceGetNumaNodeId(self, h: int) -> int:
        return int(self._get(h, "numaNode"))

    def nvmlDeviceGetName(self, h: int) -> str:
        return str(self._get(h, "name"))

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return self._Value(busId=self._get(h, "busId").encode())

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return self._Value(total=self._get(h, "memoryTotal"))


def test_nvml_on_a_real_h100_replayed(
    hw: FakeHardware, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """hack/nvml_check.py over the NVML answers a real H100 gave (replayed by a FAKE `pynvml`; the
    GPU's PCI function and device files in a fake tree where that VM had them) writes the record
    it wrote on that machine: the same NVML reads, devices, ResourceSlice and CDI spec. So the
    fake answers the calls as the real NVML did, errors included (no NUMA node in a VM)."""
    import importlib.util
    import json
    import sys

    record = json.loads(H100_RECORD.read_text())
    monkeypatch.setitem(sys.modules, "pynvml", _ReplayedNvml(record["raw"]))
    hw.add_pci("0000:00:06.0", vendor="10de", device="2330", pcie_root="pci0000:00")
    for name in record["machine"]["devFiles"]:
        if name != "nvidia-caps":
            hw.add_dev(f"/dev/{name}")
    spec = importlib.util.spec_from_file_location(
        "nvml_check", Path(__file__).parents[3] / "hack" / "nvml_check.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "record.json"
    assert script.main(["--out", str(out), "--host-root", str(hw.root)]) == 0
    replayed = json.loads(out.read_text())
    assert replayed["raw"]["gpus"] == record["raw"]["gpus"]
    for key in ("devices", "slices", "cdi", "devFilesExist"):
        assert replayed[key] == record[key], key
