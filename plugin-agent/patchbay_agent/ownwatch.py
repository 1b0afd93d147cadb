"""Following the agent's own objects on the API server: a LIST, then a WATCH, narrowed by a field
selector to what this agent writes (its DeviceReport by `metadata.name`; its node's slices of its
driver by `spec.nodeName` and `spec.driver`), so each node costs the API server one watch per
object kind it writes, whatever the size of the cluster.

Why: what the agent writes must stay there. A DeviceReport or ResourceSlice that an administrator,
a cleanup script or another controller deleted or edited is written again as soon as the watch
says so (`changewriter.ChangeWriter.seen` and `verify`), instead of at the next periodic check
(reads that cost the API server the same on a quiet node) or never. A watch costs nothing while
nothing changes: no request but the watch itself, renewed every `timeout_seconds` from the last
version seen (bookmarks keep it fresh), and no write at all.

A thread of its own (the agent's client is synchronous, and a watch holds its connection for
minutes): every event goes to the event loop (`loop.call_soon_threadsafe`), where the writer looks
at it between its writes. The listed items come as one `LISTED` event (`{"items": [...]}`), so a
deletion the watch missed while it was down is seen in the list that follows. A failed request is
tried again after the agent's one backoff rhythm; an ERROR event (410 Gone: the version is too old)
lists again. `stop()` ends a watch at once (it shuts its socket), so a writer that stops leaves no
connection behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from patchbay_agent.backoff import Backoff
from patchbay_agent.constants import FIELD_MANAGER
from patchbay_agent.metrics import Metrics

log = logging.getLogger(__name__)

#: The event that carries a LIST's items.
LISTED = "LISTED"
#: Seconds a watch runs before the API server ends it and it is renewed (one request each time).
WATCH_SECONDS = 300
#: Retry rhythm of a watch that failed (an API server that is down must not see a storm of them).
BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 60.0
#: Repairs of one writer within this many seconds of each other beyond the first `FREE_REPAIRS`
#: are a fight (the garbage collector deleting a report whose Node was replaced, a controller that
#: deletes what the agent writes): each such repair waits longer, 1 s doubling to 120 s.
FIGHT_WINDOW = 300.0
FREE_REPAIRS = 3


#: Handed a watch's connection as it opens (so that another thread can end the watch at once).
Opened = Callable[[http.client.HTTPConnection], None] | None


@runtime_checkable
class WatchClient(Protocol):
    """What following needs of the API (`kubeclient.KubeClient`); synchronous."""

    def list_objects(self, selection: Selection) -> tuple[list[dict[str, Any]], str]: ...

    def watch_objects(
        self, selection: Selection, resource_version: str, *, timeout_seconds: int = ..., opened: Opened = ...
    ) -> Iterator[tuple[str, dict[str, Any]]]: ...


@dataclass(frozen=True)
class Selection:
    """Which objects: an API version, a plural, a namespace (None: cluster-scoped) and a field
    selector that picks only the agent's own."""

    version: str
    plural: str
    namespace: str | None
    field_selector: str

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        return f"{self.plural}{where} ({self.field_selector})"


def version_of(obj: dict[str, Any]) -> str:
    """An object's resourceVersion ("" when it has none)."""
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def managers(obj: dict[str, Any]) -> set[str]:
    """The field managers that own fields of `obj` (its managedFields), e.g. "kubectl-edit"."""
    entries = (obj.get("metadata") or {}).get("managedFields") or []
    return {str(e.get("manager") or "") for e in entries if isinstance(e, dict)}


