"""Every scenario, in the order ``make bench SCENARIO=all`` runs them: those that need no real node
first, then those on the real node, which share one cluster with the real node and the chart."""

from __future__ import annotations

from patchbay_bench.harness import Scenario
from patchbay_bench.scenarios import (
    agent,
    agent_memory,
    cluster_path,
    devcluster,
    dra_path,
    dra_scale,
    health_scale,
    health_writes,
    http_flood,
    images,
    kubectl_scale,
    live_reconfig,
    node_agent_api_cost,
    node_memory,
    operator_memory,
    rollout_scale,
    rollouts,
    static_scale,
)

SCENARIOS: dict[str, Scenario] = {
    m.SCENARIO.name: m.SCENARIO
    for m in (
        devcluster,
        agent,
        agent_memory,
        http_flood,
        live_reconfig,
        node_memory,
        health_writes,
        operator_memory,
        static_scale,
        health_scale,
        kubectl_scale,
        dra_scale,
        node_agent_api_cost,
        rollout_scale,
        images,
        cluster_path,
        dra_path,
        rollouts,
    )
}
