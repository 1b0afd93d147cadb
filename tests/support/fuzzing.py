"""What the fuzz suites (tests/fuzz) share: an asyncio loop in a thread, so Hypothesis can drive a
long-lived agent with blocking calls; the tally of what was tried (printed by
tests/fuzz/conftest.py at the end of the run); and `PROVE`, the settings under which each suite
runs its fuzzer once more against an agent broken on purpose, to show that its judge fails."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Coroutine
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, settings

T = TypeVar("T")

#: A fuzzer run against an agent broken on purpose: the judge must fail it. Few examples, the same
#: ones every run (derandomized, no example database) and no shrinking: the first failure is the
#: proof, so the run stays short and fails the same way in CI as here.
PROVE = settings(
    max_examples=50,
    derandomize=True,
    database=None,
    phases=[Phase.generate],
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

#: surface -> what happened to its inputs: tried, and how they were answered
TALLY: dict[str, Counter[str]] = {}


def tally(surface: str, outcome: str) -> None:
    counts = TALLY.setdefault(surface, Counter())
    counts["tried"] += 1
    counts[outcome] += 1


class LoopThread:
    """An asyncio loop in a daemon thread; `run` a coroutine on it and wait for the result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
