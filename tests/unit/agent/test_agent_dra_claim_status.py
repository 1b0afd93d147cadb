"""DRA mode's claim status (`dra/claimstatus.py`): the entries a prepared claim gets, health
changes written again, unprepare removing ours, and which API answers end or retry a write. The
API client here records calls (a unit test); the same documents against a real API server are in
tests/integration/test_dra_claim_status_api.py."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from support.converge import until

from patchbay_agent.core.health import CheckResult, DeviceHealthTracker
from patchbay_agent.core.inventory import Inventory
from patchbay_agent.discovery import PhysicalDevice
from patchbay_agent.dra.claimstatus import ClaimStatusWriter, field_manager, status_document
from patchbay_agent.kubeclient import ApiError
from patchbay_agent.metrics import Metrics

DRIVER, NODE = "serial.patchbay.dev", "node-1"
TTY0, TTY1 = PhysicalDevice("ttyUSB0", ("/dev/ttyUSB0",)), PhysicalDevice("ttyUSB1", ("/dev/ttyUSB1",))
REF = ("team-a", "claim-1", "6a9e6a0e-0000-4000-8000-000000000001")


class Recorder:
    """Records applied documents; answers with the queued errors first."""

    def __init__(self) -> None:
        self.docs: list[tuple[dict[str, Any], str]] = []
        self.errors: list[Exception] = []
        self.applied = asyncio.Event()

    def apply_claim_status(self, doc: Mapping[str, Any], field_manager: str) -> None:
        if self.errors:
            raise self.errors.pop(0)
        self.docs.append((dict(doc), field_manager))
        self.applied.set()


def _setup() -> tuple[Inventory, DeviceHealthTracker]:
    inv, tracker = Inventory(1, "rw"), DeviceHealthTracker(1, 1)
    tracker.observe({TTY0.id: CheckResult(True), TTY1.id: CheckResult(True)})
    inv.update([TTY0, TTY1], tracker)
    return inv, tracker


def _conditions(entry: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in entry["conditions"]}


def test_the_document_names_each_device_with_ready_healthy_and_what_it_is() -> None:
    inv, tracker = _setup()
    writer = ClaimStatusWriter(DRIVER, NODE, Recorder(), inv, Metrics("example.com/serial", NODE))
    writer.prepared(*REF, [("dev-a", "ttyUSB0", "serial.patchbay.dev/device=uid-dev-a")])
    doc = status_document(DRIVER, NODE, writer.claims[REF[2]], REF, inv.current)
    assert doc["metadata"] == {"namespace": "team-a", "name": "claim-1", "uid": REF[2]}
    (entry,) = doc["status"]["devices"]
    assert (entry["driver"], entry["pool"], entry["device"]) == (DRIVER, NODE, "dev-a")
    assert _conditions(entry) == {"Ready": ("True", "Prepared"), "Healthy": ("True", "Healthy")}
    assert entry["data"]["id"] == "ttyUSB0"
    assert entry["data"]["cdiDevice"] == "serial.patchbay.dev/device=uid-dev-a"
    assert [p["host"] for p in entry["data"]["paths"]] == ["/dev/ttyUSB0"]
    assert all(c["lastTransitionTime"].endswith("Z") for c in entry["conditions"])
    # Unhealthy with the health machine's reason; gone from the node: Vanished.
    tracker.observe(
        {TTY0.id: CheckResult(False, "cannot open", True, "OpenFailed"), TTY1.id: CheckResult(True)}
    )
    inv.update([TTY0, TTY1], tracker)
    (entry,) = status_document(DRIVER, NODE, writer.claims[REF[2]], REF, inv.current)["status"]["devices"]
    assert _conditions(entry)["Healthy"] == ("False", "OpenFailed")
    tracker.observe({TTY1.id: CheckResult(True)})
    inv.update([TTY1], tracker)
    (entry,) = status_document(DRIVER, NODE, writer.claims[REF[2]], REF, inv.current)["status"]["devices"]
    assert _conditions(entry)["Healthy"] == ("False", "Vanished")
    # No claim: no entry of ours (server-side apply then removes exactly ours).
    assert status_document(DRIVER, NODE, None, REF, inv.current)["status"]["devices"] == []
    assert field_manager(DRIVER) == "patchbay-serial.patchbay.dev"


def test_the_writer_writes_once_per_change_and_removes_ours_on_unprepare() -> None:
    async def scenario() -> None:
        inv, tracker = _setup()
        client = Recorder()
        metrics = Metrics("example.com/serial", NODE)
        writer = ClaimStatusWriter(DRIVER, NODE, client, inv, metrics)
        stop = asyncio.Event()
        task = asyncio.create_task(writer.run(stop))
        try:
            writer.prepared(*REF, [("dev-a", "ttyUSB0", "cdi-a")])
            writer.prepared(*REF, [("dev-a", "ttyUSB0", "cdi-a")])  # the kubelet asks again
            await asyncio.wait_for(client.applied.wait(), 5)
            await asyncio.sleep(0.05)
            assert len(client.docs) == 1
            assert client.docs[0][1] == "patchbay-serial.patchbay.dev"
            # A health change of ANOTHER device: nothing to write; of ours: written again.
            tracker.observe(
                {TTY0.id: CheckResult(True), TTY1.id: CheckResult(False, "x", True, "ProbeFailed")}
            )
            inv.update([TTY0, TTY1], tracker)
            await asyncio.sleep(0.05)
            assert len(client.docs) == 1
            client.applied.clear()
            tracker.observe(
                {TTY0.id: CheckResult(False, "x", True, "ProbeFailed"), TTY1.id: CheckResult(True)}
            )
            inv.update([TTY0, TTY1], tracker)
            await asyncio.wait_for(client.applied.wait(), 5)
            (entry,) = client.docs[-1][0]["status"]["devices"]
            assert _conditions(entry)["Healthy"] == ("False", "ProbeFailed")
            client.applied.clear()
            writer.unprepared(*REF)
            await asyncio.wait_for(client.applied.wait(), 5)
            assert client.docs[-1][0]["status"]["devices"] == []
            assert writer.claims == {}
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)

    asyncio.run(scenario())


def test_a_claim_gone_or_replaced_ends_the_write_a_server_error_is_retried() -> None:
    async def scenario() -> None:
        inv, _tracker = _setup()
        client = Recorder()
        writer = ClaimStatusWriter(DRIVER, NODE, client, inv, Metrics("example.com/serial", NODE))
        stop = asyncio.Event()
        task = asyncio.create_task(writer.run(stop))
        try:
            client.errors = [ApiError(409, "Precondition failed: UID in precondition")]
            writer.prepared(*REF, [("dev-a", "ttyUSB0", "cdi-a")])
            await until(lambda: not client.errors and writer.claims == {})  # the 409 answered
            assert client.docs == []  # replaced: never written
            client.errors = [ApiError(500, "etcdserver: timeout"), OSError("connection reset")]
            writer.prepared(*REF, [("dev-a", "ttyUSB0", "cdi-a")])
            await asyncio.wait_for(client.applied.wait(), 10)  # after two retries (backoff)
            assert len(client.docs) == 1
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)

    asyncio.run(scenario())


def test_a_new_agent_keeps_the_status_of_claims_an_earlier_one_prepared(tmp_path: Path) -> None:
    """The kubelet does not prepare a running pod's claims again for a new agent: the record
    beside the driver's lock file tells it which claims to keep true; unprepare removes it."""

    async def scenario() -> None:
        inv, tracker = _setup()
        first = Recorder()
        writer = ClaimStatusWriter(
            DRIVER, NODE, first, inv, Metrics("example.com/serial", NODE), state_dir=tmp_path
        )
        stop = asyncio.Event()
        task = asyncio.create_task(writer.run(stop))
        writer.prepared(*REF, [("dev-a", "ttyUSB0", "cdi-a")])
        await asyncio.wait_for(first.applied.wait(), 5)
        stop.set()
        await asyncio.wait_for(task, 5)
        assert sorted(os.listdir(tmp_path)) == [f"claim-{REF[2]}.json"]
        (tmp_path / "claim-bogus.json").write_text("{not json")

        # The device goes while no agent runs; the next agent writes the claim's status again.
        tracker.observe({TTY1.id: CheckResult(True)})
        inv.update([TTY1], tracker)
        second = Recorder()
        writer = ClaimStatusWriter(
            DRIVER, NODE, second, inv, Metrics("example.com/serial", NODE), state_dir=tmp_path
        )
        stop = asyncio.Event()
        task = asyncio.create_task(writer.run(stop))
        try:
            await asyncio.wait_for(second.applied.wait(), 5)
            (entry,) = second.docs[0][0]["status"]["devices"]
            assert _conditions(entry)["Healthy"] == ("False", "Vanished")
            assert not (tmp_path / "claim-bogus.json").exists()  # unreadable: removed
            second.applied.clear()
            writer.unprepared(*REF)
            await asyncio.wait_for(second.applied.wait(), 5)
            assert os.listdir(tmp_path) == []
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)

    asyncio.run(scenario())


