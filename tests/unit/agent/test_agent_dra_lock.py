"""node_lock: DRA calls of several agent instances on one node run one at a time."""

from __future__ import annotations

import asyncio
from pathlib import Path

from patchbay_agent.kubelet.draplugin import node_lock


def test_calls_holding_the_node_lock_never_overlap_and_a_cancelled_waiter_leaves_it_free(
    tmp_path: Path,
) -> None:
    lock = tmp_path / "calls.lock"
    events: list[str] = []

    async def call(
        name: str, inside: asyncio.Event | None = None, release: asyncio.Event | None = None
    ) -> None:
        async with node_lock(lock):
            events.append(f"{name} in")
            if inside is not None:
                inside.set()
            if release is not None:
                await release.wait()
            events.append(f"{name} out")

    async def scenario() -> None:
        inside, release = asyncio.Event(), asyncio.Event()
        first = asyncio.create_task(call("a", inside, release))
        await inside.wait()
        # Separate descriptors, as separate processes would have: b and c must wait for a.
        second = asyncio.create_task(call("b"))
        waiter = asyncio.create_task(call("c"))
        for _ in range(20):
            await asyncio.sleep(0)
        waiter.cancel()
        release.set()
        await asyncio.gather(first, second)
        assert waiter.cancelled()
        await asyncio.wait_for(call("d"), 5)

    asyncio.run(scenario())
    assert events == ["a in", "a out", "b in", "b out", "d in", "d out"]
