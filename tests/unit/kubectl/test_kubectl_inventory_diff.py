"""`kubectl patchbay diff` and `why` with the nodes' NodeInventories (issue 46, item 2): what a
profile's new discovery will match before it is applied. The inventories are the agent's own
(`build_inventory` over FAKE HARDWARE trees, support/fakemachines.py), and what `diff` says a
discovery matches is held against what the agent's own backend finds on the same tree."""

from __future__ import annotations

import argparse
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
from patchbay_kubectl import cli, kube, output
from patchbay_kubectl.views import diagnosis, inventory
from patchbay_kubectl.views.plan import node_plan, profile_plan

WRITTEN = "2026-11-29T08:00:00Z"
NOTHING = "the glob /dev/ttyACM* matches nothing; the node has /dev/ttyUSB0 (0403:6001 FTDI FT232R USB UART)"
USB0 = [PhysicalDevice("ttyUSB0", ("/dev/ttyUSB0",), ("/dev/ttyUSB0",))]


def inv(root: Path, node: str, served: dict[str, list[PhysicalDevice]], max_entries: int = 128) -> Any:
    doc = build_inventory(node, None, scan(HostRoot(root), gpus=False), served, max_entries=max_entries)
    return {**doc, "observedAt": WRITTEN}


def prof(discovery: dict[str, Any], name: str = "serial") -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "resourceName": f"example.com/{name}",
            "mode": "DevicePlugin",
            "nodeSelector": {"matchLabels": {"serial": "yes"}},
            "plugin": {"discovery": discovery},
        },
    }


def globs(*g: str) -> dict[str, Any]:
    return {"paths": {"globs": list(g)}}


def node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"serial": "yes"}}}


def report(node_name: str, devices: dict[str, list[str]], profile: str = "serial") -> dict[str, Any]:
    return {
        "profile": profile,
        "nodeName": node_name,
        "devices": [
            {"id": d, "pods": [{"namespace": h.split("/")[0], "name": h.split("/")[1]} for h in holders]}
            for d, holders in devices.items()
        ],
    }


@pytest.fixture
def workstation(tmp_path: Path) -> tuple[Path, Any]:
    """An FTDI adapter (ttyUSB0) served by `serial`, a webcam, an H100, an Alveo, 8 consoles."""
    root = tmp_path / "ws"
    fakemachines.workstation(root)
    return root, inv(root, "ws", {"serial": USB0})


@pytest.mark.parametrize(
    "discovery",
    [
        globs("/dev/ttyUSB*"),
        globs("/dev/tty*"),
        globs("/dev/video*", "/dev/ttyUSB0"),
        globs("/dev/ttyACM*"),
        {"usb": {"vendor": "0403", "product": "6001"}},
        {"usb": {"vendor": "046D"}},
        {"usb": {"vendor": "0403", "product": "6015"}},
        {"pci": {"vendor": "10de", "class": "0x0302"}},
        {"pci": {"vendor": "10DE", "device": "2330"}},
        {"pci": {"vendor": "10ee"}},
        {"pci": {"vendor": "10de", "class": "0x0300"}},
    ],
)
def test_what_diff_says_a_discovery_matches_is_what_the_agent_finds(
    workstation: tuple[Path, Any], discovery: dict[str, Any]
) -> None:
    root, doc = workstation
    m = inventory.match(discovery, doc)
    assert m is not None
    config = parse({"resourceName": "example.com/x", "plugin": {"discovery": discovery}})
    agent = {d.id for d in make_backend(config.discovery, HostRoot(root)).scan()}
    assert m.ids == agent


