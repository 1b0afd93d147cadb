"""settle_memory: start-up garbage is freed before gc.freeze() would keep it for good."""

from __future__ import annotations

import gc
import weakref

from patchbay_agent.memory import settle_memory


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
