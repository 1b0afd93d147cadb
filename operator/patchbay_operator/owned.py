"""The objects the operator renders, as its repairs keep them: small values and pure decisions.

The operator owns the agents' ConfigMaps and DaemonSets (the shared node agent's and profiles'
own) and DRA profiles' DeviceClasses, all server-side applied with ONE field manager
(``FIELD_MANAGER``). Of each it keeps an ``Owned``: kind, name, whose it is (a profile, or
``SHARED_KEY``), a hash of the fields that manager's apply owns, and the other managers that own
fields through server-side apply. No copy of the object: the fields hash is enough to see an edit,
because the API server moves the ownership of every field another writer changes to that writer
(so the operator's entry in ``managedFields`` shrinks) and keeps it untouched otherwise (a
DaemonSet's status, another manager's labels). repairs.py acts on what ``change`` says.

Who edited decides what follows (``taken_over``): a field another manager took by server-side
apply (``kubectl apply --server-side --force-conflicts``, a GitOps tool) was taken on purpose and is
left alone; a field changed by an update (``kubectl edit``, ``set image``, ``patch``) is restored.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from patchbay_operator.agentpods import profile_key
from patchbay_operator.constants import FIELD_MANAGER

KINDS = ("ConfigMap", "DaemonSet", "DeviceClass")
"""The kinds the operator renders and repairs, in the order a profile's objects are applied."""


class Change(enum.Enum):
    """What happened to an owned object."""

    DELETED = "deleted"
    EDITED = "edited"


def managed(meta: Mapping[str, Any]) -> tuple[str, frozenset[str]]:
    """The hash of the fields the operator's apply owns ("" when it owns none: it never applied
    the object, or another writer took them all), and the other managers that own fields through
    server-side apply. Status subresource entries (the DaemonSet controller's) are not ours and
    never conflict with an apply of the spec, so they are left out."""
    ours: Any = None
    appliers = set()
    for entry in meta.get("managedFields") or []:
        if entry.get("operation") != "Apply" or entry.get("subresource"):
            continue
        manager = str(entry.get("manager") or "")
        if manager == FIELD_MANAGER:
            ours = entry.get("fieldsV1")
        elif manager:
            appliers.add(manager)
    if ours is None:
        return "", frozenset(appliers)
    text = json.dumps(ours, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16], frozenset(appliers)


@dataclass(frozen=True)
class Owned:
    """One rendered object as the operator keeps it (a few hundred bytes, whatever its size)."""

    kind: str
    name: str
    #: its profile, or SHARED_KEY for the shared node agent's objects
    profile: str
    #: the hash of the fields the operator's apply owns (``managed``)
    fields: str
    #: other managers owning fields through server-side apply
    appliers: frozenset[str] = frozenset()

    @classmethod
    def from_object(cls, kind: str, obj: Mapping[str, Any]) -> Owned:
        """``kind``'s object (LIST items carry no ``kind`` of their own)."""
        meta = obj.get("metadata") or {}
        fields, appliers = managed(meta)
        return cls(kind, str(meta.get("name") or ""), profile_key(meta.get("labels") or {}), fields, appliers)


def change(old: Owned | None, new: Owned | None) -> Change | None:
    """What a watch event says happened to an object the operator owns: it went, or another
    writer took fields the operator's apply owned (the hash of those changed). The operator's
    own applies change that hash too (a new spec); a repair that finds the object as rendered
    then changes nothing and says nothing (``restored``)."""
    if new is None:
        return Change.DELETED if old is not None else None
    if old is not None and old.fields != new.fields:
        return Change.EDITED
    return None


def restored(before: Owned | None, after: Owned) -> bool:
    """Whether an apply of the rendered object repaired something: it was missing, or the apply
    gave the operator back fields (an apply of what is there already changes nothing)."""
    return before is None or before.fields != after.fields


_CONFLICT = re.compile(r'conflicts? with "([^"]+)"')


def conflict_managers(body: str) -> frozenset[str]:
    """The managers a 409 answer to a server-side apply names (its causes, else its message):
    ``conflict with "kubectl-set" using apps/v1``."""
    texts: list[str] = [body]
    try:
        status = json.loads(body)
    except ValueError:
        status = None
    if isinstance(status, dict):
        causes = (status.get("details") or {}).get("causes") or []
        texts = [str(c.get("message") or "") for c in causes] or [str(status.get("message") or "")]
    return frozenset(m for text in texts for m in _CONFLICT.findall(text))


def taken_over(conflicting: Iterable[str], current: Owned | None) -> frozenset[str]:
    """The conflicting managers that took their fields by server-side apply: on purpose (an
    apply must be forced to take a field another manager owns), so the operator leaves those
    fields to them. Managers that edited by an update are not among them: their edits are
    restored."""
    if current is None:
        return frozenset()
    return frozenset(conflicting) & current.appliers
