"""Waiting on the test's event loop for something to become true (bounded, polled every 10 ms);
running a component's ``run(stop)`` loop for the length of a block."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any


async def until(check: Callable[[], Any], within: float = 5.0) -> Any:
    """Poll ``check`` until it returns something true and return that; AssertionError after
    ``within`` seconds."""
    deadline = asyncio.get_running_loop().time() + within
    while asyncio.get_running_loop().time() < deadline:
        if result := check():
            return result
        await asyncio.sleep(0.01)
    raise AssertionError("did not converge")


@contextlib.asynccontextmanager
async def running(
    run: Callable[[asyncio.Event], Awaitable[None]], stop_within: float = 10.0
) -> AsyncIterator[asyncio.Event]:
    """``run(stop)`` as a task on the test's event loop while the block runs (the block gets the
    stop event); at its end the event is set and the task awaited, at most ``stop_within`` s."""
    stop = asyncio.Event()
    task = asyncio.create_task(run(stop))
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, stop_within)
