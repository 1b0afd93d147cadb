"""The fuzz suites' shared parts: a real agent (or endpoint) running on its own event loop in a
thread, so that Hypothesis can drive it with plain blocking calls, example after example, against
ONE long-lived process state (what a node's agent sees: bad input after bad input, never a fresh
start); and a tally of what was tried, printed at the end of the run (docs/security.md#bad-input)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fuzzing import TALLY, LoopThread


@pytest.fixture(scope="module")
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    try:
        yield lt
    finally:
        lt.close()


@pytest.fixture(scope="module")
def module_dir() -> Iterator[Path]:
    """Short (Unix socket paths must stay under 108 bytes), one per module."""
    d = Path(tempfile.mkdtemp(prefix="pbz", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TALLY:
        return
    terminalreporter.section("bad input tried, per surface")
    for surface, counts in sorted(TALLY.items()):
        rest = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if k != "tried")
        terminalreporter.write_line(f"{surface}: {counts['tried']} tried ({rest})")
