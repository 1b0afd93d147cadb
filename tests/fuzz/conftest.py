"""The fuzz suites' shared parts: a real agent (or endpoint) running on its own event loop in a
thread, so that Hypothesis can drive it with plain blocking calls, example after example, against
ONE long-lived process state (what a node's agent sees: bad input after bad input, never a fresh
start); and a tally of what was tried, printed at the end of the run (docs/security.md#bad-input)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.fuzzing import TALLY, LoopThread
from support.paths import short_dir


@pytest.fixture(scope="module")
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    try:
        yield lt
    finally:
        lt.close()


@pytest.fixture(scope="module")
def module_dir() -> Iterator[Path]:
    """A directory for Unix sockets (support/paths.py), one per module."""
    with short_dir("pbz") as d:
        yield d


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TALLY:
        return
    terminalreporter.section("bad input tried, per surface")
    for surface, counts in sorted(TALLY.items()):
        rest = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if k != "tried")
        terminalreporter.write_line(f"{surface}: {counts['tried']} tried ({rest})")
