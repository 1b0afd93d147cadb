"""The operator at run time: every data flow passes through here, each job in a module of its own.

kopf hands over profiles (handlers.py); the informers hand over nodes and what the agents tell
(informer.py). The ``Controller`` owns the profile ``Registry`` and wires five parts:

- ``NodeSync`` (nodes.py): the node cache and the workers that patch static capacity;
- ``Agents`` (agents.py): DevicePlugin and DRA profiles' agents (and a DRA profile's
  DeviceClass), and their DaemonSets, pods, warnings and DeviceReports;
- ``StatusWriter`` (statuswriter.py): each profile's status, debounced, written when changed;
- ``EventRecorder`` (events.py): Events on the profile when a problem appears or goes;
- ``peering.Gate``: with several replicas, whether this one may write at all.

Blocking client calls run in a thread pool of ``concurrency`` threads (``call``), so the event
loop never blocks and the number of requests in flight is a setting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, TypeVar

from patchbay_operator import agents, evaluation, informer, maintenance, nodes, render
from patchbay_operator.agents import Agents
from patchbay_operator.config import Settings
from patchbay_operator.constants import (
    DEVICE_CLASS_RECHECK_SECONDS,
    ORPHAN_GRACE_SECONDS,
    RETRY_CREATE_SECONDS,
    SHARED_KEY,
    Mode,
)
from patchbay_operator.events import EventRecorder
from patchbay_operator.informer import Informer, Source, Store
from patchbay_operator.kube import KubeAPI, KubeError, Ref
from patchbay_operator.nodes import NodeSync
from patchbay_operator.peering import Gate, Peering
from patchbay_operator.profiles import Profile, Registry, Selector
from patchbay_operator.status import Problem
from patchbay_operator.statuswriter import StatusWriter
from patchbay_operator.timestamps import rfc3339_now

log = logging.getLogger(__name__)
T = TypeVar("T")
RULES: Source[maintenance.Rule] = Source(
    "DeviceTaintRules", maintenance.COLLECTION, maintenance.Rule.from_object
)
RULES_RECHECK_SECONDS = 300.0
"""Where DeviceTaintRules are not served at start, how often the operator asks again: a control
plane upgraded to 1.37 while the operator runs starts serving them, and its pods are not restarted
for it."""


class CleanupPendingError(RuntimeError):
    """Some nodes still carry a deleting profile's resource; the delete handler retries."""


