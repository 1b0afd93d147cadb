"""The kubelet's ListAndWatch streams of this agent, and what they say about our registrations.

The kubelet keeps one ListAndWatch stream per registration and, when that stream fails, forgets
the plugin without telling it (registration.py's module doc has the rules). So the registrar
judges each registration by its stream: did the kubelet open it within a grace, is it still
open, did it end while the same kubelet stayed (a drop)? `StreamWatch` is that bookkeeping, in a
part of its own: the servicer tells it when a stream opens and closes (`stream_opened`,
`stream_closed`, the counts), the registrar tells it when it registers (`registering`,
`registered`) and asks it for a verdict (`judge`, `lost`). Both are given the same `StreamWatch`
when they are built, so neither needs the other first; `wake` is the registrar's wake-up, set by
every stream that opens or ends (and by the registrar's own directory events).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from patchbay_agent.backoff import Backoff

log = logging.getLogger(__name__)

#: After a registration, how long the kubelet may take to open its ListAndWatch stream before a
#: stream that ended (an older one) counts as lost. Streams of a registration the kubelet had
#: already opened count as lost at once.
STREAM_OPEN_GRACE = 1.0
#: The same grace on a kubelet that has dropped us before (one client per resource), where a
#: registration without a stream is most likely a registration dropped before its stream opened:
#: it starts short and doubles per registration in a row whose stream never came (up to
#: STREAM_OPEN_GRACE), so a kubelet that is merely slow is not flooded with registrations.
DROPPING_KUBELET_STREAM_GRACE = 0.1
#: A registration dropped sooner than this after it was made counts as a repeated drop: the next
#: re-registration waits (10 ms, then x4 up to 1 s), so two kubelet clients closing each other in
#: turn cannot make us knock in a tight loop.
QUICK_DROP = 1.0


@dataclass(frozen=True)
class Lost:
    """The stream of our newest registration is gone or never came: `dropped` when it had been
    open (the kubelet dropped us, or went), else it never opened."""

    dropped: bool


class StreamWatch:
    """Counts our ListAndWatch streams and judges the newest registration by them (module doc)."""

    def __init__(self) -> None:
        #: set by every stream that opens or ends: the registrar's loop wakes up and looks
        self.wake = asyncio.Event()
        #: ListAndWatch streams open right now (the kubelet keeps exactly one per registration)
        self.open = 0
        #: ListAndWatch streams ever opened (tells a stream of the newest registration from older)
        self.opened = 0
        #: set once the registrar stops: a stream that ends then is no drop
        self.closing = False
        #: when set, check at this monotonic time whether the kubelet still holds a stream
        self.check_at: float | None = None
        #: `opened` at our newest registration
        self._at_registration = 0
        #: the kubelet dropped the stream of our newest registration (re-register at once)
        self._dropped = False
        #: re-registrations because the kubelet dropped us while it stayed (kubelets < v1.37 do
        #: in every maxSurge rollout)
        self.drops = 0
        self.registered_at = 0.0
        self._drop_backoff = Backoff(initial=0.01, maximum=1.0, factor=4.0)
        #: register no sooner than this (monotonic): the wait after a quick repeated drop
        self.not_before = 0.0
        #: the next registration follows a drop: wait for the kubelet to let go first
        self.after_drop = False
        #: registrations made again because their stream never opened, and how many in a row
        self.unopened = 0
        self._unopened_in_a_row = 0

    def close(self) -> None:
        """The registrar stops (stop seen, or shutdown began): streams that end from now on are
        the agent's own doing, no drop."""
        self.closing = True

    def take_after_drop(self) -> bool:
        """Whether the next registration follows a drop (True once per drop)."""
        after, self.after_drop = self.after_drop, False
        return after

    def stream_opened(self) -> None:
        """The servicer's ListAndWatch began (the registrar then completes a hand-over)."""
        self.open += 1
        self.opened += 1
        self.wake.set()

    def stream_closed(self) -> None:
        """The servicer's ListAndWatch ended: notice a kubelet that dropped us."""
        self.open -= 1
        if self.closing or self.open > 0:
            return  # shutting down, or the kubelet still holds a stream of ours
        if self.opened > self._at_registration:
            # The stream of our newest registration was open and is gone: the kubelet dropped us,
            # or it is gone itself (a restart); the registrar's check tells which.
            self._dropped = True
            self.check_at = time.monotonic()
        elif self.check_at is None:
            # An older registration's stream ended and the newest one's has not opened (yet): the
            # check set at registration decides; this only covers a check already passed.
            self.check_at = time.monotonic() + self.grace()
        self.wake.set()

    @property
    def newest_open(self) -> bool:
        """The kubelet holds the stream of our newest registration."""
        return self.open > 0 and self.opened > self._at_registration

    def grace(self) -> float:
        """How long a new registration's stream may take to open (see the constants)."""
        if self.drops == 0:
            return STREAM_OPEN_GRACE
        return min(STREAM_OPEN_GRACE, DROPPING_KUBELET_STREAM_GRACE * float(2**self._unopened_in_a_row))

    def registering(self) -> None:
        """A Register call is about to go: counted before it, since the kubelet may open the new
        stream before Register returns."""
        self._at_registration = self.opened

    def registered(self) -> float:
        """A registration succeeded: it supersedes streams that ended before it, and its own
        stream is checked for a grace from now; returns that grace."""
        self._dropped = False
        self.registered_at = time.monotonic()
        self.check_at = self.registered_at + self.grace()
        return self.check_at - self.registered_at

    def judge(self, now: float) -> Lost | float | None:
        """The check is due: None when the newest registration's stream is open; seconds to look
        again when only older streams are held (kubelets before v1.37 keep the older client);
        else `Lost`."""
        self.check_at = None
        dropped, self._dropped = self._dropped, False
        if self.newest_open:
            self._unopened_in_a_row = 0
            return None
        if not dropped and self.open > 0:
            # Streams of an earlier registration of ours are still held; the newest
            # registration's stream never came. Look again a grace later; a registration is made
            # again only once none is held.
            self.check_at = now + self.grace()
            return self.grace()
        return Lost(dropped)

    def lost(self, lost: Lost, now: float, resource_name: str) -> None:
        """The kubelet is still there and lost our newest registration's stream: count it, say
        why, and, after a drop that came quickly, wait a little before registering again."""
        if not lost.dropped and self.opened == self._at_registration:
            self.unopened += 1
            self._unopened_in_a_row += 1
            log.warning(
                "The kubelet opened no ListAndWatch stream within %.0f ms of our registration "
                "(dropped before it opened: kubelets before v1.37 can): registering again",
                (now - self.registered_at) * 1000,
            )
        elif lost.dropped:
            self.drops += 1
            self.after_drop = True
            if now - self.registered_at < QUICK_DROP:
                delay = self._drop_backoff.next()
                self.not_before = now + delay
                log.warning(
                    "Dropped again %.0f ms after registering: registering again in %.0f ms",
                    (now - self.registered_at) * 1000,
                    delay * 1000,
                )
            else:
                self._drop_backoff.reset()
                log.warning(
                    "The kubelet dropped our ListAndWatch stream without restarting (kubelets before "
                    "v1.37 do when another plugin process of %s leaves): registering again at once",
                    resource_name,
                )
