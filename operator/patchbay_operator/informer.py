"""The operator's own node informer: one LIST, then a WATCH, in a thread of its own.

Why not kopf's node watch: kopf runs every event of every watched object through its whole
per-object machinery (body wrappers, the diff essence, handler selection, logging), about 1 ms
of CPU per node event on these machines, and a static rollout makes two or three events per
node. That CPU was taken from the API server on the same cores and was most of the gap between
the operator and a plain client patching the same nodes (docs/benchmarks.md). This informer
does only what the operator needs: decode the event, keep the slice of the Node that
``capacity.NodeState`` holds, and hand a whole burst of events to the event loop at once.

Guarantees for the controller:

- ``list_all`` gives every node and the resourceVersion of that snapshot; nothing is missed
  between it and the watch that ``start`` opens from that version;
- every event after it is delivered in order, in batches, on the event loop;
- when the server has forgotten our resourceVersion (410 Gone: the watch was down for too
  long), the informer LISTs again and delivers the whole list as a resync, from which the
  controller learns which nodes went away meanwhile;
- any other failure (connection reset, API server restart) is retried with capped backoff
  from the last resourceVersion seen; the controller's cache stays as it was meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass

from patchbay_operator.capacity import NodeState
from patchbay_operator.kube import Kube, KubeError, Watch

log = logging.getLogger(__name__)

WATCH_TIMEOUT = 300
"""Seconds the server keeps one watch open before we re-open it from the last resourceVersion."""

BACKOFF_FIRST, BACKOFF_MAX = 0.5, 30.0
"""Seconds between attempts after a failed watch: doubling, with jitter, up to the maximum."""


@dataclass(frozen=True)
class NodeEvent:
    """One node event: ``type`` is ADDED, MODIFIED or DELETED."""

    type: str
    state: NodeState


@dataclass(frozen=True)
class Snapshot:
    """Every node at one resourceVersion (a LIST)."""

    states: list[NodeState]
    resource_version: str


def list_all(kube: Kube) -> Snapshot:
    """LIST every node, keeping only each node's ``NodeState`` (page by page, so the full Node
    bodies of a big cluster are never all in memory at once)."""
    states: list[NodeState] = []
    rv = ""
    for page in kube.list_nodes():
        states.extend(NodeState.from_node(item) for item in page.items)
        rv = page.resource_version
    return Snapshot(states, rv)


class NodeInformer:
    """Watches nodes from a snapshot's resourceVersion and calls back on the event loop.

    ``on_events`` gets each batch of events; ``on_resync`` gets a fresh ``Snapshot`` after the
    server expired our resourceVersion. Both run on ``loop``, never on the informer's thread.
    """

    def __init__(
        self,
        kube: Kube,
        loop: asyncio.AbstractEventLoop,
        on_events: Callable[[list[NodeEvent]], None],
        on_resync: Callable[[Snapshot], None],
    ) -> None:
        self._kube = kube
        self._loop = loop
        self._on_events = on_events
        self._on_resync = on_resync
        self._stopping = threading.Event()
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None
        self.resource_version = ""
        self.restarts = 0

    def start(self, resource_version: str) -> None:
        self.resource_version = resource_version
        self._thread = threading.Thread(target=self._run, name="node-informer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        watch = self._watch
        if watch is not None:
            watch.close()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        delay = BACKOFF_FIRST
        while not self._stopping.is_set():
            try:
                self._watch_once()
                delay = BACKOFF_FIRST  # the server ended the stream normally: re-open at once
            except KubeError as e:
                if self._stopping.is_set():
                    return
                self.restarts += 1
                if e.status == 410:
                    log.info("Node watch expired at resourceVersion %s; listing again", self.resource_version)
                    if self._relist():
                        delay = BACKOFF_FIRST
                        continue
                else:
                    log.warning("Node watch failed, reopening in %.1fs: %s", delay, e)
                self._stopping.wait(delay * random.uniform(0.8, 1.2))  # noqa: S311 - jitter only
                delay = min(delay * 2, BACKOFF_MAX)
            except Exception:
                log.exception("Unexpected error in the node watch; reopening")
                self._stopping.wait(BACKOFF_MAX)

    def _watch_once(self) -> None:
        watch = self._kube.watch_nodes(self.resource_version, WATCH_TIMEOUT)
        self._watch = watch
        if self._stopping.is_set():  # stop() ran between the check in _run and now
            watch.close()
            return
        try:
            for batch in watch:
                events: list[NodeEvent] = []
                for ev in batch:
                    obj = ev.get("object") or {}
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if rv:
                        self.resource_version = str(rv)
                    if ev.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        events.append(NodeEvent(str(ev["type"]), NodeState.from_node(obj)))
                if events:
                    self._loop.call_soon_threadsafe(self._on_events, events)
        finally:
            self._watch = None

    def _relist(self) -> bool:
        try:
            snapshot = list_all(self._kube)
        except (KubeError, OSError) as e:
            log.warning("Listing nodes failed: %s", e)
            return False
        self.resource_version = snapshot.resource_version
        self._loop.call_soon_threadsafe(self._on_resync, snapshot)
        return True
