"""Waiting on the test's event loop for something to become true (bounded, polled every 10 ms)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
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
