"""``why``: the profile's conditions, problems, its agent pods' trouble with the kubelet's own words
(container waiting and termination reasons, the pods' Warning events), the profile's last Events
and what to do next, keyed by the reasons docs/operations.md#troubleshooting explains; and, for a
node that serves none of the profile's devices (``why PROFILE NODE``, or the first nodes that
report none), what its NodeInventory says the discovery matches and what comes closest
(views/inventory.py)."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime

from patchbay_api.agentpods import AgentPod, Warning, explain
from patchbay_kubectl.views.inventory import SUMMARISED, backend_of, match, names, nothing_text
from patchbay_kubectl.views.objects import (
    Obj,
    age,
    group_of,
    mode_of,
    name_of,
    resource_of,
    selector_matches,
    spec,
)

HINTS: dict[str, str] = {
    "ErrImageNeverPull": "load the agent image on the node, or fix spec.agent.image (chart: agent.image)",
    "InvalidImageName": "fix spec.agent.image / the chart's agent.image",
    "ImagePullBackOff": "check the registry, the pull secrets and the image name",
    "ErrImagePull": "check the registry, the pull secrets and the image name",
    "CrashLoopBackOff": "read the message, then `kubectl logs --previous` of the agent pod",
    "CreateContainerConfigError": "the agent pod's configuration: `kubectl describe pod` of the agent pod",
    "FailedCreatePodSandBox": "the node's kubelet and CNI: the pod's events",
    "FailedMount": "the node's kubelet and the pod's volumes: the pod's events",
    "Unschedulable": "spec.agent.tolerations, spec.agent.priorityClassName, the node's free resources",
    "AgentNotReady": "the agent's log: the kubelet socket, --device-plugin-dir, discovery errors",
    "AgentStarting": "the agent's log: the kubelet socket, --device-plugin-dir, discovery errors",
    "Vanished": "the hardware: the device file is gone (`kubectl patchbay devices --unhealthy`)",
    "OpenFailed": "the hardware or its permissions: the message says what open() answered",
    "ProbeFailed": "the profile's plugin.health.exec probe failed: its message has the probe's stderr",
    "ProbeTimedOut": "the probe outlived plugin.health.exec.timeoutSeconds: the device or the timeout",
    "Flapping": "the device keeps coming and going (a loose connector, a reset loop): the hardware; "
    "it recovers after 30 s without a change",
    "DevicesUnhealthy": "`kubectl patchbay devices --unhealthy` lists them; then the hardware",
    "NoDevices": "the agent found nothing: the profile's plugin.discovery against the node; the agent's log",
    "DevicesNotAllocatable": "the kubelet lost the agent's devices (kubelets before 1.37, after an agent "
    "left): delete the agent pod on that node so its successor registers; then the kubelet's log",
    "WaitingForKubelet": "transient (the kubelet's node status sync, ~10 s); if it lasts, the kubelet's log",
    "NoMatchingNodes": "check spec.nodeSelector against `kubectl get nodes --show-labels`",
    "ResourceNameConflict": "an older profile advertises this resource: delete one of them",
    "ResourceSetByOther": "something else set this resource on the node: remove the other source",
    "InvalidCapacityLabel": "fix the node's capacity label: a non-negative integer",
    "PatchFailed": "the message names the API error (often RBAC on nodes/status)",
    "ValueMismatch": "transient after a change; if it persists, the operator's log",
    "NotAdvertised": "transient after a change; if it persists, the operator's log",
    "NodesNotReady": "transient while agents start; `kubectl patchbay nodes --profile` shows which",
    "RollingOut": "transient: a rollout keeps every node's resource",
    "NodeGroupsOverlap": "two of spec.nodeGroups match the node and the first listed wins: narrow their "
    "nodeSelectors, or order the list as meant",
    "OwnedObjectMissing": "an object the operator renders was deleted: the operator recreates it within "
    "seconds (a Recreated Event on the profile); if it stays missing, the operator's log",
    "FieldsTakenOver": "another field manager took fields the operator manages by server-side apply, and "
    "the operator leaves them: apply without those fields (or delete the object: it is recreated)",
}

_MISSING_CONFIGMAP = re.compile(r'configmaps? "([^"]+)" not found')
_WAITS = ("NodesNotReady", "RollingOut")
"""Reasons whose hint calls the wait transient: not so while an object the agents need is missing."""


def missing_owned(problems: Sequence[Obj], troubles: Sequence[Obj]) -> list[str]:
    """What the operator renders that is missing, as the cause of not being Ready: the status's
    OwnedObjectMissing problem, or an agent pod that cannot mount its ConfigMap (FailedMount:
    configmap "patchbay-node-agent" not found)."""
    out = [str(p.get("message", "")) for p in problems if p.get("reason") == "OwnedObjectMissing"]
    for t in troubles:
        texts = [str(t.get("message", ""))] + [str(e.get("message", "")) for e in t.get("events") or []]
        for name in sorted({m for text in texts for m in _MISSING_CONFIGMAP.findall(text)}):
            cause = f"ConfigMap {name}, which the agent pods mount, is missing: the operator recreates it"
            if cause not in out:
                out.append(cause)
    return out


def pod_trouble(pod: Obj, events: Sequence[Obj]) -> Obj | None:
    """Why an agent pod does not work, in the words the operator's status uses (the API package's
    ``explain``: the kubelet's and scheduler's reasons), with its last exit and latest events;
    None when it works. ``events`` are the pod's Warning events, newest last."""
    agent = AgentPod.from_object(pod)
    found = explain(agent, Warning.from_object(events[-1]) if events else None)
    if found is None:
        return None
    out: Obj = {
        "pod": agent.name,
        "node": agent.node,
        "phase": agent.phase,
        "reason": str(found.reason),
        "message": found.message,
    }
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        last = (cs.get("lastState") or {}).get("terminated") or {}
        if last:
            out["lastExit"] = {
                "exitCode": last.get("exitCode"),
                "reason": last.get("reason", ""),
                "message": (last.get("message") or "").strip(),
            }
    out["events"] = [
        {"reason": e.get("reason", ""), "message": e.get("message", ""), "count": e.get("count", 1)}
        for e in events[-3:]
    ]
    return out


