"""A profile's revisions: one ControllerRevision (apps/v1) per change of what agents or node
capacity act on (docs/design/staged-rollouts.md).

Each is named ``<profile>-<hash>`` (``patchbay_api.revisions``: the hash of the canonical JSON of
``revision_data``), in the operator's namespace, owned by the profile (garbage-collected with it),
labelled ``patchbay.dev/profile`` and ``controller-revision-hash``; ``data`` is the canonical body and
``revision`` the increasing number (a spec that goes back to an earlier revision gives that
revision the next number, as a DaemonSet does). A no-op edit (labels, annotations, the agent's pod
settings) has the same hash: nothing is written. ``spec.revisionHistoryLimit`` (default 10) old
revisions are kept besides the one in use; older ones are deleted.

They are watched (an informer, label-selected) and the one in use is put back when deleted, as
repairs.py puts back the agents' objects. Only the working replica writes (peering).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from patchbay_api.revisions import (
    DEFAULT_HISTORY_LIMIT,
    LABEL_REVISION_HASH,
    revision_data,
    revision_hash,
    revision_name,
)
from patchbay_operator import render
from patchbay_operator.config import Settings
from patchbay_operator.constants import FIELD_MANAGER, LABEL_MANAGED_BY, LABEL_PROFILE
from patchbay_operator.informer import Snapshot, Source, Store
from patchbay_operator.kube import KubeAPI, KubeError, Ref, Selectors, collection
from patchbay_operator.peering import Gate, writes
from patchbay_operator.profiles import Profile, Registry
from patchbay_operator.scheduler import OnPending, Timers

log = logging.getLogger(__name__)
Call = Callable[..., Awaitable[Any]]

API_VERSION, KIND = "apps/v1", "ControllerRevision"
REPAIR_DELAY = 0.5
"""Seconds from a deletion of a revision in use to its repair (a burst of events is one repair)."""
RETRY_SECONDS = 5.0


@dataclass(frozen=True)
class Kept:
    """One ControllerRevision as the operator keeps it, with its data (the body of a revision
    that nodes may still serve mid-rollout: a few KiB per revision kept)."""

    name: str
    profile: str
    digest: str
    revision: int
    #: the uid of the profile that owns it ("" when none)
    owner: str = ""
    #: what it holds (`revision_data`): the body a node still on it is served (staged rollouts)
    data: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Kept:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
        return cls(
            str(meta.get("name") or ""),
            str(labels.get(LABEL_PROFILE) or ""),
            str(labels.get(LABEL_REVISION_HASH) or ""),
            int(obj.get("revision") or 0),
            str(owners[0].get("uid") or "") if owners else "",
            dict(obj.get("data") or {}),
        )


def source(namespace: str) -> Source[Kept]:
    """The profiles' ControllerRevisions in the operator's namespace (labelled with a profile)."""
    return Source(
        "ControllerRevisions",
        collection(API_VERSION, KIND, namespace),
        Kept.from_object,
        Selectors(label=f"{LABEL_PROFILE},{LABEL_REVISION_HASH},{LABEL_MANAGED_BY}={FIELD_MANAGER}"),
    )


def controller_revision(profile: Profile, namespace: str, number: int) -> dict[str, Any]:
    """The ControllerRevision of ``profile``'s spec as it is now, numbered ``number``."""
    data = revision_data(profile.spec)
    digest = revision_hash(data)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": revision_name(profile.name, digest),
            "namespace": namespace,
            "labels": {
                LABEL_PROFILE: profile.name,
                LABEL_REVISION_HASH: digest,
                LABEL_MANAGED_BY: FIELD_MANAGER,
            },
            "ownerReferences": [render.owner_reference(profile)],
        },
        # The body that was hashed (its canonical JSON: `patchbay_api.revisions.canonical`).
        "data": data,
        "revision": number,
    }


def history_limit(profile: Profile) -> int:
    raw = profile.spec.get("revisionHistoryLimit")
    return DEFAULT_HISTORY_LIMIT if raw is None else max(0, int(raw))


def to_prune(kept: Iterable[Kept], in_use: set[str], limit: int) -> list[Kept]:
    """The revisions to delete: the oldest not in use beyond ``limit`` (pure)."""
    old = sorted((k for k in kept if k.name not in in_use), key=lambda k: (k.revision, k.name))
    return old[: max(0, len(old) - limit)]


