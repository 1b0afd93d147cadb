"""The operator's runtime state and work loops: the glue between events and the API.

Profiles arrive through kopf's handlers; nodes through the operator's own ``NodeInformer``
(informer.py says why not kopf). Owns, in memory: every profile (the ``Registry``), a
``NodeState`` per node, the agent DaemonSets' status, and two work loops:

- node patchers: a de-duplicating queue of node names and ``concurrency`` workers. A worker
  plans the node's JSON patch from the CURRENT cache at the moment it runs (level-based, so a
  burst of events costs one patch), sends it, and folds the server's answer back into the cache
  (so the watch event of its own write is recognised as "nothing to do": one write per node per
  change);
- the status writer: profiles are marked dirty by any relevant change; after ``status_debounce``
  seconds each dirty profile's status is recomputed and written only if it differs from the
  last one written. Thousands of node events thus cost one status write per profile per window.

Blocking client calls run in a dedicated thread pool of ``concurrency`` threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

from patchbay_operator import capacity, informer, peering, render, status
from patchbay_operator.capacity import NodeState
from patchbay_operator.config import Settings
from patchbay_operator.constants import Mode
from patchbay_operator.informer import NodeEvent, NodeInformer, Snapshot
from patchbay_operator.kube import Kube, KubeError, ref_of
from patchbay_operator.peering import Peering
from patchbay_operator.profiles import Profile, Registry

log = logging.getLogger(__name__)
T = TypeVar("T")

STATS_PERIOD = 2.0
"""Seconds between counter log lines (only logged when something changed)."""

AGENT_POLL = 2.0
"""Seconds between reads of each agent DaemonSet's status."""

MAX_STALE_RETRIES = 3
"""Immediate re-reads after a rejected patch before the node is treated as failing (and retried
after RETRY_DELAY): a patch the server keeps rejecting must not spin."""

RETRY_DELAY = 2.0
"""Seconds before a node whose patch failed (not a stale-state conflict) is tried again."""

PEERING_POLL = 2.0
"""Seconds between reads of the ClusterKopfPeering object when peering (peering.py says why)."""


class CleanupPendingError(RuntimeError):
    """Some nodes still carry a deleting profile's resource; the delete handler retries."""


