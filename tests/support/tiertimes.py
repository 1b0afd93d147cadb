"""Where a test session's time went, per tier (the top folder under tests/: unit, sockets, fuzz,
integration, conformance, e2e), printed at the end of the session so that a CI log says it.

A tier's time is the sum of its tests' setup, call and teardown: a session fixture's start is in
the setup of the first test that asks for it and its stop in the teardown of the last test, so a
cluster's start and stop count to the tier that started it. What no test holds (collection, the
session's start) is the rest of the session's wall time. tests/conftest.py registers the hooks.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import PurePosixPath

ORDER = ("unit", "sockets", "fuzz", "integration", "conformance", "e2e")


def tier_of(nodeid: str) -> str:
    """``tests/e2e/test_x.py::test_y`` -> ``e2e``; a node id outside tests/ -> its first folder."""
    parts = PurePosixPath(nodeid.split("::", 1)[0]).parts
    if len(parts) > 2 and parts[0] == "tests":
        return parts[1]
    return parts[0] if len(parts) > 1 else "(top)"


class TierTimes:
    """Seconds and test counts per tier, fed by pytest's reports of each phase of each test."""

    def __init__(self, clock: float | None = None) -> None:
        self.start(clock)

    def start(self, clock: float | None = None) -> None:
        """From zero, the session's wall time counted from ``clock`` (now by default)."""
        self.started = time.monotonic() if clock is None else clock
        self.seconds: dict[str, float] = defaultdict(float)
        self.tests: dict[str, set[str]] = defaultdict(set)

    def add(self, nodeid: str, duration: float) -> None:
        tier = tier_of(nodeid)
        self.seconds[tier] += duration
        self.tests[tier].add(nodeid)

    def lines(self, now: float | None = None) -> list[str]:
        """One line per tier that ran (the suite's order, then any other alphabetically), then the
        rest of the session's wall time and the whole."""
        wall = (time.monotonic() if now is None else now) - self.started
        tiers = [t for t in ORDER if t in self.seconds] + sorted(set(self.seconds) - set(ORDER))
        out = [
            f"{tier:<12} {self.seconds[tier]:8.1f} s  {self.seconds[tier] / 60:6.1f} min  "
            f"{len(self.tests[tier]):5d} tests"
            for tier in tiers
        ]
        rest = wall - sum(self.seconds.values())
        out.append(f"{'(other)':<12} {rest:8.1f} s  {rest / 60:6.1f} min  collection, session start")
        out.append(f"{'(session)':<12} {wall:8.1f} s  {wall / 60:6.1f} min")
        return out