class Revisions:
    """Every profile's ControllerRevisions, as watched, written and put back (the module doc)."""

    def __init__(
        self,
        kube: KubeAPI,
        call: Call,
        settings: Settings,
        *,
        registry: Registry,
        mark: Callable[[Iterable[str]], None],
        gate: Gate | None = None,
    ) -> None:
        self._kube, self._call, self._settings = kube, call, settings
        self._registry, self._mark, self._gate = registry, mark, gate
        #: the revisions a profile's nodes may still serve besides its spec's (staging.py): kept
        self.in_use: Callable[[Profile], Iterable[str]] = lambda _p: ()
        self.store: Store[Kept] = Store(attrgetter("name"), self._changed)
        self._timers: Timers[str] = Timers(OnPending.KEEP)
        #: revisions written, deleted (pruned) and recreated (/metrics, tests)
        self.created = self.pruned = self.recreated = 0

    def of(self, profile: Profile) -> list[Kept]:
        """The profile's revisions (its own: owned by its uid), oldest first."""
        mine = [
            k for k in self.store.items.values() if k.profile == profile.name and k.owner in ("", profile.uid)
        ]
        return sorted(mine, key=lambda k: (k.revision, k.name))

    def resync(self, snapshot: Snapshot[Kept]) -> None:
        self.store.resync(snapshot)

    async def reconcile(self, profile: Profile) -> None:
        """The revision of ``profile``'s spec exists and is the newest; old ones beyond the limit
        go. Nothing is written when it is so already (a no-op edit)."""
        if profile.deleting or not writes(self._gate):
            return
        ns = self._settings.namespace
        kept = self.of(profile)
        obj = controller_revision(profile, ns, 0)
        name = obj["metadata"]["name"]
        newest = kept[-1] if kept else None
        if newest is None or newest.name != name:
            obj["revision"] = (newest.revision if newest is not None else 0) + 1
            try:
                answer = await self._call(self._kube.apply, obj)
            except (KubeError, OSError) as e:
                log.warning("Writing ControllerRevision %s/%s failed: %s", ns, name, e)
                self._timers.schedule(
                    profile.name, RETRY_SECONDS, functools.partial(self._again, profile.name)
                )
                return
            self.store.fold_quietly("APPLIED", Kept.from_object(answer))
            self.created += 1
            log.info("DevicePluginProfile %s is revision %d (%s)", profile.name, obj["revision"], name)
            self._mark([profile.name])
        for old in to_prune(self.of(profile), {name, *self.in_use(profile)}, history_limit(profile)):
            try:
                await self._call(self._kube.delete, Ref(collection(API_VERSION, KIND, ns), old.name))
            except (KubeError, OSError) as e:
                log.warning("Deleting ControllerRevision %s/%s failed: %s", ns, old.name, e)
                continue
            self.store.fold_quietly("DELETED", old)
            self.pruned += 1

    def current(self, profile: Profile) -> Kept | None:
        """The profile's revision in use (its spec's), as watched; None before it is written."""
        digest = revision_hash(revision_data(profile.spec))
        return self.store.items.get(revision_name(profile.name, digest))

    def data(self, profile: str, digest: str) -> Mapping[str, Any] | None:
        """The data of the profile's revision ``digest``, as watched (None when not known)."""
        kept = self.store.items.get(revision_name(profile, digest))
        return kept.data if kept is not None and kept.data else None

    def _changed(self, old: Kept | None, new: Kept | None) -> None:
        """A revision deleted by someone else: the one in use is written again soon."""
        if new is not None or old is None:
            return
        profile = self._registry.get(old.profile)
        if profile is None or profile.deleting:
            return
        if revision_name(profile.name, revision_hash(revision_data(profile.spec))) == old.name:
            log.info("ControllerRevision %s (in use) was deleted; writing it again", old.name)
            self._timers.schedule(profile.name, REPAIR_DELAY, functools.partial(self._again, profile.name))

    async def _again(self, name: str) -> None:
        profile = self._registry.get(name)
        if profile is None:
            return
        before = self.created
        await self.reconcile(profile)
        if self.created > before:
            self.recreated += 1

    def counts(self) -> dict[str, int]:
        """Revisions created, pruned and recreated, for /metrics."""
        return {"created": self.created, "pruned": self.pruned, "recreated": self.recreated}

    async def close(self) -> None:
        await self._timers.close()