def test_a_glob_matching_nothing_is_flagged_from_the_inventory_with_what_comes_closest(
    workstation: tuple[Path, Any],
) -> None:
    _root, doc = workstation
    before, after = prof(globs("/dev/ttyUSB*")), prof(globs("/dev/ttyACM*"))
    plan = profile_plan(
        before, after, "configured", [node("ws"), node("bare")],
        [report("ws", {"ttyUSB0": ["apps/modem"]}), report("bare", {"ttyUSB0": []})],
        inventory_of={"ws": doc}.get,
    )  # fmt: skip
    assert plan.loses  # diff's exit code 1: devices lost
    bare, ws = plan.nodes  # by name
    assert [lo.device for lo in ws.lost] == ["ttyUSB0"] and ws.holders == ["apps/modem"]
    assert ws.inventory is not None and not ws.inventory.matched and ws.drops == ["/dev/ttyUSB0"]
    text = output.plan([plan], None)
    print(text)
    line = next(x for x in text.splitlines() if x.startswith("  ws: "))
    assert f"from the node's inventory (written at {WRITTEN}): MATCHES NOTHING" in line
    assert (
        "the glob /dev/ttyACM* matches nothing; the node has /dev/ttyUSB0 (0403:6001 FTDI FT232R USB UART)"
        in line
    )
    assert "it serves 1 device now (/dev/ttyUSB0)" in line
    # A node without an inventory keeps the words of before: known once the node runs it.
    assert bare.inventory is None and any("known once the node runs it" in u for u in bare.unknown)
    assert "bare: no NodeInventory" in text
    doc_json = json.loads(output.plan([plan], "json"))
    node_ws = doc_json["items"][0]["nodes"][1]
    assert node_ws["inventory"]["matchesNothing"] is True
    assert node_ws["inventory"]["writtenAt"] == WRITTEN
    assert node_ws["inventory"]["unmatched"] == ["/dev/ttyACM*"]
    assert node_ws["inventory"]["closest"][0].startswith("/dev/ttyUSB0 (0403:6001")
    assert node_ws["inventory"]["loses"] == ["/dev/ttyUSB0"] and node_ws["inventory"]["servingNow"] == 1
    assert doc_json["items"][0]["nodes"][0]["inventory"] is None
    assert yaml.safe_load(output.plan([plan], "yaml")) == doc_json


def test_a_good_glob_names_the_device_files_it_would_match_and_gain(workstation: tuple[Path, Any]) -> None:
    _root, doc = workstation
    before, after = prof(globs("/dev/ttyUSB*")), prof(globs("/dev/ttyUSB*", "/dev/video*"))
    plan = profile_plan(
        before,
        after,
        "configured",
        [node("ws")],
        [report("ws", {"ttyUSB0": []})],
        inventory_of={"ws": doc}.get,
    )
    assert not plan.loses
    (ws,) = plan.nodes
    assert ws.inventory is not None and [e.name for e in ws.inventory.matched] == [
        "/dev/ttyUSB0",
        "/dev/video0",
    ]
    assert ws.gains == ["/dev/video0"] and ws.drops == []
    assert not ws.unknown  # the inventory answered what only the node could before
    text = output.plan([plan], None)
    assert "matches /dev/ttyUSB0, /dev/video0; gains /dev/video0; loses nothing" in text


def test_a_newly_selected_node_says_what_it_would_serve(workstation: tuple[Path, Any]) -> None:
    _root, doc = workstation
    after = prof(globs("/dev/ttyUSB*"))
    np = node_plan(None, after, node("ws"), None, inventory_of={"ws": doc}.get)
    assert np.gains == ["/dev/ttyUSB0"] and not np.unknown


def test_a_usb_filter_change_loses_what_the_inventory_lists_and_the_filter_no_longer_matches(
    workstation: tuple[Path, Any],
) -> None:
    _root, doc = workstation
    before = prof({"usb": {"vendor": "0403", "product": "6001"}})
    after = prof({"usb": {"vendor": "0403", "product": "6015"}})
    rep = report("ws", {"usb-1-2": ["apps/modem"]})
    # Without the inventory, only the node could tell: nothing counted as lost.
    blind = node_plan(before, after, node("ws"), rep)
    assert not blind.lost and blind.unknown == ["what the new usb filter finds: known once the node runs it"]
    np = node_plan(before, after, node("ws"), rep, inventory_of={"ws": doc}.get)
    assert [(lo.device, lo.holders) for lo in np.lost] == [("usb-1-2", ["apps/modem"])]
    assert "the node's inventory" in np.lost[0].reason and not np.unknown
    text = output.node_inventory_text(np)
    assert (
        "the filter usb 0403:6015 matches nothing; the node has usb-1-2 (0403:6001 FTDI FT232R USB UART"
        in text
    )


def test_a_summarised_inventory_says_so(tmp_path: Path) -> None:
    hw = FakeHardware(tmp_path / "big")
    fakemachines.many_ttys(hw, 20)
    for i in range(20):
        hw.add_dev(f"/dev/ttyMI{i}")
    doc = inv(tmp_path / "big", "big", {}, max_entries=5)
    assert doc["omitted"]
    np = node_plan(prof(globs("/dev/ttyS*")), prof(globs("/dev/ttyMI*")), node("big"), report("big", {}),
                   inventory_of={"big": doc}.get)  # fmt: skip
    assert np.inventory is not None and np.inventory.summarised and len(np.inventory.matched) == 5
    assert "summarised: not all device nodes listed" in output.node_inventory_text(np)
    assert np.inventory_dict()["summarised"] is True  # type: ignore[index]