def test_status_writes_wait_until_prepare_calls_are_quiet(tmp_path: Path) -> None:
    """A burst of prepare calls is answered first: the writer holds its writes while a call is
    in flight and for the settle time after the last one (CallActivity.quiet, which the preparer
    marks its calls in), and writes at the latest after the longest wait even if calls never stop."""
    from patchbay_agent.config import Allocation
    from patchbay_agent.dra.preparer import ClaimPreparer
    from patchbay_agent.kubelet.draplugin import CallActivity

    async def scenario() -> None:
        inv, _ = _setup()
        client = Recorder()
        calls = CallActivity()
        longest = [30.0]  # the longest wait, shortened below
        writer = ClaimStatusWriter(
            DRIVER,
            NODE,
            client,
            inv,
            Metrics("example.com/serial", NODE),
            quiet=lambda: calls.quiet(settle=0.05, longest=longest[0]),
        )
        preparer = ClaimPreparer(
            DRIVER,
            NODE,
            client,
            inv,
            allocation=Allocation(),
            cdi_spec_dir=tmp_path,  # type: ignore[arg-type]
            calls=calls,
            status=writer,
        )
        stop = asyncio.Event()
        async with preparer.calls.call():  # a prepare call in flight
            task = asyncio.create_task(writer.run(stop))
            writer.prepared(*REF, [("dev-a", "ttyUSB0", "cdi-a")])
            await asyncio.sleep(0.3)
            assert client.docs == []  # held while the call runs, however long
        try:
            await asyncio.wait_for(client.applied.wait(), 5)  # then written
            assert len(client.docs) == 1
            # Calls that never stop do not hold the writes past the longest wait.
            client.applied.clear()
            longest[0] = 0.2
            async with preparer.calls.call():
                writer.unprepared(*REF)
                await asyncio.wait_for(client.applied.wait(), 5)
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)

    asyncio.run(scenario())


