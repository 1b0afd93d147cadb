"""kopf's pause rule as the controller applies it to the ClusterKopfPeering status."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

from patchbay_operator.peering import EXPIRY_MARGIN, Gate, Peering, blockers, next_expiry

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)
ME = Peering("patchbay", "me", 100)


def seen(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).isoformat()


def test_alone_or_highest_works() -> None:
    assert blockers(None, ME, NOW) == []
    assert blockers({}, ME, NOW) == []
    assert blockers({"me": {"priority": 100, "lifetime": 60, "lastseen": seen(1)}}, ME, NOW) == []
    assert blockers({"other": {"priority": 99, "lifetime": 60, "lastseen": seen(1)}}, ME, NOW) == []


def test_a_live_higher_or_equal_peer_pauses() -> None:
    status = {
        "me": {"priority": 100, "lifetime": 60, "lastseen": seen(1)},
        "high": {"priority": 200, "lifetime": 60, "lastseen": seen(5)},
        "tie": {"priority": 100, "lifetime": 60, "lastseen": seen(5)},
    }
    assert blockers(status, ME, NOW) == ["high(200)", "tie(100)"]


def test_a_dead_peer_does_not_pause() -> None:
    status = {"high": {"priority": 200, "lifetime": 60, "lastseen": seen(61)}}
    assert blockers(status, ME, NOW) == []
    # kopf writes lastseen with a "Z" or without a zone; both parse.
    z = (NOW - timedelta(seconds=10)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    naive = (NOW - timedelta(seconds=10)).replace(tzinfo=None).isoformat()
    assert blockers({"high": {"priority": 200, "lifetime": 60, "lastseen": z}}, ME, NOW) == ["high(200)"]
    assert blockers({"high": {"priority": 200, "lifetime": 60, "lastseen": naive}}, ME, NOW) == ["high(200)"]


def test_defaults_and_malformed_records() -> None:
    # No lifetime: kopf's 60 s; no lastseen: seen now; junk: ignored.
    assert blockers({"high": {"priority": 200, "lastseen": seen(59)}}, ME, NOW) == ["high(200)"]
    assert blockers({"high": {"priority": 200}}, ME, NOW) == ["high(200)"]
    junk = {"x": "junk", "y": {"priority": "high"}, "z": {"priority": 300, "lastseen": 5}}
    assert blockers(junk, ME, NOW) == []


async def test_the_gate_waits_for_a_higher_peer_and_refreshes_before_working() -> None:
    objects: list[dict[str, Any] | None] = [
        {"status": {"other": {"priority": 9, "lifetime": 60}}},
        {"status": {"other": {"priority": 9, "lifetime": 60}}},
        None,
    ]
    seen: list[str] = []

    async def read() -> dict[str, Any] | None:
        obj = objects.pop(0)
        if obj is None:
            raise OSError("API server gone")
        return obj

    async def work() -> None:
        seen.append("work")

    gate = Gate(Peering("p", "me", 5), read, lambda: seen.append("wait"), work)
    await gate.step()
    await gate.step()
    assert (gate.active, seen) == (False, ["wait"])  # told once
    await gate.step()  # unreadable: the last decision stands
    assert not gate.active
    objects.append({"status": {"me": {"priority": 5}}})
    await gate.step()
    assert (gate.active, seen) == (True, ["wait", "work"])


def test_next_expiry_is_the_first_blocking_record_to_expire() -> None:
    status = {
        "me": {"priority": 100, "lifetime": 10, "lastseen": seen(9)},  # its own: never waited for
        "high": {"priority": 200, "lifetime": 10, "lastseen": seen(3)},  # 7 s left
        "tie": {"priority": 100, "lifetime": 10, "lastseen": seen(6)},  # 4 s left
        "low": {"priority": 50, "lifetime": 10, "lastseen": seen(8)},  # not waited for
        "dead": {"priority": 300, "lifetime": 10, "lastseen": seen(11)},
    }
    assert next_expiry(status, ME, NOW) == 4.0
    assert next_expiry({"low": status["low"], "dead": status["dead"]}, ME, NOW) is None
    assert next_expiry(None, ME, NOW) is None


async def test_a_waiting_gate_looks_again_when_the_leaders_record_expires() -> None:
    """A leader killed without a clean exit renews its record no more: the standby's next look is
    right after the record expires, not up to ``every`` seconds later; working, it keeps ``every``."""
    lifetime = 3
    now = datetime.now(UTC)
    leader = {"priority": 9, "lifetime": lifetime, "lastseen": (now - timedelta(seconds=2)).isoformat()}
    objects: list[dict[str, Any]] = [{"status": {"leader": leader}}]

    async def read() -> dict[str, Any]:
        return objects[0]

    async def work() -> None:
        pass

    gate = Gate(Peering("p", "me", 5), read, lambda: None, work, every=30.0)
    await gate.step()
    assert not gate.active
    # about 1 s left of the leader's record, and the look just past it
    assert 0.5 < gate.pause <= 1.0 + EXPIRY_MARGIN
    objects[0] = {"status": {}}
    await gate.step()
    assert gate.active and gate.pause == 30.0


async def test_a_take_over_that_fails_stands_by_and_is_tried_again() -> None:
    """The leader is gone and the standby's take-over raises (its LIST refused): it writes nothing
    (stands by again), and its loop goes on to take over at the next look."""
    attempts: list[str] = []
    seen: list[str] = []

    async def read() -> dict[str, Any]:
        return {"status": {}}

    async def work() -> None:
        attempts.append("work")
        if len(attempts) == 1:
            raise OSError("connection reset while listing the profiles")
        seen.append("work")

    gate = Gate(Peering("p", "me", 5), read, lambda: seen.append("wait"), work, every=0.01)
    await gate.step()
    assert (gate.active, attempts, seen) == (False, ["work"], ["wait"])
    runs = asyncio.create_task(gate.run())
    try:
        for _ in range(200):
            if gate.active:
                break
            await asyncio.sleep(0.01)
    finally:
        runs.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runs
    assert (gate.active, attempts, seen) == (True, ["work", "work"], ["wait", "work"])


async def test_two_looks_at_once_take_over_once() -> None:
    """The gate's loop and another caller look at the same moment, with the leader gone: the
    second waits for the first's decision, so the take-over (a LIST of the profiles, the agents'
    config written) runs once, not twice side by side."""
    started = asyncio.Event()
    release = asyncio.Event()
    attempts: list[str] = []

    async def read() -> dict[str, Any]:
        return {"status": {}}

    async def work() -> None:
        attempts.append("work")
        started.set()
        await release.wait()

    gate = Gate(Peering("p", "me", 5), read, lambda: None, work)
    first = asyncio.create_task(gate.step())
    await started.wait()
    second = asyncio.create_task(gate.step())
    await asyncio.sleep(0.05)
    assert attempts == ["work"] and not gate.active  # the second waits on the first
    release.set()
    await asyncio.gather(first, second)
    assert gate.active and attempts == ["work"]
