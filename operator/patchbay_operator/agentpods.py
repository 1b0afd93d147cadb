"""Why an agent pod does not work, from the pod and its Warning events (pure).

The operator watches its agent pods (label selector, its own namespace) and the Warning events
of that namespace; each pod is kept as a small ``AgentPod`` and each pod's latest Warning as a
``Warning``. ``trouble`` turns them into the node's problem, or None for a pod that is fine:

- ``stalled=True``: it cannot get better without a change (kstatus reads ``Stalled=True`` as
  Failed): an image that may not be pulled (ErrImageNeverPull, InvalidImageName), a container
  that cannot be configured (CreateContainerConfigError), a crash loop (CrashLoopBackOff, with
  the last termination message), or any trouble that outlasted ``STALL_AFTER`` (an image pull
  backing off, a sandbox that cannot be created, unschedulable, running but never Ready);
- ``stalled=False``: it may still sort itself out (a first pull, a sandbox retry); ``recheck_at``
  says when it would count as stalled, so the status is recomputed then even if nothing else
  happens.

A pod that was never CREATED has no pod to look at: Pod Security admission, a ResourceQuota, a
missing ServiceAccount or a ValidatingAdmissionPolicy refuses it, and only the DaemonSet
controller tells, with a Warning ``FailedCreate`` event about the DaemonSet that quotes the
API server's answer. ``refusal`` turns the latest such event into the DaemonSet's trouble while
its pods are still missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from patchbay_operator.constants import LABEL_PROFILE, LABEL_SHARED_AGENT, SHARED_AGENT_VALUE, SHARED_KEY
from patchbay_operator.timestamps import parse_rfc3339

STALL_AFTER = timedelta(seconds=60)
"""How long a pod may be in trouble that can fix itself before it counts as stalled: long
enough for a first image pull or a sandbox retry, short enough that a broken rollout turns
kstatus Failed within two minutes."""

PERMANENT = {
    "ErrImageNeverPull": "the image is not on the node and its pull policy is Never",
    "InvalidImageName": "the image name is invalid",
    "CreateContainerConfigError": "the container's configuration cannot be built",
    "CrashLoopBackOff": "the agent keeps exiting",
}
"""Waiting reasons that need a change to go away."""

FAILED_CREATE = "FailedCreate"
"""The DaemonSet controller's Warning reason when the API server refuses one of its pods; its
message is the refusal as the API server wrote it (``Error creating: pods "x" is forbidden: ...``)."""

SANDBOX_REASONS = {"FailedCreatePodSandBox", "FailedMount", "FailedScheduling", "FailedKillPod"}
"""Warning event reasons that explain a pod stuck before its container starts."""


def profile_key(labels: Mapping[str, Any]) -> str:
    """Whose agent object this is: its profile, or SHARED_KEY for the shared node agent's."""
    if labels.get(LABEL_SHARED_AGENT) == SHARED_AGENT_VALUE:
        return SHARED_KEY
    return str(labels.get(LABEL_PROFILE, ""))


@dataclass(frozen=True)
class AgentPod:
    """The slice of an agent pod the operator keeps."""

    name: str
    profile: str
    node: str  # spec.nodeName, else the node the DaemonSet pinned it to
    created: str  # RFC 3339
    phase: str = ""
    ready: bool = False
    deleting: bool = False
    unschedulable: str | None = None  # the scheduler's message
    waiting: tuple[str, str] | None = None  # (reason, message) of a waiting container
    last_exit: str | None = None  # the last termination: message, or reason and exit code
    restarts: int = 0

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> AgentPod:
        meta, spec, st = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
        conditions = {c.get("type"): c for c in st.get("conditions") or []}
        sched = conditions.get("PodScheduled") or {}
        ready = (conditions.get("Ready") or {}).get("status") == "True"
        waiting = last_exit = None
        restarts = 0
        for cs in st.get("containerStatuses") or []:
            restarts += int(cs.get("restartCount") or 0)
            w = (cs.get("state") or {}).get("waiting")
            if w and w.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
                waiting = (str(w["reason"]), str(w.get("message") or ""))
            t = (cs.get("lastState") or {}).get("terminated")
            if t:
                last_exit = str(
                    t.get("message") or f"{t.get('reason', 'Error')} (exit code {t.get('exitCode')})"
                )
        return cls(
            name=str(meta.get("name", "")),
            profile=profile_key(meta.get("labels") or {}),
            node=str(spec.get("nodeName") or pinned_node(spec)),
            created=str(meta.get("creationTimestamp") or ""),
            phase=str(st.get("phase") or ""),
            ready=ready,
            deleting=bool(meta.get("deletionTimestamp")),
            unschedulable=str(sched.get("message") or "")
            if sched.get("status") == "False" and sched.get("reason") == "Unschedulable"
            else None,
            waiting=waiting,
            last_exit=last_exit.strip()[:300] if last_exit else None,
            restarts=restarts,
        )


def pinned_node(spec: Mapping[str, Any]) -> str:
    """The node a DaemonSet pod is meant for: the controller pins it with a matchFields term."""
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    for term in affinity.get("nodeSelectorTerms") or []:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return str(f["values"][0])
    return ""