def test_a_shared_devices_entry_names_its_share_and_old_records_still_load(tmp_path: Path) -> None:
    """A device that allows multiple allocations appears once per share in a claim's status:
    the API server matches an entry to its allocation result by driver, pool, device and shareID.
    A record written by an agent before shares (three fields per device) still loads."""
    inv, _ = _setup()
    writer = ClaimStatusWriter(
        DRIVER, NODE, Recorder(), inv, Metrics("example.com/serial", NODE), state_dir=tmp_path
    )
    writer.prepared(
        *REF, [("dev-a", "ttyUSB0", "cdi-a", "share-1"), ("dev-a", "ttyUSB0", "cdi-a", "share-2")]
    )
    entries = status_document(DRIVER, NODE, writer.claims[REF[2]], REF, inv.current)["status"]["devices"]
    assert [(e["device"], e["shareID"]) for e in entries] == [("dev-a", "share-1"), ("dev-a", "share-2")]
    old_record = {
        "namespace": "team-a",
        "name": "claim-1",
        "uid": REF[2],
        "devices": [["dev-a", "ttyUSB0", "cdi-a"]],
        "prepared_at": "2026-01-01T00:00:00Z",
    }
    (tmp_path / f"claim-{REF[2]}.json").write_text(json.dumps(old_record))
    fresh = ClaimStatusWriter(
        DRIVER, NODE, Recorder(), inv, Metrics("example.com/serial", NODE), state_dir=tmp_path
    )
    assert fresh.load() == 1
    (entry,) = status_document(DRIVER, NODE, fresh.claims[REF[2]], REF, inv.current)["status"]["devices"]
    assert "shareID" not in entry and entry["device"] == "dev-a"
