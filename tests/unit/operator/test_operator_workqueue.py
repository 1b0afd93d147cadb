"""The work queue alone: one holder per key, nothing lost mid-work, retries, pause."""

from __future__ import annotations

import asyncio

from patchbay_operator.workqueue import WorkQueue


async def test_a_burst_of_adds_is_one_unit_of_work() -> None:
    q: WorkQueue[str] = WorkQueue()
    for _ in range(5):
        q.add("a")
    q.add("b")
    assert len(q) == 2
    assert {await q.get(), await q.get()} == {"a", "b"}
    q.done("a")
    q.done("b")
    await asyncio.wait_for(q.wait_idle(), 1)
    assert len(q) == 0


async def test_an_add_while_held_is_queued_again_when_done_never_twice_at_once() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    held = await q.get()
    q.add("a")  # a change arrived while a worker holds "a"
    assert q._queue.empty()  # not handed to a second worker meanwhile
    q.done(held)
    assert await asyncio.wait_for(q.get(), 1) == "a"
    q.done("a")
    await asyncio.wait_for(q.wait_idle(), 1)


async def test_idle_waits_for_held_keys_and_add_after_retries() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    key = await q.get()
    idle = asyncio.ensure_future(q.wait_idle())
    await asyncio.sleep(0.01)
    assert not idle.done()
    q.add_after(key, 0.05)
    q.done(key)
    await asyncio.wait_for(idle, 1)
    assert await asyncio.wait_for(q.get(), 1) == "a"  # the retry


async def test_pause_drops_waiting_keys_and_refuses_adds_until_resumed() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.pause()
    q.add("b")
    assert q.paused
    assert len(q) == 0
    await asyncio.wait_for(q.wait_idle(), 1)
    q.resume()
    q.add("c")
    assert await asyncio.wait_for(q.get(), 1) == "c"
