"""Device health: a per-device state machine with thresholds and hysteresis, and the checks.

The machine is what makes health both calm and honest:

* the FIRST observation sets the state directly (a device found broken at start is Unhealthy
  at once; there is no history to be patient about);
* after that, `failure_threshold` failed rounds in a row turn a Healthy device Unhealthy, and
  `success_threshold` good rounds in a row turn an Unhealthy device Healthy again. It RECOVERS:
  NVIDIA's plugin marks a GPU unhealthy for good, which strands it until someone restarts the
  plugin (docs/facts.md#other-systems); here a device that comes back is advertised again;
* a result in the other direction resets the streak, so a device that flaps never crosses.

Checks, in order, all under the host root:

1. existence: every check path exists (symlinks followed inside the host root);
2. openability for device files under /dev (docs/facts.md#device-checks):
   `open(O_RDONLY | O_NONBLOCK)`. ENXIO/ENODEV/EIO mean
   the driver has no device behind the node (unplugged USB serial adapters leave exactly that) and
   fail. EBUSY (in use by a workload), EACCES/EPERM (the agent's device cgroup or mode does not
   allow it, the normal case in an unprivileged DaemonSet) prove only existence and pass.
   VFIO group files are never opened: a group opens only once, and an agent holding it even
   briefly would make a VM's open fail;
3. the optional exec probe. A probe that cannot run (missing binary, timeout, killed) is a
   failure: a check that did not happen never reports Healthy.

Every failed check carries a CamelCase reason code (`Reason`) besides its human message; the
tracker keeps, per device, its health, since when (wall clock; the first observation counts) and,
while Unhealthy, the reason and message that made it so. That is what the agent's DeviceReport
says (`report/devicereport.py`). The message is the one seen when the device turned Unhealthy, replaced only
when the reason itself changes: a probe whose stderr differs every round must not turn each round
into an API write.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from patchbay_agent.command import Outcome, run_command
from patchbay_agent.config import DEFAULT_RECOVERY_HOLD_SECONDS, ExecProbe
from patchbay_agent.constants import ENV_PROBE_DEVICE_ID, ENV_PROBE_DEVICE_PATHS, DeviceHealth
from patchbay_agent.discovery import HostRoot, PhysicalDevice
from patchbay_api.constants import HealthReason

log = logging.getLogger(__name__)

_OPEN_PROVES_NOTHING = {errno.EBUSY, errno.EACCES, errno.EPERM}
_NEVER_OPEN_PREFIXES = ("/dev/vfio/",)
#: stat() errors that mean the path is not there (as opposed to "cannot look").
_MISSING = {errno.ENOENT, errno.ENOTDIR}


#: Why a check failed, in CamelCase (a DeviceReport's `reason`): the API package's reasons.
Reason = HealthReason


#: A device whose health changes this many times within FLAP_WINDOW seconds is flapping (a loose
#: connector, a device that resets in a loop): it is held Unhealthy, reason Flapping, until its
#: health has not changed for FLAP_WINDOW and it is Healthy, then it recovers once.
FLAP_CHANGES = 3
FLAP_WINDOW = 30.0
#: An Unhealthy device is published Healthy again only once its checks have passed for this long
#: (the profile's `health.recoveryHoldSeconds`; 0 turns the hold off). Failing is published at
#: once, recovering is not: a device that comes back for 3 s and fails again must not put a pod
#: on it in between. With the flap rule this makes 10 changes in 30 s reach the kubelet, the
#: slices and the pods as ONE transition (Unhealthy) and, once the device is quiet, one recovery.
RECOVERY_HOLD_SECONDS = float(DEFAULT_RECOVERY_HOLD_SECONDS)


_PROBE_REASONS = {
    Outcome.FAILED: Reason.PROBE_FAILED,
    Outcome.TIMED_OUT: Reason.PROBE_TIMED_OUT,
    Outcome.CANNOT_RUN: Reason.PROBE_NOT_RUN,
}


def _errno_text(e: OSError) -> str:
    """ "No such device or address (ENXIO)": the errno's text and its name."""
    name = errno.errorcode.get(e.errno or 0)
    text = e.strerror or str(e)
    return f"{text} ({name})" if name else text


