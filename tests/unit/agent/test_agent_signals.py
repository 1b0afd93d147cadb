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

        main._stop_on_signals(stop, 5.0, main.Leaving(check, 10.0))
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

        main._stop_on_signals(stop, 5.0, main.Leaving(check, 10.0))
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
        main._stop_on_signals(stop, 5.0, main.Leaving(check, 0.2 - main.LIST_TIMEOUT))
        await _signal_until(stop, stop)

    asyncio.run(scenario())


@pytest.fixture
def handlers() -> Any:
    """SIGTERM/SIGINT's handlers and the remembered signals as they were before the test."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        main._early_signals.clear()


def test_a_signal_before_the_loop_takes_them_is_remembered_and_counts_as_the_first(
    timers: list[float], handlers: None
) -> None:
    """PID 1 of a container drops a signal it has no handler for: `main` sets one first, and the
    loop acts on what it remembered as soon as it takes the signals over (the check runs first)."""
    main._remember_signals()
    os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before os.kill returns to this frame
    assert main._early_signals == [signal.SIGTERM]
    ran: list[str] = []

    async def scenario() -> None:
        stop = asyncio.Event()

        async def check() -> str:
            ran.append("check")
            return "no successor on this node: stopping now"

        main._stop_on_signals(stop, 5.0, main.Leaving(check, 10.0))
        await asyncio.wait_for(stop.wait(), 5)

    asyncio.run(scenario())
    assert ran == ["check"]
    assert main._early_signals == []
    assert timers == [5.0 + main.HARD_EXIT_MARGIN + 10.0 + main.LIST_TIMEOUT]


@pytest.mark.parametrize("found", ["deleted", "not deleted", "not known"])
def test_the_pod_found_being_deleted_at_start_counts_as_the_first_signal(
    timers: list[float], found: str
) -> None:
    """`Leaving.deleted` True: the successor check runs and `stop` follows, with no signal sent;
    False, or the question failing: the agent serves on (a signal still stops it)."""

    async def scenario() -> bool:
        stop = asyncio.Event()

        async def check() -> str:
            return "successor x is Ready: stopping now"

        async def deleted() -> bool:
            if found == "not known":
                raise OSError("connection refused")
            return found == "deleted"

        main._stop_on_signals(stop, 5.0, main.Leaving(check, 10.0, deleted))
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except TimeoutError:
            return False
        return True

    assert asyncio.run(scenario()) is (found == "deleted")
    assert len(timers) == (1 if found == "deleted" else 0)
