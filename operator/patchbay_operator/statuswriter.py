"""Profile status, written rarely: at most once per debounce window, and only when it changed.

Anything that can change a profile's status marks the profile dirty (``mark``): a node event, a
patch result, an agent DaemonSet's rollout. ``run`` waits for the first mark, gathers further
marks for ``debounce`` seconds, recomputes each dirty profile's status (``compute``, pure) and
writes it only if it differs from the last one written, so thousands of node events cost one
status write per profile per window. The last status written (or found on the object at start)
is kept per profile, because conditions keep their ``lastTransitionTime`` until they flip.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

log = logging.getLogger(__name__)

Status = dict[str, Any]


class Dirty:
    """The profiles whose status must be computed again, and the wake-up of the writer's loop.

    Apart from the writer so that whatever sees a change (the node cache, the agents' stores, the
    DeviceClasses, a profile's reconcile) can mark a profile without a way back to the writer's
    owner: ``mark`` is all they call. ``every`` names every known profile (``mark_all``: a node
    change can change any profile's status)."""

    def __init__(self, every: Callable[[], Iterable[str]] = tuple) -> None:
        self._every = every
        self.names: set[str] = set()
        self.wake = asyncio.Event()

    def mark(self, names: Iterable[str]) -> None:
        self.names.update(names)
        self.wake.set()

    def mark_all(self) -> None:
        self.mark(self._every())


class StatusWriter:
    def __init__(
        self,
        compute: Callable[[str], Status | None],
        write: Callable[[str, Status], Awaitable[None]],
        debounce: float,
        dirty: Dirty | None = None,
    ) -> None:
        """``compute(name)`` gives the status to have now, or None to write nothing (a profile
        gone or being deleted); ``write`` sends it (and raises on failure: it is retried);
        ``dirty`` is what others mark (one of its own when not given)."""
        self._compute, self._write, self._debounce = compute, write, debounce
        self._written: dict[str, Status] = {}
        self._marks = dirty if dirty is not None else Dirty()
        self.paused = False
        self.writes = 0
        self.computes = 0

    @property
    def pending(self) -> int:
        """Profiles marked dirty and not computed yet."""
        return len(self._marks.names)

    def previous(self, name: str) -> Mapping[str, Any]:
        """The status last written (or found at start) for ``name``."""
        return self._written.get(name, {})

    def seed(self, name: str, status: Mapping[str, Any] | None, *, replace: bool = True) -> None:
        """What the object says now (at start, or when first seen); ``replace=False`` keeps ours."""
        if replace or name not in self._written:
            self._written[name] = dict(status) if isinstance(status, Mapping) else {}

    def conditions(self) -> dict[tuple[str, str], int]:
        """(profile, condition type) -> 1 when True, else 0, from the statuses last written: the
        /metrics gauge the alerts on Stalled and Degraded read (charts/patchbay/alerts)."""
        return {
            (name, str(c.get("type"))): int(c.get("status") == "True")
            for name, status in self._written.items()
            for c in status.get("conditions") or []
        }

    def forget(self, name: str) -> None:
        self._written.pop(name, None)
        self._marks.names.discard(name)

    def mark(self, names: Iterable[str]) -> None:
        self._marks.mark(names)

    async def flush(self) -> None:
        """Write every dirty profile whose status changed (kept dirty while paused)."""
        if self.paused:
            return
        dirty, self._marks.names = self._marks.names, set()
        for name in sorted(dirty):
            self.computes += 1
            new = self._compute(name)
            if new is None or _same(new, self._written.get(name, {})):
                continue
            try:
                await self._write(name, with_removals(self._written.get(name, {}), new))
            except Exception as e:
                log.warning("Writing the status of DevicePluginProfile %s failed: %s", name, e)
                self._marks.names.add(name)
                continue
            self.writes += 1
            self._written[name] = new
            log.debug("Updated the status of DevicePluginProfile %s", name)

    async def run(self) -> None:
        while True:
            await self._marks.wake.wait()
            self._marks.wake.clear()
            await asyncio.sleep(self._debounce)
            try:
                await self.flush()
            except Exception:
                log.exception("Unexpected error writing profile status")
            if self._marks.names and not self.paused:
                self._marks.wake.set()


def _same(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """Equal status, ignoring fields the operator does not write (e.g. a stale kopf block)."""
    return all(old.get(k) == v for k, v in new.items())


def with_removals(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``new`` as a merge patch over ``old``: every key ``old`` has and ``new`` lacks is set to
    None, at every level of nested objects, so the API server deletes it. A merge patch keeps
    what it does not name: without this a count that a status no longer has (a profile's
    `devices.healthy` once its last DeviceReport is gone) would stay as it was, stale."""
    out: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            out[key] = with_removals(before, value)
        else:
            out[key] = value
    for key in old:
        if key not in new:
            out[key] = None
    return out
