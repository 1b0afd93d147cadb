"""The operator at run time: the parts, wired once, started and stopped together.

kopf hands over profiles (handlers.py); the informers hand over nodes and what the agents tell
(informer.py). The ``Controller`` builds the parts, each with what it needs, and starts them:

- ``Registry`` (profiles.py): every profile, and who wins each resource name;
- ``Reconciler`` (reconcile.py): a profile's reconcile and delete, one way down to the parts below;
- ``NodeSync`` (nodes.py): the node cache and the workers that patch static capacity;
- ``Agents`` (agents.py): DevicePlugin and DRA profiles' agent objects, with ``DeviceClasses``
  (deviceclasses.py) for a DRA profile's DeviceClass;
- ``AgentWatch`` (agentwatch.py): the agents' DaemonSets, pods, warnings and DeviceReports;
- ``Repairs`` (repairs.py): what the operator renders, put back when deleted or edited;
- ``InventoryLabels`` (nodelabels.py): the opt-in inventory labels on the nodes;
- ``Revisions`` (revisions.py): each profile's ControllerRevisions, written, pruned, put back;
- ``ProfileStatus`` (profilestatus.py): each profile's status and Events, written by its
  ``StatusWriter`` (statuswriter.py) when marked dirty (``Dirty``: what every part marks);
- ``peering.Gate``: with several replicas, whether this one may write at all.

Blocking client calls run in a ``kube.Pool`` of ``concurrency`` threads, so the event loop never
blocks and the number of requests in flight is a setting.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from patchbay_operator import agentwatch, informer, maintenance, nodelabels, nodes, repairs, revisions
from patchbay_operator.agents import Agents
from patchbay_operator.agentwatch import AgentWatch
from patchbay_operator.config import Settings
from patchbay_operator.deviceclasses import DeviceClasses
from patchbay_operator.informer import Informer, Source
from patchbay_operator.kube import KubeAPI, KubeError, Pool, Ref
from patchbay_operator.nodelabels import InventoryLabels
from patchbay_operator.nodes import NodeSync
from patchbay_operator.parts import Writing
from patchbay_operator.peering import Gate, Peering, StandingByError, writes
from patchbay_operator.profiles import Registry
from patchbay_operator.profilestatus import ProfileStatus
from patchbay_operator.reconcile import Reconciler
from patchbay_operator.repairs import Repairs
from patchbay_operator.scheduler import Loops
from patchbay_operator.statuswriter import Dirty

log = logging.getLogger(__name__)
T = TypeVar("T")
RULES: Source[maintenance.Rule] = Source(
    "DeviceTaintRules", maintenance.COLLECTION, maintenance.Rule.from_object
)
RULES_RECHECK_SECONDS = 300.0
"""Where DeviceTaintRules are not served at start, how often the operator asks again: a control
plane upgraded to 1.37 while the operator runs starts serving them, and its pods are not restarted
for it."""
TAKE_OVER_WAIT = 30.0
"""Seconds a kopf handler waits for this replica's take-over before kopf is told to try again: the
gate looks every 2 s, and a take-over is one LIST of the profiles and one status computation."""


def fan_out(
    *feeds: tuple[Callable[[list[informer.Event[T]]], None], Callable[[informer.Snapshot[T]], None]],
) -> tuple[Callable[[list[informer.Event[T]]], None], Callable[[informer.Snapshot[T]], None]]:
    """One informer's events and resyncs handed to each of ``feeds`` (observe, resync), in order."""

    def observe(events: list[informer.Event[T]]) -> None:
        for feed, _ in feeds:
            feed(events)

    def resync(snapshot: informer.Snapshot[T]) -> None:
        for _, feed in feeds:
            feed(snapshot)

    return observe, resync


