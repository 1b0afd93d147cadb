"""DevicePlugin and DRA modes: each applied profile's agents, and everything the agents tell.

Applying is server-side apply of what render.py makes (field manager ``patchbay-operator``);
deleting goes by name (``render.object_name``), so a profile that was never applied, or whose
spec changed, deletes cleanly without rendering anything. A DRA profile also has a cluster-scoped
DeviceClass (``render.driver_name``); it is deleted when the profile leaves DRA mode or loses its
resource name, but only if the profile controls it (read first, then deleted with a uid
precondition), because a DeviceClass of that name may be someone else's. The apply's answer is
the DeviceClass as the API server stored it: ``device_classes`` keeps it per profile, so the status
says when the API server dropped ``extendedResourceName`` (docs/facts.md#dra-dropped-fields).

What the agents tell reaches the controller through four informers in the operator's own
namespace (the chart's namespaced Role allows them; no polling): the agent DaemonSets (rollout),
the agent pods and the namespace's Warning events (why a pod does not work, or why the API
server refuses to create it: agentpods.py), and
the agents' DeviceReports (each device's health and holders: devicereports.py). Reports of nodes
a profile no longer selects, and of deleted profiles, are deleted here.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any

from patchbay_operator import render
from patchbay_operator.agentpods import AgentPod, Trouble, Warning, trouble
from patchbay_operator.config import Settings
from patchbay_operator.constants import (
    API_GROUP,
    API_VERSION,
    DEVICE_CLASS_API_VERSION,
    LABEL_NAME,
    RETRY_CREATE_ANNOTATION,
    SHARED_KEY,
    Mode,
)
from patchbay_operator.devicereports import Report
from patchbay_operator.informer import Source, Store
from patchbay_operator.kube import KubeAPI, KubeError, Ref, Selectors, collection
from patchbay_operator.profiles import Profile, Selector
from patchbay_operator.status.daemonset import AgentDaemonSet
from patchbay_operator.status.dra import StoredDeviceClass

log = logging.getLogger(__name__)
Call = Callable[..., Awaitable[Any]]
AGENTS = Selectors(label=f"{LABEL_NAME}={render.AGENT_NAME}")


def sources(
    namespace: str,
) -> tuple[Source[AgentDaemonSet], Source[AgentPod], Source[Warning], Source[Report]]:
    """The informers' sources: all in the operator's namespace."""
    return (
        Source(
            "agent DaemonSets",
            collection("apps/v1", "DaemonSet", namespace),
            AgentDaemonSet.from_object,
            AGENTS,
        ),
        Source("agent pods", collection("v1", "Pod", namespace), AgentPod.from_object, AGENTS),
        Source(
            "warnings",
            collection("v1", "Event", namespace),
            Warning.from_object,
            Selectors(field="type=Warning"),
        ),
        Source(
            "device reports",
            collection(f"{API_GROUP}/{API_VERSION}", "DeviceReport", namespace),
            Report.from_object,
        ),
    )


class Agents:
    """Applies and deletes agents; keeps their DaemonSets, pods, warnings and reports."""

    def __init__(
        self, kube: KubeAPI, call: Call, settings: Settings, on_change: Callable[[str], None]
    ) -> None:
        self._kube, self._call, self._settings = kube, call, settings
        self._changed = on_change

        def by_profile(old: Any, new: Any) -> None:
            # The shared node agent's DaemonSet and pods: SHARED_KEY (every shared profile).
            for obj in (old, new):
                if obj is not None and obj.profile:
                    log.debug("%s of DevicePluginProfile %s changed", type(obj).__name__, obj.profile)
                    on_change(obj.profile)

        # Reports not believed (name -> the agent they named), so each is logged once; bounded
        # by the reports kept (an entry goes when its report is believed or deleted).
        self._distrusted: dict[str, str] = {}
        self.daemonsets: Store[AgentDaemonSet] = Store(lambda d: d.profile, by_profile)
        self.pods: Store[AgentPod] = Store(lambda p: p.name, by_profile)
        self.warnings: Store[Warning] = Store(lambda w: w.key, self._warned)

        def report_changed(old: Report | None, new: Report | None) -> None:
            if new is None and old is not None:
                self._distrusted.pop(old.name, None)
            by_profile(old, new)

        self.reports: Store[Report] = Store(lambda r: r.name, report_changed)
        # Reports with a DELETE in flight: status computations meanwhile must not send another.
        self._pruning: set[str] = set()

        #: each DRA profile's DeviceClass as the API server stored it at the last apply
        self.device_classes: dict[str, StoredDeviceClass] = {}

    def _warned(self, old: Warning | None, new: Warning | None) -> None:
        """A Warning about one of our pods, or a FailedCreate about one of our DaemonSets,
        changes that pod's or DaemonSet's profile's status."""
        warning = new or old
        if warning is None:
            return
        if warning.daemonset:
            for ds in self.daemonsets.items.values():
                if ds.name == warning.daemonset:
                    self._changed(ds.profile)
            return
        pod = self.pods.items.get(warning.pod)
        if pod is not None:
            self._changed(pod.profile)

    def create_warning(self, daemonset: AgentDaemonSet | None) -> Warning | None:
        """The latest FailedCreate event about ``daemonset`` (agentpods.refusal decides whether
        it still holds)."""
        return None if daemonset is None else self.warnings.items.get(f"DaemonSet/{daemonset.name}")

    async def retry_create(self, daemonset: str, now: str) -> None:
        """Make the DaemonSet controller try to create ``daemonset``'s pods again now: any update
        of the DaemonSet enqueues it at once, where after refused creates it would wait out its
        own rate limiter (exponential, up to minutes). The annotation changes nothing else; a
        failure is only logged (the next status computation asks again)."""
        ref = Ref(collection("apps/v1", "DaemonSet", self._settings.namespace), daemonset)
        try:
            await self._call(self._kube.annotate, ref, {RETRY_CREATE_ANNOTATION: now})
        except (KubeError, OSError) as e:
            log.warning("Asking DaemonSet %s to create its pods again failed: %s", daemonset, e)
        else:
            log.debug("Asked DaemonSet %s to create its refused pods again", daemonset)

    async def apply(self, profile: Profile, exclude: Selector | None = None) -> None:
        """Apply the profile's agent objects (`exclude`: see `render.agent_objects`); a
        DevicePlugin profile that was DRA before loses its DeviceClass."""
        for obj in render.agent_objects(profile, self._settings, exclude):
            applied = await self._call(self._kube.apply, obj)
            meta = obj["metadata"]
            where = f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]
            log.info("Applied %s %s", obj["kind"], where)
            if obj["kind"] == "DaemonSet":
                self.daemonsets.fold("APPLIED", AgentDaemonSet.from_object(applied))
            elif obj["kind"] == "DeviceClass":
                self._stored(profile, applied)
        if profile.mode is not Mode.DRA:
            await self.delete_device_class(profile)

    async def apply_device_class(self, profile: Profile) -> StoredDeviceClass:
        """Apply a DRA profile's DeviceClass alone (again) and keep what the API server stored."""
        stored = self._stored(profile, await self._call(self._kube.apply, render.device_class(profile)))
        log.info("Applied DeviceClass %s", stored.name)
        return stored

    def _stored(self, profile: Profile, applied: dict[str, Any]) -> StoredDeviceClass:
        """Keep the DeviceClass as stored; say so when the API server dropped extendedResourceName."""
        stored = StoredDeviceClass.from_object(applied)
        before = self.device_classes.get(profile.name)
        self.device_classes[profile.name] = stored
        if stored != before:
            if stored.extended_resource_name != profile.resource:
                log.warning(
                    "The API server stored DeviceClass %s without extendedResourceName %s "
                    "(DRAExtendedResource off): pods that ask for it in their limits are not served "
                    "by DRA on this cluster, ResourceClaims are",
                    stored.name,
                    profile.resource,
                )
            self._changed(profile.name)
        return stored

    async def apply_shared(self, profiles: list[tuple[Profile, Selector | None]]) -> None:
        """The shared node agent serving `profiles` (see `render.shared_agent_objects`); with no
        profile left, the shared objects go."""
        if not profiles:
            await self.delete_shared()
            return
        for obj in render.shared_agent_objects(profiles, self._settings):
            applied = await self._call(self._kube.apply, obj)
            log.info("Applied %s %s/%s", obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
            if obj["kind"] == "DaemonSet":
                self.daemonsets.fold("APPLIED", AgentDaemonSet.from_object(applied))

    async def shared_device_class(self, profile: Profile) -> None:
        """A shared DRA profile's DeviceClass (a profile with its own agent gets it from `apply`);
        a shared profile that is not DRA (any more) loses the one it controls."""
        if profile.mode is Mode.DRA:
            await self.apply_device_class(profile)
        else:
            await self.delete_device_class(profile)

    async def delete_shared(self) -> None:
        ns, name = self._settings.namespace, render.SHARED_AGENT
        for api_version, kind in (("apps/v1", "DaemonSet"), ("v1", "ConfigMap")):
            if await self._call(self._kube.delete, Ref(collection(api_version, kind, ns), name)):
                log.info("Deleted %s %s/%s (no profile uses the shared agent)", kind, ns, name)

    async def delete_own(self, profile: Profile) -> None:
        """Delete the profile's own agent DaemonSet and ConfigMap if it had them (it moved to the
        shared agent); its reports and DeviceClass stay."""
        ns, name = self._settings.namespace, render.object_name(profile.name)
        for api_version, kind in (("apps/v1", "DaemonSet"), ("v1", "ConfigMap")):
            if await self._call(self._kube.delete, Ref(collection(api_version, kind, ns), name)):
                log.info(
                    "Deleted %s %s/%s (DevicePluginProfile %s uses the shared agent)",
                    kind,
                    ns,
                    name,
                    profile.name,
                )

    def shared_pods(self) -> list[AgentPod]:
        """The shared node agent's pods (agent pods without a profile)."""
        return [p for p in self.pods.items.values() if p.profile == SHARED_KEY]

    async def delete(self, profile: Profile) -> None:
        """Delete the agent objects if they exist (a Static or conflicting profile has none), the
        DeviceClass it controls, and the profile's reports."""
        ns, name = self._settings.namespace, render.object_name(profile.name)
        for api_version, kind in (("apps/v1", "DaemonSet"), ("v1", "ConfigMap")):
            if await self._call(self._kube.delete, Ref(collection(api_version, kind, ns), name)):
                log.info("Deleted %s %s/%s", kind, ns, name)
        await self.delete_device_class(profile)
        await self.prune_reports(profile.name, keep=())
        self.device_classes.pop(profile.name, None)

    async def delete_device_class(self, profile: Profile) -> None:
        """Delete the profile's DeviceClass if there is one and the profile controls it.

        The garbage collector removes it with the profile anyway; this is for a profile that
        stays but no longer serves through DRA (mode change, lost its resource name). A DELETE
        on a cluster that does not serve resource.k8s.io answers 404, which is "gone" too.
        """
        self.device_classes.pop(profile.name, None)
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

    async def prune_reports(self, profile: str, keep: Iterable[str]) -> None:
        """Delete ``profile``'s reports except those of the nodes in ``keep``."""
        keep = set(keep)
        path = collection(f"{API_GROUP}/{API_VERSION}", "DeviceReport", self._settings.namespace)
        doomed = [
            r
            for r in self.reports.items.values()
            if r.profile == profile and r.node not in keep and r.name not in self._pruning
        ]
        for report in doomed:
            self._pruning.add(report.name)
            try:
                await self._call(self._kube.delete, Ref(path, report.name))
            except (KubeError, OSError) as e:
                log.warning("Deleting DeviceReport %s failed: %s", report.name, e)
                continue
            finally:
                self._pruning.discard(report.name)
            # Gone now, not when the watch says so: the next status must neither count it nor
            # delete it again.
            self.reports.fold("DELETED", report)
            log.info(
                "Deleted DeviceReport %s (node %s no longer serves %s)", report.name, report.node, profile
            )

    def troubles(self, profile: str, now: datetime) -> list[Trouble]:
        """Each of the profile's agent pods that does not work, and why."""
        out = []
        for pod in self.pods.items.values():
            if (
                pod.profile == profile
                and (t := trouble(pod, self.warnings.items.get(pod.name), now)) is not None
            ):
                out.append(t)
        return out

    def profile_reports(self, profile: str, served_by: str) -> list[Report]:
        """``profile``'s reports that its own agents wrote: each names (``agent``) a pod of the
        DaemonSet that serves it (``served_by``: the profile, or SHARED_KEY for the shared node
        agent) on the report's node. The admission policy makes every report name the pod whose
        token wrote it, so a report written by any other agent on that node (another profile's,
        compromised) is not believed: the node then counts as not reported, and the profile's
        own agent writes its report again within its resync (docs/security.md#reports)."""
        out = []
        for r in self.reports.items.values():
            if r.profile != profile:
                continue
            pod = self.pods.items.get(r.agent)
            if pod is not None and pod.profile == served_by and pod.node == r.node:
                self._distrusted.pop(r.name, None)
                out.append(r)
            elif self._distrusted.get(r.name) != r.agent:
                self._distrusted[r.name] = r.agent
                log.warning(
                    "Ignoring DeviceReport %s: its writer %s is not an agent pod of "
                    "DevicePluginProfile %s on node %s",
                    r.name,
                    f"pod {r.agent}" if r.agent else "(no agent named)",
                    profile,
                    r.node,
                )
        return out


def _controlled_by(obj: dict[str, Any], uid: str) -> bool:
    """Whether ``obj``'s controller owner reference is the profile with ``uid``."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(r.get("controller") and r.get("uid") == uid for r in refs)