class OwnWatch:
    """LIST + WATCH of one `Selection` in a thread; `start(deliver)` on the loop that gets the
    events, `stop()` to end it. See the module doc."""

    def __init__(
        self,
        client: WatchClient,
        selection: Selection,
        *,
        timeout_seconds: int = WATCH_SECONDS,
        backoff: Backoff | None = None,
    ) -> None:
        self._client = client
        self.selection = selection
        self._timeout = timeout_seconds
        self._backoff = backoff or Backoff(BACKOFF_INITIAL, BACKOFF_MAX)
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None
        self._thread: threading.Thread | None = None
        #: LISTs made (the first and one after each 410 or failure), watch events seen
        self.lists = 0
        self.events = 0

    def start(self, deliver: Callable[[str, dict[str, Any]], None]) -> None:
        """Follow in a daemon thread; `deliver(type, object)` is called on the running loop."""
        loop = asyncio.get_running_loop()

        def post(kind: str, obj: dict[str, Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(deliver, kind, obj)

        self._thread = threading.Thread(
            target=self._run, args=(post,), name=f"watch-{self.selection.plural}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """End the watch now: a blocked read returns at once (its socket is shut)."""
        self._stopped.set()
        with self._lock:
            conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _opened(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._conn = conn
        if self._stopped.is_set() and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)

    def _run(self, post: Callable[[str, dict[str, Any]], None]) -> None:
        sel = self.selection
        version = ""  # "": list first
        failing = False
        while not self._stopped.is_set():
            try:
                if not version:
                    items, version = self._client.list_objects(sel)
                    self.lists += 1
                    post(LISTED, {"items": items})
                for kind, obj in self._client.watch_objects(
                    sel, version, timeout_seconds=self._timeout, opened=self._opened
                ):
                    if self._stopped.is_set():
                        return
                    if kind == "ERROR":
                        # 410 Gone (the version is older than the server keeps) or another
                        # failure the server reports in the stream: list again.
                        version = ""
                        break
                    version = version_of(obj) or version
                    if kind != "BOOKMARK":
                        self.events += 1
                        post(kind, obj)
                self._backoff.reset()
                if failing:
                    log.info("Watching %s again", sel)
                failing = False
            except Exception as e:
                if self._stopped.is_set():
                    return
                delay = self._backoff.next()
                log.log(
                    logging.DEBUG if failing else logging.WARNING,
                    "Watching %s failed (%s); again in %.1fs",
                    sel,
                    e,
                    delay,
                )
                failing = True
                version = ""  # what happened meanwhile is in the next LIST
                self._stopped.wait(delay)
            finally:
                with self._lock:
                    self._conn = None

    def list_now(self) -> list[dict[str, Any]]:
        """The selected objects as the API server has them now (one LIST; raises on failure)."""
        items, _ = self._client.list_objects(self.selection)
        return items


class Repairs:
    """One writer's memory for repairing: the resourceVersions its own writes returned (their
    watch events are its own, never someone else's), and the repairs due, counted
    (`patchbay_agent_repairs_total`) and logged in the Kubernetes style once the objects are
    written again ("ResourceSlice n1-d was deleted; written again")."""

    def __init__(
        self,
        kind: str,
        metrics: Metrics | None,
        *,
        keep: int = 64,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`metrics`: where repairs are counted; None: only logged (the node agent's NodeInventory,
        which belongs to no profile's metrics)."""
        self.kind = kind
        self._clock = clock
        #: when the latest repairs were due (within FIGHT_WINDOW), and the backoff beyond them
        self._recent: deque[float] = deque()
        self._fight = Backoff(1.0, 120.0)
        self._metrics = metrics
        self._own: deque[str] = deque(maxlen=keep)
        #: name -> (cause: deleted or edited, what happened, for the log)
        self._due: dict[str, tuple[str, str]] = {}
        #: name -> the other field managers the agent's last write of it left in place
        self._kept: dict[str, frozenset[str]] = {}
        #: names the agent itself is deleting (a report someone edited, a slice the pool no
        #: longer needs): their DELETED events are its own, no repair
        self._deleting: set[str] = set()
        self.done = 0

    def wrote(self, version: str, stored: dict[str, Any] | None = None) -> None:
        """A write of the agent's own stored this resourceVersion; `stored`: the object as the
        answer gave it, whose other field managers stay after the write (a label someone added
        is not the agent's to take): their fields are no edit to repair, by anyone's write."""
        if version:
            self._own.append(version)
        if stored is not None:
            self._kept[name_of(stored)] = frozenset(managers(stored) - {FIELD_MANAGER})

    def own(self, obj: dict[str, Any]) -> bool:
        return version_of(obj) in self._own

    def suspect(self, kind: str, obj: dict[str, Any], names: Iterable[str]) -> bool:
        """Whether a watch event may be someone else's deletion or edit of one of `names` (the
        objects last written): not when it is an event of the agent's own write. A DELETED event
        of one of them, or another field manager's edit, makes its repair due at once (`_gone`,
        `_edited`): the next write of it counts it, whichever write that is."""
        names = set(names)
        self._gone(kind, obj, names)
        self._edited(kind, obj, names)
        if kind == LISTED:
            items = obj.get("items") or []
            listed = {name_of(i): i for i in items}
            return bool(names - listed.keys()) or any(
                not self.own(i) for n, i in listed.items() if n in names
            )
        if name_of(obj) not in names:
            return False
        return kind == "DELETED" or not self.own(obj)

    def look(self, names: Iterable[str], items: Iterable[dict[str, Any]]) -> bool:
        """Compare `names` (the objects last written) with `items` (as the server has them now):
        each one that is gone or that someone else edited is a repair due; True when any is."""
        stored = {name_of(i): i for i in items}
        found = False
        for name in sorted(names):
            item = stored.get(name)
            if item is None:
                self.due(name, "deleted", "deleted")
            elif not self.own(item) and (edited := edited_by(item, self._kept.get(name, ()))) is not None:
                self.due(name, "edited", edited)
            else:
                continue
            found = True
        return found

    def _gone(self, kind: str, obj: dict[str, Any], names: set[str]) -> None:
        """A DELETED event of one of `names` (the objects last written) that the agent did not
        delete itself: someone deleted it, and the next write of it is its repair, whichever path
        makes it (the ordinary write of a change may come before the check that would find it
        gone, and that check then finds the agent's own version stored).

        Why not by resourceVersion, as `own` tells an edit: the API server sends a DELETED event
        with the version of the deletion, never one the agent's write returned (docs/agent.md#
        what-the-agent-writes-again)."""
        name = name_of(obj)
        if kind != "DELETED" or name not in names:
            return
        if name in self._deleting:
            self._deleting.discard(name)
            return
        self._due.setdefault(name, ("deleted", "deleted"))

    def _edited(self, kind: str, obj: dict[str, Any], names: set[str]) -> None:
        """An ADDED or MODIFIED event of one of `names`, not of the agent's own write, whose field
        managers name someone else (`edited_by`): their edit, due for repair (the ordinary write of
        a change, if it comes before the check, undoes it: a forced apply takes the fields back)."""
        name = name_of(obj)
        if kind not in ("ADDED", "MODIFIED") or name not in names or self.own(obj):
            return
        if (happened := edited_by(obj, self._kept.get(name, ()))) is not None:
            self._due.setdefault(name, ("edited", happened))

    @contextlib.contextmanager
    def deleting(self, name: str) -> Iterator[None]:
        """Around the agent's own delete of `name`: its DELETED event is no repair due. A delete
        that raised leaves no note (no such event will come)."""
        self._deleting.add(name)
        try:
            yield
        except BaseException:
            self._deleting.discard(name)
            raise

    def pending(self, name: str) -> bool:
        return name in self._due

    def due(self, name: str, cause: str, happened: str) -> None:
        self._due[name] = (cause, happened)

    def pace(self) -> float:
        """Seconds the repair about to be written should wait: none for the first `FREE_REPAIRS`
        within `FIGHT_WINDOW`; beyond, a backoff (someone keeps undoing the agent's writes: a
        bounded number of writes, not a loop)."""
        now = self._clock()
        while self._recent and now - self._recent[0] > FIGHT_WINDOW:
            self._recent.popleft()
        self._recent.append(now)
        if len(self._recent) <= FREE_REPAIRS:
            self._fight.reset()
            return 0.0
        delay = self._fight.next()
        log.warning(
            "%s repairs keep coming (%d in %.0fs): someone keeps deleting or editing what the agent "
            "writes; writing again in %.1fs",
            self.kind,
            len(self._recent),
            FIGHT_WINDOW,
            delay,
        )
        return delay

    def written(self, names: Iterable[str]) -> None:
        """`names` were written: the repairs among them are done."""
        for name in names:
            if (repair := self._due.pop(name, None)) is not None:
                cause, happened = repair
                self.done += 1
                if self._metrics is not None:
                    self._metrics.repairs.labels(self.kind, cause).inc()
                log.warning("%s %s was %s; written again", self.kind, name, happened)


def name_of(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def edited_by(obj: dict[str, Any], kept: Iterable[str] = ()) -> str | None:
    """ "edited by kubectl-edit" when field managers other than the agent's own (and other than
    `kept`, those its own last write left in place) own fields of the stored `obj`: someone
    else's edit. None: an agent wrote it (this one or a rollout's successor, the same field
    manager), so two agents never take turns rewriting it."""
    others = managers(obj) - {FIELD_MANAGER} - set(kept)
    return f"edited by {', '.join(sorted(others))}" if others else None
