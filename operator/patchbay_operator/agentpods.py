"""When an agent pod's trouble counts as stalled, and a DaemonSet's refused pods (pure).

The operator watches its agent pods (label selector, its own namespace) and the Warning events
of that namespace; each pod is kept as a small ``AgentPod`` and each pod's latest Warning as a
``Warning`` (both the API package's, whose ``explain`` says why a pod does not work, in the same
words ``kubectl patchbay why`` prints). ``trouble`` turns that into the node's problem, or None
for a pod that is fine:

- ``stalled=True``: it cannot get better without a change (kstatus reads ``Stalled=True`` as
  Failed): an image that may not be pulled (ErrImageNeverPull, InvalidImageName), a container
  that cannot be configured (CreateContainerConfigError), a crash loop (CrashLoopBackOff, with
  the last termination message), or any trouble that outlasted ``STALL_AFTER`` (the operator's
  ``--stall-after``: an image pull backing off, a sandbox that cannot be created, unschedulable,
  running but never Ready);
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

# What an agent pod says and why it does not work is the API package's, shared with `kubectl
# patchbay why`; the operator adds when that counts as stalled, and the DaemonSet's refusals.
from patchbay_api import agentpods
from patchbay_api.agentpods import explain
from patchbay_api.constants import AgentPodReason
from patchbay_operator.constants import STALL_AFTER_SECONDS
from patchbay_operator.timestamps import parse_rfc3339

AgentPod = agentpods.AgentPod
Warning = agentpods.Warning
profile_key = agentpods.profile_key

STALL_AFTER = timedelta(seconds=STALL_AFTER_SECONDS)
"""How long a pod may be in trouble that can fix itself before it counts as stalled, by default
(the operator's ``--stall-after``: constants.STALL_AFTER_SECONDS)."""

FAILED_CREATE = AgentPodReason.FAILED_CREATE
"""The DaemonSet controller's Warning reason when the API server refuses one of its pods; its
message is the refusal as the API server wrote it (``Error creating: pods "x" is forbidden: ...``)."""


@dataclass(frozen=True)
class Trouble:
    node: str
    reason: str
    message: str
    stalled: bool
    recheck_at: datetime | None = None  # when a not-yet-stalled trouble would become stalled


def trouble(
    pod: AgentPod, warning: Warning | None, now: datetime, stall_after: timedelta = STALL_AFTER
) -> Trouble | None:
    """The pod's problem, or None when it runs and is Ready (or is going away); a trouble that
    can fix itself counts as stalled once it has lasted ``stall_after``."""
    found = explain(pod, warning)
    if found is None:
        return None
    created = parse_rfc3339(pod.created) or now
    stalled = found.permanent or now - created >= stall_after
    return Trouble(pod.node, found.reason, found.message, stalled, None if stalled else created + stall_after)


def refusal(
    daemonset: str,
    uid: str,
    rollout: Mapping[str, Any],
    warning: Warning | None,
    now: datetime,
    *,
    stall_after: timedelta = STALL_AFTER,
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
    trouble's node is "". It counts as stalled once it has lasted ``stall_after`` since the event
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
    stalled = now - since >= stall_after
    message = f"DaemonSet {daemonset} cannot create its agent pods: {warning.message}"
    return Trouble("", FAILED_CREATE, message, stalled, None if stalled else since + stall_after)
