"""When the DeviceReport is written: coalesced, only when it changed, retried after failures, the
owner looked up only alongside a write; and the PodResources reader that feeds it. A fake client
stands in for the API (the real one is in tests/sockets and tests/integration)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc
import pytest
from support.agentrun import until
from support.converge import running

from patchbay_agent.backoff import Backoff
from patchbay_agent.config import Partitions
from patchbay_agent.core.holders import PodHolders
from patchbay_agent.kubelet import podresources
from patchbay_agent.metrics import Metrics
from patchbay_agent.report.devicereport import PodRef, ReportTarget
from patchbay_agent.report.reporter import Reporter

TARGET = ReportTarget("serial", "node-1", "patchbay", "example.com/serial")
RESOURCE = "example.com/serial"


class FakeClient:
    """Records applies; raises the queued errors first. Synchronous, like pykube."""

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []
        self.errors: list[Exception] = []
        self.uid_errors: list[Exception] = []
        self.uid_calls = 0

    def apply(self, report: Any) -> None:
        if self.errors:
            raise self.errors.pop(0)
        self.applied.append(dict(report))

    def node_uid(self, node_name: str) -> str:
        self.uid_calls += 1
        if self.uid_errors:
            raise self.uid_errors.pop(0)
        return f"uid-of-{node_name}"


class World:
    """What the report shows; the test changes it and notifies."""

    def __init__(self) -> None:
        self.devices: dict[str, str] = {"tty0": "Healthy", "tty1": "Healthy"}
        self.builds = 0
        self.broken = False

    def build(self, node_uid: str | None) -> dict[str, Any]:
        self.builds += 1
        if self.broken:
            raise RuntimeError("bug while building")
        meta: dict[str, Any] = {"name": TARGET.name, "namespace": TARGET.namespace}
        if node_uid:
            meta["ownerReferences"] = [{"uid": node_uid}]
        return {"metadata": meta, "devices": [{"id": k, "health": v} for k, v in self.devices.items()]}


def _counter(metrics: Metrics, result: str) -> float:
    return metrics.report_writes.labels(result).value


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(RESOURCE, "node-1", holder_labels=True)


def _running(reporter: Reporter) -> contextlib.AbstractAsyncContextManager[asyncio.Event]:
    return running(reporter.run, 5)


def _reporter(world: World, client: FakeClient, metrics: Metrics, **kw: Any) -> Reporter:
    times = iter(range(1_767_323_045, 1_767_323_045 + 10_000))
    return Reporter(TARGET, client, world.build, metrics, clock=lambda: float(next(times)), **kw)


async def test_changes_together_become_one_write_and_an_equal_report_none(metrics: Metrics) -> None:
    world, client = World(), FakeClient()
    reporter = _reporter(world, client, metrics, coalesce=0.2)
    async with _running(reporter):
        await until(lambda: len(client.applied) == 1)
        first = client.applied[0]
        assert first["observedAt"] == "2026-01-02T03:04:05Z"
        assert first["metadata"]["ownerReferences"] == [{"uid": "uid-of-node-1"}]
        assert reporter.written == {k: v for k, v in first.items() if k != "observedAt"}

        # A burst: a device and its partner flip, notified five times, all before the loop runs
        # again (with a 10 ms sleep between them, a machine under load once stretched the burst
        # past the 0.2 s window: two writes, the test failed).
        for i in range(5):
            world.devices["tty0" if i % 2 else "tty1"] = "Unhealthy"
            reporter.notify()
        await until(lambda: reporter.unchanged + reporter.writes >= 2)
        assert len(client.applied) == 2
        assert client.applied[1]["devices"] == [
            {"id": "tty0", "health": "Unhealthy"},
            {"id": "tty1", "health": "Unhealthy"},
        ]

        # Nothing changed: looked at, not written (observedAt alone is no change).
        for _ in range(3):
            reporter.notify()
            before = reporter.unchanged
            await until(lambda b=before: reporter.unchanged > b)
        assert len(client.applied) == 2
        assert _counter(metrics, "ok") == 2
        assert metrics.report_unchanged.labels().value == reporter.unchanged == 3
        # The owner was looked up once, before the first write, never again.
        assert client.uid_calls == 1


async def test_a_failed_write_is_retried_with_backoff_and_carries_later_changes(
    metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    world, client = World(), FakeClient()
    client.errors = [
        RuntimeError("403: devicereports.patchbay.dev denied by policy: wrong node"),
        RuntimeError("cannot reach the API server"),
    ]
    reporter = _reporter(world, client, metrics, coalesce=0.01, backoff=Backoff(0.2, 0.4))
    with caplog.at_level(logging.WARNING, logger="patchbay_agent.report.reporter"):
        async with _running(reporter):
            await until(lambda: reporter.failures == 1)
            # A change while the retry waits goes into the retry, not into a write of its own.
            world.devices["tty1"] = "Unhealthy"
            reporter.notify()
            await until(lambda: len(client.applied) == 1)
    assert reporter.failures == 2
    assert _counter(metrics, "error") == 2
    assert _counter(metrics, "ok") == 1
    assert client.applied[0]["devices"][1] == {"id": "tty1", "health": "Unhealthy"}
    messages = [r.getMessage() for r in caplog.records]
    assert any("denied by policy: wrong node" in m and "retrying in" in m for m in messages)
    assert any("cannot reach the API server" in m for m in messages)


async def test_without_the_node_uid_the_report_is_written_without_an_owner_then_gets_one(
    metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    world, client = World(), FakeClient()
    client.uid_errors = [RuntimeError("403: nodes is forbidden"), RuntimeError("403: nodes is forbidden")]
    reporter = _reporter(world, client, metrics, coalesce=0.01)
    with caplog.at_level(logging.INFO, logger="patchbay_agent.report.reporter"):
        async with _running(reporter):
            await until(lambda: len(client.applied) == 1)
            assert "ownerReferences" not in client.applied[0]["metadata"]
            # A quiet node: no write, so no lookup either.
            reporter.notify()
            await until(lambda: reporter.unchanged == 1)
            assert client.uid_calls == 1
            # A change: looked up again (fails again), written without owner.
            world.devices["tty0"] = "Unhealthy"
            reporter.notify()
            await until(lambda: len(client.applied) == 2)
            assert client.uid_calls == 2
            # The next change: the lookup works, the owner joins the same write.
            world.devices["tty0"] = "Healthy"
            reporter.notify()
            await until(lambda: len(client.applied) == 3)
    assert client.applied[2]["metadata"]["ownerReferences"] == [{"uid": "uid-of-node-1"}]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "nodes is forbidden" in warnings[0].getMessage()
    assert any("owned by the node now" in r.getMessage() for r in caplog.records)


async def test_a_bug_in_building_does_not_end_reporting(
    metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    world, client = World(), FakeClient()
    world.broken = True
    reporter = _reporter(world, client, metrics, coalesce=0.01, backoff=Backoff(0.05, 0.05))
    with caplog.at_level(logging.ERROR, logger="patchbay_agent.report.reporter"):
        async with _running(reporter):
            await until(lambda: world.builds >= 2)
            world.broken = False
            await until(lambda: len(client.applied) == 1)
    assert "Building the DeviceReport patchbay/serial.node-1 failed" in caplog.text


async def test_stop_ends_the_reporter_at_once(metrics: Metrics) -> None:
    reporter = _reporter(World(), FakeClient(), metrics, coalesce=30)
    stop = asyncio.Event()
    task = asyncio.create_task(reporter.run(stop))
    await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 1)
    assert reporter.writes == 0


# --- the PodResources reader --------------------------------------------------------------------


class FakeKubelet:
    def __init__(self) -> None:
        self.pods: list[podresources.Pod] = []
        self.calls = 0
        self.error: Exception | None = None

    async def list_pods(self, socket: object, *, rpc_timeout: float) -> list[podresources.Pod]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return list(self.pods)


def _pod(ns: str, name: str, **containers: tuple[str, ...]) -> podresources.Pod:
    return podresources.Pod(
        name,
        ns,
        tuple(
            podresources.Container(
                c, (podresources.Devices(RESOURCE, ids), podresources.Devices("other.com/x", ("x0",)))
            )
            for c, ids in containers.items()
        ),
    )


def _allocations(metrics: Metrics) -> dict[tuple[str, ...], float]:
    return {k: metrics.allocated_devices.labels(*k).value for k in metrics.allocated_devices.label_values()}


async def test_without_holder_labels_metrics_carry_the_total_and_no_pod_name() -> None:
    """The default (the agent's port is open to the pod network): one series, the sum, absent
    until the kubelet has been read once."""
    plain = Metrics(RESOURCE, "node-1")
    assert "\npatchbay_agent_allocated_devices " not in plain.registry.render().decode()
    kubelet = FakeKubelet()
    holders = PodHolders("/nope.sock", RESOURCE, plain, list_pods=kubelet.list_pods)
    kubelet.pods = [_pod("ml", "trainer", main=("tty0::0", "tty0::1")), _pod("ml", "eval", main=("tty1::0",))]
    assert await holders.read()
    assert _allocations(plain) == {(): 3}
    text = plain.registry.render().decode()
    assert "\npatchbay_agent_allocated_devices 3.0\n" in text and "trainer" not in text
    kubelet.pods = []
    assert await holders.read()
    assert _allocations(plain) == {(): 0}


async def test_holders_change_only_when_the_kubelet_says_so_and_survive_its_absence(
    metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    kubelet = FakeKubelet()
    holders = PodHolders("/nope.sock", RESOURCE, metrics, list_pods=kubelet.list_pods)
    changes: list[int] = []
    holders.subscribe(lambda: changes.append(1))
    kubelet.pods = [_pod("ml", "trainer", main=("tty0::0", "tty0::1"), idle=()), _pod("x", "y")]
    assert await holders.read()
    assert holders.containers == {PodRef("ml", "trainer", "main"): ("tty0::0", "tty0::1")}
    assert _allocations(metrics) == {("ml", "trainer", "main"): 2}
    assert not await holders.read()
    assert len(changes) == 1

    with caplog.at_level(logging.INFO, logger="patchbay_agent.core.holders"):
        kubelet.error = grpc.aio.AioRpcError(
            grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "connection refused"
        )
        for _ in range(3):
            assert not await holders.read()
        # Kept as last known while the kubelet does not answer; said once.
        assert holders.containers == {PodRef("ml", "trainer", "main"): ("tty0::0", "tty0::1")}
        kubelet.error = None
        kubelet.pods = [_pod("ml", "eval", main=("tty1::0",))]
        assert await holders.read()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "UNAVAILABLE: connection refused" in warnings[0]
    assert "answers again" in caplog.text
    # The trainer's series went with the trainer.
    assert _allocations(metrics) == {("ml", "eval", "main"): 1}
    assert metrics.pod_resources_reads.labels("error").value == 3
    assert metrics.pod_resources_reads.labels("ok").value == 3


async def test_allocates_cause_one_read_shortly_after(metrics: Metrics) -> None:
    kubelet = FakeKubelet()
    holders = PodHolders(
        "/nope.sock", RESOURCE, metrics, period=3600, after_allocate=0.2, list_pods=kubelet.list_pods
    )
    stop = asyncio.Event()
    task = asyncio.create_task(holders.run(stop))
    try:
        await until(lambda: kubelet.calls == 1)  # the first read, at once
        assert holders.attempted.is_set()
        for _ in range(10):
            holders.allocated()  # a burst of Allocates
        await asyncio.sleep(0.05)
        assert kubelet.calls == 1  # not yet: the kubelet records them after our answer
        await until(lambda: kubelet.calls == 2)
        await asyncio.sleep(0.3)
        assert kubelet.calls == 2  # one read for the burst
    finally:
        stop.set()
        await asyncio.wait_for(task, 2)


@pytest.mark.parametrize("partitions", [None, Partitions(4, (1, 2, 4))], ids=["whole", "partitioned"])
async def test_dra_holders_are_the_claimed_devices_of_our_driver_and_pool(
    metrics: Metrics, partitions: Partitions | None
) -> None:
    """A DRA agent's holders (`dra_holdings`, as the agent builds them): the devices PodResources
    lists under a container's claims, for its driver and its node's pool only, by the physical ID
    each slice device name stands for; with partitions, a partition counts as its device."""
    from patchbay_agent.core.health import CheckResult, DeviceHealthTracker
    from patchbay_agent.core.inventory import Inventory
    from patchbay_agent.discovery import PhysicalDevice
    from patchbay_agent.dra.slices import device_name, partition_device_name
    from patchbay_agent.resourceagent import dra_holdings

    driver, pool = "serial.patchbay.dev", "node-1"
    inventory = Inventory(1, "rw")
    tracker = DeviceHealthTracker(1, 1)
    tty = [PhysicalDevice(f"ttyUSB{n}", (f"/dev/ttyUSB{n}",)) for n in range(3)]
    tracker.observe({d.id: CheckResult(True) for d in tty})
    inventory.update(tty, tracker)
    whole = [device_name(d.id) for d in tty]
    # ttyUSB1 claimed whole (or, partitioned, its slots 2-3); ttyUSB0 by another driver's claim
    held_name = whole[1] if partitions is None else partition_device_name(whole[1], 2, 2)

    def claim(*resources: tuple[str, str, str]) -> podresources.DynamicResource:
        return podresources.DynamicResource(
            "claim",
            "ml",
            tuple(
                podresources.ClaimResource(driver_name=d, pool_name=p, device_name=n) for d, p, n in resources
            ),
        )

    kubelet = FakeKubelet()
    kubelet.pods = [
        podresources.Pod(
            "trainer",
            "ml",
            (
                podresources.Container(
                    "main",
                    dynamic_resources=(
                        claim(
                            (driver, pool, held_name),
                            ("gpu.example.com", pool, whole[0]),  # another driver
                            (driver, "node-2", whole[0]),  # another node's pool
                            (driver, pool, "not-ours-9f9f"),  # a name this pool does not list
                        ),
                    ),
                ),
                podresources.Container("sidecar"),
            ),
        )
    ]
    held = dra_holdings(inventory, driver, pool, partitions)
    holders = PodHolders("/nope.sock", RESOURCE, metrics, list_pods=kubelet.list_pods, held=held)
    assert await holders.read()
    assert holders.containers == {PodRef("ml", "trainer", "main"): ("ttyUSB1",)}
    assert holders.plugin_held == frozenset()
    # A pod still holding devices through the DEVICE PLUGIN of the resource (a node being moved to
    # DRA): their physical IDs, whatever replica the kubelet gave out; a change is a change.
    kubelet.pods.append(_pod("ml", "legacy", main=("ttyUSB0::1",), side=("ttyUSB2",)))
    assert await holders.read()
    assert holders.plugin_held == frozenset({"ttyUSB0", "ttyUSB2"})


def test_pods_of_one_daemonset_differ_only_in_the_random_suffix() -> None:
    from patchbay_agent.report.reporter import same_daemonset

    assert same_daemonset("patchbay-serial-x7k2p", "patchbay-serial-9qz4m")
    assert not same_daemonset("patchbay-serial-x7k2p", "patchbay-serial-x7k2p")  # itself
    assert not same_daemonset("patchbay-sensor-x7k2p", "patchbay-serial-9qz4m")  # another profile's
    assert not same_daemonset("patchbay-node-agent-x7k2p", "patchbay-serial-9qz4m")
    assert not same_daemonset("patchbay-serial-x7k2p", None)
    assert not same_daemonset("", "")
    # A base cut to 58 characters: still the same DaemonSet.
    base = "patchbay-" + "a" * 49
    assert same_daemonset(base + "x7k2p", base + "9qz4m")
