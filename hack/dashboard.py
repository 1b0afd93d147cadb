"""Patchbay's Grafana dashboard, built from code with Grafana's own Foundation SDK.

``PANELS`` is the dashboard's content as data (title, kind, unit, PromQL, legend), so the e2e can
run every panel's query against a real Prometheus (tests/e2e/test_prometheus_on_real_node.py);
``build`` turns it into the dashboard with the SDK's builders, and hack/generate.py writes the
JSON to charts/patchbay/files/dashboard.json, which the chart ships in a ConfigMap for Grafana's
dashboard sidecar (`metrics.dashboard.enabled`). `make verify` fails when the JSON is stale.

Why the Foundation SDK (grafana-foundation-sdk on PyPI): Grafana Labs generates it from Grafana's
own schemas for each Grafana release, in several languages, and maintains it; it is the successor
of grafonnet, which most Kubernetes projects (kube-prometheus, the mixins) build their dashboards
with. grafanalib, the other Python choice, was Weaveworks' and has had no release since 2024-01.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@dataclass(frozen=True)
class Panel:
    title: str
    kind: str  # "stat", "timeseries" or "table"
    expr: str
    unit: str = "short"
    legend: str = ""
    description: str = ""


PANELS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    (
        "Profiles",
        (
            Panel(
                "Profiles Ready",
                "stat",
                'sum(max by (profile) (patchbay_operator_profile_conditions{condition="Ready"}))',
                description="Profiles whose Ready condition is True.",
            ),
            Panel(
                "Profiles Stalled or Degraded",
                "stat",
                "count(max by (profile) "
                '(patchbay_operator_profile_conditions{condition=~"Stalled|Degraded"}) == 1) or vector(0)',
                description="kubectl patchbay why <profile> explains each.",
            ),
            Panel(
                "Profile conditions",
                "table",
                "max by (profile, condition) (patchbay_operator_profile_conditions)",
                description="1 = True.",
            ),
        ),
    ),
    (
        "Devices",
        (
            Panel(
                "Devices by health",
                "timeseries",
                "sum by (health) (patchbay_agent_devices)",
                legend="{{health}}",
            ),
            Panel(
                "Unhealthy devices",
                "table",
                "(patchbay_agent_device_healthy == 0) * on (namespace, pod, profile) "
                "group_left (node, resource) "
                "patchbay_agent_info",
                description="kubectl patchbay devices --unhealthy says why.",
            ),
            Panel(
                "Allocated devices by resource",
                "timeseries",
                "sum by (resource) (sum by (namespace, pod, profile) (patchbay_agent_allocated_devices) "
                "* on (namespace, pod, profile) group_left (resource) patchbay_agent_info)",
                legend="{{resource}}",
            ),
        ),
    ),
    (
        "Agents",
        (
            Panel(
                "Agents registered / running",
                "timeseries",
                "sum(patchbay_agent_registered)",
                legend="registered",
            ),
            Panel(
                "Allocate latency p99",
                "timeseries",
                "histogram_quantile(0.99, sum by (le) (rate(patchbay_agent_allocate_seconds_bucket[5m])))",
                unit="s",
                legend="p99",
            ),
            Panel(
                "Agent RSS",
                "timeseries",
                # One info series per profile in the shared node agent's pod: one per pod here.
                'process_resident_memory_bytes{pod=~".*"} * on (namespace, pod) group_left (node) '
                "max by (namespace, pod, node) (patchbay_agent_info)",
                unit="bytes",
                legend="{{node}}",
            ),
        ),
    ),
    (
        "Operator",
        (
            Panel(
                "Node patches and status writes /s",
                "timeseries",
                "label_replace(rate(patchbay_operator_node_patches_total[5m]), "
                '"what", "node patches", "", "")'
                " or label_replace(rate(patchbay_operator_status_writes_total[5m]), "
                '"what", "status writes", "", "")',
                unit="ops",
                legend="{{what}}",
            ),
            Panel(
                "Watch restarts (1h)",
                "timeseries",
                "sum by (kind) (increase(patchbay_operator_watch_restarts_total[1h]))",
                legend="{{kind}}",
            ),
            Panel(
                "Work queue",
                "timeseries",
                "sum(patchbay_operator_queued)",
                legend="queued",
            ),
        ),
    ),
)


def build() -> dict[str, Any]:
    """The dashboard as the JSON Grafana imports."""
    from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import DataSourceRef

    source = DataSourceRef(type_val=DATASOURCE["type"], uid=DATASOURCE["uid"])
    kinds: dict[str, Any] = {"stat": stat.Panel, "timeseries": timeseries.Panel, "table": table.Panel}
    board = (
        dashboard.Dashboard("Patchbay")
        .uid("patchbay")
        .description(
            "Patchbay's profiles, devices, agents and operator (charts/patchbay, hack/dashboard.py)."
        )
        .tags(["patchbay", "kubernetes", "devices"])
        .refresh("30s")
        .time("now-1h", "now")
        .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
    )
    for row, panels in PANELS:
        board = board.with_row(dashboard.Row(row))
        for p in panels:
            query = prometheus.Dataquery().expr(p.expr).ref_id("A")
            if p.legend:
                query = query.legend_format(p.legend)
            if p.kind == "table":
                query = query.instant()
            panel = kinds[p.kind]().title(p.title).datasource(source).unit(p.unit).span(8).height(7)
            if p.description:
                panel = panel.description(p.description)
            board = board.with_panel(panel.with_target(query))
    doc: dict[str, Any] = json.loads(JSONEncoder(sort_keys=True).encode(board.build()))
    return doc


def queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel, for the e2e check against a real Prometheus."""
    return [(p.title, p.expr) for _, panels in PANELS for p in panels]


if __name__ == "__main__":
    print(json.dumps(build(), indent=2, sort_keys=True))