class Gets:
    """A stand-in for the API: GETs answered by path, LISTs by path (what each asked recorded)."""

    def __init__(self, objects: dict[str, Any]) -> None:
        self.objects, self.asked = objects, []  # type: ignore[var-annotated]

    def get(self, path: str) -> Any:
        self.asked.append(path)
        return self.objects.get(path)

    def list(self, path: str, label_selector: str = "", field_selector: str = "") -> list[Any]:
        return []


def test_why_profile_node_says_which_inventory_entries_come_closest(workstation: tuple[Path, Any]) -> None:
    _root, doc = workstation
    ns = "patchbay-system"
    profile = prof(globs("/dev/ttyACM*"))
    profile["status"] = {"problems": [{"node": "ws", "reason": "NoDevices", "message": "no devices"}]}
    fake = Gets(
        {
            kube.profile_path("serial"): profile,
            kube.node_path("ws"): node("ws"),
            f"{kube.reports_path(ns)}/serial.ws": report("ws", {}),
            f"{kube.INVENTORIES}/ws": doc,
        }
    )
    for named in ("ws", None):  # why serial ws; why serial (the nodes that report no devices)
        args = argparse.Namespace(
            profile="serial", node=named, output=None, namespace=ns, all_namespaces=False
        )
        text = cli.cmd_why(fake, args)  # type: ignore[arg-type]
        print(text)
        line = next(x for x in text.splitlines() if x.startswith("  ws: "))
        assert line.startswith(f"  ws: serves 0 devices; from the node's inventory (written at {WRITTEN}): ")
        assert NOTHING in line
    args = argparse.Namespace(profile="serial", node="ws", output="json", namespace=ns, all_namespaces=False)
    (found,) = json.loads(cli.cmd_why(fake, args))["nodeInventories"]  # type: ignore[arg-type]
    assert found["serving"] == 0 and found["inventory"]["matchesNothing"] is True
    assert found["inventory"]["closest"][0].startswith("/dev/ttyUSB0 (0403:6001 FTDI FT232R USB UART)")
    no_inventory = diagnosis.node_inventory(profile, node("ws"), report("ws", {}), None)
    assert no_inventory["inventory"] is None and "not known" in no_inventory["text"]
    elsewhere = {"metadata": {"name": "other", "labels": {}}}
    unselected = diagnosis.node_inventory(profile, elsewhere, None, doc)
    assert unselected["inventory"] is None and unselected["text"].startswith("not selected: ")


def test_what_comes_closest_to_a_glob_that_matches_nothing(tmp_path: Path) -> None:
    hw = fakemachines.workstation(tmp_path / "ws")
    fakemachines.many_ttys(hw, 2)  # ttyMI0, ttyMI1 of a PCI serial card
    for i in range(2):
        hw.add_dev(f"/dev/ttyMI{i}")
    doc = inv(tmp_path / "ws", "ws", {})
    files = inventory.device_files(doc)
    assert files["/dev/ttyUSB0"] == "0403:6001 FTDI FT232R USB UART"
    assert files["/dev/ttyMI0"].startswith("tty, PCI 13fe:1680")
    made = PhysicalDevice("e2e_ttyE2E0", ("/dev/e2e/ttyE2E0",), ("/dev/e2e/ttyE2E0",))
    served = inventory.device_files(inv(tmp_path / "ws", "ws", {"serial": [made]}))
    assert served["/dev/e2e/ttyE2E0"] == "served by serial"  # a file no sysfs class lists
    # The glob's folder first, the longest common start first, USB devices' files, then PCI's.
    (video,) = inventory.closest_files("/dev/video9*", files)  # only the files named like it
    assert video.startswith("/dev/video0 (046d:082d")
    assert [c.split()[0] for c in inventory.closest_files("/dev/ttyACM*", files)] == [
        "/dev/ttyUSB0",
        "/dev/ttyMI0",
        "/dev/ttyMI1",
    ]
    # Nothing named like it in its folder: the folder's files, USB devices' first.
    assert [c.split()[0] for c in inventory.closest_files("/dev/nothing*", files)][:2] == [
        "/dev/ttyUSB0",
        "/dev/video0",
    ]
    # A folder the inventory has nothing in: a file elsewhere named as the glob starts.
    assert inventory.closest_files("/dev/serial/by-id/ttyUSB*", files)[0].startswith("/dev/ttyUSB0 ")
    assert inventory.closest_files("/dev/e2e/nothing*", files) == []
    m = inventory.match(globs("/dev/e2e/nothing*"), doc)
    assert m is not None
    assert inventory.nothing_text(m).endswith("; nothing in its folder, nor a file named like it")
