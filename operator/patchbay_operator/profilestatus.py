"""Each profile's status: its inputs gathered from the caches, evaluated once, written, and the effects.

The status writer (statuswriter.py) decides when: a profile marked dirty is computed after the
debounce and written only when it changed. Here is what: ``compute`` gathers what the caches say
about the profile now (the node cache, the agents' stores, its DeviceClass as stored, the
DeviceTaintRules), lets the pure ``evaluation.evaluate`` compute the status and everything that
follows from it, and performs those effects: the problems kept for the Events posted with the
write, a timer to compute again when a pod's trouble would turn stalled or a node's kubelet has
been short for too long, the reports to prune, the refused DaemonSet to nudge, and, for a DRA
profile's rollout at the end of a wave's gate, the ResourceSlices of the wave's nodes to read (one
LIST per node, field selectors ``spec.driver`` and ``spec.nodeName``; ``rollouts.Step.read_slices``):
no slice is watched or cached beyond the wave's nodes.

The DeviceTaintRules (device maintenance, where the API server serves them) are kept here: they
are only ever read for a DRA profile's status.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from patchbay_operator import evaluation, maintenance, render, rollouts
from patchbay_operator.agents import Agents
from patchbay_operator.agentwatch import AgentWatch
from patchbay_operator.config import Settings
from patchbay_operator.constants import RETRY_CREATE_SECONDS, SHARED_KEY, Mode
from patchbay_operator.deviceclasses import DeviceClasses
from patchbay_operator.events import EventRecorder
from patchbay_operator.informer import Store
from patchbay_operator.kube import KubeAPI, Selectors
from patchbay_operator.nodes import NodeSync
from patchbay_operator.peering import Gate, writes
from patchbay_operator.profiles import Profile, Registry
from patchbay_operator.repairs import Repairs
from patchbay_operator.revisions import Revisions
from patchbay_operator.scheduler import OnPending, Timers
from patchbay_operator.staging import Staging
from patchbay_operator.status import dra
from patchbay_operator.status.conditions import Problem
from patchbay_operator.statuswriter import Dirty, StatusWriter
from patchbay_operator.timestamps import rfc3339, rfc3339_now

log = logging.getLogger(__name__)
Call = Callable[..., Awaitable[Any]]
RECHECK_SLACK = 0.5
"""Seconds after the moment a recheck is for: the evaluation then finds it past, not just before."""


class ProfileStatus:
    """Computes and writes each profile's status (see the module doc); ``writer`` is its loop."""

    def __init__(
        self,
        settings: Settings,
        kube: KubeAPI,
        call: Call,
        *,
        registry: Registry,
        nodes: NodeSync,
        watch: AgentWatch,
        classes: DeviceClasses,
        repairs: Repairs,
        dirty: Dirty,
        gate: Gate | None = None,
        agents: Agents | None = None,
        revisions: Revisions | None = None,
    ) -> None:
        self._settings, self._kube, self._call, self._registry = settings, kube, call, registry
        self._nodes, self._watch, self._classes, self._gate = nodes, watch, classes, gate
        self._repairs, self._agents = repairs, agents
        self.writer = StatusWriter(self.compute, self.write, settings.status_debounce, dirty)
        #: each profile's staged rollout (staging.py); without revisions, none: every node at once
        data = revisions.data if revisions is not None else lambda _p, _d: None
        nodes_now = lambda: self._nodes.states.values()  # noqa: E731, PLW0108 (a resync replaces the dict)
        self.staging = Staging(data, nodes_now, self.writer.previous)
        self._staged = revisions is not None
        if revisions is not None:
            revisions.in_use = self.staging.in_use
            if agents is not None:
                agents.stage = repairs.stage = self.staging.entry
                agents.stages = self.staging.entries
            nodes.serves = self.staging.served
        #: the agents' config written again after a wave moved
        self.waves = WaveWrites(registry, gate, agents if revisions is not None else None)
        self.events = EventRecorder(lambda ns, body: call(kube.create_event, ns, body))
        #: DeviceTaintRules (device maintenance), where the API server serves them
        self.rules: Store[maintenance.Rule] = Store(lambda r: r.name, self._rule_changed)
        self._problems: dict[str, list[Problem]] = {}
        #: by profile: the Normal Events of waves that moved, posted with the next status write
        self._notes: dict[str, list[str]] = {}
        #: profile -> node -> since when its allocatable has been short of its agent's healthy
        #: devices (evaluation.Inputs.short_since)
        self._short_since: dict[str, dict[str, datetime]] = {}
        #: by profile: compute again at a moment the evaluation named (REPLACE: the latest
        #: computation knows best)
        self._rechecks: Timers[str] = Timers(OnPending.REPLACE)
        #: by profile: prune its reports after this computation (REPLACE: the latest one's nodes)
        self._prunes: Timers[str] = Timers(OnPending.REPLACE)
        #: seconds between nudges of an agent DaemonSet whose pods the API server refuses
        self.retry_create_every = RETRY_CREATE_SECONDS
        #: by DaemonSet: the next nudge (KEEP: the profiles sharing the node agent ask for one)
        self._retries: Timers[str] = Timers(OnPending.KEEP)
        #: DRA rollouts: profile -> node of the wave -> its ResourceSlices as last read for the gate
        self._slices: dict[str, dict[str, dra.SliceRead]] = {}
        #: (profile, node) reads asked for and not answered yet (one at a time per node)
        self._reading: Timers[tuple[str, str]] = Timers(OnPending.KEEP)
        self._in_flight: set[tuple[str, str]] = set()
        #: ResourceSlice LISTs sent (for /metrics and the benchmarks)
        self.slice_reads = 0

    def compute(self, name: str) -> dict[str, Any] | None:
        """``name``'s status, evaluated once from the caches (``evaluation.evaluate``, pure); then
        the effects it asks for: the problems kept for the Events, a recheck timer, a prune."""
        profile = self._registry.get(name)
        if profile is None or profile.deleting:
            self._short_since.pop(name, None)
            return None
        since = self._short_since.setdefault(name, {})
        inputs = replace(
            self._inputs(profile),
            short_since=since,
            short_grace=self._settings.kubelet_behind_grace,
            stall_after=self._settings.stall_after,
        )
        result = evaluation.evaluate(inputs)
        now = datetime.now(UTC)
        self._short_since[name] = {n: since.get(n, now) for n in result.short_nodes}
        self._problems[name] = result.problems
        if result.recheck_at is None:
            self._rechecks.cancel(name)
        else:
            delay = max(0.0, (result.recheck_at - datetime.now(UTC)).total_seconds()) + RECHECK_SLACK
            self._rechecks.schedule(name, delay, lambda: self.writer.mark([name]))
        if result.keep_reports is not None:
            prune = functools.partial(self._watch.prune_reports, name, keep=result.keep_reports)
            self._prunes.schedule(name, 0.0, prune)
        if result.retry_create is not None:
            self._retry_create_later(result.retry_create, name)
        if result.rollout is not None:
            self._read_slices(profile, result.rollout)
            if result.rollout.note:
                self._notes.setdefault(name, []).append(result.rollout.note)
            if self.staging.commit(name, result.rollout):
                if profile.mode is Mode.STATIC:
                    self._nodes.enqueue_all()  # the nodes that moved get their capacity written
                elif self._agents:
                    self.waves.schedule(profile.agent_key)
        return result.status

    def _read_slices(self, profile: Profile, step: rollouts.Step) -> None:
        """Keep the slice reads of the wave's nodes only, and read the ones the gate asks for."""
        name = profile.name
        wave = set() if step.state.settled_now else set(step.state.baseline)
        kept = {n: r for n, r in self._slices.get(name, {}).items() if n in wave}
        if kept:
            self._slices[name] = kept
        else:
            self._slices.pop(name, None)
        driver = render.driver_name(name)
        for node in step.read_slices:
            key = (name, node)
            if key not in self._in_flight:
                self._in_flight.add(key)
                self._reading.schedule(key, 0.0, functools.partial(self._read_node_slices, key, driver))

    async def _read_node_slices(self, key: tuple[str, str], driver: str) -> None:
        """One node's pool of ``driver``: one LIST by field selectors; the profile computed again."""
        name, node = key
        at = datetime.now(UTC)
        try:
            self.slice_reads += 1
            items = await self._call(self._list_slices, driver, node)
            read = dra.SliceRead(at, dra.published(items))
        except Exception as e:
            log.warning("Reading node %s's ResourceSlices of %s failed: %s", node, driver, e)
            read = dra.SliceRead(at, None, str(e))
        finally:
            self._in_flight.discard(key)
        self._slices.setdefault(name, {})[node] = read
        self.writer.mark([name])

    def _list_slices(self, driver: str, node: str) -> list[dict[str, Any]]:
        selectors = Selectors(field=dra.slices_selector(driver, node))
        return [i for page in self._kube.list_pages(dra.SLICES_PATH, 100, selectors) for i in page.items]

    def _inputs(self, profile: Profile) -> evaluation.Inputs:
        """What the caches say about ``profile`` now."""
        name = profile.name
        clock = datetime.now(UTC)
        base = evaluation.Inputs(
            profile,
            self.writer.previous(name),
            rfc3339(clock),
            list(self._nodes.states.values()),
            clock=clock,
            winner=w.name if (w := self._registry.conflict(profile)) is not None else None,
            conflict_on=(
                f"CDI kind {', '.join(sorted(profile.cdi_kinds & w.cdi_kinds))}"
                if w is not None and w.resource != profile.resource
                else ""
            ),
        )
        if base.winner is not None:
            return base
        if self._staged:
            policy = rollouts.Policy.parse(profile.spec.get("rollout"))
            base = replace(base, rollout=(policy, self.staging.state(profile)))
        if profile.mode is Mode.STATIC:
            old = self.staging.current(profile) if self._staged else None
            return replace(base, failures=dict(self._nodes.failures), current_profile=old)
        shared = profile.uses_shared_agent
        key = profile.agent_key
        watch = self._watch
        return replace(
            base,
            twin=self._registry.other_way(profile) if profile.mode is Mode.DRA else None,
            daemonset=watch.daemonsets.items.get(key),
            troubles=watch.troubles(key, datetime.now(UTC)),
            reports=watch.profile_reports(name, served_by=key),
            report_nodes=frozenset(r.node for r in watch.reports.items.values() if r.profile == name),
            create_warning=watch.create_warning(watch.daemonsets.items.get(key)),
            device_class=self._classes.stored.get(name),
            maintenance=list(self.rules.items.values()) if profile.mode is Mode.DRA else (),
            slices=dict(self._slices.get(name, {})),
            shared_pods=watch.shared_pods() if shared else None,
            shared_node_selector=self._settings.node_agent_node_selector,
            owned=self._repairs.problems({key, name})
            + (self._agents.problems(name) if self._agents is not None else []),
        )

    def _retry_create_later(self, daemonset: str, name: str) -> None:
        """While the API server refuses ``daemonset``'s pods, nudge it every
        ``retry_create_every`` seconds (``AgentWatch.retry_create``), then compute ``name``'s
        status again, which asks for the next nudge only if the refusal still holds. The cause (a
        namespace label, a quota, a policy) is nothing the operator watches, so this is how a
        fix shows within seconds instead of after the DaemonSet controller's backoff. One timer
        per DaemonSet: the profiles sharing the node agent ask for the same one."""
        self._retries.schedule(
            daemonset, self.retry_create_every, functools.partial(self._retry_create, daemonset, name)
        )

    async def _retry_create(self, daemonset: str, name: str) -> None:
        if writes(self._gate):
            await self._watch.retry_create(daemonset, rfc3339_now())
        self.writer.mark([name])

    async def write(self, name: str, new: dict[str, Any]) -> None:
        """Write the status, then post the Events of its problems' transitions."""
        await self._call(self._kube.patch_profile_status, name, new)
        profile = self._registry.get(name)
        notes = self._notes.pop(name, [])
        if profile is not None:
            try:
                for note in notes:  # one per wave that moved (no storm: a wave is minutes)
                    await self.events.note(profile, rollouts.ROLLOUT_WAVE, note)
                await self.events.record(profile, self._problems.get(name, []))
            except Exception as e:  # an Event that cannot be posted must not fail the status write
                log.warning("Posting an Event on DevicePluginProfile %s failed: %s", name, e)

    def _rule_changed(self, old: maintenance.Rule | None, new: maintenance.Rule | None) -> None:
        """A DeviceTaintRule changed: the status of every DRA profile whose devices it selects."""
        rules = [r for r in (old, new) if r is not None]
        self.writer.mark(
            p.name
            for p in self._registry
            if p.mode is Mode.DRA and any(r.applies_to(render.driver_name(p.name)) for r in rules)
        )

    def mark_dra(self) -> None:
        """Every DRA profile's status (DeviceTaintRules are watched from now on)."""
        self.writer.mark(p.name for p in self._registry if p.mode is Mode.DRA)

    async def close(self) -> None:
        for timers in (self._rechecks, self._prunes, self._retries, self._reading):
            await timers.close()
        await self.waves.close()


