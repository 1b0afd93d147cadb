"""kopf's pause rule as the controller applies it to the ClusterKopfPeering status."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from patchbay_operator.peering import Gate, Peering, blockers

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
