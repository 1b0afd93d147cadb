"""The operator's keyed timers (scheduler.py): at most one per key, KEEP and REPLACE, cancel, and
actions that are coroutines (kept as tasks, cancelled by close). No test asserts a timing: long
delays stand for "not by now", zero delays for "at once"."""

from __future__ import annotations

import asyncio
import logging

import pytest
from support.converge import until

from patchbay_operator.scheduler import OnPending, Timers

LATER = 60.0
"""A delay no test waits for: the timer is still pending when the test looks."""


async def test_keep_lets_the_pending_timer_stand_however_often_it_is_asked_for() -> None:
    fired: list[str] = []
    timers: Timers[str] = Timers(OnPending.KEEP)
    assert timers.schedule("p", 0.0, lambda: fired.append("first"))
    assert not timers.schedule("p", 0.0, lambda: fired.append("second"))
    assert "p" in timers and len(timers) == 1
    await until(lambda: fired)
    await asyncio.sleep(0.02)
    assert fired == ["first"]
    assert "p" not in timers
    # Fired: the key is free, the next request is a timer of its own.
    assert timers.schedule("p", 0.0, lambda: fired.append("third"))
    await until(lambda: len(fired) == 2)
    assert fired == ["first", "third"]


async def test_keep_never_postpones_a_pending_timer() -> None:
    fired: list[str] = []
    timers: Timers[str] = Timers(OnPending.KEEP)
    timers.schedule("p", 0.0, lambda: fired.append("soon"))
    timers.schedule("p", LATER, lambda: fired.append("late"))
    await until(lambda: fired == ["soon"])
    await timers.close()


async def test_replace_runs_only_the_latest_request_earlier_or_later() -> None:
    fired: list[str] = []
    timers: Timers[str] = Timers(OnPending.REPLACE)
    timers.schedule("p", 0.0, lambda: fired.append("soon"))
    assert timers.schedule("p", LATER, lambda: fired.append("late"))  # later wins over sooner
    await asyncio.sleep(0.02)
    assert fired == [] and "p" in timers
    assert timers.schedule("p", 0.0, lambda: fired.append("now"))  # and earlier over later
    await until(lambda: fired)
    await asyncio.sleep(0.02)
    assert fired == ["now"]


async def test_keys_are_independent_and_cancel_drops_one() -> None:
    fired: list[str] = []
    timers: Timers[str] = Timers(OnPending.KEEP)
    timers.schedule("a", 0.0, lambda: fired.append("a"))
    timers.schedule("b", 0.0, lambda: fired.append("b"))
    timers.cancel("a")
    timers.cancel("unknown")  # nothing pending: nothing to do
    await until(lambda: fired)
    await asyncio.sleep(0.02)
    assert fired == ["b"]


async def test_a_coroutine_action_runs_as_a_task_and_close_cancels_it_and_the_pending_timers() -> None:
    started, ended = asyncio.Event(), []

    async def slow() -> None:
        started.set()
        await asyncio.sleep(LATER)
        ended.append("done")

    fired: list[str] = []
    timers: Timers[str] = Timers(OnPending.REPLACE)
    timers.schedule("slow", 0.0, slow)
    timers.schedule("later", LATER, lambda: fired.append("later"))
    await asyncio.wait_for(started.wait(), 5)
    assert "slow" not in timers  # fired: its task runs on its own
    await timers.close()
    assert len(timers) == 0
    assert ended == [] and fired == []


async def test_a_failing_action_is_logged_and_later_timers_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fired: list[str] = []

    def broken() -> None:
        raise RuntimeError("broken action")

    async def broken_task() -> None:
        raise RuntimeError("broken task")

    timers: Timers[str] = Timers(OnPending.KEEP)
    with caplog.at_level(logging.ERROR, logger="patchbay_operator.scheduler"):
        timers.schedule("a", 0.0, broken)
        timers.schedule("b", 0.0, broken_task)
        timers.schedule("c", 0.0, lambda: fired.append("c"))
        await until(lambda: fired and len(caplog.records) == 2)
    assert {str(r.exc_info[1]) for r in caplog.records if r.exc_info} == {"broken action", "broken task"}