def _event_time(e: Obj) -> str:
    return str(
        e.get("lastTimestamp")
        or e.get("eventTime")
        or (e.get("metadata") or {}).get("creationTimestamp")
        or ""
    )


def why(profile: Obj, pods: Sequence[Obj], events: Sequence[Obj], now: datetime, last: int = 8) -> Obj:
    """One screen's worth of why ``profile`` is (not) Ready, as data (``render_why`` prints it)."""
    st = profile.get("status") or {}
    conds = st.get("conditions") or []
    pname = name_of(profile)
    profile_events = sorted(
        (
            e
            for e in events
            if (e.get("involvedObject") or {}).get("kind") == "DevicePluginProfile"
            and (e.get("involvedObject") or {}).get("name") == pname
        ),
        key=_event_time,
    )
    by_pod: dict[str, list[Obj]] = defaultdict(list)
    for e in sorted(events, key=_event_time):
        inv = e.get("involvedObject") or {}
        if inv.get("kind") == "Pod" and e.get("type") == "Warning":
            by_pod[f"{inv.get('namespace', '')}/{inv.get('name', '')}"].append(e)
    troubles = []
    for pod in sorted(pods, key=lambda p: (str((p.get("spec") or {}).get("nodeName")), name_of(p))):
        meta = pod.get("metadata") or {}
        t = pod_trouble(pod, by_pod.get(f"{meta.get('namespace', '')}/{meta.get('name', '')}", []))
        if t is not None:
            troubles.append(t)
    ready: Obj = next((c for c in conds if c.get("type") == "Ready"), {})
    reasons: list[str] = []
    for c in conds:
        if (c.get("type") == "Ready" and c.get("status") != "True") or (
            c.get("type") != "Ready" and c.get("status") == "True"
        ):
            reasons.append(str(c.get("reason", "")))
    reasons += [str(p.get("reason", "")) for p in st.get("problems") or []]
    reasons += [str(t["reason"]) for t in troubles]
    seen: set[str] = set()
    hints = []
    causes = missing_owned(st.get("problems") or [], troubles)
    if causes:
        # The cause, not a wait: what is missing and what the operator does about it.
        hints.append(
            {"reason": "OwnedObjectMissing", "do": "; ".join(causes) + f". {HINTS['OwnedObjectMissing']}"}
        )
        seen.update(("OwnedObjectMissing", *_WAITS))
    for r in reasons:
        if r in HINTS and r not in seen:
            seen.add(r)
            hints.append({"reason": r, "do": HINTS[r]})
    if not st:
        hints.append(
            {
                "reason": "NoStatus",
                "do": "no status yet: is the operator running? (its log)",
            }
        )
    elif st.get("observedGeneration") != (profile.get("metadata") or {}).get("generation"):
        hints.append(
            {"reason": "NotObserved", "do": "the operator has not seen the latest spec yet: its log"}
        )
    return {
        "profile": pname,
        "mode": mode_of(profile),
        "resource": resource_of(profile),
        "ready": ready.get("status") == "True",
        "nodesReady": st.get("nodesReady", ""),
        "devicesAllocatable": st.get("devicesAllocatable", ""),
        "conditions": [
            {
                "type": c.get("type"),
                "status": c.get("status"),
                "reason": c.get("reason", ""),
                "message": c.get("message", ""),
                "since": c.get("lastTransitionTime"),
                "age": age(c.get("lastTransitionTime"), now),
            }
            for c in conds
        ],
        "problemCount": st.get("problemCount", len(st.get("problems") or [])),
        "problems": list(st.get("problems") or []),
        "agentPods": {"total": len(pods), "notReady": len(troubles), "trouble": troubles[:5]},
        "events": [
            {
                "type": e.get("type", ""),
                "reason": e.get("reason", ""),
                "message": e.get("message", ""),
                "count": e.get("count", 1),
                "age": age(_event_time(e) or None, now),
            }
            for e in profile_events[-last:]
        ],
        "next": hints,
    }


