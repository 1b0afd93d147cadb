"""What the agent writes is written again when someone else deletes or edits it, as its watch sees
it (ownwatch.py, the reporter, the slice publisher, the node's inventory keeper): a fake API in
memory stands in for the API server (the real one: tests/integration/agent), with a real
`OwnWatch` thread following it.

Checked: the events of the agent's own writes cost no request; a deletion and an edit by another
field manager are each repaired by exactly one write, counted and logged in the Kubernetes style;
expected writers (the same pod's other reporter, a rollout's successor, the same field manager)
are left alone; a 410 or a broken watch lists again, and a deletion missed meanwhile is repaired
from that list.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import fakemachines
from support.agentrun import until
from support.fakehw import FakeHardware

from patchbay_agent.backoff import Backoff
from patchbay_agent.changewriter import ChangeWriter
from patchbay_agent.discovery.base import HostRoot
from patchbay_agent.dra.slicepublisher import SlicePublisher, slice_watch
from patchbay_agent.dra.slices import SliceDevice
from patchbay_agent.inventory.keeper import InventoryKeeper, inventory_watch
from patchbay_agent.kubeclient import ApiError
from patchbay_agent.metrics import Metrics
from patchbay_agent.ownwatch import LISTED, OwnWatch, Repairs, Selection
from patchbay_agent.report.devicereport import ReportTarget
from patchbay_agent.report.reporter import Reporter, report_watch

NODE = "node-1"
TARGET = ReportTarget("serial", NODE, "patchbay", "example.com/serial", agent="agent-pod-abcde")
DRIVER = "serial.patchbay.dev"


class FakeApi:
    """Objects by name with resourceVersions and managedFields, a LIST and a WATCH of them (one
    watcher at a time, fed through a queue), and the reporter's and publisher's requests."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self._rv = itertools.count(100)
        self._lock = threading.Lock()
        self._events: queue.Queue[tuple[str, dict[str, Any]] | None] = queue.Queue()
        self.requests: list[str] = []
        #: what the next watch request does: None (watch) or an ApiError to raise
        self.watch_errors: list[Exception] = []
        self.closed = False

    # -- what anyone does -------------------------------------------------------------------
    def write(self, name: str, body: dict[str, Any], manager: str, *, quiet: bool = False) -> str:
        """Store `body` under `name` as `manager` wrote it; an event unless `quiet` (the watch
        was down)."""
        with self._lock:
            rv = str(next(self._rv))
            old = self.objects.get(name)
            managers = {m["manager"] for m in (old or {}).get("metadata", {}).get("managedFields", [])}
            managers.add(manager)
            meta = {
                **body.get("metadata", {}),
                "name": name,
                "resourceVersion": rv,
                "managedFields": [{"manager": m, "operation": "Apply"} for m in sorted(managers)],
            }
            obj = {**body, "metadata": meta}
            self.objects[name] = obj
        if not quiet:
            self._events.put(("ADDED" if old is None else "MODIFIED", obj))
        return rv

    def delete(self, name: str, *, quiet: bool = False) -> None:
        with self._lock:
            obj = self.objects.pop(name)
            obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(next(self._rv))}}
        if not quiet:
            self._events.put(("DELETED", obj))

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        self._events.put((kind, obj))

    def close(self) -> None:
        self.closed = True
        self._events.put(None)

    # -- the agent's requests (patchbay-agent, as kubeclient.KubeClient does them) ----------
    def apply(self, report: dict[str, Any]) -> str:
        self.requests.append("apply")
        own = {k: v for k, v in report.items() if k != "metadata"}
        return self.write(report["metadata"]["name"], own, "patchbay-agent")

    def read_report(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.requests.append("get")
        return self.objects.get(name)

    def delete_report(self, namespace: str, name: str, resource_version: str) -> None:
        self.requests.append("delete")
        if self.objects.get(name, {}).get("metadata", {}).get("resourceVersion") == resource_version:
            self.delete(name)

    def node_uid(self, node_name: str) -> str:
        return f"uid-of-{node_name}"

    def apply_slice(self, doc: dict[str, Any]) -> dict[str, Any]:
        self.requests.append("apply")
        name = doc["metadata"]["name"]
        self.write(name, {k: v for k, v in doc.items() if k != "metadata"}, "patchbay-agent")
        return self.objects[name]

    def apply_inventory(self, doc: dict[str, Any]) -> dict[str, Any]:
        self.requests.append("apply")
        name = doc["metadata"]["name"]
        self.write(name, {k: v for k, v in doc.items() if k != "metadata"}, "patchbay-agent")
        return self.objects[name]

    def dry_run_slice(self, doc: dict[str, Any]) -> dict[str, Any]:
        self.requests.append("dry-run")
        return dict(doc)

    def slice_names(self, driver: str, node_name: str) -> list[str]:
        self.requests.append("list")
        return sorted(self.objects)

    def delete_slice(self, name: str) -> None:
        self.requests.append("delete")
        with contextlib.suppress(KeyError):
            self.delete(name)

    def list_objects(self, selection: Selection) -> tuple[list[dict[str, Any]], str]:
        self.requests.append("list")
        with self._lock:
            return [dict(o) for o in self.objects.values()], "1"

    def watch_objects(
        self, selection: Selection, resource_version: str, **_: Any
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        self.requests.append("watch")
        if self.watch_errors:
            raise self.watch_errors.pop(0)
        while not self.closed:
            item = self._events.get()
            if item is None:
                return
            yield item


def _cut(api: FakeApi) -> None:
    """The watch ends with an ERROR event (410 Gone): the watcher lists again."""
    api.event("ERROR", {"kind": "Status", "code": 410})


@pytest.fixture
def metrics() -> Metrics:
    return Metrics("example.com/serial", NODE)


@contextlib.asynccontextmanager
async def running(writer: ChangeWriter, api: FakeApi) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(writer.run(stop))
    try:
        yield
    finally:
        stop.set()
        api.close()
        await asyncio.wait_for(task, 5)


def _repairs(metrics: Metrics, kind: str) -> tuple[float, float]:
    return tuple(metrics.repairs.labels(kind, c).value for c in ("deleted", "edited"))


def _reporter(api: FakeApi, metrics: Metrics, devices: Callable[[], list[str]]) -> Reporter:
    def build(uid: str | None) -> dict[str, Any]:
        meta = {"name": TARGET.name, "namespace": TARGET.namespace}
        return {"metadata": meta, "agent": TARGET.agent, "devices": [{"id": d} for d in devices()]}

    watch = report_watch(api, TARGET)
    assert watch is not None
    return Reporter(TARGET, api, build, metrics, coalesce=0.01, watch=watch)


async def test_a_deleted_or_edited_report_is_written_again_and_the_agents_own_writes_cost_nothing(
    metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    api, devices = FakeApi(), ["tty0", "tty1"]
    reporter = _reporter(api, metrics, lambda: devices)
    name = TARGET.name
    async with running(reporter, api):
        # The first list and the first write's event looked at (the list may predate the write,
        # which costs one look).
        await until(
            lambda: (
                reporter.writes == 1
                and reporter.delivered >= 2
                and not reporter._verify.is_set()
                and reporter.verifies == api.requests.count("get")
            )
        )
        looked = reporter.verifies
        # A change the agent writes itself: its own event, no look, no read.
        devices.append("tty2")
        reporter.notify()
        await until(
            lambda: reporter.writes == 2 and reporter.delivered >= 3 and not reporter._verify.is_set()
        )
        assert reporter.verifies == looked == api.requests.count("get")

        # Deleted by someone: written again, once.
        api.delete(name)
        await until(lambda: reporter.writes == 3)
        assert api.objects[name]["devices"] == [{"id": d} for d in devices]
        assert _repairs(metrics, "DeviceReport") == (1, 0)
        assert f"DeviceReport {name} was deleted; written again" in caplog.text

        # Edited by kubectl (another field manager), the `agent` field left as it was: theirs is
        # deleted (a field they own would stay under an apply) and the agent's written afresh.
        edited = {k: v for k, v in api.objects[name].items() if k != "metadata"}
        api.write(name, {**edited, "devices": [{"id": "tty0", "health": "Unhealthy"}]}, "kubectl-edit")
        await until(lambda: reporter.writes == 4)
        assert api.objects[name]["devices"] == [{"id": d} for d in devices]
        assert [m["manager"] for m in api.objects[name]["metadata"]["managedFields"]] == ["patchbay-agent"]
        assert _repairs(metrics, "DeviceReport") == (1, 1)
        assert metrics.report_restores.labels().value == reporter.restored == 2
        assert f"DeviceReport {name} was edited by kubectl-edit (deleted it); written again" in caplog.text

        # The same pod's other reporter (same agent, same field manager) and a rollout's
        # successor (same DaemonSet, same manager): looked at, left alone.
        verifies = reporter.verifies
        api.write(name, dict(edited), "patchbay-agent")
        await until(lambda: reporter.verifies == verifies + 1)
        api.write(name, {**edited, "agent": "agent-pod-fghij"}, "patchbay-agent")
        await until(lambda: reporter.verifies == verifies + 2)
        assert (reporter.writes, reporter.restored, reporter._repairs._due) == (4, 2, {})

        # Another agent's name under the agent's field manager (a forgery): replaced.
        api.write(name, {**edited, "agent": "someone-else"}, "patchbay-agent")
        await until(lambda: reporter.writes == 5)
        assert api.objects[name]["agent"] == TARGET.agent
        assert f"DeviceReport {name} was written by someone-else (deleted it); written again" in caplog.text


async def test_a_deletion_while_the_watch_was_down_is_repaired_from_the_next_list(metrics: Metrics) -> None:
    api = FakeApi()
    reporter = _reporter(api, metrics, lambda: ["tty0"])
    name = TARGET.name
    async with running(reporter, api):
        watch = reporter._watch
        assert isinstance(watch, OwnWatch)
        await until(lambda: reporter.writes == 1 and reporter.delivered >= 2)
        # Deleted while the watch was down (no event), then the watch ends with 410 Gone.
        api.delete(name, quiet=True)
        _cut(api)
        await until(lambda: reporter.writes == 2)
        assert watch.lists == 2 and name in api.objects
        # A watch request that fails: listed again after the backoff, nothing to repair.
        api.watch_errors.append(ApiError(0, "cannot reach the API server"))
        _cut(api)
        await until(lambda: watch.lists == 4, within=10)
        assert reporter.writes == 2 and _repairs(metrics, "DeviceReport") == (1, 0)


def _publisher(api: FakeApi, metrics: Metrics, ids: list[str]) -> SlicePublisher:
    def devices() -> list[SliceDevice]:
        return [SliceDevice(i, i, {"patchbay.dev/id": {"string": i}}) for i in ids]

    watch = slice_watch(api, DRIVER, NODE)
    assert watch is not None
    return SlicePublisher(DRIVER, NODE, api, devices, metrics, coalesce=0.01, watch=watch)


async def test_a_deleted_or_edited_slice_is_written_again_and_a_successors_is_left_alone(
    metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    api = FakeApi()
    publisher = _publisher(api, metrics, ["tty0", "tty1"])
    async with running(publisher, api):
        await until(
            lambda: publisher.writes == 1 and publisher.delivered >= 2 and not publisher._verify.is_set()
        )
        (name,) = api.objects

        api.delete(name)
        await until(lambda: publisher.writes == 2)
        assert len(api.objects[name]["spec"]["devices"]) == 2
        assert f"ResourceSlice {name} was deleted; written again" in caplog.text

        spec = api.objects[name]["spec"]
        api.write(name, {"spec": {**spec, "devices": spec["devices"][:1]}}, "kubectl-edit")
        await until(lambda: publisher.writes == 3)
        assert len(api.objects[name]["spec"]["devices"]) == 2
        assert _repairs(metrics, "ResourceSlice") == (1, 1)
        assert f"ResourceSlice {name} was edited by kubectl-edit; written again" in caplog.text

        # A rollout's successor publishes the node's pool too (same field manager): left alone,
        # although kubectl-edit still owns a field (the fake keeps every manager, as a label
        # someone added would stay after the agent's write): no two agents take turns.
        verifies = publisher.verifies
        api.write(name, {"spec": {**spec, "pool": {**spec["pool"], "generation": 1}}}, "patchbay-agent")
        await until(lambda: publisher.verifies == verifies + 1)
        assert (publisher.writes, publisher._repairs._due) == (3, {})
        # A new edit by another manager: repaired.
        api.write(name, {"spec": {**spec, "devices": []}}, "kubectl-patch")
        await until(lambda: publisher.writes == 4)
        assert _repairs(metrics, "ResourceSlice") == (1, 2)


async def test_a_deleted_or_edited_node_inventory_is_written_again_and_paced_when_it_keeps_coming(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The node agent's NodeInventory (inventory/keeper.py) on a FAKE HARDWARE tree (an FTDI
    adapter): its own writes cost no look; deleted (`kubectl delete nodeinventory`) or a field
    changed by another field manager (`kubectl patch`), it is written again, once each; a
    rollout's successor (the same field manager) is left alone; a fourth repair within minutes
    waits (someone keeps deleting it: paced, not a loop)."""
    caplog.set_level(logging.INFO)
    hw = FakeHardware(tmp_path)
    fakemachines.ftdi_serial_adapter(hw)
    api = FakeApi()
    watch = inventory_watch(api, NODE)
    assert watch is not None and watch.selection.field_selector == f"metadata.name={NODE}"
    keeper = InventoryKeeper(
        HostRoot(tmp_path),
        NODE,
        "agent-pod-abcde",
        api,
        dict,
        coalesce=0.01,
        rescan=3600,
        gpus=False,
        watch=watch,
    )

    def looks() -> int:  # verify()'s LISTs: every LIST but the watch's own
        return api.requests.count("list") - watch.lists

    async with running(keeper, api):
        await until(lambda: keeper.writes == 1 and keeper.delivered >= 2 and not keeper._verify.is_set())
        assert [u["port"] for u in api.objects[NODE]["usb"]] == ["1-2"]
        looked = keeper.verifies
        # A change the keeper writes itself (the adapter unplugged): its own event, no look.
        fakemachines.remove_ftdi_serial_adapter(hw)
        await until(lambda: keeper.writes == 2 and keeper.delivered >= 3 and not keeper._verify.is_set())
        assert keeper.verifies == looked == looks() and "usb" not in api.objects[NODE]
        ours = {k: v for k, v in api.objects[NODE].items() if k != "metadata"}

        # Deleted by someone: written again, once.
        api.delete(NODE)
        await until(lambda: keeper.writes == 3)
        assert api.objects[NODE]["summary"] == ours["summary"] and "usb" not in api.objects[NODE]
        assert f"NodeInventory {NODE} was deleted; written again" in caplog.text

        # A field changed by another field manager (kubectl patch): the apply puts it back.
        api.write(NODE, {**ours, "summary": {**ours["summary"], "usb": 7}}, "kubectl-patch")
        await until(lambda: keeper.writes == 4)
        assert api.objects[NODE]["summary"] == ours["summary"]
        assert f"NodeInventory {NODE} was edited by kubectl-patch; written again" in caplog.text
        assert keeper.restored == 2

        # A rollout's successor writes the node's inventory too (same field manager): looked at,
        # left alone, although kubectl-patch still owns a field (the fake keeps every manager, as
        # a label someone added stays after the agent's apply).
        verifies = keeper.verifies
        api.write(NODE, {**ours, "agent": "agent-pod-fghij"}, "patchbay-agent")
        await until(lambda: keeper.verifies == verifies + 1)
        assert (keeper.writes, keeper._repairs._due) == (4, {})

        # Someone keeps deleting it: the third repair in the window is free, the fourth is held.
        api.delete(NODE)
        await until(lambda: keeper.writes == 5)
        verifies = keeper.verifies
        api.delete(NODE)
        await until(lambda: keeper.verifies == verifies + 1)
        assert keeper._retry_at is not None and NODE not in api.objects, "repaired at once: not paced"
        await until(lambda: keeper.writes == 6)
        assert keeper.restored == 4 and "NodeInventory repairs keep coming" in caplog.text


def test_repairs_tell_the_agents_own_events_from_someone_elses(metrics: Metrics) -> None:
    repairs = Repairs("ResourceSlice", metrics)
    ours = {
        "metadata": {"name": "a", "resourceVersion": "7", "managedFields": [{"manager": "patchbay-agent"}]}
    }
    repairs.wrote("7")
    theirs = {
        "metadata": {"name": "a", "resourceVersion": "8", "managedFields": [{"manager": "kubectl-edit"}]}
    }
    other = {"metadata": {"name": "b", "resourceVersion": "9"}}
    assert not repairs.suspect("MODIFIED", ours, {"a"})
    assert repairs.suspect("MODIFIED", theirs, {"a"})
    assert repairs.suspect("DELETED", ours, {"a"})
    assert not repairs.suspect("DELETED", other, {"a"})  # not one the agent wrote (a shrunk pool's)
    assert not repairs.suspect(LISTED, {"items": [ours, other]}, {"a"})
    assert repairs.suspect(LISTED, {"items": [other]}, {"a"})
    assert repairs.suspect(LISTED, {"items": [theirs]}, {"a"})
    # look(): what the server has now, against what was written.
    assert not repairs.look({"a"}, [ours])
    assert repairs.look({"a", "b"}, [theirs])
    repairs.written(["a"])
    repairs.written(["b"])
    assert (metrics.repairs.labels("ResourceSlice", "deleted").value, repairs.done) == (1, 2)
    assert metrics.repairs.labels("ResourceSlice", "edited").value == 1


def test_a_stopped_watch_ends_its_thread(metrics: Metrics) -> None:
    api = FakeApi()
    watch = OwnWatch(api, Selection("v1", "things", None, "metadata.name=a"), backoff=Backoff(0.01, 0.02))

    async def main() -> None:
        got: list[str] = []
        watch.start(lambda kind, _obj: got.append(kind))
        await until(lambda: got == [LISTED])
        api.write("a", {}, "someone")
        await until(lambda: got == [LISTED, "ADDED"])
        watch.stop()
        api.close()
        await asyncio.to_thread(watch.join, 5)

    asyncio.run(main())
    assert watch._thread is not None and not watch._thread.is_alive()


def test_repairs_that_keep_coming_are_paced_not_a_loop(metrics: Metrics) -> None:
    """Someone keeps undoing the agent's writes (the garbage collector deleting a report whose
    Node was replaced, a controller deleting slices): the first repairs in a while are immediate,
    then each waits longer (1 s doubling, with jitter), and after a quiet while they are free again."""
    now = [0.0]
    repairs = Repairs("DeviceReport", metrics, clock=lambda: now[0])
    delays = []
    for _ in range(6):
        delays.append(repairs.pace())
        now[0] += 1.0
    assert delays[:3] == [0.0, 0.0, 0.0]
    assert 0.8 <= delays[3] <= 1.2 and 1.6 <= delays[4] <= 2.4 and 3.2 <= delays[5] <= 4.8
    now[0] += 301.0
    assert repairs.pace() == 0.0


class _Counting(ChangeWriter):
    """A writer whose `sync()` only counts (every call a successful write)."""

    def __init__(self) -> None:
        super().__init__(coalesce=0.0)
        self.syncs = 0

    async def sync(self) -> bool:
        self.syncs += 1
        self.succeeded()
        return True


async def test_a_paced_repair_is_written_when_its_hold_ends_not_at_once() -> None:
    """`verify()` repairs by `notify()` then `hold(pace())`: the loop must honour the hold even
    though a change is pending (it wrote at once before, so a fight with someone deleting the
    report was a write per deletion: 37 of 37 in a minute on the real node, 2026-11-28)."""
    for hold in (3600.0, 0.05):
        writer = _Counting()
        stop = asyncio.Event()
        task = asyncio.create_task(writer.run(stop))
        try:
            await until(lambda w=writer: w.syncs == 1)  # the first write
            writer.notify()
            writer.hold(hold)
            if hold > 1:
                for _ in range(200):  # turns of the event loop, not wall time: the old loop wrote in ~5
                    await asyncio.sleep(0)
                assert writer.syncs == 1, "wrote during the hold"
            else:  # the pending change is written when the hold ends
                await until(lambda w=writer: w.syncs == 2)
                assert writer._retry_at is None
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)


def test_a_deletion_the_ordinary_write_undid_first_is_still_counted(metrics: Metrics) -> None:
    """Seen on the real node (twice: 0.08 s, then 0.03 s on v1.34.4 in CI): a DeviceReport deleted
    just as the reporter wrote a change was written again by that ordinary write, and the repair
    check then found its own version stored: the repair was done but never counted. The DELETED
    event makes the repair due, whichever write comes first. It carries the version *of the
    deletion* (as the API server sends it, docs/agent.md#what-the-agent-writes-again), never one
    the agent wrote: an earlier fix matched it against the agent's own versions and so never fired
    on a real API server."""
    repairs = Repairs("DeviceReport", metrics)
    repairs.wrote("7")
    deleted = {"metadata": {"name": "a", "resourceVersion": "8"}}  # the deletion's revision
    assert not repairs.suspect("MODIFIED", {"metadata": {"name": "a", "resourceVersion": "7"}}, {"a"})
    assert not repairs.pending("a")
    assert not repairs.suspect("DELETED", {"metadata": {"name": "b", "resourceVersion": "8"}}, {"a"})
    assert not repairs.pending("b")  # not an object the agent last wrote
    assert repairs.suspect("DELETED", deleted, {"a"})
    assert repairs.pending("a")
    repairs.wrote("9")  # the ordinary write, before the check
    repairs.written(["a"])
    assert (metrics.repairs.labels("DeviceReport", "deleted").value, repairs.done) == (1, 1)


def test_the_agents_own_deletion_is_no_repair_and_a_failed_one_forgets_itself(metrics: Metrics) -> None:
    """The reporter deletes a report someone edited (to write it afresh), the slice publisher the
    slices a pool no longer needs: their DELETED events are the agent's own, no repair (counted
    once, as edited, not again as deleted). A delete that failed leaves nothing behind: someone
    else's deletion later is a repair."""
    repairs = Repairs("DeviceReport", metrics)
    repairs.wrote("7")
    repairs.due("a", "edited", "edited by kubectl-edit (deleted it)")
    with repairs.deleting("a"):
        pass  # the delete
    repairs.suspect("DELETED", {"metadata": {"name": "a", "resourceVersion": "9"}}, {"a"})
    repairs.wrote("10")
    repairs.written(["a"])
    assert repairs.suspect("DELETED", {"metadata": {"name": "a", "resourceVersion": "11"}}, {"a"})
    repairs.wrote("12")
    repairs.written(["a"])
    counted = {c: metrics.repairs.labels("DeviceReport", c).value for c in ("edited", "deleted")}
    assert counted == {"edited": 1, "deleted": 1}

    with contextlib.suppress(OSError), repairs.deleting("a"):
        raise OSError("the delete failed")
    repairs.suspect("DELETED", {"metadata": {"name": "a", "resourceVersion": "13"}}, {"a"})
    assert repairs.pending("a")


def test_an_edit_the_ordinary_write_undid_first_is_still_counted(metrics: Metrics) -> None:
    """The same race for an edit: `kubectl edit` just as the reporter applies a change (forced: it
    takes the edited fields back), and the check finds the agent's own version stored. The
    MODIFIED event with another field manager makes the repair due; one by the agent's own field
    manager (a rollout's successor), or with only the managers its last write left in place (a
    label someone added), does not."""
    repairs = Repairs("ResourceSlice", metrics)
    agent = [{"manager": "patchbay-agent", "operation": "Apply"}]
    labelled = {
        "metadata": {"name": "s", "resourceVersion": "7", "managedFields": [*agent, {"manager": "ops"}]}
    }
    repairs.wrote("7", labelled)
    successor = {"metadata": {"name": "s", "resourceVersion": "8", "managedFields": agent}}
    assert repairs.suspect("MODIFIED", successor, {"s"})  # looked at, but no repair due
    assert not repairs.pending("s")
    kept = {"metadata": {"name": "s", "resourceVersion": "9", "managedFields": [*agent, {"manager": "ops"}]}}
    repairs.suspect("MODIFIED", kept, {"s"})
    assert not repairs.pending("s")
    edit = {
        "metadata": {
            "name": "s",
            "resourceVersion": "10",
            "managedFields": [*agent, {"manager": "kubectl-edit"}],
        }
    }
    repairs.suspect("MODIFIED", edit, {"s"})
    assert repairs.pending("s")
    repairs.wrote("11")  # the ordinary (forced) write, before the check
    repairs.written(["s"])
    assert (metrics.repairs.labels("ResourceSlice", "edited").value, repairs.done) == (1, 1)
