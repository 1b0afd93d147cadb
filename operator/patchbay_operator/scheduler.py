"""The operator's one way to say "look at this again at T": keyed one-shot timers on the event loop;
and its long-running loops, supervised (``Loops``).

Several parts must come back to something later although nothing they watch will tell them: a
pod's trouble that turns stalled (the status is computed again), a DeviceClass the API server
stored without its extendedResourceName (applied again), a DeviceReport of an unknown profile
(deleted after a grace), a DaemonSet whose pods the API server refuses (nudged again). Each keeps
at most one timer per key, and each needs one of two rules when it asks again while a timer is
pending:

- ``OnPending.KEEP``: the pending timer stands, so asking again never postpones it (a grace or a
  retry period runs from the first request, however often the request repeats);
- ``OnPending.REPLACE``: the latest request wins, earlier or later than the pending one, because it
  was computed from newer facts (the pending one may be moot).

An action may be a plain function or return an awaitable: that runs as a task the timers keep,
so ``close`` cancels it with the pending timers and an exception in it is logged, not lost.

A loop (a patch worker, the status writer, the peering gate) ends only when stopped: one that
ends with an error is logged with its traceback and named by ``Loops.failed``, which fails the
operator's liveness probe (handlers.py), so the kubelet restarts an operator that would otherwise
stay up without, say, its status writer.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)
K = TypeVar("K", bound=Hashable)
Action = Callable[[], Awaitable[None] | None]


class OnPending(enum.Enum):
    """What a request for a key does while a timer for that key is pending."""

    KEEP = "keep"
    REPLACE = "replace"


class Timers(Generic[K]):
    """At most one pending timer per key, on the running event loop (see the module doc)."""

    def __init__(self, on_pending: OnPending) -> None:
        self.on_pending = on_pending
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Future[None]] = set()

    def __contains__(self, key: object) -> bool:
        return key in self._timers

    def __len__(self) -> int:
        """Timers pending (not the tasks their actions started)."""
        return len(self._timers)

    def schedule(self, key: K, delay: float, action: Action) -> bool:
        """Run ``action`` in ``delay`` seconds, by ``on_pending``'s rule when ``key`` has a timer
        pending already; whether this request is the one that will run."""
        old = self._timers.get(key)
        if old is not None:
            if self.on_pending is OnPending.KEEP:
                return False
            old.cancel()
        loop = asyncio.get_running_loop()
        self._timers[key] = loop.call_later(max(0.0, delay), self._fire, key, action)
        return True

    def cancel(self, key: K) -> None:
        """Nothing more for ``key`` (a task its action started already goes on)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def _fire(self, key: K, action: Action) -> None:
        # The key is free again before the action runs: what the action asks for is a new timer.
        self._timers.pop(key, None)
        try:
            result = action()
        except Exception:
            log.exception("A timer's action for %s failed", key)
            return
        if result is not None:
            task = asyncio.ensure_future(result)
            self._tasks.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Future[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("A timer's action failed", exc_info=task.exception())

    async def close(self) -> None:
        """Cancel every pending timer and every task an action started, and wait for those."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Loops:
    """The operator's own long-running loops (see the module doc)."""

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[None]] = []
        #: the loops that ended with an error, by name
        self.failed: list[str] = []

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        task.add_done_callback(self._ended)
        self._tasks.append(task)

    def running(self) -> int:
        return sum(not t.done() for t in self._tasks)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        self.failed.append(str(getattr(task.get_coro(), "__qualname__", task.get_name())))
        log.error("The operator's loop %s ended", self.failed[-1], exc_info=task.exception())

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        # each loop's end: cancelled, or its error already logged (`_ended`)
        await asyncio.gather(*self._tasks, return_exceptions=True)
