"""The operator's Prometheus /metrics: its own counters, read at scrape time.

Nothing is counted twice: the controller's parts keep plain counters (node patches, status
writes, informer restarts, API requests...) and ``StatsCollector`` turns ``Controller.stats()``
into metric families when Prometheus scrapes. prometheus-client serves them (a thread), with the
process collector (RSS, CPU) beside them; the operator runs once per cluster, so its 2-3 MiB do
not multiply (docs/facts.md#client-memory).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

PREFIX = "patchbay_operator"

COUNTERS = {
    "reconciles": "Profile reconciles (kopf's create/update/resume handler calls).",
    "nodeEvents": "Node watch events folded into the cache.",
    "nodePatches": "JSON patches of node status that succeeded.",
    "nodePatchFailures": "JSON patches of node status that failed (retried).",
    "statusWrites": "Profile status writes.",
    "statusComputes": "Profile status computations (most end in no write: nothing changed).",
    "driftReassertions": "Node patches that set a capacity back to the value the operator last wrote "
    "there (something else changed it).",
    "inventoryLabelWrites": "Server-side applies of a node's inventory labels (one per inventory "
    "change that changes them; --inventory-node-labels).",
    "inventoryLabelFailures": "Applies of a node's inventory labels that failed (retried).",
}
GAUGES = {
    "nodes": "Nodes in the operator's cache.",
    "profiles": "DevicePluginProfiles known.",
    "queued": "Nodes queued or being patched (the work queue's depth).",
    "agentPods": "Agent pods the operator watches.",
    "deviceReports": "DeviceReports (one per profile and node) the operator holds.",
    "statusPending": "Profiles marked for a status recomputation.",
    "maxPatchesPerNode": "The most patches any one node has had (1 per change is the design).",
    "working": "1 when this replica writes, 0 while it waits for a peer (peering).",
    "eventsSuppressed": "Profile events not posted (deduplicated or rate-limited).",
}
LABELLED = {
    "watchRestarts": (
        "kind",
        "counter",
        "Informer watch restarts (410 relists and reconnects), by watched kind.",
    ),
    "apiRequests": (
        "verb",
        "counter",
        "Requests to the API server, by verb (WATCH counts each watch opened).",
    ),
    "events": ("type", "counter", "Events posted on profiles, by type."),
    "repairs": (
        "kind",
        "counter",
        "Objects the operator renders put back after a deletion or an edit, by kind.",
    ),
    "revisions": (
        "action",
        "counter",
        "Profiles' ControllerRevisions created, pruned (past revisionHistoryLimit) and recreated "
        "(the one in use, deleted by someone else).",
    ),
    "fieldsTakenOver": (
        "kind",
        "counter",
        "Edits left alone: another manager took fields by server-side apply (one Warning Event each).",
    ),
    "profileConditions": (
        ("profile", "condition"),
        "gauge",
        "1 while a profile's condition is True, else 0 (its last status written).",
    ),
}


ROLLOUT = {
    "rolloutHalted": (
        "patchbay_rollout_halted",
        "gauge",
        "1 while a profile's staged rollout is halted (a wave failed its gate or its deadline), else 0.",
    ),
    "rolloutWaves": (
        "patchbay_rollout_waves",
        "counter",
        "Waves of staged rollouts begun (the canary counts).",
    ),
}
"""The staged rollouts' metrics, named as docs/design/staged-rollouts.md names them."""


def metric_name(key: str) -> str:
    """``nodePatches`` -> ``patchbay_operator_node_patches`` (counters get ``_total`` when exposed)."""
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in key)
    return f"{PREFIX}_{snake}"


class StatsCollector(Collector):
    def __init__(self, stats: Callable[[], Mapping[str, Any]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        for key, text in COUNTERS.items():
            yield CounterMetricFamily(metric_name(key), text, value=float(s.get(key, 0)))
        for key, text in GAUGES.items():
            yield GaugeMetricFamily(metric_name(key), text, value=float(s.get(key, 0)))
        for key, (label, kind, text) in LABELLED.items():
            names = [label] if isinstance(label, str) else list(label)
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                metric_name(key), text, labels=names
            )
            for value, n in sorted((s.get(key) or {}).items()):
                values = [str(value)] if isinstance(label, str) else [str(v) for v in value]
                family.add_metric(values, float(n))
            yield family
        halted = GaugeMetricFamily(*ROLLOUT["rolloutHalted"][::2], labels=["profile"])
        for profile, n in sorted((s.get("rolloutHalted") or {}).items()):
            halted.add_metric([profile], float(n))
        yield halted
        name, _, text = ROLLOUT["rolloutWaves"]
        yield CounterMetricFamily(name, text, value=float(s.get("rolloutWaves", 0)))


def serve(address: tuple[str, int], stats: Callable[[], Mapping[str, Any]]) -> None:
    """Serve /metrics on ``address`` in a thread of prometheus-client's."""
    registry = CollectorRegistry()
    registry.register(StatsCollector(stats))
    ProcessCollector(registry=registry)
    start_http_server(address[1], addr=address[0], registry=registry)
