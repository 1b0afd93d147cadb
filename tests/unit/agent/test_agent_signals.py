"""What the agent process does with SIGTERM/SIGINT (`patchbay_agent.main._stop_on_signals`), with real
signals sent to this process: with a successor check (`successor.py`), the first signal runs it
while `stop` stays unset, and `stop` is set when it ends, however it ends; a second signal stops at
once; the last-resort exit is armed with the check's time added. The check itself is tested on
the real API server (tests/integration/agent/test_agent_successor_on_the_api_server.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from typing import Any

import pytest

from patchbay_agent import main


@pytest.fixture
def timers(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The last-resort exits armed (their delay); none ever fires here."""
    armed: list[float] = []

    class Timer:
        def __init__(self, after: float, *_: Any, **__: Any) -> None:
            armed.append(after)
            self.daemon = True

        def start(self) -> None:
            pass

    monkeypatch.setattr(threading, "Timer", Timer)
    return armed


async def _signal_until(stop: asyncio.Event, event: asyncio.Event) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(event.wait(), 5)


def test_without_a_check_the_signal_stops_at_once(timers: list[float]) -> None:
    async def scenario() -> None:
        stop = asyncio.Event()
        main._stop_on_signals(stop, 5.0)
        await _signal_until(stop, stop)

    asyncio.run(scenario())
    assert timers == [5.0 + main.HARD_EXIT_MARGIN]


def test_the_check_runs_first_and_stop_follows_it(timers: list[float]) -> None:
    async def scenario() -> None:
        stop, started, release = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def check() -> str:
            started.set()
            await release.wait()
            return "successor x Ready after 0.10s: stopping now"

        main._stop_on_signals(stop, 5.0, check, 10.0)
        await _signal_until(stop, started)
        await asyncio.sleep(0.2)
        assert not stop.is_set()  # still serving while the check waits
        release.set()
        await asyncio.wait_for(stop.wait(), 5)

    asyncio.run(scenario())
    assert timers == [5.0 + main.HARD_EXIT_MARGIN + 10.0 + main.LIST_TIMEOUT]


def test_a_second_signal_stops_at_once(timers: list[float]) -> None:
    async def scenario() -> None:
        stop, started = asyncio.Event(), asyncio.Event()

        async def check() -> str:
            started.set()
            await asyncio.sleep(60)
            return "never"

        main._stop_on_signals(stop, 5.0, check, 10.0)
        await _signal_until(stop, started)
        await _signal_until(stop, stop)

    asyncio.run(scenario())
    assert len(timers) == 1


@pytest.mark.parametrize("outcome", ["raises", "overruns"])
def test_a_check_that_fails_or_overruns_still_stops(timers: list[float], outcome: str) -> None:
    async def scenario() -> None:
        stop = asyncio.Event()

        async def check() -> str:
            if outcome == "raises":
                raise RuntimeError("the API server said no")
            await asyncio.sleep(60)
            return "never"

        # bound = wait + LIST_TIMEOUT: a wait of -LIST_TIMEOUT + 0.2 gives the check 0.2 s
        main._stop_on_signals(stop, 5.0, check, 0.2 - main.LIST_TIMEOUT)
        await _signal_until(stop, stop)

    asyncio.run(scenario())
