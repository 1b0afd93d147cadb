"""Leaving a node to the agent that replaces it: on SIGTERM, serve on until the successor is Ready.

A DaemonSet rollout with `maxSurge` (the agents' default) starts the new agent beside the old one
and deletes the old one once the new one is available, so the kubelet always holds a stream of
the resource. But the DaemonSet controller deletes an out-of-date pod AT ONCE when that pod is
not Ready (`podsShouldBeOnNode`, the same in every release we support; docs/facts.md#daemonset-rollouts),
and an agent that serves and is registered still reads not Ready until its readiness probe's next
tick. An agent deleted in that moment used to leave its resource without an endpoint until the
new agent registered: about 2 s in which the kubelet refused pods ("no healthy devices").

So, before it stops, the agent asks the API server once for the other pods of its own DaemonSet on
its node (its DaemonSet's selector, `--daemonset-selector`, and `spec.nodeName`). A pod there that
is not being deleted is its successor: the agent keeps serving, everything running as before the
signal, until one of them is Ready (the kubelet then holds its stream: the successor counts as
ready only then) or none is left, at most `--successor-wait` seconds. No such pod (the DaemonSet
deleted, the node no longer selected, a pod deleted by hand): it stops at once, so capacity that
nothing will serve does not stay.

One LIST per exit, field-selected to one node (the API server's watch cache indexes pods by
node); then, only while a successor starts, one every POLL_INTERVAL.

And one LIST at start (`deleted_already`): the agent is PID 1 of its container, where a SIGTERM
that comes before the agent has a handler for it is dropped, not delivered later; so once its
handlers are set, the agent asks whether its own pod is being deleted already, and if so leaves
as on SIGTERM (docs/facts.md#signals-at-start). A deletion after that LIST reaches the handler:
the kubelet signals only after the API server has the deletion.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

#: How often the successor's readiness is read while the agent waits for it.
POLL_INTERVAL = 0.25
#: One LIST may take this long; a slower or failed one ends the wait (the agent then stops).
LIST_TIMEOUT = 2.0


class PodLister(Protocol):
    def daemon_pods(
        self, namespace: str, selector: str, node_name: str, *, timeout: float
    ) -> list[dict[str, Any]]:
        """The pods in `namespace` matching the label `selector` on node `node_name`."""
        ...


@dataclass(frozen=True)
class Identity:
    """Which pod this agent is and how its DaemonSet selects its pods."""

    namespace: str
    pod_name: str
    node_name: str
    #: the DaemonSet's pod selector as a label selector (`k=v,k2=v2`)
    selector: str


def is_ready(pod: dict[str, Any]) -> bool:
    """The pod's Ready condition is True (what the DaemonSet controller reads too)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def successors(me: Identity, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods among `pods` that may take over from us: not us, and not being deleted."""
    return [
        p
        for p in pods
        if (p.get("metadata") or {}).get("name") != me.pod_name
        and not (p.get("metadata") or {}).get("deletionTimestamp")
    ]


async def wait_for_successor(client: PodLister, me: Identity, bound: float) -> str:
    """Return once a successor of ours is Ready, none is left, or `bound` seconds passed (see the
    module doc); what happened, for the log. Never raises: an API error ends the wait."""
    start = time.monotonic()
    deadline = start + bound
    waited_for: set[str] = set()
    while True:
        try:
            pods = await asyncio.to_thread(
                client.daemon_pods, me.namespace, me.selector, me.node_name, timeout=LIST_TIMEOUT
            )
        except Exception as e:  # any failure: stop as without a successor
            return f"could not list the DaemonSet's pods on this node ({e}): stopping now"
        others = successors(me, pods)
        names = sorted(str(p["metadata"]["name"]) for p in others)
        ready = [str(p["metadata"]["name"]) for p in others if is_ready(p)]
        took = time.monotonic() - start
        if ready:
            if not waited_for:
                return f"successor {ready[0]} is Ready: stopping now"
            return f"successor {ready[0]} Ready after {took:.2f}s: stopping now"
        if not others:
            if not waited_for:
                return "no successor on this node: stopping now"
            return f"successor {', '.join(sorted(waited_for))} gone after {took:.2f}s: stopping now"
        if time.monotonic() >= deadline:
            waiting = ", ".join(names)
            return f"successor {waiting} not Ready after {took:.2f}s (--successor-wait): stopping now"
        if not waited_for:
            log.info("Serving on until successor %s is Ready (at most %.1fs)", ", ".join(names), bound)
        waited_for.update(names)
        await asyncio.sleep(min(POLL_INTERVAL, max(0.0, deadline - time.monotonic())))


async def deleted_already(client: PodLister, me: Identity) -> bool:
    """Whether our own pod is being deleted (its deletionTimestamp set) now: asked once at start,
    after the signal handlers are set (see the module doc). False when our pod is not among the
    DaemonSet's pods on this node; ApiError (or OSError) when the LIST fails."""
    pods = await asyncio.to_thread(
        client.daemon_pods, me.namespace, me.selector, me.node_name, timeout=LIST_TIMEOUT
    )
    return any(
        (p.get("metadata") or {}).get("name") == me.pod_name
        and bool((p.get("metadata") or {}).get("deletionTimestamp"))
        for p in pods
    )
