"""Judging the registration a device-plugin agent stands on, with the kubelet that is there.

Once registered, the registrar (`registration.Registrar`) asks `RegistrationCheck` on every round
what to do: hand over when due (`handover.HandOver`), look at the kubelet's count of our devices
(`KubeletView`: kubelets before 1.37 can lose them while our stream stays open), and judge the
stream of our newest registration (`streams.StreamWatch`): open, still on its way, never opened,
dropped, or gone with the kubelet itself (a restart, not a drop). The answer is when to look
again, or a `Verdict`: register again now, or wait for the next kubelet. Before registering after
a drop it also waits, briefly, until the kubelet has let go of us (`let_go`). The rules are
registration.py's module doc.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import grpc

from patchbay_agent.deviceplugin.handover import HandOver
from patchbay_agent.deviceplugin.streams import Lost, StreamWatch
from patchbay_agent.kubelet.sockets import probe

log = logging.getLogger(__name__)

#: After the kubelet dropped us, how long to wait at most for its PodResources to show none of
#: our devices allocatable (it has run its disconnect) before registering again, and how often to
#: look. The kubelet's disconnect follows the connection close within microseconds; the bound only
#: matters when another endpoint keeps the devices allocatable (v1.37 promotes one).
DROP_SETTLE_TIMEOUT = 0.1
DROP_SETTLE_EVERY = 0.002
#: The deadline of one PodResources read while waiting for the kubelet to let go (within
#: DROP_SETTLE_TIMEOUT), and of one read of the kubelet's view. A look at the view is rare and
#: nothing waits on it, so it may take its time: with the drop path's 50 ms, a busy node (a v1.34.4
#: CI run, builds beside it) read nothing, counted that as "not short", and left the kubelet at 0
#: healthy devices while our stream stayed open.
DROP_SETTLE_READ_TIMEOUT = 0.05
VIEW_READ_TIMEOUT = 2.0

#: After another agent's socket of our resource goes, when to look at the kubelet's view of our
#: devices: once its streams have surely ended and the kubelet acted on that (tens of ms on a
#: quiet node), and again later for a busy one.
VIEW_AFTER_LEAVE = (0.05, 0.3, 1.0, 3.0)
#: After another agent that may hold the kubelet's endpoint of our resource left, how long to wait
#: before registering again (`HandOver.may_hold_the_endpoint`). Its stream ended before its socket
#: went and the kubelet looks for a client to close within microseconds of that end; were our
#: Register to land before that look, the leaver's end would close OUR new client (a drop).
LEAVE_SETTLE = 0.05
#: A view found short is looked at again this much later before it counts (our own list may be on
#: its way to the kubelet).
VIEW_CONFIRM = 0.1
#: What connecting to a socket file answers when no process listens on it any more.
GONE = frozenset({errno.ECONNREFUSED, errno.ENOENT})


class AllocatableRead(Protocol):
    """Reads how many of our devices the kubelet counts allocatable now (PodResources), giving
    up after `rpc_timeout` seconds (grpc's DEADLINE_EXCEEDED)."""

    def __call__(self, *, rpc_timeout: float) -> Awaitable[int]: ...


class KubeletView:
    """Whether the kubelet counts as allocatable every device we advertise healthy, read from its
    PodResources (GetAllocatableResources). On kubelets before 1.37 another process's client can
    take our devices away while OUR stream stays open (a leaving agent that registered again,
    docs/facts.md#kubelet-endpoints); nothing on the stream tells us, so we look: shortly after
    another agent's socket of our resource goes, and on every backstop poll."""

    def __init__(
        self,
        kubelet_allocatable: AllocatableRead | None,
        advertised_healthy: Callable[[], tuple[int, int]] | None,
    ) -> None:
        """`advertised_healthy` gives (snapshot version, devices we advertise Healthy)."""
        self._read = kubelet_allocatable
        self._ours = advertised_healthy
        #: when to look (monotonic times, sorted)
        self._looks: list[float] = []
        #: looks that found the kubelet short of our devices, and re-registrations they caused
        self.short_seen = 0

    @property
    def available(self) -> bool:
        return self._read is not None and self._ours is not None

    @property
    def due(self) -> float | None:
        """When to look next (monotonic); None: no look due."""
        return self._looks[0] if self._looks else None

    def look_at(self, *when: float) -> None:
        if self.available:
            self._looks = sorted({*self._looks, *when})

    def looked(self, now: float) -> None:
        """Every look due by `now` is done."""
        self._looks = [t for t in self._looks if t > now]

    async def short(self) -> str | None:
        """A message when the kubelet counts fewer of our devices allocatable than we advertise
        Healthy, twice VIEW_CONFIRM apart with our devices unchanged (a list of ours on its way
        to the kubelet is not a loss); else None. Errors reading PodResources count as not short."""
        assert self._read is not None
        assert self._ours is not None
        try:
            version, ours = self._ours()
            theirs = await self._read(rpc_timeout=VIEW_READ_TIMEOUT)
            if theirs >= ours:
                return None
            await asyncio.sleep(VIEW_CONFIRM)
            again, ours = self._ours()
            theirs = await self._read(rpc_timeout=VIEW_READ_TIMEOUT)
        except (grpc.aio.AioRpcError, OSError) as e:
            log.debug("PodResources unreadable while checking the kubelet's view: %s", e)
            return None
        if again != version or theirs >= ours:
            return None
        self.short_seen += 1
        return f"the kubelet counts {theirs} of our {ours} healthy devices allocatable"


class Verdict(enum.Enum):
    """What the registrar must do about its registration, besides looking again later."""

    #: register again now
    REGISTER = "register"
    #: our stream ended because the kubelet itself went: register with the next kubelet only
    KUBELET_GONE = "kubelet gone"


class RegistrationCheck:
    """See the module doc; one per registrar, built with the parts it judges by."""

    def __init__(
        self,
        streams: StreamWatch,
        handover: HandOver,
        kubelet_socket: Path,
        resource_name: str,
        *,
        kubelet_allocatable: AllocatableRead | None = None,
        advertised_healthy: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        """`kubelet_allocatable` reads how many of our devices the kubelet counts allocatable now
        (PodResources) and `advertised_healthy` how many we advertise Healthy (with the snapshot's
        version); without them a re-registration after a drop does not wait for the kubelet and
        the kubelet's view is not checked."""
        self._streams = streams
        self._handover = handover
        self._kubelet_socket = kubelet_socket
        self._resource_name = resource_name
        self._kubelet_allocatable = kubelet_allocatable
        self.view = KubeletView(kubelet_allocatable, advertised_healthy)
        #: registrations made again because the kubelet had lost our devices (`KubeletView`)
        self.retakes = 0
        #: when to register again because an agent that may hold the kubelet's endpoint of our
        #: resource left (monotonic; None: not due), and how many times that was done
        self.endpoint_retake_at: float | None = None
        self.endpoint_retakes = 0

    def endpoint_may_be_gone(self, now: float) -> None:
        """An agent that may hold the kubelet's endpoint of our resource left (module doc of
        `handover`): register again once it has surely been let go (LEAVE_SETTLE)."""
        self.endpoint_retake_at = now + LEAVE_SETTLE

    def registered(self) -> None:
        """A registration of ours succeeded: it is the kubelet's endpoint now, or a later one's."""
        self.endpoint_retake_at = None

    async def judge(self, endpoint: str) -> float | Verdict | None:
        """Registered (as `endpoint`) with the kubelet that is there: hand over when due, look at
        the stream of our newest registration and at the kubelet's view. A Verdict, or when to
        look again (None: on the next event)."""
        now = time.monotonic()
        if self._streams.newest_open:
            retake = self.endpoint_retake_at
            if retake is not None:
                if now < retake:
                    return retake - now
                self.endpoint_retake_at = None
                self.endpoint_retakes += 1
                log.warning(
                    "Another agent of %s left that may have registered after us: the kubelet "
                    "(before v1.37) would send Allocate to its removed socket; registering again",
                    self._resource_name,
                )
                return Verdict.REGISTER
            if self._handover.due(endpoint):
                await self._handover.hand_over(endpoint)
            view = self.view
            if view.due is not None and now >= view.due and not self._handover.in_flight:
                view.looked(now)
                if self._handover.one_client and (why := await view.short()) is not None:
                    self.retakes += 1
                    log.warning(
                        "%s while our ListAndWatch stream is open (kubelets before v1.37 after "
                        "another agent of %s left): registering again",
                        why[0].upper() + why[1:],
                        self._resource_name,
                    )
                    return Verdict.REGISTER
        check_at = self._streams.check_at
        if check_at is None:
            return self.view_wait(now)
        if now < check_at:
            return min(check_at - now, self.view_wait(now) or check_at - now)
        verdict = self._streams.judge(now)
        if verdict is None:
            return self.view_wait(now)
        if not isinstance(verdict, Lost):
            return verdict
        if probe(self._kubelet_socket) in GONE:
            # Our stream ended because the kubelet itself went (a restart): not a drop. Its socket
            # file stays until the next kubelet replaces it; wait for that (inotify).
            log.info(
                "The kubelet at %s is gone (its socket refuses): waiting for a kubelet", self._kubelet_socket
            )
            return Verdict.KUBELET_GONE
        self._streams.lost(verdict, now, self._resource_name)
        return Verdict.REGISTER

    def view_wait(self, now: float) -> float | None:
        """How long until the kubelet's view is due to be looked at (None: not due)."""
        return None if self.view.due is None else max(0.0, self.view.due - now)

    async def let_go(self) -> None:
        """Wait (at most DROP_SETTLE_TIMEOUT) until the kubelet counts none of our devices
        allocatable: then its disconnect has run and cannot undo the registration we send next.
        Errors reading PodResources end the wait: registering is what matters."""
        if self._kubelet_allocatable is None:
            return
        deadline = time.monotonic() + DROP_SETTLE_TIMEOUT
        try:
            # A poll, not an event: the kubelet announces nothing; PodResources is all there is.
            read = self._kubelet_allocatable
            while await read(rpc_timeout=DROP_SETTLE_READ_TIMEOUT) > 0 and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(DROP_SETTLE_EVERY)
        except (grpc.aio.AioRpcError, OSError) as e:
            log.debug("PodResources unreadable while waiting for the kubelet to let go: %s", e)
