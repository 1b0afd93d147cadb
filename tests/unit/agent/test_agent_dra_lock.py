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


def test_a_prepare_reads_its_claims_while_another_instance_holds_the_lock(tmp_path: Path) -> None:
    """The claim's GET changes nothing on the node, so it is not queued behind the node lock: a
    prepare whose lock another instance holds has already read its claim, and writes nothing
    until the lock is free."""
    import threading
    from typing import Any

    from patchbay_agent.config import Allocation
    from patchbay_agent.core.inventory import Inventory
    from patchbay_agent.dra.preparer import ClaimPreparer
    from patchbay_agent.kubelet.draplugin import ClaimRef

    lock = tmp_path / "calls.lock"
    read = threading.Event()

    class Reader:
        def resource_claim(
            self, namespace: str, name: str, *, timeout: float | None = None
        ) -> dict[str, Any]:
            read.set()
            raise LookupError(f"resourceclaims {name!r} not found")

    preparer = ClaimPreparer(
        "x.patchbay.dev",
        "node-a",
        Reader(),
        Inventory(1, None),
        allocation=Allocation(),
        cdi_spec_dir=tmp_path,
        lock_path=lock,
    )

    async def scenario() -> None:
        inside, release = asyncio.Event(), asyncio.Event()

        async def other_instance() -> None:
            async with node_lock(lock):
                inside.set()
                await release.wait()

        holder = asyncio.create_task(other_instance())
        await inside.wait()
        prepare = asyncio.create_task(preparer.prepare([ClaimRef("ns", "0" * 8 + "-uid", "claim")]))
        for _ in range(500):  # at most 5 s
            if read.is_set():
                break
            await asyncio.sleep(0.01)
        assert read.is_set(), "the claim was not read while another instance held the lock"
        await asyncio.sleep(0.05)
        assert not prepare.done(), "the prepare finished without the node lock"
        release.set()
        await holder
        results = await asyncio.wait_for(prepare, 5)
        assert "not found" in results["0" * 8 + "-uid"].error

    asyncio.run(scenario())
