"""The DeviceReport as a pure function of (snapshot, health statuses, pods), and the health facts it
reports: reason codes from the real checks, `since` that moves only when the health flips."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from support.fakehw import FakeHardware
from support.reports import node_owner

from patchbay_agent.config import ExecProbe
from patchbay_agent.core.health import CheckResult, DeviceHealthTracker, Reason, check_paths, run_exec_probe
from patchbay_agent.core.inventory import Inventory, Snapshot
from patchbay_agent.discovery import HostRoot, PhysicalDevice
from patchbay_agent.report.devicereport import (
    MAX_DEVICES,
    MAX_HOLDERS,
    MAX_MESSAGE_LENGTH,
    MAX_MESSAGE_TOTAL,
    MAX_PODS_PER_DEVICE,
    PodRef,
    ReportTarget,
    SliceState,
    build_report,
    cap,
    holders_by_device,
    rfc3339,
    with_observed_at,
)

TARGET = ReportTarget("serial", "node-1", "patchbay", "example.com/serial", agent="agent-abc12")
T0 = 1_767_323_045.0  # 2026-01-02T03:04:05Z


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _devices(n: int) -> list[PhysicalDevice]:
    return [PhysicalDevice(f"tty{i}", (f"/dev/tty{i}",), (f"/dev/tty{i}",)) for i in range(n)]


def _snapshot(devices: list[PhysicalDevice], tracker: DeviceHealthTracker, replicas: int = 1) -> Snapshot:
    async def build() -> Snapshot:
        inv = Inventory(replicas, "rw")
        inv.update(devices, tracker)
        return inv.current

    return asyncio.run(build())


def test_rfc3339_and_cap() -> None:
    assert rfc3339(T0) == "2026-01-02T03:04:05Z"
    assert rfc3339(T0 + 0.999) == "2026-01-02T03:04:05Z"
    assert cap("short", 10) == "short"
    assert cap("x" * 600, 512) == "x" * 509 + "..."
    assert len(cap("é" * 600, MAX_MESSAGE_LENGTH)) == MAX_MESSAGE_LENGTH


def test_a_report_folds_replicas_counts_and_names_the_holders() -> None:
    clock = Clock()
    devices = _devices(3)
    tracker = DeviceHealthTracker(1, 1, clock=clock)
    tracker.observe(
        {
            "tty0": CheckResult(True),
            "tty1": CheckResult(
                False, "/dev/tty1: cannot open: No such device or address (ENXIO)", code="OpenFailed"
            ),
            "tty2": CheckResult(True),
        }
    )
    snap = _snapshot(devices, tracker, replicas=2)
    trainer, sidecar, other = (
        PodRef("ml", "trainer", "main"),
        PodRef("ml", "trainer", "side"),
        PodRef("a", "b", "c"),
    )
    containers = {
        # Two replicas of one device in one container, and a replica of it in another: one device.
        trainer: ("tty0::0", "tty0::1"),
        sidecar: ("tty0::1", "tty2::0"),
        # An ID the kubelet still reports for a device no longer listed: folded, then ignored.
        other: ("tty9::3",),
    }
    report = build_report(TARGET, snap, containers, node_uid="uid-1")

    assert report["apiVersion"] == "patchbay.dev/v1beta1"
    assert report["kind"] == "DeviceReport"
    assert report["metadata"] == {
        "name": "serial.node-1",
        "namespace": "patchbay",
        "labels": {"patchbay.dev/profile": "serial", "app.kubernetes.io/managed-by": "patchbay-agent"},
        "ownerReferences": [node_owner("node-1", "uid-1")],
    }
    assert (report["profile"], report["nodeName"], report["resourceName"], report["agent"]) == (
        "serial",
        "node-1",
        "example.com/serial",
        "agent-abc12",
    )
    assert "observedAt" not in report
    assert report["summary"] == {"total": 3, "healthy": 2, "unhealthy": 1, "allocated": 2}
    assert report["devices"] == [
        {
            "id": "tty0",
            "health": "Healthy",
            "since": "2026-01-02T03:04:05Z",
            "pods": [
                {"namespace": "ml", "name": "trainer", "container": "main"},
                {"namespace": "ml", "name": "trainer", "container": "side"},
            ],
        },
        {
            "id": "tty1",
            "health": "Unhealthy",
            "reason": "OpenFailed",
            "message": "/dev/tty1: cannot open: No such device or address (ENXIO)",
            "since": "2026-01-02T03:04:05Z",
        },
        {
            "id": "tty2",
            "health": "Healthy",
            "since": "2026-01-02T03:04:05Z",
            "pods": [{"namespace": "ml", "name": "trainer", "container": "side"}],
        },
    ]
    written = with_observed_at(report, T0 + 60)
    assert written["observedAt"] == "2026-01-02T03:05:05Z"
    assert {k: v for k, v in written.items() if k != "observedAt"} == report


def test_without_a_node_uid_or_pod_name_the_report_has_no_owner_and_no_agent() -> None:
    tracker = DeviceHealthTracker(1, 1)
    tracker.observe({"tty0": CheckResult(True)})
    report = build_report(
        ReportTarget("p", "n", "ns", "example.com/serial"),
        _snapshot(_devices(1), tracker),
        {},
    )
    assert "ownerReferences" not in report["metadata"]
    assert "agent" not in report
    assert report["summary"] == {"total": 1, "healthy": 1, "unhealthy": 0, "allocated": 0}
    assert report["devices"] == [
        {"id": "tty0", "health": "Healthy", "since": rfc3339(tracker.status("tty0").since)}
    ]  # type: ignore[union-attr]


def test_a_dra_report_says_what_the_api_server_does_with_taints_and_what_is_left_out() -> None:
    tracker = DeviceHealthTracker(1, 1)
    tracker.observe({"tty0": CheckResult(True), "tty1": CheckResult(False, "gone", code="Vanished")})
    snap = _snapshot(_devices(2), tracker)
    plain = build_report(TARGET, snap, {})
    assert "deviceTaints" not in plain and "withheld" not in plain["summary"]
    kept = build_report(TARGET, snap, {}, slices=SliceState("Kept"))
    assert kept["deviceTaints"] == "Kept" and kept["summary"]["withheld"] == 0
    assert all("withheld" not in d for d in kept["devices"])
    dropped = build_report(TARGET, snap, {}, slices=SliceState("Dropped", frozenset({"tty1"})))
    assert dropped["deviceTaints"] == "Dropped"
    assert dropped["summary"] == {"total": 2, "healthy": 1, "unhealthy": 1, "allocated": 0, "withheld": 1}
    assert [(d["id"], d.get("withheld")) for d in dropped["devices"]] == [("tty0", None), ("tty1", True)]


def test_long_messages_reasons_and_holder_lists_are_capped() -> None:
    tracker = DeviceHealthTracker(1, 1)
    tracker.observe(
        {"tty0": CheckResult(False, "probe exited 1: " + "E" * 2000, code="ProbeFailed" + "X" * 100)}
    )
    snap = _snapshot(_devices(1), tracker, replicas=100)
    containers = {PodRef("ns", f"pod{i:03d}", "c"): (f"tty0::{i}",) for i in range(100)}
    (device,) = build_report(TARGET, snap, containers)["devices"]
    assert len(device["message"]) == MAX_MESSAGE_LENGTH
    assert device["message"].startswith("probe exited 1: EEE")
    assert device["message"].endswith("...")
    assert len(device["reason"]) == 64
    assert len(device["pods"]) == MAX_PODS_PER_DEVICE
    assert device["pods"][0] == {"namespace": "ns", "name": "pod000", "container": "c"}


def test_over_the_crd_limit_unhealthy_and_held_devices_are_kept_and_summary_counts_all() -> None:
    n = MAX_DEVICES + 10
    devices = [PhysicalDevice(f"v{i}") for i in range(n)]
    tracker = DeviceHealthTracker(1, 1)
    tracker.observe({d.id: CheckResult(d.id != f"v{n - 1}", "gone", code="Vanished") for d in devices})
    snap = _snapshot(devices, tracker)
    report = build_report(TARGET, snap, {PodRef("a", "b", "c"): (f"v{n - 2}",)})
    ids = [d["id"] for d in report["devices"]]
    assert len(ids) == MAX_DEVICES
    assert ids[-2:] == [f"v{n - 2}", f"v{n - 1}"]
    assert ids[:3] == ["v0", "v1", "v2"]
    assert report["summary"] == {"total": n, "healthy": n - 1, "unhealthy": 1, "allocated": 1}


def test_holders_and_messages_stay_within_the_report_wide_budgets() -> None:
    """600 held devices (one holder each, 612 holders) and 300 unhealthy ones with 500-character
    messages (150,000 characters): the report keeps 512 holders and 65,536 characters, the
    unhealthy devices' messages first, and every device's reason; summary counts everything."""
    n = 900
    devices = [PhysicalDevice(f"v{i:03d}") for i in range(n)]
    tracker = DeviceHealthTracker(1, 1)
    tracker.observe(
        {d.id: CheckResult(i < 600, "m" * 500, code="ProbeFailed") for i, d in enumerate(devices)}
    )
    snap = _snapshot(devices, tracker)
    containers = {PodRef("ns", f"p{i:03d}", "c"): (f"v{i:03d}",) for i in range(600)}
    containers[PodRef("ns", "many", "c")] = tuple(f"v{i:03d}" for i in range(12))
    report = build_report(TARGET, snap, containers)
    entries = report["devices"]
    assert sum(len(e.get("pods", ())) for e in entries) == MAX_HOLDERS
    assert sum(len(e.get("message", "")) for e in entries) <= MAX_MESSAGE_TOTAL
    unhealthy = [e for e in entries if e["health"] == "Unhealthy"]
    assert len(unhealthy) == 300 and all(e["reason"] == "ProbeFailed" for e in unhealthy)
    assert sum(1 for e in unhealthy if "message" in e) == MAX_MESSAGE_TOTAL // 500 + 1  # the last one cut
    assert report["summary"] == {"total": n, "healthy": 600, "unhealthy": 300, "allocated": 600}


def test_holders_fold_by_the_snapshot_then_by_the_suffix() -> None:
    replica_of = {"long-abc-1234abcd::0": "a-very-long-id"}
    got = holders_by_device({PodRef("n", "p", "c"): ("long-abc-1234abcd::0", "gpu::12", "plain")}, replica_of)
    assert got == {
        "a-very-long-id": [PodRef("n", "p", "c")],
        "gpu": [PodRef("n", "p", "c")],
        "plain": [PodRef("n", "p", "c")],
    }


def test_since_moves_only_when_the_health_flips() -> None:
    clock = Clock()
    t = DeviceHealthTracker(failure_threshold=2, success_threshold=2, clock=clock, recovery_hold=0)
    t.observe({"a": CheckResult(True)})
    first = t.status("a")
    assert first is not None
    assert (first.healthy, first.since, first.reason, first.message) == (True, T0, "", "")

    clock.now += 10
    t.observe({"a": CheckResult(False, "probe exited 1: x", code=Reason.PROBE_FAILED)})  # streak 1 of 2
    assert t.status("a") == first
    clock.now += 10
    t.observe({"a": CheckResult(False, "probe exited 1: y", code=Reason.PROBE_FAILED)})  # flips
    down = t.status("a")
    assert down is not None
    assert (down.healthy, down.since, down.reason, down.message) == (
        False,
        T0 + 20,
        "ProbeFailed",
        "probe exited 1: y",
    )

    # Still Unhealthy for the same reason with other words: nothing changes (no write per round).
    clock.now += 10
    t.observe({"a": CheckResult(False, "probe exited 1: z", code=Reason.PROBE_FAILED)})
    assert t.status("a") == down
    # For another reason: the reason and message change, `since` does not.
    clock.now += 10
    t.observe({"a": CheckResult(False, "/dev/a: No such file or directory (ENOENT)", code=Reason.VANISHED)})
    other = t.status("a")
    assert other is not None
    assert (other.healthy, other.since, other.reason) == (False, T0 + 20, "Vanished")
    assert other.message == "/dev/a: No such file or directory (ENOENT)"

    # One good round of the two needed: still Unhealthy since T0+20; the second flips it.
    clock.now += 10
    t.observe({"a": CheckResult(True)})
    assert t.status("a") == other
    clock.now += 10
    t.observe({"a": CheckResult(True)})
    up = t.status("a")
    assert up is not None
    assert (up.healthy, up.since, up.reason, up.message) == (True, T0 + 60, "", "")


def test_a_device_found_broken_is_unhealthy_since_its_first_observation() -> None:
    """And a failure that names no reason code says CheckFailed."""
    clock = Clock()
    t = DeviceHealthTracker(3, 1, clock=clock)
    t.observe({"a": CheckResult(False, "broken")})
    status = t.status("a")
    assert status is not None
    assert (status.healthy, status.since, status.reason, status.message) == (
        False,
        T0,
        "CheckFailed",
        "broken",
    )
    assert t.status("never-seen") is None


def test_check_reasons_vanished_and_open_failed(tmp_path: Path) -> None:
    hw = FakeHardware(tmp_path / "h")
    root = HostRoot(hw.root)
    missing = check_paths(root, PhysicalDevice("ttyUSB9", check_paths=("/dev/ttyUSB9",)))
    assert (missing.ok, missing.code) == (False, Reason.VANISHED)
    assert missing.reason == "/dev/ttyUSB9: No such file or directory (ENOENT)"
    # FAKE HARDWARE: a bound Unix socket file opens with ENXIO, like an unplugged adapter's node.
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(hw.path("/dev/ttyUSB0")))
        gone = check_paths(root, PhysicalDevice("ttyUSB0", check_paths=("/dev/ttyUSB0",)))
    finally:
        sock.close()
    assert (gone.ok, gone.code) == (False, Reason.OPEN_FAILED)
    assert gone.reason == "/dev/ttyUSB0: cannot open: No such device or address (ENXIO)"
    assert check_paths(root, PhysicalDevice("ok")).code == ""


@pytest.mark.parametrize(
    ("body", "timeout", "code", "message"),
    [
        (
            'echo "first" >&2\necho "sensor says no" >&2\nexit 3\n',
            5,
            Reason.PROBE_FAILED,
            "probe exited 3: sensor says no",
        ),
        ("sleep 30\n", 0.5, Reason.PROBE_TIMED_OUT, "probe timed out after 0.5s"),
    ],
)
def test_probe_reasons(tmp_path: Path, body: str, timeout: float, code: Reason, message: str) -> None:
    script = tmp_path / "probe.sh"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    result = asyncio.run(
        run_exec_probe(ExecProbe((str(script),), timeout), HostRoot(tmp_path), PhysicalDevice("virtual-0"))
    )
    assert (result.ok, result.code, result.reason) == (False, code, message)


def test_a_probe_that_cannot_run_is_probe_not_run(tmp_path: Path) -> None:
    probe = ExecProbe((str(tmp_path / "absent"),), 2)
    result = asyncio.run(run_exec_probe(probe, HostRoot(tmp_path), PhysicalDevice("virtual-0")))
    assert (result.ok, result.code) == (False, Reason.PROBE_NOT_RUN)
    assert result.reason.startswith(f"probe {str(tmp_path / 'absent')!r} cannot run:")


def test_allocation_failures_count_at_once_and_the_report_carries_the_count_and_the_last() -> None:
    """report/failures.py: nothing failed, no field; each failure counts and tells the writer."""
    from patchbay_agent.report.failures import AllocationFailures

    clock = Clock()
    failures = AllocationFailures(clock)
    told: list[int] = []
    failures.subscribe(lambda: told.append(failures.count))
    tracker = DeviceHealthTracker(1, 1)
    tracker.observe({"tty0": CheckResult(True)})
    snap = _snapshot(_devices(1), tracker)
    assert failures.field() is None
    assert "allocationFailures" not in build_report(TARGET, snap, {}, allocation_failures=failures.field())
    clock.now = T0 + 7
    failures.record("Allocate: unknown device nope::0")
    clock.now = T0 + 9
    failures.record("Allocate: " + "x" * 600)
    assert told == [1, 2], "every failure tells the reporter (its change writer coalesces)"
    report = build_report(TARGET, snap, {}, allocation_failures=failures.field())
    assert report["allocationFailures"] == {
        "count": 2,
        "since": rfc3339(T0),
        "last": {"time": rfc3339(T0 + 9), "message": cap("Allocate: " + "x" * 600, MAX_MESSAGE_LENGTH)},
    }
    assert len(report["allocationFailures"]["last"]["message"]) == MAX_MESSAGE_LENGTH
