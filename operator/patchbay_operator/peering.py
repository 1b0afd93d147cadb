"""Which replica works when several run with kopf peering (pure).

kopf pauses a peered replica's handlers while a live peer has a higher (or the same) priority,
but the operator's node work does not go through kopf: the node informer, the patch workers and
the status writer would go on in a paused replica, with a profile registry that kopf no longer
updates (a paused replica could push an old capacity back onto nodes against the active one).
So the controller applies kopf's own rule to the same ``ClusterKopfPeering`` object:

- every peer writes ``status.<identity> = {priority, lifetime, lastseen}`` as a keep-alive;
- a peer is dead once ``lastseen + lifetime`` has passed;
- this replica waits while any OTHER live peer has a priority greater than or equal to its own
  (kopf freezes every replica on a tie, so replicas need distinct priorities;
  docs/facts.md#kopf-api-writes).

``blockers`` is that rule, pure; ``Gate`` applies it every few seconds to the object as read by
the function it is given, and tells the controller when to stop and start writing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from patchbay_operator.timestamps import parse_rfc3339

log = logging.getLogger(__name__)

DEFAULT_LIFETIME = 60
"""Seconds kopf assumes for a peer whose record names no lifetime."""

EXPIRY_MARGIN = 0.05
"""Seconds past a blocking peer's expiry at which a waiting replica looks again."""


@dataclass(frozen=True)
class Peering:
    """This replica in a peering: the object's name, the identity it gives kopf, its priority."""

    name: str
    identity: str
    priority: int


def _live_blockers(
    status: Mapping[str, Any] | None, me: Peering, now: datetime
) -> list[tuple[str, datetime]]:
    """Each live peer this replica must wait for, as (``identity(priority)``, when its record
    expires). A malformed record is ignored, as kopf cannot have written it; a record without
    ``lastseen`` counts as seen just now (kopf's reading too)."""
    waiting: list[tuple[str, datetime]] = []
    for identity, record in (status or {}).items():
        if identity == me.identity or not isinstance(record, Mapping):
            continue
        try:
            priority = int(record.get("priority", 0))
            lifetime = int(record.get("lifetime", DEFAULT_LIFETIME))
        except (TypeError, ValueError):
            continue
        seen = parse_rfc3339(record.get("lastseen")) if "lastseen" in record else now
        if seen is None:
            continue
        if seen.tzinfo is None:
            seen = seen.replace(tzinfo=now.tzinfo)
        expires = seen + timedelta(seconds=lifetime)
        if expires <= now:
            continue  # dead: kopf cleans it up
        if priority >= me.priority:
            waiting.append((f"{identity}({priority})", expires))
    return waiting


def blockers(status: Mapping[str, Any] | None, me: Peering, now: datetime) -> list[str]:
    """The live peers this replica must wait for (empty: it works), as ``identity(priority)``."""
    return sorted(name for name, _ in _live_blockers(status, me, now))


def next_expiry(status: Mapping[str, Any] | None, me: Peering, now: datetime) -> float | None:
    """Seconds until the first of the peers this replica waits for expires (None: it waits for
    none). A leader killed without a clean exit stops renewing its record; the standby should
    look again right then, not at its next regular turn."""
    deadlines = [expires for _, expires in _live_blockers(status, me, now)]
    return (min(deadlines) - now).total_seconds() if deadlines else None


class Gate:
    """Whether this replica may write, decided from the peering object every ``every`` seconds.

    A peered replica starts waiting, as kopf starts it paused. ``on_wait`` runs when it must stop
    writing; ``on_work`` (awaited) before it writes again: the controller re-lists the profiles
    then, because kopf delivered nothing while this replica waited. An unreadable object changes
    nothing (the last decision stands). A waiting replica looks again when the record it waits
    for would expire (``next_expiry``), so a dead leader's standby takes over at once, not up to
    ``every`` seconds later. A take-over that raises stands by again (``on_wait``) and is tried
    again at the next look: it never ends the loop.
    """

    def __init__(
        self,
        me: Peering,
        read: Callable[[], Awaitable[Mapping[str, Any] | None]],
        on_wait: Callable[[], None],
        on_work: Callable[[], Awaitable[None]],
        every: float = 2.0,
    ) -> None:
        self.me, self.every = me, every
        self._read, self._on_wait, self._on_work = read, on_wait, on_work
        #: set while this replica works: `active`, and what a kopf handler waits on (`until_working`)
        self._working = asyncio.Event()
        self._decided = False
        #: one decision at a time: two at once (the loop's and a caller's) could both take over
        self._deciding = asyncio.Lock()
        #: seconds until the next look: ``every``, or sooner when a peer's record expires sooner
        self.pause = every

    async def step(self) -> None:
        """One decision; a second caller waits for the first's to end, then makes its own."""
        async with self._deciding:
            await self._step()

    async def _step(self) -> None:
        self.pause = self.every
        try:
            obj = await self._read()
        except Exception as e:  # the object's reader may fail in any way: keep the last decision
            log.warning("Reading ClusterKopfPeering %s failed: %s", self.me.name, e)
            return
        now = datetime.now(UTC)
        status = (obj or {}).get("status")
        waiting = blockers(status, self.me, now)
        expiry = next_expiry(status, self.me, now)
        if expiry is not None:
            # just past the expiry (kopf's own reading of "dead" is ``deadline <= now``)
            self.pause = min(self.every, expiry + EXPIRY_MARGIN)
        if waiting and (self.active or not self._decided):
            self._working.clear()
            self._on_wait()
            log.info("Waiting: live peers with priority >= %d: %s", self.me.priority, ", ".join(waiting))
        elif not waiting and not self.active:
            try:
                await self._on_work()
            except Exception:
                # A take-over that failed half way (its LIST refused, a computation that raised)
                # must not end this loop: the replica would never work again, with the leader gone.
                self._on_wait()
                log.exception("Taking over failed; standing by, and trying again in %g s", self.every)
                return
            self._working.set()
            log.info("Working: no live peer has priority >= %d", self.me.priority)
        self._decided = True

    @property
    def active(self) -> bool:
        """Whether this replica works (may write) now."""
        return self._working.is_set()

    async def until_working(self, patience: float) -> bool:
        """Whether this replica works, waiting up to ``patience`` seconds for it to take over.

        kopf resumes a replica's profile handlers on its own reading of the same peering object,
        which can come before this gate's (it looks every ``every`` seconds) and so before the
        take-over has re-listed the profiles and resumed their rollouts from their status: a
        handler that ran then would apply the agents' objects from the standby's stale copy (a
        rollout begun again, its moved nodes put back). The handlers wait here first."""
        if not self.active:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._working.wait(), patience)
        return self.active

    async def run(self) -> None:
        while True:
            try:
                await self.step()
            except Exception:  # whatever it is, the next look may decide: the loop goes on
                log.exception("Deciding whether to work failed")
            await asyncio.sleep(self.pause)


class StandingByError(Exception):
    """A kopf handler ran in a replica that does not work (yet): kopf tries it again later."""


def writes(gate: Gate | None) -> bool:
    """Whether this replica may write now: always without peering, else while its gate is open.
    What the timers do later (a DeviceClass applied again, a DaemonSet nudged, orphan reports
    deleted) asks this first: a waiting replica leaves it to the working one."""
    return gate is None or gate.active