@dataclass(frozen=True)
class Warning:
    """The latest Warning event about one agent pod, or the latest ``FailedCreate`` about one
    agent DaemonSet (``daemonset`` set, ``pod`` empty)."""

    pod: str
    reason: str
    message: str
    count: int = 1
    daemonset: str = ""
    uid: str = ""  # the involved object's uid: a DaemonSet re-created under the same name is another
    since: str = ""  # RFC 3339: when the event was first seen (firstTimestamp, else eventTime)

    @property
    def key(self) -> str:
        """How the store keeps it: the pod's name, ``DaemonSet/<name>``, or "" (not kept: events
        about any other object, and a DaemonSet's other warnings, which do not say why pods are
        missing and would hide the FailedCreate that does)."""
        if self.pod:
            return self.pod
        return f"DaemonSet/{self.daemonset}" if self.daemonset else ""

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Warning:
        involved = obj.get("involvedObject") or {}
        kind, name = involved.get("kind"), str(involved.get("name", ""))
        reason = str(obj.get("reason") or "")
        refused = kind == "DaemonSet" and reason == FAILED_CREATE
        return cls(
            pod=name if kind == "Pod" else "",
            reason=reason,
            # A refusal quotes the admission's whole answer (Pod Security lists every check that
            # failed): keep more of it than of a pod's warning, still bounded.
            message=str(obj.get("message") or "").strip()[: 600 if refused else 300],
            count=int(obj.get("count") or 1),
            daemonset=name if refused else "",
            uid=str(involved.get("uid") or ""),
            since=str(
                obj.get("firstTimestamp")
                or obj.get("eventTime")
                or (obj.get("metadata") or {}).get("creationTimestamp")
                or ""
            ),
        )


@dataclass(frozen=True)
class Trouble:
    node: str
    reason: str
    message: str
    stalled: bool
    recheck_at: datetime | None = None  # when a not-yet-stalled trouble would become stalled


def trouble(pod: AgentPod, warning: Warning | None, now: datetime) -> Trouble | None:
    """The pod's problem, or None when it runs and is Ready (or is going away)."""
    if pod.deleting or (pod.phase == "Running" and pod.ready):
        return None
    created = parse_rfc3339(pod.created) or now
    overdue = now - created >= STALL_AFTER
    recheck = None if overdue else created + STALL_AFTER

    def found(reason: str, message: str, permanent: bool = False) -> Trouble:
        stalled = permanent or overdue
        return Trouble(pod.node, reason, message, stalled, None if stalled else recheck)

    if pod.waiting is not None:
        reason, message = pod.waiting
        if reason == "CrashLoopBackOff" and pod.last_exit:
            message = f"restarted {pod.restarts} times; last exit: {pod.last_exit}"
        return found(reason, message or PERMANENT.get(reason, reason), permanent=reason in PERMANENT)
    if pod.unschedulable is not None:
        return found("Unschedulable", pod.unschedulable)
    if warning is not None and warning.reason in SANDBOX_REASONS:
        return found(warning.reason, warning.message)
    if pod.phase == "Running":
        return found("AgentNotReady", "the agent runs but has not registered with the kubelet")
    return found("AgentStarting", f"the agent pod is {pod.phase or 'Pending'}, not Ready yet")


def refusal(
    daemonset: str, uid: str, rollout: Mapping[str, Any], warning: Warning | None, now: datetime
) -> Trouble | None:
    """Why the agent DaemonSet ``daemonset`` (``uid``, its ``status`` as ``rollout``) has pods
    missing that the API server refused to create, or None.

    The FailedCreate event outlives its cause (events live an hour), so it counts only while the
    DaemonSet's own status says pods are missing: fewer nodes run an up-to-date pod than should
    (``updatedNumberScheduled`` counts pods that exist, Ready or not, so a refusal during a rollout
    counts as well as one of the first pods). Once the pods are created the status catches up and
    the refusal is gone, whatever the event says. An event about an earlier DaemonSet of the
    same name (another uid) is not this one's.

    A refusal is not tied to a node (the controller stops at the first refused pod), so the
    trouble's node is "". It counts as stalled once it has lasted ``STALL_AFTER`` since the event
    was first seen: a quota or a ServiceAccount may appear a moment later at install time, Pod
    Security or a policy need a change. The message names the DaemonSet and quotes the cluster.
    """
    if warning is None or warning.reason != FAILED_CREATE or warning.daemonset != daemonset:
        return None
    if uid and warning.uid and uid != warning.uid:
        return None
    desired = int(rollout.get("desiredNumberScheduled") or 0)
    created = min(
        int(rollout.get("updatedNumberScheduled") or 0), int(rollout.get("currentNumberScheduled") or 0)
    )
    if created >= desired:
        return None
    since = parse_rfc3339(warning.since) or now
    stalled = now - since >= STALL_AFTER
    message = f"DaemonSet {daemonset} cannot create its agent pods: {warning.message}"
    return Trouble("", FAILED_CREATE, message, stalled, None if stalled else since + STALL_AFTER)
