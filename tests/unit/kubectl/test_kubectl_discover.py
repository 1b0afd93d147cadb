"""`kubectl patchbay discover` on inventories the agent's own code builds from FAKE HARDWARE trees
(support/fakemachines.py): kinds grouped across nodes with what serves them, --unserved, -o json,
and --propose: a profile whose discovery, run by the agent's own backend on each node's tree,
finds exactly that kind of device, with a node selector that selects exactly the nodes having it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import fakemachines
from support.fakehw import FakeHardware

from patchbay_agent.config import parse
from patchbay_agent.discovery import make_backend
from patchbay_agent.discovery.base import HostRoot, PhysicalDevice
from patchbay_agent.inventory.document import build_inventory
from patchbay_agent.inventory.sysfs import scan
from patchbay_api.selectors import label_selector_matches
from patchbay_kubectl.arguments import build_parser
from patchbay_kubectl.views import discover

SERIAL = [PhysicalDevice("ttyUSB0", ("/dev/ttyUSB0",), ("/dev/ttyUSB0",))]


@pytest.fixture
def fleet(tmp_path: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """node-1: a workstation whose adapter a profile serves; node-2: an adapter, not served;
    node-3: a camera only."""
    trees = {n: tmp_path / n for n in ("node-1", "node-2", "node-3")}
    fakemachines.workstation(trees["node-1"])
    fakemachines.ftdi_serial_adapter(FakeHardware(trees["node-2"]))
    fakemachines.usb_camera(FakeHardware(trees["node-3"]))
    served = {"node-1": {"serial": SERIAL}}
    return {
        n: (root, build_inventory(n, None, scan(HostRoot(root), gpus=False), served.get(n, {})))
        for n, root in trees.items()
    }


def _node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}}}


def test_kinds_are_grouped_across_nodes_with_what_serves_them(fleet: dict[str, Any]) -> None:
    inventories = [doc for _root, doc in fleet.values()]
    kinds = {k.key: k for k in discover.kinds_of(inventories)}
    ftdi = kinds["0403:6001"]
    assert ftdi.description == "FTDI FT232R USB UART"
    assert sorted(ftdi.nodes) == ["node-1", "node-2"] and ftdi.patterns == ["/dev/ttyUSB*"]
    assert ftdi.served_text() == "served by serial (not on 1 node)"
    assert kinds["046d:082d"].served_text() == "not served" and sorted(kinds["046d:082d"].nodes) == [
        "node-1",
        "node-3",
    ]
    assert kinds["pci:10de:2330"].description == "NVIDIA 3D controller (nvidia)"
    assert kinds["pci:10ee:5004"].description == "Xilinx Processing accelerators (xclmgmt)"
    # The adapter's tty and the camera's video0 are shown with their USB devices, not again.
    assert not [k for k in kinds.values() if k.bus == "char"]
    text = discover.render(discover.kinds_of(inventories), 0, None)
    lines = {line.split()[0]: line for line in text.splitlines()[1:]}
    cells = [c.strip() for c in lines["0403:6001"].split("   ") if c.strip()]
    assert cells == [
        "0403:6001",
        "FTDI FT232R USB UART",
        "2 nodes",
        "/dev/ttyUSB*",
        "served by serial (not on 1 node)",
    ]
    unserved = discover.select(discover.kinds_of(inventories), unserved=True)
    assert "0403:6001" in [k.key for k in unserved]  # node-2's is not served
    only_node_1 = discover.select(discover.kinds_of([fleet["node-1"][1]]), unserved=True)
    assert "0403:6001" not in [k.key for k in only_node_1]
    as_json = json.loads(discover.render(unserved, 0, "json"))
    assert {i["kind"] for i in as_json["items"]} >= {"0403:6001", "046d:082d"}


def test_a_large_node_says_how_many_more_it_has(tmp_path: Path) -> None:
    fakemachines.many_ttys(FakeHardware(tmp_path), 300)
    doc = build_inventory("big", None, scan(HostRoot(tmp_path), gpus=False), {})
    text = discover.render(discover.kinds_of([doc]), discover.omitted_count([doc]), None)
    assert "and 172 more devices" in text


@pytest.mark.parametrize(
    ("labelled", "by_hand"),
    [(True, False), (True, True), (False, False)],
    ids=["inventory-label", "inventory-label-and-a-node-labelled-by-hand", "hostname-fallback"],
)
def test_a_proposed_profile_serves_exactly_that_kind_on_exactly_those_nodes(
    fleet: dict[str, Any], labelled: bool, by_hand: bool
) -> None:
    inventories = [doc for _root, doc in fleet.values()]
    (ftdi,) = discover.select(discover.kinds_of(inventories), kind="0403:6001")
    label = {"inventory.patchbay.dev/usb-0403-6001": "present"} if labelled else {}
    kwok = _node("kwok-1", **(label if by_hand else {}))
    nodes = [_node("node-1", **label), _node("node-2", **label), _node("node-3"), kwok]
    text = discover.propose(ftdi, "ftdi", "DRA", nodes)
    assert ("fallback" in text) != labelled
    said = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
    assert ("(labelled by hand or by another tool), selected too: kwok-1." in said) == by_hand, said
    profile = yaml.safe_load(text)
    assert profile["kind"] == "DevicePluginProfile" and profile["spec"]["mode"] == "DRA"
    selected = [
        n["metadata"]["name"]
        for n in nodes
        if label_selector_matches(profile["spec"]["nodeSelector"], n["metadata"]["labels"])
    ]
    assert selected == ["node-1", "node-2"] + (["kwok-1"] if by_hand else [])
    # The agent's own config parser and USB backend, on each node's tree: the adapter only.
    config = parse({"resourceName": profile["spec"]["resourceName"], "plugin": profile["spec"]["plugin"]})
    for name, (root, _doc) in fleet.items():
        found = make_backend(config.discovery, HostRoot(root)).scan()
        assert [d.id for d in found] == (["usb-1-2"] if name != "node-3" else []), name


def test_a_pci_kind_is_proposed_with_pci_selectors_and_a_bare_tty_with_a_glob(tmp_path: Path) -> None:
    hw = fakemachines.workstation(tmp_path)
    serial = hw.path("/sys/devices/platform/serial8250/tty/ttyS0")
    serial.mkdir(parents=True)
    (serial / "uevent").write_text("MAJOR=4\nMINOR=64\nDEVNAME=ttyS0\n")
    (serial / "type").write_text("4\n")
    (serial / "device").symlink_to("../..")
    (hw.path("/sys/class/tty") / "ttyS0").symlink_to("../../devices/platform/serial8250/tty/ttyS0")
    doc = build_inventory("n", None, scan(HostRoot(tmp_path), gpus=False), {})
    kinds = discover.kinds_of([doc])
    (gpu,) = discover.select(kinds, kind="10de:2330")
    profile = yaml.safe_load(discover.propose(gpu, "gpus", "DevicePlugin", [_node("n")]))
    assert profile["spec"]["plugin"]["discovery"] == {
        "pci": {"vendor": "10de", "device": "2330", "class": "0x0302"}
    }
    config = parse({"resourceName": "patchbay.dev/gpus", "plugin": profile["spec"]["plugin"]})
    assert [d.id for d in make_backend(config.discovery, HostRoot(tmp_path)).scan()] == ["0000:3b:00.0"]
    (tty,) = discover.select(kinds, kind="tty:/dev/ttyS*")
    text = discover.propose(tty, "uarts", "DevicePlugin", [_node("n")])
    assert "a glob" in text and yaml.safe_load(text)["spec"]["plugin"]["discovery"] == {
        "paths": {"globs": ["/dev/ttyS*"]}
    }


def test_the_command_line_takes_discovers_flags() -> None:
    args = build_parser().parse_args(
        ["discover", "0403:6001", "--propose", "ftdi", "--mode", "DRA", "-o", "yaml"]
    )
    assert (args.kind, args.propose, args.mode, args.output) == ("0403:6001", "ftdi", "DRA", "yaml")
