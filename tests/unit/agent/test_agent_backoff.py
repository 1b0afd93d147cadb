"""How the agent's loops pace themselves: the registrar's retry backoff (the agent's only one) and
the one interruptible sleep the monitor and the registrar share."""

from __future__ import annotations

import asyncio

import pytest

from patchbay_agent.backoff import Backoff
from patchbay_agent.wakeup import wait_any


def test_backoff_doubles_up_to_its_cap_with_jitter_and_resets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("patchbay_agent.backoff.random.uniform", lambda a, b: 1.0)
    b = Backoff(initial=0.1, maximum=1.0)
    assert [b.next() for _ in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    b.reset()
    assert b.next() == pytest.approx(0.1)


def test_backoff_jitter_stays_within_20_percent() -> None:
    b = Backoff(initial=1.0, maximum=1.0)
    delays = [b.next() for _ in range(200)]
    assert all(0.8 <= d <= 1.2 for d in delays)
    assert len(set(delays)) > 1  # agents of one node do not knock in step


def test_wait_any_returns_when_an_event_is_set_or_the_time_is_up() -> None:
    async def scenario() -> None:
        first, second = asyncio.Event(), asyncio.Event()
        asyncio.get_running_loop().call_later(0.05, second.set)
        # An hour-long sleep that the event ends (wait_for would raise if it did not).
        await asyncio.wait_for(wait_any((first, second), 3600), timeout=10)
        assert second.is_set()

        # Already set: at once. Nothing set: the time runs out, without TimeoutError.
        await asyncio.wait_for(wait_any((second,), 3600), timeout=10)
        await wait_any((first,), 0.01)
        await wait_any((first,), -1.0)
        assert not first.is_set()

        # No waiter is left behind on the events.
        await asyncio.sleep(0)
        current = asyncio.current_task()
        assert [t for t in asyncio.all_tasks() if t is not current] == []

    asyncio.run(scenario())
