"""The status writer alone: debounced, written only when changed, retried, held while paused."""

from __future__ import annotations

import asyncio
from typing import Any

from support.converge import until

from patchbay_operator.statuswriter import StatusWriter


class Recorder:
    def __init__(self) -> None:
        self.value: dict[str, Any] = {"ready": 1}
        self.computed = 0
        self.writes: list[tuple[str, dict[str, Any]]] = []
        self.fail = 0

    def compute(self, name: str) -> dict[str, Any] | None:
        self.computed += 1
        return None if name == "gone" else dict(self.value)

    async def write(self, name: str, status: dict[str, Any]) -> None:
        if self.fail:
            self.fail -= 1
            raise OSError("connection reset")
        self.writes.append((name, status))


async def computed(w: StatusWriter, count: int) -> None:
    """Until the writer has computed ``count`` statuses in all. A computation and its write are
    one step of the loop here (the recorder's write never suspends), so a write is done too."""
    await until(lambda: w.computes >= count)
    assert w.computes == count


async def test_many_marks_in_a_window_cost_one_write_and_an_unchanged_status_none() -> None:
    r = Recorder()
    w = StatusWriter(r.compute, r.write, debounce=0.05)
    task = asyncio.create_task(w.run())
    try:
        for _ in range(100):
            w.mark(["p"])
        await computed(w, 1)
        assert r.writes == [("p", {"ready": 1})]
        assert r.computed == 1
        w.mark(["p"])  # nothing changed
        await computed(w, 2)
        assert len(r.writes) == 1
        r.value = {"ready": 2}
        w.mark(["p", "gone"])
        await computed(w, 4)
        assert r.writes[-1] == ("p", {"ready": 2})
        assert w.writes == 2
    finally:
        task.cancel()


async def test_a_failed_write_is_retried_and_paused_writers_write_nothing() -> None:
    r = Recorder()
    r.fail = 1
    w = StatusWriter(r.compute, r.write, debounce=0.02)
    task = asyncio.create_task(w.run())
    try:
        w.mark(["p"])
        await computed(w, 2)  # failed, then retried
        assert r.writes == [("p", {"ready": 1})]
        w.paused = True
        r.value = {"ready": 3}
        w.mark(["p"])
        # Time for the loop's debounce and a flush, which must write nothing (while paused no
        # write can happen however long this takes: a pass under load is still right).
        await asyncio.sleep(0.1)
        assert len(r.writes) == 1 and w.computes == 2 and w.pending == 1
        w.paused = False
        w.mark([])
        await computed(w, 3)
        assert r.writes[-1] == ("p", {"ready": 3})
    finally:
        task.cancel()


def test_seed_keeps_what_the_object_said_for_transition_times() -> None:
    r = Recorder()
    w = StatusWriter(r.compute, r.write, debounce=0)
    w.seed("p", {"conditions": [{"type": "Ready"}]})
    w.seed("p", {"conditions": []}, replace=False)
    assert w.previous("p") == {"conditions": [{"type": "Ready"}]}
    w.forget("p")
    assert w.previous("p") == {}


async def test_a_key_the_status_no_longer_has_is_removed_by_the_patch() -> None:
    """The write is a merge patch: a key that went (a DevicePlugin profile's `devices.healthy`
    once its last DeviceReport is gone) must be sent as None, or the API server keeps it."""
    r = Recorder()
    r.value = {"devices": {"capacity": 8, "healthy": 8}, "problems": [], "dra": {"x": 1}}
    w = StatusWriter(r.compute, r.write, debounce=0.02)
    task = asyncio.create_task(w.run())
    try:
        w.mark(["p"])
        await computed(w, 1)
        r.value = {"devices": {"capacity": 0}, "problems": [{"reason": "NoDevices"}]}
        w.mark(["p"])
        await computed(w, 2)
        assert r.writes[-1] == (
            "p",
            {"devices": {"capacity": 0, "healthy": None}, "problems": [{"reason": "NoDevices"}], "dra": None},
        )
        # What it remembers is the status itself, without the Nones.
        assert w.previous("p") == {"devices": {"capacity": 0}, "problems": [{"reason": "NoDevices"}]}
    finally:
        task.cancel()
