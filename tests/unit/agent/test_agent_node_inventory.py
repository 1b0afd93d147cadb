"""The node inventory on FAKE HARDWARE trees shaped like real machines (support/fakemachines.py):
what sysfs says is read right (ids, strings, drivers, NUMA, IOMMU, the device files a USB device
brings), which profile serves what, the bounds (10,000 device files give a bounded object, the
largest the CRD admits stays under etcd's 1.5 MiB), and the keeper: hot-plug seen through /dev,
nothing written while nothing changes."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import fakemachines
from support.converge import until
from support.fakehw import FakeHardware

from patchbay_agent.discovery.base import HostRoot, PhysicalDevice
from patchbay_agent.inventory.document import MAX_ENTRIES, build_inventory
from patchbay_agent.inventory.keeper import InventoryKeeper
from patchbay_agent.inventory.sysfs import scan

REPO = Path(__file__).resolve().parents[3]
SERIAL = [PhysicalDevice("ttyUSB0", ("/dev/ttyUSB0",), ("/dev/ttyUSB0",))]
ETCD_REQUEST_LIMIT = 1536 * 1024


def test_a_workstation_reads_as_its_hardware(tmp_path: Path) -> None:
    fakemachines.workstation(tmp_path)
    hw = scan(HostRoot(tmp_path), gpus=False)
    pci = {p.address: p for p in hw.pci}
    gpu = pci["0000:3b:00.0"]
    assert (gpu.vendor, gpu.device, gpu.device_class, gpu.driver, gpu.numa_node, gpu.iommu_group) == (
        "10de", "2330", "030200", "nvidia", 1, 45,
    )  # fmt: skip
    assert (gpu.subsystem_vendor, gpu.subsystem_device) == ("10de", "16c1")
    fpga = pci["0000:af:00.0"]
    assert (fpga.vendor, fpga.device_class, fpga.driver, fpga.iommu_group) == (
        "10ee",
        "120000",
        "xclmgmt",
        None,
    )
    usb = {u.port: u for u in hw.usb}
    ftdi = usb["1-2"]
    assert (ftdi.vendor, ftdi.product, ftdi.manufacturer, ftdi.product_name, ftdi.serial) == (
        "0403", "6001", "FTDI", "FT232R USB UART", "A50285BI",
    )  # fmt: skip
    assert ftdi.dev_nodes == ("/dev/ttyUSB0",) and ftdi.bus_node == "/dev/bus/usb/001/005"
    assert usb["1-3"].dev_nodes == ("/dev/video0",)
    assert sorted(usb) == ["1-2", "1-3"]  # the interfaces are not devices
    char = {c.path: c for c in hw.char}
    # Virtual consoles are no hardware: only the adapter's tty and the camera.
    assert sorted(char) == ["/dev/ttyUSB0", "/dev/video0"]
    assert (char["/dev/ttyUSB0"].driver, char["/dev/ttyUSB0"].parent) == ("ftdi_sio", "1-2")
    assert (char["/dev/video0"].device_class, char["/dev/video0"].parent) == ("video4linux", "1-3")


def test_each_entry_says_which_profile_serves_it(tmp_path: Path) -> None:
    fakemachines.workstation(tmp_path)
    hw = scan(HostRoot(tmp_path), gpus=False)
    served = {
        "serial": [PhysicalDevice("ttyUSB0", ("/dev/ttyUSB0",), ("/dev/ttyUSB0",))],
        "gpus": [
            PhysicalDevice(
                "0000_3b_00.0",
                (),
                ("/sys/bus/pci/devices/0000:3b:00.0",),
                attributes=(("pciAddress", "0000:3b:00.0"),),
            )
        ],
    }
    doc = build_inventory("node-1", "agent-x", hw, served, "uid-1")
    by_addr = {p["address"]: p for p in doc["pci"]}
    assert by_addr["0000:3b:00.0"]["servedBy"] == ["gpus"]
    assert "servedBy" not in by_addr["0000:af:00.0"]
    usb = {u["port"]: u for u in doc["usb"]}
    assert usb["1-2"]["servedBy"] == ["serial"]  # through its ttyUSB0
    assert "servedBy" not in usb["1-3"]
    assert usb["1-2"]["devNodes"] == ["/dev/ttyUSB0"]
    served_by = {c["path"]: c.get("servedBy") for c in doc["char"]}
    assert served_by == {"/dev/ttyUSB0": ["serial"], "/dev/video0": None}
    assert doc["summary"] == {"pci": 2, "usb": 2, "char": 2, "gpus": 0}
    assert doc["metadata"]["name"] == doc["nodeName"] == "node-1" and doc["agent"] == "agent-x"
    assert doc["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert "omitted" not in doc


def test_ten_thousand_device_files_give_a_bounded_inventory(tmp_path: Path) -> None:
    hw_tree = FakeHardware(tmp_path)
    fakemachines.many_ttys(hw_tree, 10_000)
    fakemachines.ftdi_serial_adapter(hw_tree)
    hw = scan(HostRoot(tmp_path), gpus=False)
    assert len(hw.char) == 10_001
    served = {"serial": [PhysicalDevice("ttyUSB0", ("/dev/ttyUSB0",), ("/dev/ttyUSB0",))]}
    doc = build_inventory("node-1", "agent-x", hw, served)
    assert len(doc["char"]) == MAX_ENTRIES
    assert doc["summary"]["char"] == 10_001
    # The served one is kept whatever its place; the rest are counted, never refused.
    assert any(c["path"] == "/dev/ttyUSB0" for c in doc["char"])
    assert doc["omitted"] == [{"kind": "char", "group": "tty", "count": 10_001 - MAX_ENTRIES}]
    size = len(json.dumps(doc, separators=(",", ":")))
    print(f"inventory of a node with 10,001 ttys: {size} bytes")
    assert size < 128 * 1024


def _longest(schema: dict[str, Any]) -> Any:
    """The largest value a schema admits (every list full, every string at its longest)."""
    t = schema.get("type")
    if t == "object":
        return {k: _longest(v) for k, v in schema.get("properties", {}).items() if k not in ("metadata",)}
    if t == "array":
        return [_longest(schema["items"])] * schema["maxItems"]
    if t == "integer":
        return 2**63 - 1
    if "enum" in schema:
        return max(schema["enum"], key=len)
    if schema.get("format") == "date-time":
        return "2026-11-29T00:00:00Z"
    return "x" * schema.get("maxLength", 0)


def test_the_largest_inventory_the_crd_admits_fits_in_one_etcd_request() -> None:
    crd = yaml.safe_load((REPO / "crds" / "patchbay.dev_nodeinventories.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    largest = len(json.dumps(_longest(schema), separators=(",", ":")))
    print(f"largest NodeInventory the CRD admits: {largest} bytes")
    assert largest < ETCD_REQUEST_LIMIT


class Recorder:
    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []

    def apply_inventory(self, doc: dict[str, Any]) -> dict[str, Any]:
        self.applied.append(doc)
        return {**doc, "metadata": {**doc["metadata"], "resourceVersion": str(len(self.applied))}}

    def node_uid(self, node_name: str) -> str:
        return "uid-1"


@contextlib.asynccontextmanager
async def keeping(root: Path, served: Any = dict) -> AsyncIterator[tuple[InventoryKeeper, Recorder]]:
    """A keeper running on the test's loop (coalescing 50 ms, the backstop rescan an hour away,
    so only inotify events cause writes), with a recording client."""
    client = Recorder()
    keeper = InventoryKeeper(
        HostRoot(root), "node-1", "agent-x", client, served, coalesce=0.05, rescan=3600, gpus=False
    )
    stop = asyncio.Event()
    task = asyncio.create_task(keeper.run(stop))
    try:
        yield keeper, client
    finally:
        stop.set()
        await task


@pytest.mark.asyncio
async def test_hot_plug_is_written_once_each_way_and_nothing_while_quiet(tmp_path: Path) -> None:
    """An adapter plugged in (its /dev/ttyUSB0 appears) is in the next write, unplugged it is
    gone in the one after; scans that find nothing new write nothing. The backstop rescan is
    an hour here, so only /dev's inotify events can have caused the writes."""
    hw = FakeHardware(tmp_path)
    fakemachines.usb_camera(hw)
    async with keeping(tmp_path) as (keeper, client):
        await until(lambda: len(client.applied) == 1)
        assert [u["port"] for u in client.applied[0]["usb"]] == ["1-3"]
        assert client.applied[0]["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        fakemachines.ftdi_serial_adapter(hw)
        await until(lambda: len(client.applied) == 2)
        assert [u["port"] for u in client.applied[1]["usb"]] == ["1-2", "1-3"]
        assert "/dev/ttyUSB0" in [c["path"] for c in client.applied[1]["char"]]
        fakemachines.remove_ftdi_serial_adapter(hw)
        await until(lambda: len(client.applied) == 3)
        assert [u["port"] for u in client.applied[2]["usb"]] == ["1-3"]
        # Something under /dev that changes nothing read: a scan, no write.
        scans = keeper.scans
        hw.add_dev("/dev/unrelated")
        await until(lambda: keeper.scans > scans)
        await asyncio.sleep(0.2)
        assert len(client.applied) == 3 and keeper.unchanged >= 1


@pytest.mark.asyncio
async def test_a_change_of_what_is_served_is_written(tmp_path: Path) -> None:
    hw = FakeHardware(tmp_path)
    fakemachines.ftdi_serial_adapter(hw)
    served: dict[str, list[PhysicalDevice]] = {}
    async with keeping(tmp_path, lambda: served) as (keeper, client):
        await until(lambda: len(client.applied) == 1)
        assert "servedBy" not in client.applied[0]["usb"][0]
        served["serial"] = [PhysicalDevice("ttyUSB0", ("/dev/ttyUSB0",), ("/dev/ttyUSB0",))]
        keeper.notify()
        await until(lambda: len(client.applied) == 2)
        assert client.applied[1]["usb"][0]["servedBy"] == ["serial"]


def test_device_files_a_profile_serves_that_sysfs_does_not_list_are_listed(tmp_path: Path) -> None:
    """Files a `paths` glob serves with no class device behind them (mknod-made, as the demo's)
    are listed as class `paths`; a USB device's own /dev/bus/usb file is not listed twice."""
    hw = FakeHardware(tmp_path)
    fakemachines.ftdi_serial_adapter(hw)
    served = {
        "sensors": [PhysicalDevice("s0", ("/dev/patchbay-demo/sensor0",), ("/dev/patchbay-demo/sensor0",))],
        "raw-usb": [PhysicalDevice("usb-1-2", ("/dev/bus/usb/001/005",), ("/sys/bus/usb/devices/1-2",))],
        "serial": SERIAL,
    }
    doc = build_inventory("n", None, scan(HostRoot(tmp_path), gpus=False), served)
    assert [(c["path"], c["class"], c["servedBy"]) for c in doc["char"]] == [
        ("/dev/ttyUSB0", "tty", ["serial"]),
        ("/dev/patchbay-demo/sensor0", "paths", ["sensors"]),
    ]
    assert doc["usb"][0]["servedBy"] == ["raw-usb", "serial"]
    # A profile keeps a vanished device (Unhealthy) for a while: its file is not listed once gone.
    gone = build_inventory(
        "n", None, scan(HostRoot(tmp_path), gpus=False), served, exists=lambda p: "demo" not in p
    )
    assert [c["path"] for c in gone["char"]] == ["/dev/ttyUSB0"]


async def test_a_served_file_that_goes_leaves_at_once(tmp_path: Path) -> None:
    """A profile keeps a vanished device in its devices (Unhealthy) for a while: the keeper
    watches the served files' directories, so the file leaves the inventory when it goes."""
    hw = FakeHardware(tmp_path)
    hw.add_dev("/dev/patchbay-demo/sensor0")
    served = {
        "sensors": [PhysicalDevice("s0", ("/dev/patchbay-demo/sensor0",), ("/dev/patchbay-demo/sensor0",))]
    }
    async with keeping(tmp_path, lambda: served) as (_keeper, client):
        await until(lambda: len(client.applied) == 1)
        assert [c["path"] for c in client.applied[0]["char"]] == ["/dev/patchbay-demo/sensor0"]
        hw.remove_dev("/dev/patchbay-demo/sensor0")
        await until(lambda: len(client.applied) == 2)
        assert "char" not in client.applied[1]
