"""CDI spec files: content, one file per resource, written only on change, atomically."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from patchbay_agent.cdi import CdiSpecs, spec_document, spec_file_name
from patchbay_agent.core.inventory import DeviceSpec, Snapshot


def _snap(specs: dict[str, list[tuple[str, str]]], perms: str = "rw") -> Snapshot:
    return Snapshot(
        1,
        specs={
            pid: tuple(DeviceSpec(container_path=c, host_path=h, permissions=perms) for c, h in nodes)
            for pid, nodes in specs.items()
        },
    )


def test_spec_names_every_device_with_its_nodes_sorted() -> None:
    snap = _snap(
        {
            "ttyUSB1": [("/dev/ttyUSB1", "/srv/fake/dev/ttyUSB1")],
            "pair": [("/dev/a", "/dev/a"), ("/dev/b", "/dev/b")],
            "no-nodes": [],
        }
    )
    assert spec_document("example.com/serial", snap) == {
        "cdiVersion": "0.5.0",
        "kind": "example.com/serial",
        "devices": [
            {
                "name": "pair",
                "containerEdits": {
                    "deviceNodes": [
                        {"path": "/dev/a", "hostPath": "/dev/a", "permissions": "rw"},
                        {"path": "/dev/b", "hostPath": "/dev/b", "permissions": "rw"},
                    ]
                },
            },
            {
                "name": "ttyUSB1",
                "containerEdits": {
                    "deviceNodes": [
                        {"path": "/dev/ttyUSB1", "hostPath": "/srv/fake/dev/ttyUSB1", "permissions": "rw"}
                    ]
                },
            },
        ],
    }


def test_one_file_per_resource() -> None:
    assert spec_file_name("example.com/serial") == "patchbay_example.com_serial.json"


def test_written_on_change_only_atomically_and_again_when_removed(tmp_path: Path) -> None:
    cdi = CdiSpecs(tmp_path / "cdi", "example.com/serial", "example.com/serial")
    one = _snap({"ttyUSB0": [("/dev/ttyUSB0", "/dev/ttyUSB0")]})
    assert cdi.ensure(one) is True
    assert json.loads(cdi.path.read_text()) == spec_document("example.com/serial", one)
    assert stat.S_IMODE(cdi.path.stat().st_mode) == 0o644
    assert cdi.ensure(one) is False
    two = _snap(
        {"ttyUSB0": [("/dev/ttyUSB0", "/dev/ttyUSB0")], "ttyUSB1": [("/dev/ttyUSB1", "/dev/ttyUSB1")]}
    )
    assert cdi.ensure(two) is True
    assert [d["name"] for d in json.loads(cdi.path.read_text())["devices"]] == ["ttyUSB0", "ttyUSB1"]
    cdi.path.unlink()  # e.g. /var/run emptied by a reboot while the agent ran
    assert cdi.ensure(two) is True
    assert cdi.writes == 3
    # Only the spec itself: no temporary file left behind.
    assert [p.name for p in cdi.directory.iterdir()] == [cdi.path.name]
