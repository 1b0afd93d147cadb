"""The discovery + health loop: keeps the inventory true.

A round = scan (devices that appeared or vanished) + path checks + exec probes, then one
observation per device into its health machine, then a new snapshot if anything the kubelet sees
changed. Rounds run every `health.periodSeconds` and, for backends with device files, at once when
inotify reports a change in a watched /dev directory: a removed device node reaches the kubelet in
milliseconds, not a period later. Exec probes run on periodic rounds only (and for devices seen for
the first time); event rounds reuse each device's last probe result, so a burst of udev events
cannot fork a burst of probes.

`reconfigure` swaps the discovery backend and the health settings of a running monitor (a profile
changed in place, without a new registration; agent.py): the next round runs at once with them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from patchbay_agent.config import Health
from patchbay_agent.core.health import (
    OK,
    CheckResult,
    DeviceHealthTracker,
    Reason,
    check_paths,
    run_exec_probe,
)
from patchbay_agent.core.inventory import Inventory, SnapshotRefusedError
from patchbay_agent.discovery import Backend, HostRoot, PhysicalDevice
from patchbay_agent.fswatch import DirWatcher
from patchbay_agent.metrics import Metrics
from patchbay_agent.wakeup import wait_any

log = logging.getLogger(__name__)

#: At most this many exec probes run at once, however many devices there are.
MAX_PARALLEL_PROBES = 8


class Monitor:
    def __init__(
        self,
        backend: Backend,
        root: HostRoot,
        health: Health,
        inventory: Inventory,
        metrics: Metrics,
    ) -> None:
        self._backend = backend
        self._root = root
        self._health = health
        self._inventory = inventory
        self._metrics = metrics
        self.tracker = DeviceHealthTracker(
            health.failure_threshold, health.success_threshold, recovery_hold=health.recovery_hold_seconds
        )
        self._probe_results: dict[str, CheckResult] = {}
        self._probe_slots = asyncio.Semaphore(MAX_PARALLEL_PROBES)
        self._kick = asyncio.Event()
        self._watcher: DirWatcher | None = None
        self._known: dict[str, PhysicalDevice] = {}
        self.rounds = 0
        #: set by `reconfigure`: the next round is a periodic one (probes run) and the period restarts
        self._reperiod = False

    def _scan_and_check(self) -> tuple[list[PhysicalDevice], dict[str, CheckResult]]:
        """Scan, then check every device's paths.

        A device seen earlier in this run that is no longer discovered stays listed and fails:
        the kubelet keeps counting it in capacity but not in allocatable, the profile's status
        names the node (Degraded), and the device recovers when it comes back. Silently shrinking
        capacity would hide a broken or unplugged device. Only a restart of the agent forgets it.
        """
        found = self._backend.scan()
        present = {d.id for d in found}
        self._known.update((d.id, d) for d in found)
        results = {d.id: check_paths(self._root, d) for d in found}
        for dev_id in self._known.keys() - present:
            device = self._known[dev_id]
            results[dev_id] = CheckResult(
                False,
                f"no longer discovered ({', '.join(device.check_paths) or 'no device files'})",
                definite=True,
                code=Reason.VANISHED,
            )
        # First-seen order: a device that vanishes and returns keeps its place in the list.
        return list(self._known.values()), results

    async def _probe(self, device: PhysicalDevice) -> CheckResult:
        assert self._health.exec is not None
        async with self._probe_slots:
            return await run_exec_probe(self._health.exec, self._root, device)

    async def round(self, *, periodic: bool) -> bool:
        """One round; True when a new snapshot was published (the inventory tells its subscribers).
        Raises SnapshotRefusedError when a front-end refuses the new list (the kubelet's limit)."""
        started = time.perf_counter()
        devices, results = await asyncio.to_thread(self._scan_and_check)
        if self._health.exec is not None:
            await self._run_probes(devices, results, periodic)
        self.tracker.observe(results)
        changed = self._inventory.update(devices, self.tracker)
        self.rounds += 1
        snap = self._inventory.current
        self._metrics.observe_round(
            time.perf_counter() - started,
            {pid: pid in snap.healthy_physical for pid in snap.physical},
            snap.advertised,
            len(snap.healthy),
        )
        return changed

    async def _run_probes(
        self, devices: Sequence[PhysicalDevice], results: dict[str, CheckResult], periodic: bool
    ) -> None:
        present = {d.id for d in devices}
        for gone in set(self._probe_results) - present:
            del self._probe_results[gone]
        todo = [d for d in devices if results[d.id].ok and (periodic or d.id not in self._probe_results)]
        outcomes = await asyncio.gather(*(self._probe(d) for d in todo))
        for d, outcome in zip(todo, outcomes, strict=True):
            self._probe_results[d.id] = outcome
        for d in devices:
            if results[d.id].ok:
                results[d.id] = self._probe_results.get(d.id, OK)

    def reconfigure(self, backend: Backend | None, health: Health) -> None:
        """Use `backend` (None: keep the current one) and `health` from the next round on, and run
        that round now. A new discovery forgets the devices it no longer finds instead of calling
        them vanished: the user narrowed the profile, nothing broke. Devices still found keep their
        health, `since` and streak; a changed probe is run for every device in that round."""
        if backend is not None:
            self._backend = backend
            self._known.clear()
            watch_dirs = backend.watch_dirs()
            if watch_dirs and self._watcher is None:
                self._watcher = DirWatcher(self._on_fs_event)  # on the loop: reconfigure runs there
            if self._watcher is not None:
                self._watcher.ensure(watch_dirs)
        if health.exec != self._health.exec:
            self._probe_results.clear()
        self.tracker.set_thresholds(
            health.failure_threshold, health.success_threshold, health.recovery_hold_seconds
        )
        self._health = health
        self._reperiod = True
        self._kick.set()

    def _on_fs_event(self, directory: Path, name: str, mask: int) -> None:
        """A watched directory changed: run a round now."""
        self._kick.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds until `stop` is set. The first round must already have run (see Agent)."""
        watch_dirs = self._backend.watch_dirs()
        if watch_dirs and self._watcher is None:
            self._watcher = DirWatcher(self._on_fs_event)
            self._watcher.ensure(watch_dirs)
        next_periodic = time.monotonic() + self._health.period_seconds
        try:
            while not stop.is_set():
                timeout = next_periodic - time.monotonic()
                release = self.tracker.seconds_to_release()
                await wait_any((self._kick, stop), timeout if release is None else min(timeout, release))
                if stop.is_set():
                    break
                periodic = self._reperiod or time.monotonic() >= next_periodic
                if not periodic and not self._kick.is_set():
                    # Woken for a recovery hold that ended: publish it without a round (a round
                    # would count towards every device's thresholds).
                    if self.tracker.release_due():
                        self._inventory.update(list(self._known.values()), self.tracker)
                    continue
                self._reperiod = False
                self._kick.clear()
                if periodic:
                    next_periodic = time.monotonic() + self._health.period_seconds
                    if self._watcher is not None:
                        # Backstop: re-add watches for directories that were (re)created.
                        self._watcher.ensure(self._backend.watch_dirs())
                try:
                    await self.round(periodic=periodic)
                except SnapshotRefusedError as e:
                    log.error("Not publishing the new device list: %s", e)
                    self._metrics.list_too_large.inc()
                except Exception:
                    # A broken round must not end health monitoring; the next one may work.
                    log.exception("Discovery/health round failed")
        finally:
            if self._watcher is not None:
                self._watcher.close()
