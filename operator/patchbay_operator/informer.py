"""The operator's one way to watch: a LIST, then a WATCH from its resourceVersion, in a thread.

Used for every kind the operator follows besides its profiles: nodes, and its own agent
DaemonSets (a label selector in its namespace). Why not kopf for these: kopf runs every event
through its whole per-object machinery, about 1 ms of CPU per node event here, and on nodes its
stateful handlers would write to every Node (docs/facts.md#kopf-on-nodes). This informer decodes
each object into the small value the controller keeps (``Source.decode``) and hands a whole
burst of events to the event loop at once.

Guarantees for the controller:

- ``list_all`` gives every object and the resourceVersion of that snapshot; nothing is missed
  between it and the watch that ``start`` opens from that version;
- every event after it is delivered in order, in batches, on the event loop;
- when the server has forgotten our resourceVersion (410 Gone: the watch was down too long),
  the informer LISTs again and delivers the whole list as a resync, from which the controller
  learns which objects went away meanwhile;
- any other failure (connection reset, API server restart) is retried with capped backoff
  (backoff.py) from the last resourceVersion seen; the controller's cache stays as it was.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from patchbay_operator.backoff import Backoff
from patchbay_operator.kube import (
    NO_SELECTORS,
    EventReader,
    KubeAPI,
    KubeError,
    PageDecoder,
    Selectors,
    Watch,
    WatchEvent,
    json_event,
    json_page,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

WATCHED = ("ADDED", "MODIFIED", "DELETED")
"""The watch event types that carry one of the kind's objects (BOOKMARK only moves the version on)."""

WATCH_TIMEOUT = 300
"""Seconds the server keeps one watch open before we re-open it from the last resourceVersion."""

LIST_CHUNK = 500
"""Objects per LIST page at most: a big cluster is never one giant response. Pages of large
objects hold fewer (``kube.PAGE_BYTES``)."""


@dataclass(frozen=True)
class Source(Generic[T]):
    """What to watch (a collection path and optional selectors) and what to keep of each object
    (``decode``: a full object -> the small value the controller holds)."""

    kind: str  # for logs and metrics: "nodes", "agent DaemonSets"
    path: str
    decode: Callable[[Mapping[str, Any]], T]
    selectors: Selectors = NO_SELECTORS
    #: objects the LIST's first page asks for, before their size is known (later pages: as many
    #: as ``kube.PAGE_BYTES`` holds): fewer for kinds whose objects can be large
    first_page: int = LIST_CHUNK
    #: reads a LIST page's body, and a WATCH line, straight into the values kept (``decode`` is
    #: not applied to what they give): for kinds whose objects are large and mostly dropped.
    #: Both or neither.
    decode_page: PageDecoder | None = None
    read_event: EventReader | None = None

    def page_decoder(self) -> PageDecoder:
        """How a LIST page of this kind becomes kept values: ``decode_page``, or JSON then ``decode``."""
        if self.decode_page is not None:
            return self.decode_page
        decode = self.decode

        def read(raw: bytes) -> tuple[list[Any], str, str]:
            items, rv, cont = json_page(raw)
            return [decode(item) for item in items], rv, cont

        return read

    def event_reader(self) -> EventReader:
        """How a WATCH line of this kind becomes an event with a kept value: ``read_event``, or
        JSON then ``decode`` (for the types that carry one of this kind's objects)."""
        if self.read_event is not None:
            return self.read_event
        decode = self.decode

        def read(line: bytes) -> WatchEvent:
            ev = json_event(line)
            return WatchEvent(ev.type, ev.resource_version, decode(ev.object)) if ev.type in WATCHED else ev

        return read


@dataclass(frozen=True)
class Event(Generic[T]):
    """One watch event: ``type`` is ADDED, MODIFIED or DELETED."""

    type: str
    obj: T


@dataclass(frozen=True)
class Snapshot(Generic[T]):
    """Every object at one resourceVersion (a LIST)."""

    items: list[T]
    resource_version: str


def list_all(kube: KubeAPI, source: Source[T]) -> Snapshot[T]:
    """LIST every object, decoding page by page (full bodies are never all in memory at once)."""
    items: list[T] = []
    rv = ""
    decode = source.page_decoder()
    for page in kube.list_pages(
        source.path, LIST_CHUNK, source.selectors, first=source.first_page, decode=decode
    ):
        items.extend(page.items)
        rv = page.resource_version
    return Snapshot(items, rv)


