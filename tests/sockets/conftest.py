"""Fixtures for the agent's tests on real sockets: the kubelet's device-plugin directory and a fake
hardware tree, both in the test's ``short_dir`` (tests/conftest.py: socket paths stay short)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.fakehw import FakeHardware


@pytest.fixture
def plugin_dir(short_dir: Path) -> Path:
    d = short_dir / "dp"
    d.mkdir()
    return d


@pytest.fixture
def hw(short_dir: Path) -> FakeHardware:
    return FakeHardware(short_dir / "host")