@dataclass
class Counters:
    """What the operator did, for logs and the benchmark (API writes per node per change)."""

    node_patches: int = 0
    node_patch_failures: int = 0
    status_writes: int = 0
    node_events: int = 0
    per_node: dict[str, int] = field(default_factory=dict)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Controller:
    def __init__(self, settings: Settings, kube: Kube, peer: Peering | None = None) -> None:
        self.settings = settings
        self.kube = kube
        self.peer = peer
        # A peered replica starts waiting, as kopf starts it paused, until the peering says go.
        self.active = peer is None
        self.registry = Registry()
        self.nodes: dict[str, NodeState] = {}
        self.daemonsets: dict[str, dict[str, Any]] = {}
        self.failures: dict[str, str] = {}
        self.counters = Counters()
        self._winners: dict[str, Profile] | None = None
        self._pool = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="kube")
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._inflight: set[str] = set()
        self._again: set[str] = set()
        self._stale: dict[str, int] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._status_dirty: set[str] = set()
        self._status_wake = asyncio.Event()
        self._written: dict[str, dict[str, Any]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._informer: NodeInformer | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Load every profile, then every node, before anything is planned or patched.

        kopf runs startup handlers before it watches profiles, so when the first profile
        handler runs the node cache is complete (a deleting profile after a restart knows every
        node it set) and resource-name conflicts are decided on full knowledge.
        """
        await self.refresh_profiles()
        log.info("Loaded %d DevicePluginProfiles", len(list(self.registry)))
        snapshot = await self.call(informer.list_all, self.kube)
        self.resync_nodes(snapshot)
        log.info("Listed %d nodes at resourceVersion %s", len(snapshot.states), snapshot.resource_version)
        self._informer = NodeInformer(
            self.kube, asyncio.get_running_loop(), self.observe_events, self.resync_nodes
        )
        self._informer.start(snapshot.resource_version)
        for i in range(self.settings.concurrency):
            self._tasks.append(asyncio.create_task(self._patcher(), name=f"patcher-{i}"))
        self._tasks.append(asyncio.create_task(self._status_writer(), name="status-writer"))
        self._tasks.append(asyncio.create_task(self._stats_logger(), name="stats"))
        self._tasks.append(asyncio.create_task(self._agent_poller(), name="agents"))
        if self.peer is not None:
            self._tasks.append(asyncio.create_task(self._peering_poller(self.peer), name="peering"))

    async def stop(self) -> None:
        if self._informer is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._informer.stop)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # --- profiles ----------------------------------------------------------------------------

    def _remember(self, profile: Profile, body: Mapping[str, Any]) -> None:
        self.registry.upsert(profile)
        self._winners = None
        if profile.name not in self._written:
            previous = body.get("status")
            self._written[profile.name] = dict(previous) if isinstance(previous, Mapping) else {}

    def winners(self) -> dict[str, Profile]:
        if self._winners is None:
            self._winners = self.registry.static_winners()
        return self._winners

    def upsert_profile(self, body: Mapping[str, Any]) -> Profile:
        """A profile was created, changed or seen on resume: re-plan every node against it."""
        profile = Profile.from_body(body)
        self._remember(profile, body)
        self.enqueue_all()
        self.mark_resource_dirty(profile.resource)
        return profile

    async def reconcile(self, body: Mapping[str, Any]) -> None:
        """A profile was created, changed or seen on resume (level-based, idempotent): re-plan the
        nodes, and apply or remove its agents depending on its mode and on conflicts."""
        profile = self.upsert_profile(body)
        winner = self.conflict_winner(profile)
        if winner is not None:
            log.warning(
                "DevicePluginProfile %s not applied: %s is provided by %s",
                profile.name,
                profile.resource,
                winner.name,
            )
        if profile.mode is Mode.DEVICE_PLUGIN and winner is None:
            await self.apply_agent(profile)
        else:
            await self.delete_agent(profile)

    async def retire(self, body: Mapping[str, Any]) -> None:
        """A profile is being deleted: remove its agents and node values, promote the next."""
        profile = Profile.from_body(body)
        await self.delete_agent(profile)
        promoted = await self.release(profile)
        if promoted is not None:
            log.info("DevicePluginProfile %s now provides %s", promoted.name, promoted.resource)
            if promoted.mode is Mode.DEVICE_PLUGIN:
                await self.apply_agent(promoted)

    def conflict_winner(self, profile: Profile) -> Profile | None:
        """The profile that holds ``profile``'s resource name instead of it, if any."""
        w = self.registry.winner(profile.resource)
        return None if w is None or w.name == profile.name else w

    async def release(self, deleting: Profile, patience: float = 60.0) -> Profile | None:
        """Remove a deleting profile's resource from every node it set; return the profile
        promoted in its place (the next one with the same resource name), if any.

        Works after a restart too: ``start`` listed every node before any profile handler ran,
        and ownership comes from the node annotations, not from memory. Raises
        ``CleanupPendingError`` when some node still carries the resource after ``patience`` seconds.
        """
        name = deleting.name
        profile = replace(deleting, deleting=True)
        self.registry.upsert(profile)
        self._winners = None
        self.enqueue_all()
        deadline = time.monotonic() + patience
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wait_idle(), max(0.1, deadline - time.monotonic()))
            left = [n.name for n in self.nodes.values() if any(o.profile == name for o in n.owners.values())]
            if not left:
                break
            if time.monotonic() > deadline:
                raise CleanupPendingError(f"{len(left)} nodes still carry {profile.resource}, e.g. {left[0]}")
            await asyncio.sleep(0.2)
        self.registry.remove(name)
        self._winners = None
        self._written.pop(name, None)
        self._status_dirty.discard(name)
        log.info("Removed %s from every node for DevicePluginProfile %s", profile.resource, name)
        promoted = self.registry.winner(profile.resource)
        self.mark_resource_dirty(profile.resource)
        return promoted

    def forget(self, name: str) -> None:
        self.registry.remove(name)
        self._winners = None
        self._written.pop(name, None)

    # --- agents (DevicePlugin mode) ----------------------------------------------------------

    async def apply_agent(self, profile: Profile) -> None:
        for obj in render.agent_objects(profile, self.settings):
            applied = await self.call(self.kube.apply, obj)
            log.info("Applied %s %s/%s", obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
            if obj["kind"] == "DaemonSet":
                self.observe_daemonset(profile.name, applied)
        self.mark_dirty(profile.name)

    async def delete_agent(self, profile: Profile) -> None:
        """Delete the agent objects if they exist (a Static or conflicting profile has none)."""
        for obj in reversed(render.agent_objects(profile, self.settings)):
            if await self.call(self.kube.delete, ref_of(obj)):
                log.info(
                    "Deleted %s %s/%s", obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"]
                )
        self.daemonsets.pop(profile.name, None)

    def observe_daemonset(self, profile: str, body: Mapping[str, Any] | None) -> None:
        """Keep the agent DaemonSet's rollout state (generation + status) for status.py."""
        if body is None:
            changed = self.daemonsets.pop(profile, None) is not None
        else:
            meta = body.get("metadata") or {}
            slim = {
                "metadata": {"generation": meta.get("generation")},
                "status": dict(body.get("status") or {}),
            }
            changed = self.daemonsets.get(profile) != slim
            self.daemonsets[profile] = slim
        if changed:
            self.mark_dirty(profile)

    async def _agent_poller(self, every: float = AGENT_POLL) -> None:
        """Read each applied agent DaemonSet's status every few seconds.

        Polling, not a watch: a kopf watch on DaemonSets is cluster-wide (the operator runs
        clusterwide for profiles and nodes) and would need cluster-wide RBAC on DaemonSets;
        a GET per DevicePlugin profile in our own namespace needs only the namespaced Role.
        """
        while True:
            await asyncio.sleep(every)
            for profile in list(self.registry) if self.active else []:
                if (
                    profile.mode is not Mode.DEVICE_PLUGIN
                    or profile.deleting
                    or self.conflict_winner(profile)
                ):
                    continue
                ds_ref = ref_of(render.agent_objects(profile, self.settings)[1])
                try:
                    body = await self.call(self.kube.get, ds_ref)
                except (KubeError, OSError) as e:
                    log.warning("Reading DaemonSet %s failed: %s", ds_ref.path, e)
                    continue
                self.observe_daemonset(profile.name, body)

    # --- nodes -------------------------------------------------------------------------------

    def observe_events(self, events: list[NodeEvent]) -> None:
        """A batch of watch events from the informer, in order."""
        for ev in events:
            self.observe_state(ev.type, ev.state)

    def resync_nodes(self, snapshot: Snapshot) -> None:
        """Every node as LISTed: nodes missing from it were deleted while we were not watching."""
        listed = {s.name for s in snapshot.states}
        for name in [n for n in self.nodes if n not in listed]:
            self.observe_state("DELETED", self.nodes[name])
        for state in snapshot.states:
            self.observe_state("LISTED", state)

    def observe_node(self, event_type: str, body: Mapping[str, Any]) -> None:
        """Fold a Node the API server returned (a patch result, a fresh read) into the cache."""
        self.observe_state(event_type, NodeState.from_node(body))

    def observe_state(self, event_type: str, state: NodeState) -> None:
        """Fold a node event into the cache; queue the node if it now needs a patch.

        Cheap on purpose: heartbeats change nothing we keep, so they stop at the comparison,
        and so does the watch event of our own patch (its resourceVersion is the one the
        patch response already gave us).
        """
        self.counters.node_events += 1
        name = state.name
        if event_type == "DELETED":
            if self.nodes.pop(name, None) is not None:
                self.failures.pop(name, None)
                self.mark_all_dirty()
            return
        old = self.nodes.get(name)
        if old is not None and not capacity.newer(state.resource_version, old.resource_version):
            return
        self.nodes[name] = state
        if old is not None and replace(old, resource_version=state.resource_version) == state:
            return
        self.mark_all_dirty()
        if capacity.plan(state, self.winners()):
            self.enqueue(name)

    def enqueue(self, name: str) -> None:
        if not self.active:
            return  # a waiting replica keeps its cache current but writes nothing
        if name in self._inflight:
            self._again.add(name)
        elif name not in self._queued:
            self._queued.add(name)
            self._idle.clear()
            self._queue.put_nowait(name)

    def enqueue_all(self) -> None:
        winners = self.winners()
        for name, state in self.nodes.items():
            if capacity.plan(state, winners):
                self.enqueue(name)

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def _patcher(self) -> None:
        while True:
            name = await self._queue.get()
            self._queued.discard(name)
            self._inflight.add(name)
            try:
                await self._patch_node(name)
            except Exception:
                log.exception("Unexpected error patching node %s", name)
            finally:
                self._inflight.discard(name)
                if name in self._again:
                    self._again.discard(name)
                    self.enqueue(name)
                if not self._queued and not self._inflight:
                    self._idle.set()

    async def _patch_node(self, name: str) -> None:
        state = self.nodes.get(name)
        if state is None or not self.active:
            return  # gone, or queued before this replica started waiting
        ops = capacity.plan(state, self.winners())
        if not ops:
            return
        try:
            result = await self.call(self.kube.patch_node_status, name, ops)
        except KubeError as e:
            self.counters.node_patch_failures += 1
            if e.status == 404:
                self.nodes.pop(name, None)
                return
            if e.status in (409, 422) and self._stale.get(name, 0) < MAX_STALE_RETRIES:
                # Our cache was stale (a path we remove is already gone): read it once, re-plan.
                self._stale[name] = self._stale.get(name, 0) + 1
                try:
                    fresh = await self.call(self.kube.get_node, name)
                except (KubeError, OSError) as again:
                    self._fail(name, str(again))
                    return
                if fresh is None:
                    self.nodes.pop(name, None)
                else:
                    self.observe_node("REFRESHED", fresh)
                    self._again.add(name)
                return
            self._fail(name, str(e))
            return
        except OSError as e:
            self.counters.node_patch_failures += 1
            self._fail(name, f"{type(e).__name__}: {e}")
            return
        self.counters.node_patches += 1
        self.counters.per_node[name] = self.counters.per_node.get(name, 0) + 1
        self._stale.pop(name, None)
        if self.failures.pop(name, None) is not None:
            self.mark_all_dirty()
        log.debug("Patched node %s: %s", name, ops)
        self.observe_node("PATCHED", result)

    def _fail(self, name: str, message: str) -> None:
        log.warning("Patching node %s failed, retrying in %.0fs: %s", name, RETRY_DELAY, message)
        self.failures[name] = message
        self._stale.pop(name, None)
        self.mark_all_dirty()
        asyncio.get_running_loop().call_later(RETRY_DELAY, self.enqueue, name)

    # --- status ------------------------------------------------------------------------------

    def mark_dirty(self, name: str) -> None:
        self._status_dirty.add(name)
        self._status_wake.set()

    def mark_all_dirty(self) -> None:
        for p in self.registry:
            self._status_dirty.add(p.name)
        self._status_wake.set()

    def mark_resource_dirty(self, resource: str) -> None:
        for p in self.registry:
            if p.resource == resource:
                self._status_dirty.add(p.name)
        self._status_wake.set()

    def compute_status(self, profile: Profile) -> dict[str, Any]:
        previous = self._written.get(profile.name, {})
        winner = self.conflict_winner(profile)
        if winner is not None:
            return status.conflict_status(profile, winner.name, previous, now())
        if profile.mode is Mode.STATIC:
            reports = [
                rep
                for node in self.nodes.values()
                if (rep := capacity.report(profile, node, self.failures.get(node.name))) is not None
            ]
            return status.static_status(profile, reports, previous, now())
        return status.plugin_status(
            profile, self.daemonsets.get(profile.name), self.nodes.values(), previous, now()
        )

    async def flush_status(self) -> None:
        if not self.active:
            return  # kept dirty: written once this replica works
        dirty, self._status_dirty = self._status_dirty, set()
        for name in sorted(dirty):
            profile = self.registry.get(name)
            if profile is None or profile.deleting:
                continue
            new = self.compute_status(profile)
            if _same(new, self._written.get(name, {})):
                continue
            try:
                await self.call(self.kube.patch_profile_status, name, new)
            except (KubeError, OSError) as e:
                log.warning("Writing the status of DevicePluginProfile %s failed: %s", name, e)
                self._status_dirty.add(name)
                continue
            self.counters.status_writes += 1
            self._written[name] = new
            log.debug("Updated the status of DevicePluginProfile %s", name)

    async def _status_writer(self) -> None:
        while True:
            await self._status_wake.wait()
            self._status_wake.clear()
            await asyncio.sleep(self.settings.status_debounce)
            try:
                await self.flush_status()
            except Exception:
                log.exception("Unexpected error writing profile status")
            if self._status_dirty and self.active:
                self._status_wake.set()

    # --- peering -----------------------------------------------------------------------------

    async def _peering_poller(self, me: Peering, every: float = PEERING_POLL) -> None:
        """Apply kopf's pause rule (peering.py) to the peering object, every few seconds.

        Pausing stops this replica's own writes (node patches, status, agent reads) at once; the
        node cache stays current. Resuming first re-lists the profiles, because kopf delivered
        nothing while this replica waited: planning nodes from that stale registry could push an
        old capacity back onto every node. An unreadable object changes nothing.
        """
        decided = False
        while True:
            try:
                obj = await self.call(self.kube.get_cluster_peering, me.name)
                waiting = peering.blockers((obj or {}).get("status"), me, datetime.now(UTC))
                if waiting and (self.active or not decided):
                    self.active = False
                    log.info("Waiting: live peers with priority >= %d: %s", me.priority, ", ".join(waiting))
                elif not waiting and not self.active:
                    await self.refresh_profiles()
                    self.active = True
                    log.info("Working: no live peer has priority >= %d", me.priority)
                    self.enqueue_all()
                    self.mark_all_dirty()
                decided = True
            except (KubeError, OSError) as e:
                log.warning("Reading ClusterKopfPeering %s failed: %s", me.name, e)
            await asyncio.sleep(every)

    async def refresh_profiles(self) -> None:
        """Replace the registry with the profiles as they are now (and their last status): at
        start, and when a peered replica takes over from a registry kopf stopped updating."""
        bodies = await self.call(self.kube.list_profiles)
        listed = set()
        for body in bodies:
            profile = Profile.from_body(body)
            listed.add(profile.name)
            self.registry.upsert(profile)
            current = body.get("status")
            self._written[profile.name] = dict(current) if isinstance(current, Mapping) else {}
        for gone in [p.name for p in self.registry if p.name not in listed]:
            self.forget(gone)
        self._winners = None

    def stats(self) -> dict[str, int]:
        c = self.counters
        return {
            "nodes": len(self.nodes),
            "profiles": len(list(self.registry)),
            "nodeEvents": c.node_events,
            "nodePatches": c.node_patches,
            "nodePatchFailures": c.node_patch_failures,
            "maxPatchesPerNode": max(c.per_node.values(), default=0),
            "statusWrites": c.status_writes,
            "queued": len(self._queued) + len(self._inflight),
            "working": int(self.active),
        }

    async def _stats_logger(self, every: float = STATS_PERIOD) -> None:
        """One line with the operator's counters whenever they moved: what it costs the API."""
        last: dict[str, int] = {}
        while True:
            await asyncio.sleep(every)
            current = self.stats()
            if current != last:
                log.info("Stats %s", json.dumps(current, separators=(",", ":")))
                last = current


def _same(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """Equal status, ignoring fields the operator does not write (e.g. a stale kopf block)."""
    return all(old.get(k) == v for k, v in new.items())
