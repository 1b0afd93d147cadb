"""The one change-writer loop: keep objects on the API server equal to what the agent knows,
writing only when they changed, coalesced, retried with backoff, never in the way.

Three writers use it: the DeviceReport (`report/reporter.py`), the ResourceSlices
(`dra/slicepublisher.py`) and the claims' `status.devices` (`dra/claimstatus.py`). It is a leaf
module so that the DRA front-end's writers (below `report/` in the layers) share it too.
`notify()` is all the rest of the agent does (subscribed to the device snapshots and the holders).
The loop then lets the changes settle (`settle()`: `coalesce` seconds by default, so changes that
come together, a device and its replicas, a burst of udev events, land in one write; the claim
status writer waits until prepare calls are quiet instead) and calls the writer's `sync()`, which
builds the object, compares it with the last one written and writes only when it differs. A
failed write calls `failed()`, which schedules the retry with the agent's one backoff rhythm;
changes that arrive meanwhile go into that retry. With `resync`, `check()` runs that often (the
slices: does the API server keep device taints now?). Nothing here raises into the agent: a bug in
building is logged and retried later.

With a `watch` (`ownwatch.OwnWatch`, the writer's own objects on the API server), every event goes
to this loop, which hands it to `seen()` between writes, never during one (an event may arrive
before the answer to the write that caused it): `seen()` says whether it may be someone else's
deletion or edit (an event of the writer's own write is not), and if so `verify()` compares the
server's state with the writer's last write and repairs what it must (writes again). Nothing is
written when nothing changes: the watch is the only request of a quiet writer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from patchbay_agent.backoff import Backoff
from patchbay_agent.ownwatch import OwnWatch
from patchbay_agent.wakeup import wait_any

log = logging.getLogger(__name__)

#: Changes within this many seconds become one write.
COALESCE_SECONDS = 0.5
#: Retry rhythm of failed writes: a missing CRD on 1,000 nodes must not become a request storm.
BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 120.0
#: Watch events kept while the loop is busy; more are taken as one that calls for a look.
_MAX_EVENTS = 64
#: How long the loop sleeps when nothing happens and no resync is asked for.
_IDLE = 3600.0


class ChangeWriter:
    """The loop; subclasses implement `sync()` (and `check()` with `resync`)."""

    #: what is written, for log messages ("DeviceReport ns/name")
    what = "object"

    def __init__(
        self,
        *,
        coalesce: float = COALESCE_SECONDS,
        backoff: Backoff | None = None,
        resync: float | None = None,
        watch: OwnWatch | None = None,
    ) -> None:
        self._coalesce = coalesce
        self._watch = watch
        #: watch events not looked at yet, and set when there are
        self._events: list[tuple[str, dict[str, Any]]] = []
        self._overflow = False
        self._verify = asyncio.Event()
        #: watch events handed to this writer
        self._backoff = backoff or Backoff(BACKOFF_INITIAL, BACKOFF_MAX)
        self._resync = resync
        self._kick = asyncio.Event()
        #: monotonic time of the next retry of a failed write; None when none is due
        self._retry_at: float | None = None
        self.writes = 0
        self.failures = 0
        #: watch events handed to this writer; `verify()` calls done (events not of its own writes)
        self.delivered = 0
        self.verifies = 0

    def notify(self) -> None:
        """What the object shows may have changed: compare (and write) soon."""
        self._kick.set()

    async def sync(self) -> bool:
        """Build, compare, write when different; True when written. Calls `failed()` or
        `succeeded()` after a write attempt."""
        raise NotImplementedError

    async def settle(self, stop: asyncio.Event) -> None:
        """Before a sync: let changes that come together arrive (`coalesce` seconds, or until
        `stop`)."""
        await wait_any((stop,), self._coalesce)

    async def check(self) -> None:
        """Every `resync` seconds: make sure what was written is still there (may `notify()`)."""

    def seen(self, kind: str, obj: dict[str, Any]) -> bool:
        """An event of the watch (`ownwatch`: ADDED, MODIFIED, DELETED or LISTED), looked at
        between writes: True when `verify()` should look (someone else may have deleted or edited
        the object)."""
        return False

    async def verify(self) -> None:
        """After `seen()` said so, between writes: repair what someone else deleted or edited
        (typically by `notify()` with the last write forgotten)."""

    def _deliver(self, kind: str, obj: dict[str, Any]) -> None:
        self.delivered += 1
        if len(self._events) < _MAX_EVENTS:
            self._events.append((kind, obj))
        else:
            # Far behind (a failing write's backoff): forget them, and look anyway.
            self._overflow = True
        self._verify.set()

    def _suspect(self) -> bool:
        """Whether an event not looked at yet calls for `verify()`."""
        events, self._events = self._events, []
        overflow, self._overflow = self._overflow, False
        self._verify.clear()
        try:
            return any([self.seen(kind, obj) for kind, obj in events]) or overflow
        except Exception:
            log.exception("Looking at a watch event of the %s failed", self.what)
            return True

    def hold(self, seconds: float) -> None:
        """Write nothing for `seconds` (a repair paced by `ownwatch.Repairs.pace`); then sync."""
        if seconds > 0:
            self._retry_at = time.monotonic() + seconds
            self._kick.set()

    def failed(self) -> float:
        """A write failed: count it and schedule the retry; returns the delay."""
        self.failures += 1
        delay = self._backoff.next()
        self._retry_at = time.monotonic() + delay
        return delay

    def succeeded(self) -> None:
        """A write (or a comparison that needed none) succeeded: no retry is due."""
        self._backoff.reset()
        self._retry_at = None

    async def run(self, stop: asyncio.Event) -> None:
        """Write the first object, then every change, until `stop` is set; with a watch, repair
        what someone else deleted or edited meanwhile."""
        if self._watch is not None:
            self._watch.start(self._deliver)
        try:
            await self._run(stop)
        finally:
            if self._watch is not None:
                self._watch.stop()

    async def _run(self, stop: asyncio.Event) -> None:
        self._kick.set()
        next_resync = time.monotonic() + (self._resync if self._resync is not None else _IDLE)
        while not stop.is_set():
            until = next_resync if self._retry_at is None else min(self._retry_at, next_resync)
            if self._retry_at is None:
                await wait_any((self._kick, self._verify, stop), until - time.monotonic())
            else:
                # A failed write: changes that arrive meanwhile wait for the retry.
                await wait_any((stop,), until - time.monotonic())
            if stop.is_set():
                break
            if self._verify.is_set() and self._retry_at is None and self._suspect():
                try:
                    await self.verify()
                except Exception:
                    log.exception("Checking the %s on the API server failed", self.what)
                self.verifies += 1
            if time.monotonic() >= next_resync:
                next_resync = time.monotonic() + (self._resync if self._resync is not None else _IDLE)
                if self._resync is not None:
                    await self.check()
            if self._retry_at is not None and time.monotonic() < self._retry_at:
                continue  # a paced repair's hold or a failed write's backoff: not before it ends
            if self._retry_at is None and not self._kick.is_set():
                continue
            await self.settle(stop)
            if stop.is_set():
                break
            self._kick.clear()
            try:
                await self.sync()
            except Exception:
                # A bug in building must not end writing, nor the agent: try again later.
                log.exception("Building the %s failed", self.what)
                self._retry_at = time.monotonic() + self._backoff.next()
