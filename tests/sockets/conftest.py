"""Fixtures for the agent's tests: short temporary directories (Unix socket paths must stay under
108 bytes, pytest's tmp_path is too long for a socket name plus a resource name) and a fake
hardware tree."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.fakehw import FakeHardware


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="pb", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def plugin_dir(short_dir: Path) -> Path:
    d = short_dir / "dp"
    d.mkdir()
    return d


@pytest.fixture
def hw(short_dir: Path) -> FakeHardware:
    return FakeHardware(short_dir / "host")
