"""Events on a profile's transitions: a problem appears (Warning), a problem goes (Normal).

``transitions`` compares the problems of the last status written with the new ones (pure);
``EventRecorder`` turns transitions into Kubernetes Events, deduplicated (the same event for the
same profile at most once per ``DEDUPE_WINDOW``) and rate-limited (at most ``BURST`` per profile,
refilled at ``RATE`` per second), so a flapping device or a thousand failing nodes cannot flood
the API server. Suppressed events are counted, not lost silently: ``kubectl describe dpp``
still has the whole picture in the status. ``note`` posts one Normal Event that is no transition
(a staged rollout's wave), through the same deduplication and rate limit.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from patchbay_operator.constants import API_GROUP, API_VERSION, FIELD_MANAGER, KIND, Reason
from patchbay_operator.profiles import Profile
from patchbay_operator.status.conditions import Problem
from patchbay_operator.timestamps import rfc3339_now

DEDUPE_WINDOW = 600.0
"""Seconds during which the same event (profile, type, reason, message) is posted only once."""

BURST, RATE = 10, 10 / 60
"""Per profile: at most 10 events at once, refilled at 10 a minute."""

EVENT_NAMESPACE = "default"
"""Events about a cluster-scoped object live in "default" (where kubectl describe finds them)."""


@dataclass(frozen=True)
class Transition:
    type: str  # Warning | Normal
    reason: str
    message: str


def _where(p: Problem, text: str) -> str:
    """``text`` said of where the problem is; a problem of no node (pods the API server refused
    to create, agentpods.refusal) names its DaemonSet in its own message."""
    if not p.node:
        # A halted rollout names its nodes itself (rollouts.py); any other is the DaemonSet's.
        return text if p.reason == Reason.ROLLOUT_HALTED else f"agent DaemonSet: {text}"
    return f"node {p.node}" + (f", device {p.device}" if p.device else "") + f": {text}"


def transitions(before: Mapping[tuple[str, str, str], Problem], after: Iterable[Problem]) -> list[Transition]:
    """New problems as Warnings (their own reason), resolved ones as Normal ``Recovered``.

    Transient problems (``Problem.transient``) count as no problem: an agent that starts, or a
    node not patched yet, posts nothing; one that turns stalled posts its Warning then."""
    before = {k: p for k, p in before.items() if not p.transient}
    now = {p.key: p for p in after if not p.transient}
    out = [
        Transition("Warning", p.reason, p.message if not p.node else _where(p, p.message))
        for k, p in sorted(now.items())
        if k not in before
    ]
    out += [
        Transition("Normal", "Recovered", _where(p, f"{p.reason} resolved"))
        for k, p in sorted(before.items())
        if k not in now
    ]
    return out


class EventRecorder:
    def __init__(
        self,
        post: Callable[[str, dict[str, Any]], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._post, self._clock = post, clock
        self._seen: dict[tuple[str, str, str, str], float] = {}
        self._tokens: dict[str, tuple[float, float]] = {}  # profile -> (tokens, at)
        self._problems: dict[str, dict[tuple[str, str, str], Problem]] = {}
        self.posted: dict[str, int] = {"Warning": 0, "Normal": 0}
        self.suppressed = 0

    def forget(self, profile: str) -> None:
        self._problems.pop(profile, None)
        self._tokens.pop(profile, None)

    def baseline(self, profile: str, problems: Iterable[Problem]) -> None:
        """The problems as they stand without posting (at start: no event for old news)."""
        self._problems[profile] = {p.key: p for p in problems}

    async def record(self, profile: Profile, problems: Iterable[Problem]) -> None:
        problems = list(problems)
        before = self._problems.get(profile.name)
        self._problems[profile.name] = {p.key: p for p in problems}
        if before is None:
            return  # the first status this replica writes: the baseline, not a transition
        for t in transitions(before, problems):
            if self._allow(profile.name, t):
                await self._post(EVENT_NAMESPACE, event(profile, t))
                self.posted[t.type] += 1
            else:
                self.suppressed += 1

    async def note(self, profile: Profile, reason: str, message: str) -> None:
        """One Normal Event about ``profile`` that no problem's transition says (a wave moved)."""
        t = Transition("Normal", reason, message)
        if self._allow(profile.name, t):
            await self._post(EVENT_NAMESPACE, event(profile, t))
            self.posted[t.type] += 1
        else:
            self.suppressed += 1

    def _allow(self, profile: str, t: Transition) -> bool:
        now = self._clock()
        key = (profile, t.type, t.reason, t.message)
        if now - self._seen.get(key, -DEDUPE_WINDOW) < DEDUPE_WINDOW:
            return False
        tokens, at = self._tokens.get(profile, (float(BURST), now))
        tokens = min(float(BURST), tokens + (now - at) * RATE)
        if tokens < 1:
            self._tokens[profile] = (tokens, now)
            return False
        self._tokens[profile] = (tokens - 1, now)
        self._seen[key] = now
        return True


def event(profile: Profile, t: Transition) -> dict[str, Any]:
    """A core/v1 Event about ``profile`` (kubectl describe dpp lists it)."""
    stamp = rfc3339_now()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{profile.name}.{uuid.uuid4().hex[:12]}", "namespace": EVENT_NAMESPACE},
        "involvedObject": {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": KIND,
            "name": profile.name,
            "uid": profile.uid,
        },
        "type": t.type,
        "reason": t.reason,
        "message": t.message[:1024],
        "source": {"component": FIELD_MANAGER},
        "reportingComponent": FIELD_MANAGER,
        "reportingInstance": FIELD_MANAGER,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
