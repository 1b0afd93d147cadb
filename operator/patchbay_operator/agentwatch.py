"""What the agents tell, through four informers in the operator's own namespace, and what follows.

The chart's namespaced Role allows them; no polling: the agent DaemonSets (rollout), the agent
pods and the namespace's Warning events (why a pod does not work, or why the API server refuses to
create it: agentpods.py), and the agents' DeviceReports (each device's health and holders:
devicereports.py). A change marks the status of the profile it concerns (every shared profile's
for the shared node agent's objects).

The few writes that follow from what they tell are here too: reports of nodes a profile no longer
selects are deleted (the status evaluation names them), reports of profiles that do not exist are
deleted after ``ORPHAN_GRACE_SECONDS``, and a DaemonSet whose pods the API server refuses is
nudged (``retry_create``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass
from datetime import datetime, timedelta
from operator import attrgetter
from typing import Any

from patchbay_operator import render
from patchbay_operator.agentpods import AgentPod, Trouble, Warning, trouble
from patchbay_operator.constants import (
    API_GROUP,
    API_VERSION,
    LABEL_NAME,
    ORPHAN_GRACE_SECONDS,
    RETRY_CREATE_ANNOTATION,
    SHARED_KEY,
)
from patchbay_operator.devicereports import Report, decode_event, decode_page
from patchbay_operator.informer import Source, Store
from patchbay_operator.kube import KubeError, Ref, Selectors, WatchEvent, collection
from patchbay_operator.parts import Part
from patchbay_operator.peering import Gate, writes
from patchbay_operator.scheduler import OnPending, Timers
from patchbay_operator.status.daemonset import AgentDaemonSet

log = logging.getLogger(__name__)
AGENTS = Selectors(label=f"{LABEL_NAME}={render.AGENT_NAME}")


def reports_collection(namespace: str) -> str:
    return collection(f"{API_GROUP}/{API_VERSION}", "DeviceReport", namespace)


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
            reports_collection(namespace),
            Report.from_object,
            # 20 at the CRD's bounds are 15 MB of JSON; later pages follow kube.PAGE_BYTES.
            first_page=20,
            decode_page=decode_page,
            read_event=lambda line: WatchEvent(*decode_event(line)),
        ),
    )


@dataclass(eq=False)
class AgentWatch(Part):
    """The agents' DaemonSets, pods, warnings and reports, and the writes that follow from them."""

    _: KW_ONLY
    mark: Callable[[Iterable[str]], None]
    gate: Gate | None = None

    def __post_init__(self) -> None:
        # Reports not believed (name -> the agent they named), so each is logged once; bounded
        # by the reports kept (an entry goes when its report is believed or deleted).
        self._distrusted: dict[str, str] = {}
        self.daemonsets: Store[AgentDaemonSet] = Store(attrgetter("profile"), self._by_profile)
        self.pods: Store[AgentPod] = Store(attrgetter("name"), self._pod_changed)
        self.warnings: Store[Warning] = Store(attrgetter("key"), self._warned)
        self.reports: Store[Report] = Store(attrgetter("name"), self._report_changed)
        # Reports with a DELETE in flight: status computations meanwhile must not send another.
        self._pruning: set[str] = set()
        #: by profile: its reports' deletion once the grace is over (KEEP: runs from the first
        #: report seen; later ones never postpone it)
        self._orphans: Timers[str] = Timers(OnPending.KEEP)
        #: by agent pod gone: the deletion of the reports that still name it (`_writer_gone`)
        self._writers_gone: Timers[str] = Timers(OnPending.KEEP)

    # --- changes -----------------------------------------------------------------------------

    def _by_profile(self, old: Any, new: Any) -> None:
        # The shared node agent's DaemonSet and pods: SHARED_KEY (every shared profile).
        for obj in (old, new):
            if obj is not None and obj.profile:
                log.debug("%s of DevicePluginProfile %s changed", type(obj).__name__, obj.profile)
                self._changed(obj.profile)

    def _pod_changed(self, old: AgentPod | None, new: AgentPod | None) -> None:
        self._by_profile(old, new)
        if old is not None and new is None:
            self._writers_gone.schedule(old.name, 0.0, functools.partial(self._writer_gone, old.name))

    async def _writer_gone(self, pod: str) -> None:
        """An agent pod is gone: the reports that still name it as their writer are deleted, so
        the agent now on the node writes them afresh (its reporter writes a deleted report again
        at once). A DaemonSet rollout's old pod may write the report after its successor did (both
        run while the successor starts), and the successor leaves a report of its own DaemonSet's
        pods alone (report/reporter.py, `same_daemonset`): without this, a report naming a pod
        that no longer exists stayed until a device changed, and no status believed it (the node
        counted as not reported, 0 nodes updated)."""
        if not writes(self.gate):
            return
        for report in [r for r in self.reports.items.values() if r.agent == pod]:
            await self._delete_if_written_by(report, pod)

    async def _delete_if_written_by(self, report: Report, pod: str) -> None:
        """Delete ``report`` if the API server's copy still names ``pod`` as its writer. The
        informer's copy may be seconds old: in a rollout of the shared agent the new pod takes the
        node's reports over (writes them naming itself) as the old one goes, and the pod's DELETED
        can come before the reports' MODIFIED; deleting on the informer's word deleted live reports
        (rewritten half a second later: a repair, and the node unreported meanwhile; CI, v1.34.4).
        So the report is read, and deleted only in the version read (a resourceVersion
        precondition: 409 if written in between, which reads it again)."""
        if report.name in self._pruning:
            return
        ref = Ref(reports_collection(self.settings.namespace), report.name)
        self._pruning.add(report.name)
        try:
            for _ in range(3):
                if (obj := await self.call(self.kube.get, ref)) is None:
                    return  # deleted meanwhile; the watch says so
                if (writer := obj.get("agent") or "") != pod:  # one field: no decode of the devices
                    log.info("DeviceReport %s left: %s wrote it after %s was gone", report.name, writer, pod)
                    return
                try:
                    await self.call(self.kube.delete, ref, "", str(obj["metadata"]["resourceVersion"]))
                except KubeError as e:
                    if e.status == 409:
                        continue  # written since the read: read it again
                    raise
                self._forget(report, f"its writer, agent pod {pod}, is gone")
                return
            log.warning("DeviceReport %s: written again under each of 3 deletes; left", report.name)
        except (KubeError, OSError) as e:
            log.warning("Deleting DeviceReport %s failed: %s", report.name, e)
        finally:
            self._pruning.discard(report.name)

    def _report_changed(self, old: Report | None, new: Report | None) -> None:
        if new is None and old is not None:
            self._distrusted.pop(old.name, None)
        self._by_profile(old, new)

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

    def _changed(self, profile: str) -> None:
        """An agent object of ``profile`` changed: its status, or every shared profile's for the
        shared node agent's objects (no profile); a profile nobody knows has its reports pruned."""
        if profile == SHARED_KEY:
            self.mark([p.name for p in self.registry.shared_agent_profiles()])
        elif self.registry.get(profile) is None:
            self.prune_orphans_later([profile])
        else:
            self.mark([profile])

    def applied(self, daemonset: AgentDaemonSet) -> None:
        """An agent DaemonSet as the API server answered its apply, usually before its watch event.

        Not always: the answer comes back through a worker thread, and meanwhile the watch may
        have brought the DaemonSet and the status its controller wrote right after (pods desired,
        pods refused). A copy of the same DaemonSet (uid) at the same or a newer generation is
        then at least as new as the answer, and stays: folding the answer over it put back the
        status of the moment of the apply (0 pods desired) for good, since the DaemonSet did not
        change again, so a refusal of its pods was never seen and the profile never turned
        Stalled (the refusals integration test, 3 runs in 20 on a loaded machine). An older copy
        catches up through the watch, as it did before answers were folded."""
        known = self.daemonsets.items.get(daemonset.profile)
        if known is not None and known.uid == daemonset.uid and known.generation >= daemonset.generation:
            return
        change = self.daemonsets.fold_quietly("APPLIED", daemonset)
        if change is not None:
            self._by_profile(*change)

    # --- what the status reads ----------------------------------------------------------------

    def create_warning(self, daemonset: AgentDaemonSet | None) -> Warning | None:
        """The latest FailedCreate event about ``daemonset`` (agentpods.refusal decides whether
        it still holds)."""
        return None if daemonset is None else self.warnings.items.get(f"DaemonSet/{daemonset.name}")

    def shared_pods(self) -> list[AgentPod]:
        """The shared node agent's pods (agent pods without a profile)."""
        return [p for p in self.pods.items.values() if p.profile == SHARED_KEY]

    def troubles(self, profile: str, now: datetime) -> list[Trouble]:
        """Each of the profile's agent pods that does not work, and why."""
        out = []
        stall_after = timedelta(seconds=self.settings.stall_after)
        for pod in self.pods.items.values():
            if (
                pod.profile == profile
                and (t := trouble(pod, self.warnings.items.get(pod.name), now, stall_after)) is not None
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

    # --- the writes that follow ---------------------------------------------------------------

    async def retry_create(self, daemonset: str, now: str) -> None:
        """Make the DaemonSet controller try to create ``daemonset``'s pods again now: any update
        of the DaemonSet enqueues it at once, where after refused creates it would wait out its
        own rate limiter (exponential, up to minutes). The annotation changes nothing else; a
        failure is only logged (the next status computation asks again)."""
        ref = Ref(collection("apps/v1", "DaemonSet", self.settings.namespace), daemonset)
        try:
            await self.call(self.kube.annotate, ref, {RETRY_CREATE_ANNOTATION: now})
        except (KubeError, OSError) as e:
            log.warning("Asking DaemonSet %s to create its pods again failed: %s", daemonset, e)
        else:
            log.debug("Asked DaemonSet %s to create its refused pods again", daemonset)

    async def prune_reports(self, profile: str, keep: Iterable[str]) -> None:
        """Delete ``profile``'s reports except those of the nodes in ``keep``."""
        keep = set(keep)
        doomed = [
            r
            for r in self.reports.items.values()
            if r.profile == profile and r.node not in keep and r.name not in self._pruning
        ]
        for report in doomed:
            await self._delete_report(report, f"node {report.node} no longer serves {profile}")

    async def _delete_report(self, report: Report, why: str) -> None:
        if report.name in self._pruning:
            return
        self._pruning.add(report.name)
        try:
            await self.call(self.kube.delete, Ref(reports_collection(self.settings.namespace), report.name))
        except (KubeError, OSError) as e:
            log.warning("Deleting DeviceReport %s failed: %s", report.name, e)
            return
        finally:
            self._pruning.discard(report.name)
        self._forget(report, why)

    def _forget(self, report: Report, why: str) -> None:
        """A report this replica deleted is gone now, not when the watch says so: the next status
        must neither count it nor delete it again."""
        change = self.reports.fold_quietly("DELETED", report)
        if change is not None:
            self._report_changed(*change)
        log.info("Deleted DeviceReport %s (%s)", report.name, why)

    def prune_orphans_later(self, profiles: Iterable[str]) -> None:
        """DeviceReports of profiles that do not exist (an agent's of a profile deleted while the
        operator was down, or a report no agent of ours should have written) are deleted after
        `ORPHAN_GRACE_SECONDS`, when the profile is still unknown: nothing reads them, and a
        misbehaving agent must not be able to fill etcd and the operator's memory with them."""
        for profile in profiles:
            if profile:
                self._orphans.schedule(
                    profile, ORPHAN_GRACE_SECONDS, functools.partial(self._prune_orphan, profile)
                )

    async def _prune_orphan(self, profile: str) -> None:
        if self.registry.get(profile) is not None or not writes(self.gate):
            return  # known meanwhile, or a waiting replica (the working one prunes)
        if any(r.profile == profile for r in self.reports.items.values()):
            log.info("Deleting the DeviceReports of %s: no such DevicePluginProfile", profile)
            await self.prune_reports(profile, keep=())

    async def close(self) -> None:
        await self._orphans.close()
        await self._writers_gone.close()
