"""Which replica works when several run with kopf peering (pure).

kopf pauses a peered replica's handlers while a live peer has a higher (or the same) priority,
but the operator's node work does not go through kopf: the node informer, the patch workers and
the status writer would go on in a paused replica, with a profile registry that kopf no longer
updates (a paused replica could push an old capacity back onto nodes against the active one).
So the controller applies kopf's own rule to the same ``ClusterKopfPeering`` object:

- every peer writes ``status.<identity> = {priority, lifetime, lastseen}`` as a keep-alive;
- a peer is dead once ``lastseen + lifetime`` has passed;
- this replica waits while any OTHER live peer has a priority greater than or equal to its own
  (kopf freezes every replica on a tie, so replicas need distinct priorities).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

DEFAULT_LIFETIME = 60
"""Seconds kopf assumes for a peer whose record names no lifetime."""


@dataclass(frozen=True)
class Peering:
    """This replica in a peering: the object's name, the identity it gives kopf, its priority."""

    name: str
    identity: str
    priority: int


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def blockers(status: Mapping[str, Any] | None, me: Peering, now: datetime) -> list[str]:
    """The live peers this replica must wait for (empty: it works), as ``identity(priority)``.

    A malformed record is ignored, as kopf cannot have written it; a record without
    ``lastseen`` counts as seen just now (kopf's reading too).
    """
    waiting: list[str] = []
    for identity, record in (status or {}).items():
        if identity == me.identity or not isinstance(record, Mapping):
            continue
        try:
            priority = int(record.get("priority", 0))
            lifetime = int(record.get("lifetime", DEFAULT_LIFETIME))
        except (TypeError, ValueError):
            continue
        seen = _parse_time(record.get("lastseen")) if "lastseen" in record else now
        if seen is None:
            continue
        if seen.tzinfo is None:
            seen = seen.replace(tzinfo=now.tzinfo)
        if seen + timedelta(seconds=lifetime) <= now:
            continue  # dead: kopf cleans it up
        if priority >= me.priority:
            waiting.append(f"{identity}({priority})")
    return sorted(waiting)
