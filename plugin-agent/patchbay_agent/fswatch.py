"""inotify on the asyncio event loop (`inotify_simple`, no thread, no polling).

inotify notices a deleted socket in well under a millisecond, where `watchfiles` and a 1 s poll
take far longer and a poll can miss a delete + recreate entirely (docs/facts.md#inotify). Watches
vanish with their directory (IN_IGNORED); callers call `ensure()` from a slow loop to put them
back, which is also how a directory that did not exist yet gets watched once it appears.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from inotify_simple import INotify, flags

log = logging.getLogger(__name__)

#: Entries appearing, vanishing or being renamed in a directory, and the directory itself going.
DIR_CHANGES = (
    flags.CREATE | flags.DELETE | flags.MOVED_FROM | flags.MOVED_TO | flags.DELETE_SELF | flags.MOVE_SELF
)

EventCallback = Callable[[Path, str, int], None]


class DirWatcher:
    """Watches directories; calls `callback(directory, entry name, mask)` on the event loop."""

    def __init__(self, callback: EventCallback, mask: int = DIR_CHANGES) -> None:
        self._callback = callback
        self._mask = mask
        self._inotify = INotify(nonblocking=True)
        self._by_wd: dict[int, Path] = {}
        self._by_path: dict[Path, int] = {}
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._inotify.fileno(), self._on_readable)

    def ensure(self, directories: Iterable[Path]) -> None:
        """Watch every directory that exists and is not watched yet; missing ones are skipped."""
        for d in directories:
            if d in self._by_path:
                continue
            try:
                wd = self._inotify.add_watch(str(d), self._mask)
            except OSError:
                continue  # not there (yet): the caller's slow loop tries again
            self._by_wd[wd] = d
            self._by_path[d] = wd
            log.debug("Watching %s", d)

    def _on_readable(self) -> None:
        try:
            events = self._inotify.read(timeout=0)
        except OSError as e:  # pragma: no cover - the fd is ours; this would be a kernel bug
            log.error("inotify read failed: %s", e)
            return
        for ev in events:
            directory = self._by_wd.get(ev.wd)
            if directory is None:
                continue
            if ev.mask & flags.IGNORED:
                # The kernel dropped the watch (directory deleted or unmounted).
                del self._by_wd[ev.wd]
                self._by_path.pop(directory, None)
            try:
                self._callback(directory, ev.name, ev.mask)
            except Exception:
                log.exception("inotify callback failed for %s/%s", directory, ev.name)

    def close(self) -> None:
        if self._inotify.closed:
            return
        self._loop.remove_reader(self._inotify.fileno())
        self._inotify.close()