class HealthMachine:
    """One device's health with hysteresis. `observe()` says whether the state flipped."""

    __slots__ = ("_failure_threshold", "_streak", "_success_threshold", "state")

    def __init__(self, failure_threshold: int, success_threshold: int) -> None:
        if failure_threshold < 1 or success_threshold < 1:
            raise ValueError("thresholds must be >= 1")
        self._failure_threshold = failure_threshold
        self._success_threshold = success_threshold
        self.state: DeviceHealth | None = None
        # Consecutive results that disagree with the current state.
        self._streak = 0

    @property
    def healthy(self) -> bool:
        return self.state is DeviceHealth.HEALTHY

    def set_thresholds(self, failure_threshold: int, success_threshold: int) -> None:
        """New thresholds (a profile changed in place); the current state and streak stay."""
        if failure_threshold < 1 or success_threshold < 1:
            raise ValueError("thresholds must be >= 1")
        self._failure_threshold = failure_threshold
        self._success_threshold = success_threshold

    def observe(self, ok: bool, definite: bool = False) -> bool:
        """Record one check round; True when the state changed (including the first one).

        ``definite`` failures (a device that vanished) flip to Unhealthy at once: hysteresis is
        for checks that flap, and a missing device must leave allocatable within milliseconds.
        Recovery always needs ``success_threshold`` rounds.
        """
        observed = DeviceHealth.HEALTHY if ok else DeviceHealth.UNHEALTHY
        if self.state is None or (definite and not ok):
            changed = self.state is not observed
            self.state = observed
            self._streak = 0
            return changed
        if observed is self.state:
            self._streak = 0
            return False
        self._streak += 1
        needed = self._success_threshold if ok else self._failure_threshold
        if self._streak >= needed:
            self.state = observed
            self._streak = 0
            return True
        return False


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    #: What the check saw, in words (a DeviceReport's `message`).
    reason: str = ""
    #: A failure that is a fact, not a flaky check (the device vanished): no failure threshold.
    definite: bool = False
    #: Why it failed, in CamelCase; empty when ok (CheckFailed is assumed for a failure without).
    code: str = ""


OK = CheckResult(True)


def check_paths(root: HostRoot, device: PhysicalDevice) -> CheckResult:
    """Existence and openability of a device's check paths (blocking: run it off the loop)."""
    for host_path in device.check_paths:
        real = root.resolve(host_path)
        try:
            st = os.stat(real)
        except OSError as e:
            code = Reason.VANISHED if e.errno in _MISSING else Reason.STAT_FAILED
            return CheckResult(False, f"{host_path}: {_errno_text(e)}", code=code)
        if not host_path.startswith("/dev/") or host_path.startswith(_NEVER_OPEN_PREFIXES):
            continue
        if stat.S_ISDIR(st.st_mode):
            continue
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError as e:
            if e.errno in _OPEN_PROVES_NOTHING:
                continue
            return CheckResult(False, f"{host_path}: cannot open: {_errno_text(e)}", code=Reason.OPEN_FAILED)
        os.close(fd)
    return OK


async def run_exec_probe(probe: ExecProbe, root: HostRoot, device: PhysicalDevice) -> CheckResult:
    """Run the profile's probe for one device; only exit status 0 in time is healthy.

    The probe sees the device's paths as the AGENT can open them (under the host root), in
    PATCHBAY_DEVICE_PATHS (comma-separated), and its ID in PATCHBAY_DEVICE_ID.
    """
    paths = ",".join(str(root.path(p)) for p in device.dev_paths or device.check_paths)
    result = await run_command(
        probe.command, {ENV_PROBE_DEVICE_ID: device.id, ENV_PROBE_DEVICE_PATHS: paths}, probe.timeout_seconds
    )
    if result.ok:
        return OK
    name = f"probe {probe.command[0]!r}" if result.outcome is Outcome.CANNOT_RUN else "probe"
    return CheckResult(False, f"{name} {result.detail}", code=_PROBE_REASONS[result.outcome])


