"""The agent loops' one way to sleep: until a deadline, or earlier when woken.

The monitor (health period) and the registrar (poll backstop, retry delays from
`registration.Backoff`) both sleep like this: an inotify event, a closed stream or SIGTERM sets an
`asyncio.Event` and the loop runs at once instead of a period later.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


async def wait_any(events: Iterable[asyncio.Event], seconds: float) -> None:
    """Return as soon as one of `events` is set, or after `seconds` (at once when that is not
    positive). Never raises TimeoutError and leaves no waiter behind."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=max(0.0, seconds), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
