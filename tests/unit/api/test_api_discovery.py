"""`patchbay_api.discovery`: the agent's matching rules as pure functions. `glob_matches` must
answer, for one path, what the agent's `glob.glob` over the host root answers for the whole tree;
here both run over the same tree for a spread of patterns (hidden names, nested folders, classes,
ranges, `**` without recursion, literal components)."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

from patchbay_api.discovery import device_id, glob_matches, path_id, pci_matches, usb_matches

FILES = [
    "/dev/ttyUSB0",
    "/dev/ttyUSB1",
    "/dev/ttyACM0",
    "/dev/ttyS0",
    "/dev/.hidden0",
    "/dev/serial/by-id/usb-FTDI_FT232R-if00-port0",
    "/dev/serial/by-id/.tmp",
    "/dev/dri/renderD128",
    "/dev/dri/card0",
    "/dev/e2e/ttyE2E0",
    "/dev/e2e/sub/ttyE2E9",
    "/dev/video0",
    "/dev/bus/usb/001/005",
]
PATTERNS = [
    "/dev/ttyUSB*",
    "/dev/tty*",
    "/dev/tty[AU]*",
    "/dev/tty[!S]*",
    "/dev/ttyUSB?",
    "/dev/*",
    "/dev/.*",
    "/dev/*/*",
    "/dev/**",
    "/dev/**/tty*",
    "/dev/serial/by-id/*",
    "/dev/serial/by-id/.*",
    "/dev/*/by-id/usb-*",
    "/dev/dri/renderD*",
    "/dev/e2e/ttyE2E0",
    "/dev/e2e/*",
    "/dev/e2e/nothing*",
    "/dev/bus/usb/*/*",
    "/dev/ttyS0",
    "/dev//ttyUSB*",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_glob_matches_answers_as_glob_glob_does_on_a_tree(tmp_path: Path, pattern: str) -> None:
    for f in FILES:
        p = tmp_path / f.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"")
    root = str(tmp_path)
    # The agent's HostRoot.glob: the pattern under the escaped root, files only (PathsBackend).
    by_glob = {
        "/" + str(Path(m).relative_to(root))
        for m in glob.glob(glob.escape(root) + "/" + pattern.lstrip("/"))
        if not Path(m).is_dir()
    }
    assert {f for f in FILES if glob_matches(pattern, f)} == by_glob


def test_ids_and_filters() -> None:
    assert path_id("/dev/serial/by-id/usb-FTDI-if00") == "serial_by-id_usb-FTDI-if00"
    assert len(device_id("x" * 100)) == 63
    sysfs = {"vendor": "0x10DE", "device": "0x2330", "class": "0x030200"}.get
    inventory = {"vendor": "10de", "device": "2330", "class": "030200"}.get
    for read in (sysfs, inventory):
        assert pci_matches("10de", None, "0x0302", read)
        assert pci_matches("10de", "2330", None, read)
        assert not pci_matches("10de", None, "0x0300", read)
        assert not pci_matches("8086", None, None, read)
    usb = {"idVendor": "0403", "idProduct": "6001", "serial": "A9XYZ"}.get
    assert usb_matches("0403", "6001", None, usb) and usb_matches("0403", None, "A9XYZ", usb)
    assert not usb_matches("0403", "6015", None, usb) and not usb_matches("0403", None, "other", usb)