class Controller:
    def __init__(self, settings: Settings, kube: KubeAPI, peer: Peering | None = None) -> None:
        self.settings, self.kube = settings, kube
        self.registry = Registry()
        self._pool = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="kube")
        self.status = StatusWriter(self.compute_status, self._write_status, settings.status_debounce)
        self.nodes = NodeSync(kube, self.call, self.registry.static_winners, self.mark_all_dirty)
        self.agents = Agents(kube, self.call, settings, self._agents_changed)
        self.events = EventRecorder(lambda ns, body: self.call(kube.create_event, ns, body))
        #: DeviceTaintRules (device maintenance), where the API server serves them
        self.rules: Store[maintenance.Rule] = Store(lambda r: r.name, self._rule_changed)
        self.reconciles = 0
        #: seconds between applies of a DeviceClass whose extendedResourceName was dropped
        self.device_class_recheck = DEVICE_CLASS_RECHECK_SECONDS
        self._problems: dict[str, list[Problem]] = {}
        self._rechecks: dict[str, asyncio.TimerHandle] = {}
        #: profile -> node -> since when its allocatable has been short of its agent's healthy
        #: devices (evaluation.Inputs.short_since)
        self._short_since: dict[str, dict[str, datetime]] = {}
        self._class_checks: dict[str, asyncio.TimerHandle] = {}
        self._orphan_checks: dict[str, asyncio.TimerHandle] = {}  # by profile name
        #: seconds between nudges of an agent DaemonSet whose pods the API server refuses
        self.retry_create_every = RETRY_CREATE_SECONDS
        self._retries: dict[str, asyncio.TimerHandle] = {}  # by DaemonSet name
        self.gate: Gate | None = None
        if peer is not None:
            read = lambda: self.call(kube.get_cluster_peering, peer.name)  # noqa: E731
            self.gate = Gate(peer, read, self._stand_by, self._take_over)
            self._stand_by()  # as kopf starts a peered replica paused
        self._informers: list[Informer[Any]] = []
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Load every profile, then every node and what the agents tell, before anything is planned.

        kopf runs startup handlers before it watches profiles, so when the first profile
        handler runs the caches are complete (a deleting profile after a restart knows every
        node it set) and resource-name conflicts are decided on full knowledge.
        """
        await self.refresh_profiles()
        log.info("Loaded %d DevicePluginProfiles", len(self.registry))
        await self._watch(nodes.SOURCE, self.nodes.observe, self.nodes.resync)
        a = self.agents
        ds_source, pod_source, warning_source, report_source = agents.sources(self.settings.namespace)
        await self._watch(ds_source, a.daemonsets.observe, a.daemonsets.resync)
        await self._watch(pod_source, a.pods.observe, a.pods.resync)
        await self._watch(warning_source, a.warnings.observe, a.warnings.resync)
        await self._watch(report_source, a.reports.observe, a.reports.resync, required=False)
        if await self._serves_device_taint_rules():
            await self._watch(RULES, self.rules.observe, self.rules.resync, required=False)
        else:
            self._spawn(self._watch_rules_once_served())
        log.info(
            "Listed %d nodes, %d agent pods, %d DeviceReports, %d DeviceTaintRules",
            len(self.nodes.states),
            len(a.pods.items),
            len(a.reports.items),
            len(self.rules.items),
        )
        known = {p.name for p in self.registry}
        self._prune_orphans_later({r.profile for r in a.reports.items.values()} - known)
        for _ in range(self.settings.concurrency):
            self._spawn(self.nodes.run_worker())
        self._spawn(self.status.run())
        if self.gate is not None:
            self._spawn(self.gate.run())

    async def _watch(
        self,
        source: Source[T],
        on_events: Callable[..., None],
        on_resync: Callable[..., None],
        *,
        required: bool = True,
    ) -> None:
        """LIST ``source`` now (so the cache is complete before any handler runs), then watch it.

        A source that is not ``required`` (the agents' DeviceReports: their CRD may come later
        than the operator) does not stop the start when its LIST fails; its informer lists it as
        soon as it can.
        """
        rv = ""
        try:
            snapshot = await self.call(informer.list_all, self.kube, source)
        except (KubeError, OSError) as e:
            if required:
                raise
            log.warning("Listing %s failed, will retry: %s", source.kind, e)
        else:
            on_resync(snapshot)
            rv = snapshot.resource_version
        watcher = Informer(self.kube, source, asyncio.get_running_loop(), on_events, on_resync)
        watcher.start(rv)
        self._informers.append(watcher)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.create_task(coro))

    async def stop(self) -> None:
        for timer in [*self._class_checks.values(), *self._orphan_checks.values(), *self._retries.values()]:
            timer.cancel()
        self._class_checks.clear()
        self._orphan_checks.clear()
        self._retries.clear()
        loop = asyncio.get_running_loop()
        for watcher in self._informers:
            await loop.run_in_executor(None, watcher.stop)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # --- profiles ----------------------------------------------------------------------------

    async def reconcile(self, body: Mapping[str, Any]) -> None:
        """A profile was created, changed or seen on resume (level-based, idempotent): re-plan the
        nodes, and apply or remove its agents depending on its mode and on conflicts."""
        profile = Profile.from_body(body)
        self.reconciles += 1
        self.registry.upsert(profile)
        self.status.seed(profile.name, body.get("status"), replace=False)
        self.nodes.enqueue_all()
        self.mark_resource_dirty(profile.resource)
        winner = self.registry.conflict(profile)
        if winner is not None:
            log.warning(
                "DevicePluginProfile %s not applied: %s is provided by %s",
                profile.name,
                profile.resource,
                winner.name,
            )
        if profile.mode.runs_agents and winner is None:
            await self._apply_agents(profile)
        else:
            await self.agents.delete(profile)
            await self._apply_shared()
        await self._reapply_dra_twin(profile)

    async def _apply_agents(self, profile: Profile) -> None:
        """A DRA profile's agents leave out the nodes of the profile that serves the same
        resource through node capacity (KEP-5004: never both ways on one node). A profile that
        leaves `spec.agent` alone is served by the shared node agent (one pod per node for all
        of them); one with agent settings of its own gets its own DaemonSet."""
        if render.is_shared(profile):
            await self.agents.delete_own(profile)
            await self._apply_shared()
            await self.agents.shared_device_class(profile)
        else:
            await self.agents.apply(profile, exclude=self._exclusion(profile))
            await self._apply_shared()
        self._check_device_class_later(profile.name)

    def _exclusion(self, profile: Profile) -> Selector | None:
        twin = self.registry.other_way(profile) if profile.mode is Mode.DRA else None
        return twin.selector if twin is not None else None

    def _shared_profiles(self) -> list[Profile]:
        return [
            p
            for p in self.registry
            if p.mode.runs_agents
            and not p.deleting
            and render.is_shared(p)
            and self.registry.conflict(p) is None
        ]

    async def _apply_shared(self) -> None:
        """The shared node agent becomes what the shared profiles say now (or goes)."""
        await self.agents.apply_shared([(p, self._exclusion(p)) for p in self._shared_profiles()])

    async def _serves_device_taint_rules(self, *, quiet: bool = False) -> bool:
        """Whether this API server serves DeviceTaintRules (resource.k8s.io/v1, Kubernetes 1.37
        on): the operator then shows each DRA profile's device maintenance in its status. Asked
        at start, from the group version's discovery document, and then every
        ``RULES_RECHECK_SECONDS`` while the answer is no (``quiet``: those logged at debug)."""
        group, _, version = maintenance.API.rpartition("/")
        level = logging.DEBUG if quiet else logging.INFO
        try:
            doc = await self.call(self.kube.get, Ref(group, version))
        except (KubeError, OSError) as e:
            log.log(
                logging.DEBUG if quiet else logging.WARNING,
                "Cannot tell whether DeviceTaintRules are served (%s): device maintenance not shown",
                e,
            )
            return False
        if not maintenance.served(doc):
            log.log(
                level, "This API server serves no DeviceTaintRules (1.37 on): device maintenance not shown"
            )
            return False
        return True

    async def _watch_rules_once_served(self) -> None:
        """Ask again every ``RULES_RECHECK_SECONDS``; once DeviceTaintRules are served, list and
        watch them, and recompute the DRA profiles' status (their maintenance)."""
        while True:
            await asyncio.sleep(RULES_RECHECK_SECONDS)
            if await self._serves_device_taint_rules(quiet=True):
                log.info("DeviceTaintRules are served now: device maintenance shown from now on")
                await self._watch(RULES, self.rules.observe, self.rules.resync, required=False)
                self.status.mark(p.name for p in self.registry if p.mode is Mode.DRA)
                return

    def _rule_changed(self, old: maintenance.Rule | None, new: maintenance.Rule | None) -> None:
        """A DeviceTaintRule changed: the status of every DRA profile whose devices it selects."""
        rules = [r for r in (old, new) if r is not None]
        self.status.mark(
            p.name
            for p in self.registry
            if p.mode is Mode.DRA and any(r.applies_to(render.driver_name(p.name)) for r in rules)
        )

    def _agents_changed(self, profile: str) -> None:
        """An agent object changed: its profile's status, or every shared profile's for the
        shared node agent's objects (no profile)."""
        if profile == SHARED_KEY:
            self.status.mark(p.name for p in self._shared_profiles())
        elif self.registry.get(profile) is None:
            self._prune_orphans_later([profile])
        else:
            self.status.mark([profile])

    def _prune_orphans_later(self, profiles: Iterable[str]) -> None:
        """DeviceReports of profiles that do not exist (an agent's of a profile deleted while the
        operator was down, or a report no agent of ours should have written) are deleted after
        `ORPHAN_GRACE_SECONDS`, when the profile is still unknown: nothing reads them, and a
        misbehaving agent must not be able to fill etcd and the operator's memory with them."""
        loop = asyncio.get_running_loop()
        for profile in profiles:
            if profile and profile not in self._orphan_checks:
                self._orphan_checks[profile] = loop.call_later(
                    ORPHAN_GRACE_SECONDS, self._spawn_prune_orphan, profile
                )

    def _spawn_prune_orphan(self, profile: str) -> None:
        self._spawn(self._prune_orphan(profile))

    async def _prune_orphan(self, profile: str) -> None:
        self._orphan_checks.pop(profile, None)
        if self.registry.get(profile) is not None or self.status.paused:
            return  # known meanwhile, or a standby replica (the active one prunes)
        if any(r.profile == profile for r in self.agents.reports.items.values()):
            log.info("Deleting the DeviceReports of %s: no such DevicePluginProfile", profile)
            await self.agents.prune_reports(profile, keep=())

    def _check_device_class_later(self, name: str) -> None:
        """Where the API server dropped the profile's DeviceClass's extendedResourceName, apply the
        class again in a while: a control plane upgraded meanwhile keeps it (detected, not assumed
        from a version). Nothing is scheduled while it is kept."""
        old = self._class_checks.pop(name, None)
        if old is not None:
            old.cancel()
        profile, stored = self.registry.get(name), self.agents.device_classes.get(name)
        if profile is None or stored is None or stored.extended_resource_name == profile.resource:
            return
        loop = asyncio.get_running_loop()
        self._class_checks[name] = loop.call_later(
            self.device_class_recheck, lambda: self._spawn(self._check_device_class(name))
        )

    async def _check_device_class(self, name: str) -> None:
        self._class_checks.pop(name, None)
        profile = self.registry.get(name)
        if (
            profile is None
            or profile.deleting
            or profile.mode is not Mode.DRA
            or self.registry.conflict(profile) is not None
        ):
            return
        if self.gate is None or self.gate.active:
            try:
                await self.agents.apply_device_class(profile)
            except (KubeError, OSError) as e:
                log.warning("Applying DeviceClass of DevicePluginProfile %s again failed: %s", name, e)
        self._check_device_class_later(name)

    async def _reapply_dra_twin(self, profile: Profile) -> None:
        """The node-capacity side of a resource changed (selector, mode, gone): the DRA profile
        of the same resource re-applies its agents with the new exclusion."""
        twin = self.registry.other_way(profile)
        if (
            twin is not None
            and twin.mode is Mode.DRA
            and not twin.deleting
            and self.registry.conflict(twin) is None
        ):
            await self._apply_agents(twin)

    async def delete(self, body: Mapping[str, Any], patience: float = 60.0) -> None:
        """A profile is being deleted: remove its agents and every node value it set (ownership
        comes from the node annotations, so this works after a restart too), then hand its
        resource name to the next profile in line. Raises ``CleanupPendingError`` while some
        node still carries the resource after ``patience`` seconds (kopf retries)."""
        profile = replace(Profile.from_body(body), deleting=True)
        await self.agents.delete(profile)
        self.registry.upsert(profile)  # deleting: never a winner, so every node plans its removal
        await self._apply_shared()
        self.nodes.enqueue_all()
        deadline = time.monotonic() + patience
        while left := self.nodes.carrying(profile.name):
            if time.monotonic() > deadline:
                raise CleanupPendingError(f"{len(left)} nodes still carry {profile.resource}, e.g. {left[0]}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.nodes.queue.wait_idle(), max(0.1, deadline - time.monotonic()))
            await asyncio.sleep(0.2)
        self.registry.remove(profile.name)
        self.status.forget(profile.name)
        self.events.forget(profile.name)
        log.info("Removed %s from every node for DevicePluginProfile %s", profile.resource, profile.name)
        self.mark_resource_dirty(profile.resource)
        promoted = self.registry.winner(profile.resource, dra=profile.dra)
        if promoted is not None:
            log.info("DevicePluginProfile %s now provides %s", promoted.name, promoted.resource)
            if promoted.mode.runs_agents:
                await self._apply_agents(promoted)
        await self._promote_cdi_kind(profile)
        await self._reapply_dra_twin(profile)

    async def _promote_cdi_kind(self, gone: Profile) -> None:
        """The profiles that waited for ``gone``'s CDI kind: the next in line is applied now."""
        if gone.cdi_kind is None:
            return
        waiting = sorted(
            (p for p in self.registry if p.cdi_kind == gone.cdi_kind and not p.deleting),
            key=lambda p: p.sort_key,
        )
        self.status.mark(p.name for p in waiting)
        for p in waiting:
            if self.registry.conflict(p) is None and p.mode.runs_agents:
                log.info("DevicePluginProfile %s now has CDI kind %s", p.name, p.cdi_kind)
                await self._apply_agents(p)

    async def refresh_profiles(self) -> None:
        """The registry becomes the profiles as they are now (with their status): at start, and
        when a peered replica takes over from a registry kopf stopped updating."""
        bodies = await self.call(self.kube.list_profiles)
        for gone in self.registry.replace_all(Profile.from_body(b) for b in bodies):
            self.status.forget(gone)
        for body in bodies:
            self.status.seed(str(body["metadata"]["name"]), body.get("status"))

    # --- status ------------------------------------------------------------------------------

    def mark_all_dirty(self) -> None:
        self.status.mark(p.name for p in self.registry)

    def mark_resource_dirty(self, resource: str) -> None:
        self.status.mark(p.name for p in self.registry if p.resource == resource)

    def compute_status(self, name: str) -> dict[str, Any] | None:
        """``name``'s status, evaluated once from the caches (``evaluation.evaluate``, pure); then
        the effects it asks for: the problems kept for the Events, a recheck timer, a prune."""
        profile = self.registry.get(name)
        if profile is None or profile.deleting:
            self._short_since.pop(name, None)
            return None
        since = self._short_since.setdefault(name, {})
        inputs = replace(
            self._inputs(profile), short_since=since, short_grace=self.settings.kubelet_behind_grace
        )
        result = evaluation.evaluate(inputs)
        now = datetime.now(UTC)
        self._short_since[name] = {n: since.get(n, now) for n in result.short_nodes}
        self._problems[name] = result.problems
        self._recheck(name, result.recheck_at)
        if result.keep_reports is not None:
            self._spawn(self.agents.prune_reports(name, keep=result.keep_reports))
        if result.retry_create is not None:
            self._retry_create_later(result.retry_create, name)
        return result.status

    def _inputs(self, profile: Profile) -> evaluation.Inputs:
        """What the caches say about ``profile`` now."""
        name = profile.name
        base = evaluation.Inputs(
            profile,
            self.status.previous(name),
            rfc3339_now(),
            list(self.nodes.states.values()),
            winner=w.name if (w := self.registry.conflict(profile)) is not None else None,
            conflict_on=(
                f"CDI kind {profile.cdi_kind}" if w is not None and w.resource != profile.resource else ""
            ),
        )
        if base.winner is not None:
            return base
        if profile.mode is Mode.STATIC:
            return replace(base, failures=dict(self.nodes.failures))
        shared = render.is_shared(profile)
        key = SHARED_KEY if shared else name
        return replace(
            base,
            twin=self.registry.other_way(profile) if profile.mode is Mode.DRA else None,
            daemonset=self.agents.daemonsets.items.get(key),
            troubles=self.agents.troubles(key, datetime.now(UTC)),
            reports=self.agents.profile_reports(name, served_by=key),
            report_nodes=frozenset(r.node for r in self.agents.reports.items.values() if r.profile == name),
            create_warning=self.agents.create_warning(self.agents.daemonsets.items.get(key)),
            device_class=self.agents.device_classes.get(name),
            maintenance=list(self.rules.items.values()) if profile.mode is Mode.DRA else (),
            shared_pods=self.agents.shared_pods() if shared else None,
            shared_node_selector=self.settings.node_agent_node_selector,
        )

    def _recheck(self, name: str, when: datetime | None) -> None:
        """Recompute ``name``'s status when a pod's trouble would turn stalled, even if nothing
        else happens by then."""
        old = self._rechecks.pop(name, None)
        if old is not None:
            old.cancel()
        if when is not None:
            delay = max(0.0, (when - datetime.now(UTC)).total_seconds()) + 0.5
            loop = asyncio.get_running_loop()
            self._rechecks[name] = loop.call_later(delay, self.status.mark, [name])

    def _retry_create_later(self, daemonset: str, name: str) -> None:
        """While the API server refuses ``daemonset``'s pods, nudge it every
        ``retry_create_every`` seconds (``Agents.retry_create``), then compute ``name``'s status
        again, which asks for the next nudge only if the refusal still holds. The cause (a
        namespace label, a quota, a policy) is nothing the operator watches, so this is how a
        fix shows within seconds instead of after the DaemonSet controller's backoff. One timer
        per DaemonSet: the profiles sharing the node agent ask for the same one."""
        if daemonset in self._retries:
            return
        loop = asyncio.get_running_loop()
        self._retries[daemonset] = loop.call_later(
            self.retry_create_every, lambda: self._spawn(self._retry_create(daemonset, name))
        )

    async def _retry_create(self, daemonset: str, name: str) -> None:
        self._retries.pop(daemonset, None)
        if self.gate is None or self.gate.active:
            await self.agents.retry_create(daemonset, rfc3339_now())
        self.status.mark([name])

    async def _write_status(self, name: str, new: dict[str, Any]) -> None:
        await self.call(self.kube.patch_profile_status, name, new)
        profile = self.registry.get(name)
        if profile is not None:
            try:
                await self.events.record(profile, self._problems.get(name, []))
            except Exception as e:  # an Event that cannot be posted must not fail the status write
                log.warning("Posting an Event on DevicePluginProfile %s failed: %s", name, e)

    # --- peering -----------------------------------------------------------------------------

    def _stand_by(self) -> None:
        """Write nothing (no node patch, no status) until the gate says go; caches stay current."""
        self.nodes.queue.pause()
        self.status.paused = True

    async def _take_over(self) -> None:
        await self.refresh_profiles()
        self.nodes.queue.resume()
        self.status.paused = False
        self.nodes.enqueue_all()
        self.mark_all_dirty()

    # --- counters ----------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The operator's counters, for /metrics (metrics.py) and the tests."""
        n = self.nodes
        return {
            "nodes": len(n.states),
            "profiles": len(self.registry),
            "reconciles": self.reconciles,
            "nodeEvents": n.events,
            "nodePatches": n.patches,
            "nodePatchFailures": n.patch_failures,
            "maxPatchesPerNode": max(n.per_node.values(), default=0),
            "statusWrites": self.status.writes,
            "statusComputes": self.status.computes,
            "statusPending": self.status.pending,
            "queued": len(n.queue),
            "agentPods": len(self.agents.pods.items),
            "deviceReports": len(self.agents.reports.items),
            "working": int(self.gate is None or self.gate.active),
            "eventsSuppressed": self.events.suppressed,
            "events": dict(self.events.posted),
            "watchRestarts": {w.kind: w.restarts for w in self._informers},
            "profileConditions": self.status.conditions(),
            "driftReassertions": n.drift_reassertions,
            "apiRequests": dict(getattr(self.kube, "requests", {})),
        }
