"""Kubernetes timestamps (RFC 3339, UTC, whole seconds: what metav1.Time serialises to), and the
same with microseconds for moments kept to measure a duration by (``rfc3339_precise``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def rfc3339_now() -> str:
    """Now, as a status condition's ``lastTransitionTime`` or an Event's timestamps want it."""
    return rfc3339(datetime.now(UTC))


def rfc3339(when: datetime) -> str:
    """`when` (aware) in that form."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_precise(when: datetime) -> str:
    """`when` (aware) in RFC 3339 with microseconds: a moment a duration is measured from (a
    rollout gate's start), which whole seconds would move up to 1 s earlier."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(value: Any) -> datetime | None:
    """A timestamp read from an API object; None for anything that is not one (a missing or
    malformed field is the writer's problem, never a crash here)."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
