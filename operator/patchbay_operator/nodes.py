"""Static capacity on every node: the node cache the informer feeds, and the workers that patch.

A worker plans a node's JSON patch from the CURRENT cache at the moment it runs (level-based, so
a burst of events costs one patch; capacity.plan), sends it, and folds the server's answer back
into the cache, so the watch event of its own write is recognised as "nothing to do": one write
per node per change. Failures:

- 409/422 (the patch was planned from a stale cache: a path we remove is already gone, or the
  node is no longer the version a patch that takes a free resource tests for): read the node
  once, re-plan, at most ``MAX_STALE_RETRIES`` times in a row;
- 404: the node is gone; forget it;
- anything else (or too many stale retries): remember the failure (the status reports it) and
  try again after a per-node backoff.

During a Static profile's staged rollout a node's patch is planned for the revision the node
serves (``serves``: staging.py), so a wave is the patches of the nodes it moved.

The work queue is paused while this replica must not write (peering), and a held node is
skipped then too.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from patchbay_operator import capacity
from patchbay_operator.backoff import Backoff
from patchbay_operator.capacity import NodeState
from patchbay_operator.informer import Event, Snapshot, Source
from patchbay_operator.kube import NODES_PATH, KubeAPI, KubeError
from patchbay_operator.profiles import Profile
from patchbay_operator.workqueue import WorkQueue

log = logging.getLogger(__name__)
Call = Callable[..., Awaitable[Any]]

MAX_STALE_RETRIES = 3
"""Immediate re-reads after a rejected patch before the node is treated as failing: a patch the
server keeps rejecting must not spin."""

RETRY_FIRST, RETRY_MAX = 2.0, 30.0
"""Seconds before a node whose patch failed is tried again: the first delay, and the cap."""

SOURCE = Source("nodes", NODES_PATH, NodeState.from_node)


class NodeWriter:
    """What the parts that write Nodes share (static capacity here, the inventory labels in
    nodelabels.py): a work queue of node names, its workers (``run_worker``, each calling
    ``sync``), and one way to handle a write's failure (``write``): 404, the node is forgotten;
    409/422 (planned from a stale cache), the node read once, folded and queued again, at most
    ``MAX_STALE_RETRIES`` times in a row; anything else, tried again after a per-node backoff."""

    what = "Patching node"
    """How the warning of a failed write starts ("Patching node n-1 failed, retrying in ...")."""

    def __init__(self, kube: KubeAPI, call: Call) -> None:
        self._kube, self._call = kube, call
        self.queue: WorkQueue[str] = WorkQueue()
        self._stale: dict[str, int] = {}
        self._retry: dict[str, Backoff] = {}
        self.patch_failures = 0

    async def sync(self, name: str) -> None:
        raise NotImplementedError

    def fold(self, event_type: str, state: NodeState) -> None:
        raise NotImplementedError

    def forget(self, name: str) -> None:
        """The node is gone."""
        raise NotImplementedError

    def failed(self, name: str, message: str) -> None:
        """A write failed and is tried again later (nothing to do by default)."""

    async def run_worker(self) -> None:
        while True:
            name = await self.queue.get()
            try:
                await self.sync(name)
            except Exception:
                log.exception("Unexpected error: %s %s", self.what.lower(), name)
            finally:
                self.queue.done(name)

    async def write(self, name: str, fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any] | None:
        """``fn(name, *args)`` in the pool: the node as stored, or None when it failed (handled)."""
        try:
            result: dict[str, Any] = await self._call(fn, name, *args)
        except KubeError as e:
            self.patch_failures += 1
            if e.status == 404:
                self.forget(name)
            elif e.status in (409, 422) and self._stale.get(name, 0) < MAX_STALE_RETRIES:
                self._stale[name] = self._stale.get(name, 0) + 1
                await self._reread(name)
            else:
                self._fail(name, str(e))
            return None
        except OSError as e:
            self.patch_failures += 1
            self._fail(name, f"{type(e).__name__}: {e}")
            return None
        self._stale.pop(name, None)
        self._retry.pop(name, None)
        return result

    async def _reread(self, name: str) -> None:
        """Our cache was stale (a path we remove is already gone): read the node once, re-plan."""
        try:
            fresh = await self._call(self._kube.get_node, name)
        except (KubeError, OSError) as e:
            self._fail(name, str(e))
            return
        if fresh is None:
            self.forget(name)
            return
        self.fold("REFRESHED", NodeState.from_node(fresh))
        self.queue.add(name)  # held by this worker: queued again when it is done

    def _fail(self, name: str, message: str) -> None:
        delay = self._retry.setdefault(name, Backoff(first=RETRY_FIRST, maximum=RETRY_MAX)).next()
        log.warning("%s %s failed, retrying in %.1fs: %s", self.what, name, delay, message)
        self._stale.pop(name, None)
        self.failed(name, message)
        self.queue.add_after(name, delay)


class NodeSync(NodeWriter):
    """The node cache and its patch workers (``run_worker``, ``concurrency`` of them)."""

    def __init__(
        self,
        kube: KubeAPI,
        call: Call,
        winners: Callable[[], Mapping[str, Profile]],
        on_change: Callable[[], None],
    ) -> None:
        super().__init__(kube, call)
        self._winners, self._on_change = winners, on_change
        self.states: dict[str, NodeState] = {}
        self.failures: dict[str, str] = {}
        self.events = 0
        self.patches = 0
        self.per_node: dict[str, int] = {}
        #: patches that set a node's capacity back to the value this operator last wrote there
        #: (something else changed it): the drift alert's counter
        self.drift_reassertions = 0
        self._written: dict[tuple[str, str], Any] = {}
        #: a winner as one node serves it (staged rollouts: Staging.served); None: the spec
        self.serves: Callable[[Profile, NodeState], Profile] | None = None

    def _plan(self, state: NodeState, winners: Mapping[str, Profile]) -> capacity.JsonPatch:
        """The node's patch, each winner as the node serves it (its rollout's revision)."""
        serves = self.serves
        if serves is not None and winners:
            winners = {r: serves(p, state) for r, p in winners.items()}
        return capacity.plan(state, winners)

    # --- the cache -----------------------------------------------------------------------------

    def observe(self, events: list[Event[NodeState]]) -> None:
        """A batch of watch events from the informer, in order."""
        for ev in events:
            self.fold(ev.type, ev.obj)

    def resync(self, snapshot: Snapshot[NodeState]) -> None:
        """Every node as LISTed: nodes missing from it were deleted while we were not watching."""
        listed = {s.name for s in snapshot.items}
        for name in [n for n in self.states if n not in listed]:
            self.fold("DELETED", self.states[name])
        for state in snapshot.items:
            self.fold("LISTED", state)

    def fold(self, event_type: str, state: NodeState) -> None:
        """Fold one node into the cache; queue it if it now needs a patch.

        Cheap on purpose: heartbeats change nothing we keep, so they stop at the comparison, and
        so does the watch event of our own patch (the patch response gave us its resourceVersion).
        """
        self.events += 1
        name = state.name
        if event_type == "DELETED":
            if self.states.pop(name, None) is not None:
                self.failures.pop(name, None)
                self._on_change()
            return
        old = self.states.get(name)
        if old is not None and not capacity.newer(state.resource_version, old.resource_version):
            return
        self.states[name] = state
        if old is not None and replace(old, resource_version=state.resource_version) == state:
            return
        self._on_change()
        if self._plan(state, self._winners()):
            self.queue.add(name)

    def enqueue_all(self) -> None:
        """Queue every node whose patch is not empty (after a profile or the winners changed)."""
        winners = self._winners()
        for name, state in self.states.items():
            if self._plan(state, winners):
                self.queue.add(name)

    def carrying(self, profile: str) -> list[str]:
        """Nodes that still carry a value ``profile`` set (from their ownership annotations)."""
        return [n.name for n in self.states.values() if any(o.profile == profile for o in n.owners.values())]

    # --- the workers ---------------------------------------------------------------------------

    def forget(self, name: str) -> None:
        self.states.pop(name, None)

    def failed(self, name: str, message: str) -> None:
        self.failures[name] = message
        self._on_change()

    async def sync(self, name: str) -> None:
        state = self.states.get(name)
        if state is None or self.queue.paused:
            return  # gone, or this replica stopped writing after the node was taken
        ops = self._plan(state, self._winners())
        if not ops:
            return
        result = await self.write(name, self._kube.patch_node_status, ops)
        if result is None:
            return
        self.patches += 1
        self.per_node[name] = self.per_node.get(name, 0) + 1
        for op in ops:
            if op["op"] in ("add", "replace") and op["path"].startswith("/status/capacity/"):
                key = (name, op["path"])
                self.drift_reassertions += self._written.get(key) == op["value"]
                self._written[key] = op["value"]
        if self.failures.pop(name, None) is not None:
            self._on_change()
        log.debug("Patched node %s: %s", name, ops)
        self.fold("PATCHED", NodeState.from_node(result))
