"""What a profile change costs the API server: the requests (by verb and resource) and the watch
events (by resource) it served for the resources a change can touch, from its own metrics, less
the background (kwok's node heartbeats and leases, the controllers' resyncs)."""

from __future__ import annotations

import time
from collections.abc import Callable

from patchbay_bench.kube import WRITE_VERBS, Metrics
from patchbay_bench.setup import Cluster

#: what a profile change can cause: everything else (kwok's node heartbeats and leases, the
#: controllers' resyncs) is background here
RELEVANT = {
    "configmaps",
    "daemonsets",
    "devicepluginprofiles",
    "devicereports",
    "pods",
    "controllerrevisions",
    "events",
}


Counts = dict[str, dict[str, float]]


def served(before: Metrics, after: Metrics) -> Counts:
    """Requests ("verb/resource") and watch events ("resource") served between two scrapes of the
    API server's metrics, for the RELEVANT resources."""
    out: Counts = {"requests": {}, "events": {}}
    for part, name, keys in (
        ("requests", "apiserver_request_total", ("verb", "resource")),
        ("events", "apiserver_watch_events_total", ("resource",)),
    ):
        a, b = before.by(name, *keys), after.by(name, *keys)
        for k, v in b.items():
            if k[-1] in RELEVANT:
                out[part]["/".join(k)] = v - a.get(k, 0)
    return out


def window(cluster: Cluster, seconds: float, action: Callable[[], object] | None = None) -> Counts:
    """Requests (by verb/resource) and watch events (by kind) the API server served in ``seconds``
    after ``action()`` (None: an idle window), for the resources a change can touch."""
    before = cluster.api.metrics()
    if action is not None:
        action()
    time.sleep(seconds)
    return served(before, cluster.api.metrics())


def minus(change: Counts, idle: Counts) -> Counts:
    return {
        part: {k: v - idle[part].get(k, 0) for k, v in counts.items() if v - idle[part].get(k, 0) > 0}
        for part, counts in change.items()
    }


def writes(counts: dict[str, float]) -> float:
    return sum(v for k, v in counts.items() if k.split("/")[0] in WRITE_VERBS)
