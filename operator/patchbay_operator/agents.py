"""DevicePlugin mode: each applied profile's agent objects (ConfigMap + DaemonSet), and what the
DaemonSets' rollouts look like.

Applying is server-side apply of what render.py makes (field manager ``patchbay-operator``);
deleting goes by name (``render.object_name``), so a profile that was never applied, or whose
spec changed, deletes cleanly without rendering anything. The DaemonSets' status reaches the
controller through the informer (a label selector in the operator's own namespace, which the
chart's namespaced Role allows), not through polling.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from patchbay_operator import render
from patchbay_operator.config import Settings
from patchbay_operator.constants import LABEL_NAME
from patchbay_operator.informer import Event, Snapshot, Source
from patchbay_operator.kube import KubeAPI, Ref, collection
from patchbay_operator.profiles import Profile
from patchbay_operator.status import AgentDaemonSet

log = logging.getLogger(__name__)
Call = Callable[..., Awaitable[Any]]


def source(namespace: str) -> Source[AgentDaemonSet]:
    """The informer's source: the operator's agent DaemonSets, in its namespace only."""
    path = collection("apps/v1", "DaemonSet", namespace)
    return Source("agent DaemonSets", path, AgentDaemonSet.from_object, f"{LABEL_NAME}={render.AGENT_NAME}")


class Agents:
    """Applies and deletes agents; keeps each profile's DaemonSet as last seen."""

    def __init__(
        self, kube: KubeAPI, call: Call, settings: Settings, on_change: Callable[[str], None]
    ) -> None:
        self._kube, self._call, self._settings, self._on_change = kube, call, settings, on_change
        self.daemonsets: dict[str, AgentDaemonSet] = {}

    async def apply(self, profile: Profile) -> None:
        for obj in render.agent_objects(profile, self._settings):
            applied = await self._call(self._kube.apply, obj)
            log.info("Applied %s %s/%s", obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
            if obj["kind"] == "DaemonSet":
                self._fold("APPLIED", AgentDaemonSet.from_object(applied))

    async def delete(self, profile: Profile) -> None:
        """Delete the agent objects if they exist (a Static or conflicting profile has none)."""
        ns, name = self._settings.namespace, render.object_name(profile.name)
        for api_version, kind in (("apps/v1", "DaemonSet"), ("v1", "ConfigMap")):
            if await self._call(self._kube.delete, Ref(collection(api_version, kind, ns), name)):
                log.info("Deleted %s %s/%s", kind, ns, name)
        if self.daemonsets.pop(profile.name, None) is not None:
            self._on_change(profile.name)

    def observe(self, events: list[Event[AgentDaemonSet]]) -> None:
        for ev in events:
            self._fold(ev.type, ev.obj)

    def resync(self, snapshot: Snapshot[AgentDaemonSet]) -> None:
        listed = {ds.profile for ds in snapshot.items}
        for gone in [p for p in self.daemonsets if p not in listed]:
            self._fold("DELETED", self.daemonsets[gone])
        for ds in snapshot.items:
            self._fold("LISTED", ds)

    def _fold(self, event_type: str, ds: AgentDaemonSet) -> None:
        if not ds.profile:
            return
        if event_type == "DELETED":
            changed = self.daemonsets.pop(ds.profile, None) is not None
        else:
            changed = self.daemonsets.get(ds.profile) != ds
            self.daemonsets[ds.profile] = ds
        if changed:
            self._on_change(ds.profile)