WHY_NODES = 3
"""Nodes ``why`` without a node reads the inventory of: the first that report no devices."""


def empty_nodes(profile: Obj) -> list[str]:
    """The nodes the profile's status says found no device (``NoDevices``), the first few."""
    st = profile.get("status") or {}
    found = [str(p.get("node")) for p in st.get("problems") or [] if p.get("reason") == "NoDevices"]
    return sorted(set(found))[:WHY_NODES]


def node_inventory(profile: Obj, node: Obj, report: Obj | None, inventory: Obj | None) -> Obj:
    """What one node serves of the profile and, where it serves nothing, what its inventory says
    the profile's discovery matches there and which entries come closest."""
    name = name_of(node)
    labels = (node.get("metadata") or {}).get("labels") or {}
    out: Obj = {"node": name}
    if report is not None:
        out["serving"] = len(report.get("devices") or [])
    if not selector_matches(spec(profile).get("nodeSelector"), labels):
        out["text"] = "not selected: the profile's nodeSelector does not match the node's labels"
        out["inventory"] = None
        return out
    _group, plugin = group_of(profile, labels)
    discovery = plugin.get("discovery") or {}
    found = match(discovery, inventory) if inventory is not None else None
    if inventory is None:
        out["text"] = "no NodeInventory: what the profile's discovery matches there is not known"
        out["inventory"] = None
        return out
    if found is None:
        out["text"] = f"discovery {backend_of(discovery) or '<none>'}: nothing a node's inventory lists"
        out["inventory"] = None
        return out
    out["inventory"] = found.as_dict()
    head = f"from the node's inventory (written at {found.written_at}): "
    if found.matched:
        text = f"the profile's discovery matches {names(e.name for e in found.matched)}"
        if found.unmatched:
            text += f"; {nothing_text(found)}"
    else:
        text = nothing_text(found)
    extra = [*found.notes, *([SUMMARISED] if found.summarised else [])]
    out["text"] = head + text + "".join(f" ({x})" for x in extra)
    return out
