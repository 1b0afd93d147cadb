"""settle_memory: start-up garbage is freed before gc.freeze() would keep it for good, and the
agent does both once it is ready, not before its first registration."""

from __future__ import annotations

import asyncio
import gc
import weakref
from types import SimpleNamespace

from patchbay_agent.memory import settle_memory
from patchbay_agent.resourceagent import SETTLE_POLL, ResourceAgent


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


class Front:
    """A front-end that is ready when the test says (only `ready` is read)."""

    def __init__(self) -> None:
        self.is_ready = False

    def ready(self) -> bool:
        return self.is_ready


async def test_the_freeze_waits_for_the_front_end_to_be_ready() -> None:
    """The collection and the freeze run once the kubelet holds our stream, not before the first
    registration (they took 5-10 ms of the event loop the registration waited for)."""
    agent = SimpleNamespace(front=Front())
    gc.unfreeze()
    try:
        settling = asyncio.create_task(ResourceAgent._settle_when_ready(agent, asyncio.Event()))  # type: ignore[arg-type]
        await asyncio.sleep(SETTLE_POLL * 5)
        assert not settling.done() and gc.get_freeze_count() == 0
        agent.front.is_ready = True
        await asyncio.wait_for(settling, 1.0)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


async def test_the_freeze_does_not_wait_past_a_stop() -> None:
    stop = asyncio.Event()
    stop.set()
    gc.unfreeze()
    try:
        await asyncio.wait_for(ResourceAgent._settle_when_ready(SimpleNamespace(front=Front()), stop), 1.0)  # type: ignore[arg-type]
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