class Informer(Generic[T]):
    """Watches ``source`` from a snapshot's resourceVersion and calls back on the event loop.

    ``on_events`` gets each batch of events; ``on_resync`` gets a fresh ``Snapshot`` after the
    server expired our resourceVersion. Both run on ``loop``, never on the informer's thread.
    """

    def __init__(
        self,
        kube: KubeAPI,
        source: Source[T],
        loop: asyncio.AbstractEventLoop,
        on_events: Callable[[list[Event[T]]], None],
        on_resync: Callable[[Snapshot[T]], None],
    ) -> None:
        self._kube, self._source, self._loop = kube, source, loop
        self._on_events, self._on_resync = on_events, on_resync
        self._stopping = threading.Event()
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None
        self.resource_version = ""
        self.restarts = 0
        self.kind = source.kind

    def start(self, resource_version: str) -> None:
        """Watch from ``resource_version``; with ``""`` (the first LIST failed, e.g. a CRD that is
        not installed yet) LIST first, in the informer's thread, retrying with backoff."""
        self.resource_version = resource_version
        name = f"informer-{self._source.kind.replace(' ', '-')}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        watch = self._watch
        if watch is not None:
            watch.close()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        backoff = Backoff()
        while not self._stopping.is_set():
            if not self.resource_version and not self._relist():
                self._stopping.wait(backoff.next())
                continue
            try:
                self._watch_once()
                backoff.reset()  # the server ended the stream normally: re-open at once
                continue
            except KubeError as e:
                if self._stopping.is_set():
                    return
                self.restarts += 1
                if e.status == 410:
                    log.info(
                        "Watch of %s expired at resourceVersion %s; listing again",
                        self._source.kind,
                        self.resource_version,
                    )
                    if self._relist():
                        backoff.reset()
                        continue
                else:
                    log.warning("Watch of %s failed, reopening: %s", self._source.kind, e)
            except Exception:
                log.exception("Unexpected error in the watch of %s; reopening", self._source.kind)
            self._stopping.wait(backoff.next())

    def _watch_once(self) -> None:
        src = self._source
        watch = self._kube.watch(
            src.path, self.resource_version, WATCH_TIMEOUT, src.selectors, src.event_reader()
        )
        self._watch = watch
        if self._stopping.is_set():  # stop() ran between the check in _run and now
            watch.close()
            return
        try:
            for batch in watch:
                events: list[Event[T]] = []
                for ev in batch:
                    if ev.resource_version:
                        self.resource_version = ev.resource_version
                    if ev.type in WATCHED:
                        events.append(Event(ev.type, ev.object))
                if events:
                    self._loop.call_soon_threadsafe(self._on_events, events)
        finally:
            self._watch = None

    def _relist(self) -> bool:
        try:
            snapshot = list_all(self._kube, self._source)
        except (KubeError, OSError) as e:
            log.warning("Listing %s failed: %s", self._source.kind, e)
            return False
        self.resource_version = snapshot.resource_version
        self._loop.call_soon_threadsafe(self._on_resync, snapshot)
        return True


class Store(Generic[T]):
    """The objects of one informer, by key, for kinds that need no more than "latest wins".

    ``on_change(old, new)`` runs for every object that was added, changed or deleted (``old`` or
    ``new`` is None then); an event that changes nothing calls nothing.
    """

    def __init__(self, key: Callable[[T], str], on_change: Callable[[T | None, T | None], None]) -> None:
        self._key, self._on_change = key, on_change
        self.items: dict[str, T] = {}

    def observe(self, events: list[Event[T]]) -> None:
        for ev in events:
            self.fold(ev.type, ev.obj)

    def resync(self, snapshot: Snapshot[T]) -> None:
        listed = {self._key(o) for o in snapshot.items}
        for gone in [k for k in self.items if k not in listed]:
            self.fold("DELETED", self.items[gone])
        for obj in snapshot.items:
            self.fold("LISTED", obj)

    def fold(self, event_type: str, obj: T) -> None:
        change = self.fold_quietly(event_type, obj)
        if change is not None:
            self._on_change(*change)

    def fold_quietly(self, event_type: str, obj: T) -> tuple[T | None, T | None] | None:
        """Fold ``obj`` without calling ``on_change``; the change (old, new), or None when there
        was none. For the owner's own writes (an apply's answer, a delete it sent): it knows what
        it changed and acts on it itself, so nothing calls back into it from below."""
        key = self._key(obj)
        if not key:
            return None
        old = self.items.get(key)
        if event_type == "DELETED":
            return (old, None) if self.items.pop(key, None) is not None else None
        if old == obj:
            return None
        self.items[key] = obj
        return (old, obj)
