"""The health state machine (thresholds, hysteresis, recovery) and the real checks."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pytest
from support.fakehw import FakeHardware

from patchbay_agent.config import ExecProbe
from patchbay_agent.constants import DeviceHealth
from patchbay_agent.core.health import (
    CheckResult,
    DeviceHealthTracker,
    HealthMachine,
    check_paths,
    run_exec_probe,
)
from patchbay_agent.discovery import HostRoot, PhysicalDevice


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


def test_a_device_that_flaps_is_held_unhealthy_until_it_is_quiet() -> None:
    """Ten changes in 30 s (a device that vanishes and returns every 3 s, successThreshold 1) reach
    the status as three (Unhealthy, Healthy, Unhealthy: then reason Flapping) and, once it stayed
    Healthy 30 s with no change, one recovery; an ordinary failure and recovery is never held."""
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
    assert published == [False, True, False]
    st = tracker.status("d")
    assert st is not None and (st.healthy, st.reason) == (False, "Flapping")
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
    # An ordinary failure and recovery: published at once, both ways.
    now[0] += 100.0
    tracker.observe({"d": gone, "e": ok})
    assert not tracker.healthy("d")
    now[0] += 1.0
    tracker.observe({"d": ok, "e": ok})
    assert tracker.healthy("d")
