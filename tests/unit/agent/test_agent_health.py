"""The health state machine (thresholds, hysteresis, recovery) and the real checks."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.fakehw import FakeHardware

from patchbay_agent.config import ExecProbe, Health, PathsDiscovery
from patchbay_agent.constants import DeviceHealth
from patchbay_agent.core.health import (
    CheckResult,
    DeviceHealthTracker,
    HealthMachine,
    check_paths,
    run_exec_probe,
)
from patchbay_agent.core.inventory import Inventory
from patchbay_agent.core.monitor import Monitor
from patchbay_agent.discovery import HostRoot, PhysicalDevice, make_backend
from patchbay_agent.metrics import Metrics


def test_first_observation_sets_state_directly() -> None:
    m = HealthMachine(failure_threshold=3, success_threshold=2)
    assert m.state is None
    assert m.observe(False) is True
    assert m.state is DeviceHealth.UNHEALTHY


def test_failure_threshold_then_recovery_with_success_threshold() -> None:
    m = HealthMachine(failure_threshold=3, success_threshold=2)
    m.observe(True)
    assert [m.observe(False) for _ in range(3)] == [False, False, True]
    assert m.state is DeviceHealth.UNHEALTHY
    # It recovers: success_threshold good rounds in a row.
    assert [m.observe(True) for _ in range(2)] == [False, True]
    assert m.state is DeviceHealth.HEALTHY


def test_flapping_never_crosses_the_threshold() -> None:
    m = HealthMachine(failure_threshold=2, success_threshold=1)
    m.observe(True)
    for _ in range(10):
        assert m.observe(False) is False
        assert m.observe(True) is False
    assert m.healthy


def test_thresholds_of_one_flip_immediately() -> None:
    m = HealthMachine(1, 1)
    m.observe(True)
    assert m.observe(False) and m.state is DeviceHealth.UNHEALTHY
    assert m.observe(True) and m.state is DeviceHealth.HEALTHY


def test_invalid_thresholds_are_refused() -> None:
    with pytest.raises(ValueError, match="thresholds"):
        HealthMachine(0, 1)


def test_tracker_forgets_vanished_devices() -> None:
    t = DeviceHealthTracker(2, 1)
    assert t.observe({"a": CheckResult(True), "b": CheckResult(False, "gone")})
    assert t.healthy("a") and not t.healthy("b")
    assert t.reason("b") == "gone"
    assert t.observe({"a": CheckResult(True)})
    assert not t.healthy("b")
    assert not t.observe({"a": CheckResult(True)})


def test_check_paths_existence_and_symlinks(tmp_path: Path) -> None:
    hw = FakeHardware(tmp_path / "host")
    hw.add_dev("/dev/ttyUSB0")
    hw.add_symlink("/dev/serial0", "/dev/ttyUSB0")
    root = HostRoot(hw.root)
    assert check_paths(root, PhysicalDevice("a", check_paths=("/dev/ttyUSB0", "/dev/serial0"))).ok
    missing = check_paths(root, PhysicalDevice("b", check_paths=("/dev/ttyUSB0", "/dev/ttyUSB9")))
    assert not missing.ok
    assert "/dev/ttyUSB9" in missing.reason
    hw.remove_dev("/dev/ttyUSB0")
    assert not check_paths(root, PhysicalDevice("a", check_paths=("/dev/serial0",))).ok


def test_check_paths_fails_when_a_node_cannot_be_opened(tmp_path: Path) -> None:
    """A device node with no driver behind it opens with ENXIO (what an unplugged USB serial
    adapter's stale node does). FAKE HARDWARE: a bound Unix socket file at /dev/ttyUSB0 also
    opens with ENXIO, deterministically."""
    hw = FakeHardware(tmp_path / "h")
    node = hw.path("/dev/ttyUSB0")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(node))
        result = check_paths(HostRoot(hw.root), PhysicalDevice("ttyUSB0", check_paths=("/dev/ttyUSB0",)))
    finally:
        sock.close()
    assert not result.ok
    assert result.reason.startswith("/dev/ttyUSB0: cannot open")
    assert check_paths(HostRoot("/"), PhysicalDevice("null", check_paths=("/dev/null",))).ok


def _probe(tmp_path: Path, body: str, timeout: float = 5) -> ExecProbe:
    script = tmp_path / "probe.sh"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return ExecProbe(command=(str(script),), timeout_seconds=timeout)


def test_exec_probe_sees_device_env_and_exit_code_decides(tmp_path: Path) -> None:
    hw = FakeHardware(tmp_path / "host")
    hw.add_dev("/dev/ttyUSB0")
    out = tmp_path / "seen"
    probe = _probe(tmp_path, f'echo "$PATCHBAY_DEVICE_ID $PATCHBAY_DEVICE_PATHS" > {out}\nexit 0\n')
    dev = PhysicalDevice("ttyUSB0", ("/dev/ttyUSB0",), ("/dev/ttyUSB0",))
    assert asyncio.run(run_exec_probe(probe, HostRoot(hw.root), dev)).ok
    assert out.read_text().strip() == f"ttyUSB0 {hw.path('/dev/ttyUSB0')}"
    failing = _probe(tmp_path, 'echo "sensor says no" >&2\nexit 3\n')
    result = asyncio.run(run_exec_probe(failing, HostRoot(hw.root), dev))
    assert not result.ok
    assert result.reason == "probe exited 3: sensor says no"


def test_exec_probe_that_cannot_run_or_hangs_is_unhealthy(tmp_path: Path) -> None:
    dev = PhysicalDevice("virtual-0")
    root = HostRoot(tmp_path)
    missing = ExecProbe(command=(str(tmp_path / "no-such-probe"),), timeout_seconds=2)
    result = asyncio.run(run_exec_probe(missing, root, dev))
    assert not result.ok
    assert "cannot run" in result.reason
    hang = ExecProbe(command=(sys.executable, "-c", "import time; time.sleep(60)"), timeout_seconds=1)
    result = asyncio.run(run_exec_probe(hang, root, dev))
    assert not result.ok
    assert "timed out" in result.reason


def test_a_definite_failure_skips_the_failure_threshold_but_not_recovery() -> None:
    m = HealthMachine(3, 2)
    assert m.observe(True)
    assert m.observe(False, definite=True)  # vanished: Unhealthy at once
    assert not m.healthy
    assert not m.observe(True)  # recovery still needs 2 good rounds
    assert m.observe(True)
    assert m.healthy
    assert not m.observe(False)  # an ordinary failure still needs 3


def test_a_device_that_flaps_is_one_transition_then_one_recovery() -> None:
    """Ten changes in 30 s (a device that vanishes and returns every 3 s, successThreshold 1, the
    default 10 s recovery hold) reach the status as ONE transition (Unhealthy; reason Flapping
    from the third change on) and, once it stayed Healthy 30 s with no change, one recovery."""
    now = [1000.0]
    tracker = DeviceHealthTracker(1, 1, clock=lambda: now[0])
    ok, gone = CheckResult(True), CheckResult(False, "no longer discovered", True, "Vanished")
    tracker.observe({"d": ok, "e": ok})
    published: list[bool] = []
    for i in range(10):
        now[0] += 3.0
        tracker.observe({"d": gone if i % 2 == 0 else ok, "e": ok})
        if not published or published[-1] != tracker.healthy("d"):
            published.append(tracker.healthy("d"))
    assert published == [False]
    assert tracker.healthy("e")
    st = tracker.status("d")
    assert st is not None and (st.healthy, st.reason, st.since) == (False, "Flapping", 1003.0)
    assert "changed 3 times in 30 s" in st.message
    # Healthy now but changed within 30 s: still held.
    now[0] += 29.0
    tracker.observe({"d": ok, "e": ok})
    assert not tracker.healthy("d")
    now[0] += 2.0
    tracker.observe({"d": ok, "e": ok})
    assert tracker.healthy("d")
    st = tracker.status("d")
    assert st is not None and st.healthy and st.since == now[0]


def test_a_recovery_is_published_once_the_checks_passed_for_the_hold() -> None:
    """Failing is published at once; recovering only after `recovery_hold` seconds of passing
    checks. A failure during the hold calls it off (still Unhealthy, `since` kept, the reason
    of the new failure)."""
    now = [1000.0]
    tracker = DeviceHealthTracker(1, 1, clock=lambda: now[0], recovery_hold=10.0)
    ok = CheckResult(True)
    tracker.observe({"d": ok})
    assert tracker.seconds_to_release() is None
    now[0] += 100.0
    assert tracker.observe({"d": CheckResult(False, "/dev/d: cannot open", code="OpenFailed")})
    assert not tracker.healthy("d")
    now[0] += 40.0
    assert not tracker.observe({"d": CheckResult(False, "/dev/d: cannot open", code="OpenFailed")})
    now[0] += 1.0
    assert not tracker.observe({"d": ok})  # passes again: held, nothing published
    assert not tracker.healthy("d")
    assert tracker.seconds_to_release() == 10.0
    now[0] += 4.0  # (a third change within 30 s would be flapping; this is the second)
    assert not tracker.observe({"d": CheckResult(False, "probe exited 1", code="ProbeFailed")})
    st = tracker.status("d")
    assert st is not None and (st.healthy, st.since, st.reason) == (False, 1100.0, "ProbeFailed")
    assert tracker.seconds_to_release() is None
    now[0] += 40.0
    assert not tracker.observe({"d": ok})  # held again, from now
    now[0] += 9.9
    assert not tracker.observe({"d": ok})
    assert not tracker.healthy("d")
    assert tracker.seconds_to_release() == pytest.approx(0.1)
    now[0] += 0.1
    assert tracker.release_due()  # between rounds (the monitor wakes for it)
    assert tracker.healthy("d")
    st = tracker.status("d")
    assert st is not None and (st.healthy, st.since) == (True, now[0])
    assert tracker.seconds_to_release() is None and not tracker.release_due()


def test_a_recovery_hold_of_zero_publishes_at_once_and_can_be_changed_live() -> None:
    now = [1000.0]
    tracker = DeviceHealthTracker(1, 1, clock=lambda: now[0], recovery_hold=0)
    fail, ok = CheckResult(False, "x", code="OpenFailed"), CheckResult(True)
    tracker.observe({"d": ok})
    for _ in range(2):  # an ordinary failure and recovery: both published at once
        now[0] += 100.0
        assert tracker.observe({"d": fail})
        now[0] += 1.0
        assert tracker.observe({"d": ok}) and tracker.healthy("d")
    tracker.set_thresholds(1, 1, recovery_hold=5.0)  # a profile changed in place
    now[0] += 100.0
    tracker.observe({"d": fail})
    now[0] += 1.0
    assert not tracker.observe({"d": ok}) and not tracker.healthy("d")
    now[0] += 5.0
    assert tracker.observe({"d": ok}) and tracker.healthy("d")


def test_a_device_broken_at_start_and_a_vanished_one_recover_through_the_hold() -> None:
    now = [1000.0]
    tracker = DeviceHealthTracker(3, 1, clock=lambda: now[0], recovery_hold=10.0)
    tracker.observe({"a": CheckResult(False, "broken"), "b": CheckResult(True)})
    now[0] += 100.0
    tracker.observe({"a": CheckResult(True), "b": CheckResult(False, "gone", True, "Vanished")})
    assert not tracker.healthy("a") and not tracker.healthy("b")
    now[0] += 1.0
    tracker.observe({"a": CheckResult(True), "b": CheckResult(True)})
    now[0] += 9.0
    tracker.observe({"a": CheckResult(True), "b": CheckResult(True)})
    assert tracker.healthy("a") and not tracker.healthy("b")
    now[0] += 1.0
    tracker.observe({"a": CheckResult(True), "b": CheckResult(True)})
    assert tracker.healthy("b")
    # A device that goes away while held is forgotten with its hold.
    now[0] += 100.0
    tracker.observe({"a": CheckResult(False, "gone", True, "Vanished")})
    now[0] += 1.0
    tracker.observe({"a": CheckResult(True)})
    assert tracker.seconds_to_release() is not None
    tracker.observe({})
    assert tracker.seconds_to_release() is None


async def test_the_monitor_publishes_a_recovery_when_its_hold_ends_not_at_its_next_round(
    tmp_path: Path,
) -> None:
    """A fake /dev tree watched with inotify, a 300 s period and a 0.5 s recovery hold: the
    device file removed is Unhealthy at once (the watch runs a round), put back it is held, and
    it is published Healthy when the hold ends: nothing but the monitor's wake-up for the hold can
    do that within the bound."""
    hw = FakeHardware(tmp_path / "host")
    hw.add_dev("/dev/ttyUSB0")
    root = HostRoot(hw.root)
    health = Health(period_seconds=300, failure_threshold=1, success_threshold=1, recovery_hold_seconds=0.5)
    inventory = Inventory(1, "rw")
    monitor = Monitor(
        make_backend(PathsDiscovery(globs=("/dev/ttyUSB*",)), root),
        root,
        health,
        inventory,
        Metrics("example.com/serial", "node-1"),
    )
    await monitor.round(periodic=True)
    assert inventory.current.healthy_physical == {"ttyUSB0"}
    stop = asyncio.Event()
    task = asyncio.create_task(monitor.run(stop))

    async def until(what: str, predicate: Callable[[], bool], bound: float = 10.0) -> None:
        started = time.monotonic()
        while not predicate():
            assert time.monotonic() - started < bound, f"{what} within {bound} s"
            await asyncio.sleep(0.01)

    try:
        await asyncio.sleep(0.1)  # the watch is in place
        hw.remove_dev("/dev/ttyUSB0")
        await until("Unhealthy", lambda: not inventory.current.healthy_physical)
        hw.add_dev("/dev/ttyUSB0")
        await until("checked again", lambda: monitor.tracker.seconds_to_release() is not None)
        assert not inventory.current.healthy_physical  # held
        await until("Healthy", lambda: inventory.current.healthy_physical == {"ttyUSB0"})
        rounds = monitor.rounds
        status = monitor.tracker.status("ttyUSB0")
        assert status is not None and status.healthy
        assert monitor.rounds == rounds  # published without a round
    finally:
        stop.set()
        await task