@dataclass(frozen=True)
class DeviceStatus:
    """One device's health as a report states it."""

    healthy: bool
    #: wall-clock seconds when the device entered this health (its first observation counts)
    since: float
    #: while Unhealthy: the reason code and message of the failure that made it so
    reason: str = ""
    message: str = ""


class DeviceHealthTracker:
    """The machines of every device present, keyed by physical device ID."""

    def __init__(
        self,
        failure_threshold: int,
        success_threshold: int,
        clock: Callable[[], float] = time.time,
        *,
        recovery_hold: float = RECOVERY_HOLD_SECONDS,
    ) -> None:
        self._failure_threshold = failure_threshold
        self._success_threshold = success_threshold
        self._clock = clock
        self._recovery_hold = recovery_hold
        #: per device published Unhealthy whose machine is Healthy again: since when (the hold)
        self._recovering: dict[str, float] = {}
        self._machines: dict[str, HealthMachine] = {}
        self._reasons: dict[str, str] = {}
        self._status: dict[str, DeviceStatus] = {}
        #: per device: when its machine's state changed, within the last FLAP_WINDOW
        self._changes: dict[str, collections.deque[float]] = {}
        #: devices held Unhealthy as flapping
        self._flapping: set[str] = set()

    def observe(self, results: Mapping[str, CheckResult]) -> bool:
        """Feed one round's results; forget devices no longer present. True when anything flipped."""
        changed = False
        now = self._clock()
        for gone in set(self._machines) - set(results):
            del self._machines[gone]
            self._reasons.pop(gone, None)
            self._status.pop(gone, None)
            self._changes.pop(gone, None)
            self._flapping.discard(gone)
            self._recovering.pop(gone, None)
            changed = True
        for dev_id, result in results.items():
            machine = self._machines.get(dev_id)
            if machine is None:
                machine = self._machines[dev_id] = HealthMachine(
                    self._failure_threshold, self._success_threshold
                )
            before = machine.state
            flipped = machine.observe(result.ok, result.definite)
            if flipped and before is not None:
                self._changes.setdefault(dev_id, collections.deque()).append(now)
            if self._damp(dev_id, machine, now, result):
                changed = True
            elif dev_id in self._flapping:
                pass  # held Unhealthy: the machine's flips do not reach the status
            elif flipped and self._hold(dev_id, machine, now, result):
                pass  # published Unhealthy still: the recovery waits (or was called off)
            elif flipped:
                changed = True
                if before is None:
                    if not result.ok:
                        log.warning("Device %s is Unhealthy: %s", dev_id, result.reason)
                else:
                    log.info(
                        "Device %s is %s%s",
                        dev_id,
                        machine.state,
                        "" if result.ok else f": {result.reason}",
                    )
                self._status[dev_id] = _status_of(machine.healthy, now, result)
            else:
                current = self._status.get(dev_id)
                code = result.code or Reason.CHECK_FAILED
                if current is not None and not current.healthy and not result.ok and current.reason != code:
                    # Still Unhealthy, for another reason now (OpenFailed, then Vanished): say so,
                    # keeping `since`.
                    self._status[dev_id] = _status_of(False, current.since, result)
            if not result.ok:
                self._reasons[dev_id] = result.reason
        return self._release(now) or changed

    def _hold(self, dev_id: str, machine: HealthMachine, now: float, result: CheckResult) -> bool:
        """A flip of a device published Unhealthy: its machine turned Healthy (start the recovery
        hold) or Unhealthy again during the hold (call it off; the reason is updated, `since` is
        kept). True when the flip is not published."""
        current = self._status.get(dev_id)
        if current is None or current.healthy:
            return False
        if machine.healthy:
            if self._recovery_hold <= 0:
                return False
            self._recovering[dev_id] = now
            log.info(
                "Device %s passes its checks again; Healthy once it has for %g s", dev_id, self._recovery_hold
            )
            return True
        if (
            self._recovering.pop(dev_id, None) is not None
            and (result.code or Reason.CHECK_FAILED) != current.reason
        ):
            self._status[dev_id] = _status_of(False, current.since, result)
        return True

    def _release(self, now: float) -> bool:
        """Publish Healthy the devices whose recovery hold is over; True when any was."""
        released = False
        for dev_id, started in list(self._recovering.items()):
            machine = self._machines.get(dev_id)
            if machine is None or not machine.healthy or dev_id in self._flapping:
                del self._recovering[dev_id]
            elif now - started >= self._recovery_hold:
                del self._recovering[dev_id]
                log.info("Device %s is Healthy (its checks passed for %g s)", dev_id, now - started)
                self._status[dev_id] = DeviceStatus(True, now)
                released = True
        return released

    def release_due(self) -> bool:
        """Publish the recoveries whose hold is over (between rounds); True when any was."""
        return self._release(self._clock())

    def seconds_to_release(self) -> float | None:
        """Seconds until the next recovery hold ends (None: no device is held), so the monitor
        publishes the recovery on time rather than at its next periodic round."""
        if not self._recovering:
            return None
        return max(0.0, min(self._recovering.values()) + self._recovery_hold - self._clock())

    def _damp(self, dev_id: str, machine: HealthMachine, now: float, result: CheckResult) -> bool:
        """Enter or leave the flapping hold (see FLAP_CHANGES); True when the published health
        changed by it."""
        changes = self._changes.get(dev_id)
        while changes and now - changes[0] >= FLAP_WINDOW:
            changes.popleft()
        count = len(changes) if changes else 0
        if dev_id not in self._flapping:
            if count < FLAP_CHANGES:
                return False
            self._flapping.add(dev_id)
            self._recovering.pop(dev_id, None)
            current = self._status.get(dev_id)
            was_healthy = current is None or current.healthy
            since = now if was_healthy else current.since  # type: ignore[union-attr]
            last = self._reasons.get(dev_id) or result.reason
            message = f"its health changed {count} times in {FLAP_WINDOW:g} s (last failure: {last})"
            log.warning("Device %s is flapping: %s; held Unhealthy until it is stable", dev_id, message)
            self._status[dev_id] = DeviceStatus(False, since, Reason.FLAPPING, message)
            return was_healthy
        if count == 0 and machine.healthy:
            self._flapping.discard(dev_id)
            if self._recovery_hold > FLAP_WINDOW:
                # Quiet for FLAP_WINDOW, so Healthy at least that long: the rest of the hold.
                self._recovering[dev_id] = now - FLAP_WINDOW
                return False
            log.info("Device %s is stable again (no change for %g s): Healthy", dev_id, FLAP_WINDOW)
            self._status[dev_id] = DeviceStatus(True, now)
            return True
        return False

    def set_thresholds(
        self, failure_threshold: int, success_threshold: int, recovery_hold: float | None = None
    ) -> None:
        """New thresholds (and recovery hold) for every device (a profile changed in place): each
        keeps its health, its `since` and its streak, judged by the new thresholds from the next
        round on; a recovery hold under way is measured against the new hold."""
        for machine in self._machines.values():
            machine.set_thresholds(failure_threshold, success_threshold)
        self._failure_threshold = failure_threshold
        self._success_threshold = success_threshold
        if recovery_hold is not None:
            self._recovery_hold = recovery_hold

    def healthy(self, dev_id: str) -> bool:
        machine = self._machines.get(dev_id)
        return (
            machine is not None
            and machine.healthy
            and dev_id not in self._flapping
            and dev_id not in self._recovering
        )

    def reason(self, dev_id: str) -> str:
        """The message of the device's latest failed check (even while still Healthy)."""
        return self._reasons.get(dev_id, "")

    def status(self, dev_id: str) -> DeviceStatus | None:
        """The device's health, since when and why; None for a device never observed."""
        return self._status.get(dev_id)


def _status_of(healthy: bool, since: float, result: CheckResult) -> DeviceStatus:
    if healthy:
        return DeviceStatus(True, since)
    return DeviceStatus(False, since, result.code or Reason.CHECK_FAILED, result.reason)
