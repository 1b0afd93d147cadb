"""A work queue of keys (node names): each key is worked on by one worker at a time, once per
burst of changes, and can be retried later. No I/O; the controller's workers drain it.

The semantics are client-go's workqueue's, which level-based controllers rely on:

- ``add(key)`` while the key waits does nothing (a burst of events costs one unit of work);
- ``add(key)`` while a worker holds the key marks it dirty: it is queued again when that worker
  calls ``done(key)``, so a change that arrived mid-work is never lost, and two workers never
  hold one key;
- ``add_after(key, delay)`` queues it later (a retry);
- ``wait_idle()`` returns once nothing waits and nothing is held (the operator waits for this
  before it reports a profile's nodes clean);
- ``pause()`` drops what waits and refuses adds until ``resume()`` (a replica that must not
  write); keys held by workers finish.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._waiting: set[K] = set()
        self._held: set[K] = set()
        self._dirty: set[K] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._paused = False

    def __len__(self) -> int:
        """Keys waiting or held."""
        return len(self._waiting | self._held)

    def add(self, key: K) -> None:
        if self._paused:
            return
        if key in self._held:
            self._dirty.add(key)
        elif key not in self._waiting:
            self._waiting.add(key)
            self._idle.clear()
            self._queue.put_nowait(key)

    def add_after(self, key: K, delay: float) -> None:
        asyncio.get_running_loop().call_later(delay, self.add, key)

    async def get(self) -> K:
        """The next key; the caller holds it until ``done(key)``."""
        while True:
            key = await self._queue.get()
            if key in self._waiting:  # not dropped by pause() meanwhile
                self._waiting.discard(key)
                self._held.add(key)
                return key

    def done(self, key: K) -> None:
        self._held.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)
        if not self._waiting and not self._held:
            self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def pause(self) -> None:
        self._paused = True
        self._waiting.clear()
        self._dirty.clear()
        if not self._held:
            self._idle.set()

    def resume(self) -> None:
        self._paused = False

    @property
    def paused(self) -> bool:
        return self._paused
