"""DRA mode's health list for the kubelet (`dra/healthservice.py`): what each message says, built once per
snapshot (and API version: v1, and v1alpha1 for kubelets before 1.37), and a stream's heartbeat,
changes, vanished devices and clean end (no sockets here)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from patchbay_agent.api import dra_health_v1_pb2 as pb
from patchbay_agent.api import dra_health_v1alpha1_pb2 as alpha_pb
from patchbay_agent.core.health import CheckResult, DeviceHealthTracker
from patchbay_agent.core.inventory import Inventory
from patchbay_agent.discovery import PhysicalDevice
from patchbay_agent.dra.healthservice import DraHealthServicer, HealthReports, health_response
from patchbay_agent.dra.slices import device_name

NODE = "node-1"
TTY0, TTY1 = PhysicalDevice("ttyUSB0", ("/dev/ttyUSB0",)), PhysicalDevice("ttyUSB1", ("/dev/ttyUSB1",))


def _states(message: pb.NodeWatchResourcesResponse) -> dict[str, tuple[str, str]]:
    assert {d.device.pool_name for d in message.devices} <= {NODE}
    return {
        d.device.device_name: (pb.HealthStatus.Name(d.health), d.message.split(":")[0])
        for d in message.devices
    }


def _setup() -> tuple[Inventory, DeviceHealthTracker]:
    inv, tracker = Inventory(1, "rw"), DeviceHealthTracker(1, 1, recovery_hold=0)
    tracker.observe({TTY0.id: CheckResult(True), TTY1.id: CheckResult(True)})
    inv.update([TTY0, TTY1], tracker)
    return inv, tracker


def test_the_list_names_devices_as_the_slices_do() -> None:
    inv, tracker = _setup()
    tracker.observe({TTY0.id: CheckResult(True), TTY1.id: CheckResult(False, "gone", True, "Vanished")})
    inv.update([TTY0, TTY1], tracker)
    message = health_response(inv.current, NODE, now=1234.9)
    assert _states(message) == {
        device_name("ttyUSB0"): ("HEALTHY", ""),
        device_name("ttyUSB1"): ("UNHEALTHY", "Vanished"),
    }
    assert {(d.last_updated_time, d.health_check_timeout_seconds) for d in message.devices} == {(1234, 30)}
    # A device the tracker never observed is neither healthy nor unhealthy.
    unobserved = dataclasses.replace(inv.current, status={})
    assert _states(health_response(unobserved, NODE, now=0))[device_name("ttyUSB1")] == (
        "UNKNOWN",
        "",
    )


def test_the_list_is_built_once_per_snapshot() -> None:
    inv, tracker = _setup()
    reports = HealthReports(NODE, inv)
    first = reports.response(inv.current)
    assert reports.response(inv.current) is first
    tracker.observe({TTY0.id: CheckResult(True), TTY1.id: CheckResult(False, "gone", True, "Vanished")})
    inv.update([TTY0, TTY1], tracker)
    assert reports.response(inv.current) is not first


async def test_a_stream_sends_changes_heartbeats_vanished_devices_and_ends() -> None:
    inv, tracker = _setup()
    servicer = DraHealthServicer(HealthReports(NODE, inv), heartbeat=0.05)
    context: Any = None
    stream = servicer.NodeWatchResources(pb.NodeWatchResourcesRequest(), context)
    healthy = {device_name("ttyUSB0"): ("HEALTHY", ""), device_name("ttyUSB1"): ("HEALTHY", "")}
    assert _states(await anext(stream)) == healthy
    assert servicer.streams == 1
    assert _states(await anext(stream)) == healthy  # nothing changed: the heartbeat

    tracker.observe({TTY0.id: CheckResult(True)})  # ttyUSB1 is no longer discovered
    inv.update([TTY0], tracker)
    message = await anext(stream)
    while _states(message) == healthy:
        message = await anext(stream)
    assert _states(message) == {
        device_name("ttyUSB0"): ("HEALTHY", ""),
        device_name("ttyUSB1"): ("UNKNOWN", "no longer discovered"),
    }
    # Said once; then left out (the kubelet forgets it after its timeout).
    assert _states(await anext(stream)) == {device_name("ttyUSB0"): ("HEALTHY", "")}

    inv.close()
    rest = [m async for m in stream]
    assert len(rest) <= 1
    assert servicer.streams == 0


async def test_a_cancelled_stream_is_counted_out() -> None:
    inv, _tracker = _setup()
    servicer = DraHealthServicer(HealthReports(NODE, inv))
    context: Any = None
    stream = servicer.NodeWatchResources(pb.NodeWatchResourcesRequest(), context)
    await anext(stream)
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    pending.cancel()
    await asyncio.gather(pending, return_exceptions=True)
    assert servicer.streams == 0


def test_the_v1alpha1_list_is_the_v1_list_in_v1alpha1_types_built_once() -> None:
    inv, tracker = _setup()
    tracker.observe({TTY0.id: CheckResult(True), TTY1.id: CheckResult(False, "gone", True, "Vanished")})
    inv.update([TTY0, TTY1], tracker)
    reports = HealthReports(NODE, inv)
    v1 = reports.response(inv.current)
    alpha = reports.response_as(inv.current, alpha_pb.NodeWatchResourcesResponse)
    assert isinstance(alpha, alpha_pb.NodeWatchResourcesResponse)
    assert alpha.SerializeToString() == v1.SerializeToString()
    (sick,) = [d for d in alpha.devices if d.health == alpha_pb.UNHEALTHY]
    assert (sick.device.pool_name, sick.device.device_name) == (NODE, device_name("ttyUSB1"))
    assert sick.message.startswith("Vanished") and sick.health_check_timeout_seconds == 30
    assert reports.response_as(inv.current, alpha_pb.NodeWatchResourcesResponse) is alpha
    assert reports.response_as(inv.current, pb.NodeWatchResourcesResponse) is v1
    tracker.observe({TTY0.id: CheckResult(True), TTY1.id: CheckResult(True)})
    inv.update([TTY0, TTY1], tracker)
    again = reports.response_as(inv.current, alpha_pb.NodeWatchResourcesResponse)
    assert again is not alpha and {d.health for d in again.devices} == {alpha_pb.HEALTHY}


async def test_a_v1alpha1_stream_counts_with_the_v1_streams() -> None:
    inv, tracker = _setup()
    servicer = DraHealthServicer(HealthReports(NODE, inv), heartbeat=0.05)
    context: Any = None
    stream = servicer.v1alpha1.NodeWatchResources(alpha_pb.NodeWatchResourcesRequest(), context)
    first = await anext(stream)
    assert isinstance(first, alpha_pb.NodeWatchResourcesResponse)
    assert {d.device.device_name for d in first.devices} == {device_name("ttyUSB0"), device_name("ttyUSB1")}
    assert (servicer.streams, servicer.opened) == (1, {"v1": 0, "v1alpha1": 1})
    tracker.observe({TTY0.id: CheckResult(True)})  # ttyUSB1 is no longer discovered
    inv.update([TTY0], tracker)
    message = await anext(stream)
    while len(message.devices) == 2 and all(d.health == alpha_pb.HEALTHY for d in message.devices):
        message = await anext(stream)
    assert isinstance(message, alpha_pb.NodeWatchResourcesResponse)
    gone = {d.device.device_name: (d.health, d.message) for d in message.devices}[device_name("ttyUSB1")]
    assert gone == (alpha_pb.UNKNOWN, "no longer discovered")
    inv.close()
    _ = [m async for m in stream]
    assert servicer.streams == 0
