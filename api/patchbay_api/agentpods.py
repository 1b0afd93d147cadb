"""Why an agent pod does not work, from the pod and its latest Warning event: one explanation.

The operator puts it in the profile's status (adding when it counts as stalled) and ``kubectl
patchbay why`` prints it (adding the pod's last exit and events), so both say the same thing in
the same words. ``explain`` reads, in this order:

- a container waiting for a reason the kubelet names (not ``ContainerCreating`` or
  ``PodInitializing``, which are progress): that reason and the kubelet's message; a crash loop
  says how often it restarted and how the agent last exited; ``PERMANENT`` reasons need a change;
- a pod the scheduler cannot place: ``Unschedulable`` and the scheduler's message;
- a pod stuck before its container starts: the latest Warning event's reason and message when it
  is one of ``SANDBOX_REASONS`` (a sandbox, a mount, scheduling);
- a running pod that is not Ready (the agent's readiness is its kubelet registration):
  ``AgentNotReady``; anything else: ``AgentStarting``.

A pod that was never created has no pod to look at: the DaemonSet controller's ``FailedCreate``
Warning about the DaemonSet quotes the API server's refusal (``Warning.daemonset``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from patchbay_api.constants import LABEL_PROFILE, LABEL_SHARED_AGENT, SHARED_AGENT_VALUE, AgentPodReason

#: How the operator's stores key the shared node agent's DaemonSet and pods: no profile is named so.
SHARED_KEY = "*shared*"

PERMANENT = {
    "ErrImageNeverPull": "the image is not on the node and its pull policy is Never",
    "InvalidImageName": "the image name is invalid",
    "CreateContainerConfigError": "the container's configuration cannot be built",
    "CrashLoopBackOff": "the agent keeps exiting",
}
"""Waiting reasons that need a change to go away."""

SANDBOX_REASONS = frozenset({"FailedCreatePodSandBox", "FailedMount", "FailedScheduling", "FailedKillPod"})
"""Warning event reasons that explain a pod stuck before its container starts."""

_PROGRESS = (None, "ContainerCreating", "PodInitializing")


def profile_key(labels: Mapping[str, Any]) -> str:
    """Whose agent object this is: its profile, or SHARED_KEY for the shared node agent's."""
    if labels.get(LABEL_SHARED_AGENT) == SHARED_AGENT_VALUE:
        return SHARED_KEY
    return str(labels.get(LABEL_PROFILE, ""))


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
class AgentPod:
    """The slice of an agent pod that says whether it works."""

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
            if w and w.get("reason") not in _PROGRESS:
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

    @property
    def works(self) -> bool:
        """Running and Ready, or going away (a pod being deleted is no one's trouble)."""
        return self.deleting or (self.phase == "Running" and self.ready)


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
        """How a store keeps it: the pod's name, ``DaemonSet/<name>``, or "" (not kept: events
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
        refused = kind == "DaemonSet" and reason == AgentPodReason.FAILED_CREATE
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
class Explanation:
    """What is wrong with an agent pod: a CamelCase reason, a message, and whether it needs a
    change to go away (``permanent``) rather than time."""

    reason: str
    message: str
    permanent: bool = False


def explain(pod: AgentPod, warning: Warning | None) -> Explanation | None:
    """Why ``pod`` does not work (``warning``: its latest Warning event), or None when it does."""
    if pod.works:
        return None
    if pod.waiting is not None:
        reason, message = pod.waiting
        if reason == "CrashLoopBackOff" and pod.last_exit:
            message = f"restarted {pod.restarts} times; last exit: {pod.last_exit}"
        return Explanation(reason, message or PERMANENT.get(reason, reason), reason in PERMANENT)
    if pod.unschedulable is not None:
        return Explanation(AgentPodReason.UNSCHEDULABLE, pod.unschedulable)
    if warning is not None and warning.reason in SANDBOX_REASONS:
        return Explanation(warning.reason, warning.message)
    if pod.phase == "Running":
        return Explanation(
            AgentPodReason.AGENT_NOT_READY, "the agent runs but has not registered with the kubelet"
        )
    return Explanation(
        AgentPodReason.AGENT_STARTING, f"the agent pod is {pod.phase or 'Pending'}, not Ready yet"
    )
