"""A DRA profile's DeviceClass: applied, read back as stored, applied again while dropped, deleted.

The class is cluster-scoped, named ``render.driver_name`` (``<profile>.patchbay.dev``), and its
``extendedResourceName`` lets unchanged pods ask for the resource. The apply's answer is the class
as the API server stored it: ``stored`` keeps it per profile, so the status says when the API server
dropped ``extendedResourceName`` (docs/facts.md#dra-dropped-fields). While it is dropped the class
is applied again every ``recheck`` seconds: a control plane upgraded meanwhile keeps it (detected,
not assumed from a version); nothing is scheduled while it is kept, or once it is deleted.

It is deleted when the profile leaves DRA mode or loses its resource name, but only if the profile
controls it (read first, then deleted with a uid precondition), because a DeviceClass of that name
may be someone else's.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from patchbay_operator import render
from patchbay_operator.constants import DEVICE_CLASS_API_VERSION, DEVICE_CLASS_RECHECK_SECONDS, Mode
from patchbay_operator.kube import KubeAPI, KubeError, Ref, collection
from patchbay_operator.peering import Gate, writes
from patchbay_operator.profiles import Profile, Registry
from patchbay_operator.scheduler import OnPending, Timers
from patchbay_operator.status.dra import StoredDeviceClass

log = logging.getLogger(__name__)
Call = Callable[..., Awaitable[Any]]


class DeviceClasses:
    """Each DRA profile's DeviceClass, as applied and as the API server stored it."""

    def __init__(
        self,
        kube: KubeAPI,
        call: Call,
        *,
        registry: Registry,
        mark: Callable[[Iterable[str]], None],
        gate: Gate | None = None,
    ) -> None:
        self._kube, self._call, self._registry, self._mark, self._gate = kube, call, registry, mark, gate
        #: each DRA profile's DeviceClass as the API server stored it at the last apply
        self.stored: dict[str, StoredDeviceClass] = {}
        #: seconds between applies of a DeviceClass whose extendedResourceName was dropped
        self.recheck = DEVICE_CLASS_RECHECK_SECONDS
        #: by profile (REPLACE: each apply decides anew whether another is needed)
        self._rechecks: Timers[str] = Timers(OnPending.REPLACE)

    async def apply(self, profile: Profile, obj: dict[str, Any] | None = None) -> StoredDeviceClass:
        """Apply a DRA profile's DeviceClass (``obj``: as render.agent_objects made it), keep what
        the API server stored, and apply it again later if that lacks the resource name."""
        applied = await self._call(self._kube.apply, obj if obj is not None else render.device_class(profile))
        return self.keep(profile, applied)

    def keep(self, profile: Profile, applied: dict[str, Any]) -> StoredDeviceClass:
        """The class as the API server answered an apply of it (this part's, or a repair's):
        kept, and applied again later if that lacks the resource name."""
        stored = StoredDeviceClass.from_object(applied)
        log.info("Applied DeviceClass %s", stored.name)
        before = self.stored.get(profile.name)
        self.stored[profile.name] = stored
        if stored != before:
            if stored.extended_resource_name != profile.resource:
                log.warning(
                    "The API server stored DeviceClass %s without extendedResourceName %s "
                    "(DRAExtendedResource off): pods that ask for it in their limits are not served "
                    "by DRA on this cluster, ResourceClaims are",
                    stored.name,
                    profile.resource,
                )
            self._mark([profile.name])
        self._check_later(profile.name)
        return stored

    async def delete(self, profile: Profile) -> None:
        """Delete the profile's DeviceClass if there is one and the profile controls it.

        The garbage collector removes it with the profile anyway; this is for a profile that
        stays but no longer serves through DRA (mode change, lost its resource name). A DELETE
        on a cluster that does not serve resource.k8s.io answers 404, which is "gone" too.
        """
        self.forget(profile.name)
        ref = Ref(collection(DEVICE_CLASS_API_VERSION, "DeviceClass"), render.driver_name(profile.name))
        obj = await self._call(self._kube.get, ref)
        if obj is None or not _controlled_by(obj, profile.uid):
            return
        uid = str(obj["metadata"].get("uid") or "")
        try:
            if await self._call(self._kube.delete, ref, uid):
                log.info(
                    "Deleted DeviceClass %s (DevicePluginProfile %s no longer DRA)", ref.name, profile.name
                )
        except KubeError as e:
            if e.status != 409:  # 409: replaced meanwhile by another object of that name
                raise

    def forget(self, name: str) -> None:
        """Nothing kept of ``name``'s DeviceClass any more, and no apply scheduled."""
        self.stored.pop(name, None)
        self._rechecks.cancel(name)

    def _check_later(self, name: str) -> None:
        """Where the API server dropped the profile's DeviceClass's extendedResourceName, apply the
        class again in ``recheck`` seconds; nothing while it is kept (or not stored at all)."""
        profile, stored = self._registry.get(name), self.stored.get(name)
        if profile is None or stored is None or stored.extended_resource_name == profile.resource:
            self._rechecks.cancel(name)
            return
        self._rechecks.schedule(name, self.recheck, lambda: self._check(name))

    async def _check(self, name: str) -> None:
        profile = self._registry.get(name)
        if (
            profile is None
            or profile.deleting
            or profile.mode is not Mode.DRA
            or self._registry.conflict(profile) is not None
        ):
            return
        if writes(self._gate):
            try:
                await self.apply(profile)  # which asks for the next check while still dropped
                return
            except (KubeError, OSError) as e:
                log.warning("Applying DeviceClass of DevicePluginProfile %s again failed: %s", name, e)
        self._check_later(name)

    def checking(self, name: str) -> bool:
        """Whether an apply of ``name``'s DeviceClass is scheduled (it was stored dropped)."""
        return name in self._rechecks

    async def close(self) -> None:
        await self._rechecks.close()


def _controlled_by(obj: dict[str, Any], uid: str) -> bool:
    """Whether ``obj``'s controller owner reference is the profile with ``uid``."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(r.get("controller") and r.get("uid") == uid for r in refs)
