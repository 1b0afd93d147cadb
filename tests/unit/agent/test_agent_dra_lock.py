"""node_lock: DRA calls of several agent instances on one node run one at a time; a claim the
prepare answers with an error is told as an allocation failure; the spec's copy, written after
the answer under the lock, never outlives an unprepare."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from patchbay_agent.cdi import SpecCopies
from patchbay_agent.config import Allocation
from patchbay_agent.core.inventory import Inventory
from patchbay_agent.dra.preparer import ClaimPreparer
from patchbay_agent.kubelet.draplugin import ClaimRef, node_lock

UID = "0" * 8 + "-uid"


def _preparer(tmp_path: Path, reader: Any, **kw: Any) -> ClaimPreparer:
    return ClaimPreparer(
        "x.patchbay.dev",
        "node-a",
        reader,
        Inventory(1, None),
        allocation=Allocation(),
        cdi_spec_dir=tmp_path,
        lock_path=tmp_path / "calls.lock",
        **kw,
    )


class MissingClaims:
    """A claim reader whose every claim is gone; `read` is set at the first read."""

    def __init__(self) -> None:
        import threading

        self.read = threading.Event()

    def resource_claim(self, namespace: str, name: str, *, timeout: float | None = None) -> dict[str, Any]:
        self.read.set()
        raise LookupError(f"resourceclaims {name!r} not found")


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
    lock = tmp_path / "calls.lock"
    reader = MissingClaims()
    read = reader.read
    preparer = _preparer(tmp_path, reader)

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


def test_a_claim_prepared_with_an_error_is_an_allocation_failure(tmp_path: Path) -> None:
    """A NodePrepareResources claim answered with an error (here its read) is told to
    `on_failure` (the report's allocationFailures), once per claim."""
    failed: list[str] = []
    preparer = _preparer(tmp_path, MissingClaims(), on_failure=failed.append)
    results = asyncio.run(preparer.prepare([ClaimRef("ns", UID, "claim")]))
    assert "not found" in results[UID].error
    assert len(failed) == 1 and failed[0].startswith("NodePrepareResources: ")
    assert "not found" in failed[0]


class AllocatedElsewhere:
    """A claim allocated only devices of another driver: prepared, with no device of ours (its
    CDI spec is written all the same)."""

    def resource_claim(self, namespace: str, name: str, *, timeout: float | None = None) -> dict[str, Any]:
        result = {"request": "r", "driver": "other.dev", "pool": "p", "device": "d"}
        return {"metadata": {"uid": UID}, "status": {"allocation": {"devices": {"results": [result]}}}}


def test_the_specs_copy_follows_the_answer_and_never_outlives_an_unprepare(tmp_path: Path) -> None:
    """The copy a reboot needs is written after the answer; an unprepare that comes between the
    answer and that write leaves neither the spec nor a copy (a copy would bring the unprepared
    claim's spec back, cdi.SpecGuard)."""
    cdi, state = tmp_path / "cdi", tmp_path / "state"
    preparer = _preparer(tmp_path, AllocatedElsewhere(), copies=SpecCopies(cdi, state))
    preparer.cdi_spec_dir = cdi
    spec = preparer.spec_path(UID)
    copy = state / "cdi" / spec.name
    claim = [ClaimRef("ns", UID, "claim")]

    async def scenario() -> None:
        assert (await preparer.prepare(claim))[UID].error == ""
        assert spec.exists()
        await preparer.late.settle()
        assert json.loads(copy.read_text()) == json.loads(spec.read_text())
        # Unprepared at once after the answer, before the late write runs.
        assert (await preparer.prepare(claim))[UID].error == ""
        assert (await preparer.unprepare(claim))[UID] == ""
        await preparer.late.settle()
        assert not spec.exists() and not copy.exists()

    asyncio.run(scenario())


class ClaimsElsewhere:
    """Claims named c<i> with UID <i, 8 digits>-uid, each allocated only a device of another
    driver (prepared, a CDI spec written)."""

    def resource_claim(self, namespace: str, name: str, *, timeout: float | None = None) -> dict[str, Any]:
        result = {"request": "r", "driver": "other.dev", "pool": "p", "device": "d"}
        uid = f"{int(name[1:]):08d}-uid"
        return {"metadata": {"uid": uid}, "status": {"allocation": {"devices": {"results": [result]}}}}


def test_the_specs_copies_wait_until_the_calls_are_quiet_then_come_together(tmp_path: Path) -> None:
    """A burst of prepares: no copy is written while calls are in flight (written after each
    answer, a copy ran on the event loop while the kubelet's next call waited for it), every one
    once they are quiet, and the holders are told once for the burst."""
    cdi, state = tmp_path / "cdi", tmp_path / "state"
    changes: list[int] = []
    preparer = _preparer(
        tmp_path, ClaimsElsewhere(), copies=SpecCopies(cdi, state), on_change=lambda: changes.append(1)
    )
    preparer.cdi_spec_dir = cdi
    uids = [f"{i:08d}-uid" for i in range(5)]

    async def scenario() -> None:
        # Another call in flight for the whole burst (as the kubelet's next one would be).
        async with preparer.calls.call():
            for i, uid in enumerate(uids):
                assert (await preparer.prepare([ClaimRef("ns", uid, f"c{i}")]))[uid].error == ""
                assert preparer.spec_path(uid).exists()
            await asyncio.sleep(0.2)  # four times the quiet window: the calls are not quiet
            assert not list(state.glob("cdi/*.json")) and changes == []
        await preparer.late.settle()
        copies = sorted(p.name for p in state.glob("cdi/*.json"))
        assert copies == sorted(preparer.spec_path(uid).name for uid in uids)
        assert changes == [1]

    asyncio.run(scenario())
