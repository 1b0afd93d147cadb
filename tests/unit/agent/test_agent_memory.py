"""settle_memory: start-up garbage is freed before gc.freeze() would keep it for good, and the
agent does both once it is ready, not before its first registration."""

from __future__ import annotations

import asyncio
import gc
import weakref

from patchbay_agent.memory import SETTLE_POLL, settle_memory, settle_when_ready


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_cyclic_garbage_is_collected_before_the_freeze() -> None:
    a, b = Node(), Node()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    gc.disable()  # no automatic collection may take the credit
    try:
        del a, b
        assert alive() is not None
        freed = settle_memory()
    finally:
        gc.enable()
    assert alive() is None
    assert freed >= 2


async def test_the_freeze_waits_for_the_front_end_to_be_ready() -> None:
    """The collection and the freeze run once the kubelet holds our stream, not before the first
    registration (they took 5-10 ms of the event loop the registration waited for)."""
    ready = False
    gc.unfreeze()
    try:
        settling = asyncio.create_task(settle_when_ready(lambda: ready, asyncio.Event()))
        await asyncio.sleep(SETTLE_POLL * 5)
        assert not settling.done() and gc.get_freeze_count() == 0
        ready = True
        await asyncio.wait_for(settling, 1.0)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


async def test_the_freeze_does_not_wait_past_a_stop() -> None:
    stop = asyncio.Event()
    stop.set()
    gc.unfreeze()
    try:
        await asyncio.wait_for(settle_when_ready(lambda: False, stop), 1.0)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