class Controller:
    def __init__(self, settings: Settings, kube: KubeAPI, peer: Peering | None = None) -> None:
        self.settings, self.kube = settings, kube
        self.pool = Pool(settings.concurrency)
        call = self.pool.call
        self.gate: Gate | None = None
        if peer is not None:
            read = lambda: call(kube.get_cluster_peering, peer.name)  # noqa: E731
            self.gate = Gate(peer, read, self._stand_by, self._take_over)
        self.registry = registry = Registry()
        dirty, gate = Dirty(registry.names), self.gate
        self.nodes = NodeSync(kube, call, registry.static_winners, dirty.mark_all)
        self.labels = InventoryLabels(kube, call, self.nodes, enabled=settings.inventory_node_labels)
        self.watch = AgentWatch(kube, call, settings, registry=registry, mark=dirty.mark, gate=gate)
        self.classes = DeviceClasses(kube, call, registry=registry, mark=dirty.mark, gate=gate)
        # What Agents and Repairs share: one writer at a time per agent's objects (parts.Writing).
        shared: dict[str, Any] = {"registry": registry, "watch": self.watch, "classes": self.classes}
        shared |= {"mark": dirty.mark, "writing": Writing()}
        self.agents = Agents(kube, call, settings, **shared)
        self.repairs = Repairs(kube, call, settings, gate=gate, **shared)
        self.revisions = revisions.Revisions(
            kube, call, settings, registry=registry, mark=dirty.mark, gate=gate
        )
        self.statuses = ProfileStatus(
            settings,
            kube,
            call,
            registry=registry,
            nodes=self.nodes,
            watch=self.watch,
            classes=self.classes,
            repairs=self.repairs,
            agents=self.agents,
            revisions=self.revisions,
            dirty=dirty,
            gate=gate,
        )
        self.status = self.statuses.writer
        self.reconciler = Reconciler(
            registry, self.nodes, self.agents, self.status, self.statuses.events, revisions=self.revisions
        )
        self._informers: list[Informer[Any]] = []
        #: its own loops; the liveness probe fails while one has ended with an error
        self.loops = Loops()
        if self.gate is not None:
            self._stand_by()  # as kopf starts a peered replica paused

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Load every profile, then every node and what the agents tell, before anything is planned.

        kopf runs startup handlers before it watches profiles, so when the first profile handler runs the
        caches are complete (a deleting profile after a restart knows every node it set) and resource-name
        conflicts are decided on full knowledge (then `Agents.unused_shared`, handlers.py)."""
        await self.refresh_profiles()
        log.info("Loaded %d DevicePluginProfiles", len(self.registry))
        if self.settings.inventory_node_labels:  # listed first: no node is planned without it
            await self._watch(nodelabels.SOURCE, *self.labels.inventory_feed, required=False)
        n, w, r = self.nodes, self.watch, self.repairs
        await self._watch(nodes.SOURCE, *fan_out((n.observe, n.resync), self.labels.node_feed))
        ds_source, pod_source, warning_source, report_source = agentwatch.sources(self.settings.namespace)
        # the agent DaemonSets' one informer feeds their rollouts (agentwatch.py) and repairs
        feeds = (w.daemonsets.observe, w.daemonsets.resync), (r.observe_daemonsets, r.resync_daemonsets)
        await self._watch(ds_source, *fan_out(*feeds))
        await self._watch(pod_source, w.pods.observe, w.pods.resync)
        await self._watch(warning_source, w.warnings.observe, w.warnings.resync)
        await self._watch(report_source, w.reports.observe, w.reports.resync, required=False)
        configmaps, deviceclasses = repairs.sources(self.settings.namespace)
        owned = self.repairs.stores
        await self._watch(configmaps, owned["ConfigMap"].observe, owned["ConfigMap"].resync)
        # Where resource.k8s.io/v1 is not served yet, no DeviceClass to repair either.
        await self._watch(
            deviceclasses, owned["DeviceClass"].observe, owned["DeviceClass"].resync, required=False
        )
        revs = self.revisions.store
        await self._watch(
            revisions.source(self.settings.namespace), revs.observe, revs.resync, required=False
        )
        rules = self.statuses.rules
        if await self._serves_device_taint_rules():
            await self._watch(RULES, rules.observe, rules.resync, required=False)
        else:
            self.loops.spawn(self._watch_rules_once_served())
        log.info(
            "Listed %d nodes, %d agent pods, %d DeviceReports, %d DeviceTaintRules",
            len(self.nodes.states),
            len(w.pods.items),
            len(w.reports.items),
            len(rules.items),
        )
        w.prune_orphans_later({r.profile for r in w.reports.items.values()} - set(self.registry.names()))
        for _ in range(self.settings.concurrency):
            self.loops.spawn(self.nodes.run_worker())
            self.loops.spawn(self.labels.run_worker())
        self.loops.spawn(self.status.run())
        if self.gate is not None:
            self.loops.spawn(self.gate.run())

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
            snapshot = await self.pool.call(informer.list_all, self.kube, source)
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

    async def stop(self) -> None:
        for part in (self.statuses, self.repairs, self.revisions, self.classes, self.watch):
            await part.close()
        loop = asyncio.get_running_loop()
        for watcher in self._informers:
            await loop.run_in_executor(None, watcher.stop)
        await self.loops.stop()
        self.pool.shutdown()

    async def refresh_profiles(self) -> None:
        """The registry becomes the profiles as they are now (with their status): at start, and
        when a peered replica takes over from a registry kopf stopped updating."""
        self.reconciler.replace_all(await self.pool.call(self.kube.list_profiles))

    # --- profiles: kopf's handlers hand them over ---------------------------------------------

    async def reconcile(self, body: Mapping[str, Any]) -> None:
        await self._until_working()
        await self.reconciler.reconcile(body)

    async def delete(self, body: Mapping[str, Any], patience: float = 60.0) -> None:
        await self._until_working()
        await self.reconciler.delete(body, patience)

    async def _until_working(self) -> None:
        """A peered replica hands a profile on only once its own gate has opened (its take-over
        done; `Gate.until_working`); raises StandingByError when it does not within
        `TAKE_OVER_WAIT` seconds (kopf tries the handler again)."""
        if self.gate is not None and not await self.gate.until_working(TAKE_OVER_WAIT):
            raise StandingByError(f"this replica has not taken over within {TAKE_OVER_WAIT:g} s")

    # --- DeviceTaintRules: watched where the API server serves them ---------------------------

    async def _serves_device_taint_rules(self, *, quiet: bool = False) -> bool:
        """Whether this API server serves DeviceTaintRules (resource.k8s.io/v1, Kubernetes 1.37
        on): the operator then shows each DRA profile's device maintenance in its status. Asked
        at start, from the group version's discovery document, and then every
        ``RULES_RECHECK_SECONDS`` while the answer is no (``quiet``: those logged at debug)."""
        group, _, version = maintenance.API.rpartition("/")
        level = logging.DEBUG if quiet else logging.INFO
        try:
            doc = await self.pool.call(self.kube.get, Ref(group, version))
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
                rules = self.statuses.rules
                await self._watch(RULES, rules.observe, rules.resync, required=False)
                self.statuses.mark_dra()
                return

    # --- peering -----------------------------------------------------------------------------

    def _stand_by(self) -> None:
        """Write nothing (no node patch, no status) until the gate says go; caches stay current."""
        self.nodes.queue.pause()
        self.labels.queue.pause()
        self.status.paused = True

    async def _take_over(self) -> None:
        self.statuses.staging.states.clear()  # resumed from the status it finds (staging.py)
        await self.refresh_profiles()
        self.nodes.queue.resume()
        self.status.paused = False
        self.nodes.enqueue_all()
        self.labels.resume()
        self.status.mark(self.registry.names())
        # Written now, not after the debounce: the caches are warm and complete, nothing is
        # still arriving to gather, and the profiles' status went unwritten while the leader died.
        await self.status.flush()
        await self.statuses.waves.write_all()
        await self.agents.unused_shared(taking_over=True)

    # --- counters ----------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The operator's counters, for /metrics (metrics.py) and the tests."""
        n = self.nodes
        return {
            "nodes": len(n.states),
            "profiles": len(self.registry),
            "reconciles": self.reconciler.reconciles,
            "nodeEvents": n.events,
            "nodePatches": n.patches,
            "nodePatchFailures": n.patch_failures,
            "maxPatchesPerNode": max(n.per_node.values(), default=0),
            "statusWrites": self.status.writes,
            "statusComputes": self.status.computes,
            "statusPending": self.status.pending,
            "queued": len(n.queue),
            "agentPods": len(self.watch.pods.items),
            "deviceReports": len(self.watch.reports.items),
            "working": int(writes(self.gate)),
            "eventsSuppressed": self.statuses.events.suppressed,
            "events": dict(self.statuses.events.posted),
            "watchRestarts": {w.kind: w.restarts for w in self._informers},
            "profileConditions": self.status.conditions(),
            "driftReassertions": n.drift_reassertions,
            **self.labels.stats(),
            "repairs": dict(self.repairs.repairs),
            "revisions": self.revisions.counts(),
            **self.statuses.staging.stats(),
            "fieldsTakenOver": dict(self.repairs.taken_over),
            "apiRequests": dict(getattr(self.kube, "requests", {})),
        }