class WaveWrites:
    """A staged rollout that moved (a wave, a halt's put-back, the end) is told to the agents: their
    ConfigMap is written again, the ConfigMap alone (nothing in a DaemonSet changes with a wave):
    the shared agents' for `SHARED_KEY`, else the profile's own agents'. One timer a key: a burst
    of waves of the profiles sharing the node agent is one write."""

    def __init__(self, registry: Registry, gate: Gate | None, agents: Agents | None) -> None:
        """``agents`` None: nothing is staged (or no agent is managed), nothing to write."""
        self._registry, self._gate, self._agents = registry, gate, agents
        self._timers: Timers[str] = Timers(OnPending.KEEP)

    def schedule(self, key: str) -> None:
        self._timers.schedule(key, 0.0, functools.partial(self._write, key))

    async def _write(self, key: str) -> None:
        """Not while this replica stands by, nor while it takes over (its gate opens after
        that): `write_all` writes them then."""
        if writes(self._gate):
            await self._apply(key)

    async def _apply(self, key: str) -> None:
        if self._agents is None:
            return
        if key == SHARED_KEY:
            await self._agents.apply_shared(daemonset=False)
        else:
            await self._agents.apply_wave(key)

    async def write_all(self) -> None:
        """At a take-over, after its first computation: the agents' config of every staged profile
        from its rollout as resumed from its status. A wave that computation moved is not written
        by its own timer (the gate is still closed then), and what the replica that left wrote
        last may not be what the status says."""
        keys = {
            p.agent_key
            for p in self._registry
            if p.mode.runs_agents and not p.deleting and self._registry.conflict(p) is None
        }
        for key in sorted(keys):
            await self._apply(key)

    async def close(self) -> None:
        await self._timers.close()
