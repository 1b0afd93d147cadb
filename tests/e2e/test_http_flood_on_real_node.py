"""The agent pod's HTTP port under a flood of idle connections, on the REAL node.

A profile's agent pod serves 4 FAKE devices on the real node. From the node (the address the
kubelet's own probes come from, so the flood shares their address's half of the cap, the hardest
case), a client keeps 2,000 half-sent requests open against the pod's IP on port 9464 for 15 s and
reopens whatever the agent closes (tests/support/flood.py, a process of its own). Meanwhile and
after:

* the kubelet keeps the devices: allocatable stays 4 and the DeviceReport keeps 4 healthy;
* the kubelet's gRPC calls to the agent are answered: a pod that asks for a device during the
  flood is admitted (Allocate) and runs with it;
* `/healthz` asked from the node, the flood's own address, is answered every time (each try
  within 30 s; the latencies are printed);
* the agent is not restarted and is Ready after the flood;
* the agent process's RSS after the flood is back within 4 MiB of its level before it (the
  endpoint of 2026-11-25 stayed 8.4 MiB above idle for good: docs/benchmarks.md, the flood
  bench), and the agent's own gauge says no connection is held.

No timing assertion: the waits are bounded, the latencies are printed for the note.
"""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from kubernetes import client
from prometheus_client.metrics_core import Metric
from support.clusters import Cluster
from support.promtext import parse, value
from support.realnode import (
    DEVICES,
    OnNode,
    busybox_pod,
    limits,
    pod_processes,
    serial_profile,
    wait_for,
)

from patchbay_devcluster import DevCluster

FLOOD = 2000
HOLD = 15.0
PORT = 9464
#: the flood client, run as a process of its own
FLOOD_SCRIPT = Path(__file__).resolve().parents[1] / "support" / "flood.py"


def healthz_ms(host: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(f"http://{host}:{PORT}/healthz", timeout=30) as r:
        assert r.status == 200 and r.read() == b"ok\n"
    return (time.perf_counter() - started) * 1000


def rss_mib(e2e_cluster: DevCluster, pod: client.V1Pod) -> float:
    """VmRSS of the agent process of `pod` (its one process but the pause), from the kernel."""
    (fields,) = pod_processes(e2e_cluster, pod).values()
    return int(fields["VmRSS"].split()[0]) / 1024


def scrape_if(host: str, ok: Callable[[dict[str, Metric]], bool]) -> dict[str, Metric] | None:
    """The agent's /metrics parsed, when `ok` holds for it; else None (to be polled again)."""
    with urllib.request.urlopen(f"http://{host}:{PORT}/metrics", timeout=30) as r:
        families = parse(r.read().decode())
    return families if ok(families) else None


def report_healthy(cluster: Cluster, namespace: str, name: str) -> int | None:
    reports = client.CustomObjectsApi(cluster.api).list_namespaced_custom_object(
        "patchbay.dev", "v1beta1", namespace, "devicereports"
    )["items"]
    mine = [r for r in reports if r.get("profile") == name and r.get("nodeName")]
    return int(mine[0]["summary"]["healthy"]) if len(mine) == 1 else None


def test_a_flood_of_idle_connections_costs_the_node_nothing(on_node: OnNode) -> None:
    patchbay, cluster, e2e_cluster, real_node, namespace, fake_dev = on_node
    name, res = serial_profile(cluster, fake_dev, real_node)
    try:
        (agent,) = wait_for("the agent pod Ready", lambda: patchbay.ready_agents(name), 120)
        host = agent.status.pod_ip
        full = (str(DEVICES), str(DEVICES))
        wait_for("devices on the node", lambda: cluster.values(real_node, res) == full, 60)
        wait_for(
            "4 healthy in the report", lambda: report_healthy(cluster, patchbay.namespace, name) == 4, 60
        )
        healthz_ms(host)
        time.sleep(2)
        idle = rss_mib(e2e_cluster, agent)

        probes: list[float] = []
        failures: list[str] = []
        seen_values: set[tuple[str | None, str | None]] = set()
        seen_healthy: set[int | None] = set()
        peak = idle
        # The flood in a process of its own: in a thread here it would hold the GIL the probe
        # below needs, and a probe's request sent late could be evicted unread.
        flood = subprocess.Popen(
            [sys.executable, str(FLOOD_SCRIPT), host, str(PORT), str(FLOOD), str(HOLD)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            end = time.monotonic() + HOLD
            pod = limits(busybox_pod("during-flood", real_node, "ls /dev | grep ttyE2E; sleep 3600"), res, 1)
            cluster.core.create_namespaced_pod(namespace, pod)
            while time.monotonic() < end:
                try:
                    probes.append(healthz_ms(host))
                except OSError as e:
                    failures.append(repr(e))
                seen_values.add(cluster.values(real_node, res))
                seen_healthy.add(report_healthy(cluster, patchbay.namespace, name))
                peak = max(peak, rss_mib(e2e_cluster, agent))
                time.sleep(0.5)
            out, _ = flood.communicate(timeout=60)
            opened = int(out.strip())
        finally:
            if flood.poll() is None:
                flood.kill()
                flood.wait()
        time.sleep(3)
        after = rss_mib(e2e_cluster, agent)

        def running() -> bool:
            p = cluster.core.read_namespaced_pod("during-flood", namespace)
            return p.status.phase == "Running"

        wait_for("the pod admitted during the flood running", running, 120)
        print(
            f"\nflood of {FLOOD} idle connections from the node for {HOLD:g} s: {opened:,} opened; "
            f"/healthz from the node: {len(probes)} answered, p50 {statistics.median(probes):.1f} ms, "
            f"max {max(probes):.0f} ms; {len(failures)} failed {failures[:3]}; "
            f"agent RSS idle {idle:.1f} MiB, peak {peak:.1f}, 3 s after {after:.1f}"
        )
        # The probe shares the flood's address (the node's), so its half of the cap: it must still
        # never be closed unanswered (it sends its request at once; 12 of 27 were, before the
        # endpoint accepted at most half an address's share per turn of its loop).
        assert not failures, failures
        assert seen_values == {full}, seen_values  # allocatable never dropped
        assert seen_healthy == {4}, seen_healthy
        (now,) = wait_for("the agent pod Ready after the flood", lambda: patchbay.ready_agents(name), 60)
        assert now.metadata.uid == agent.metadata.uid
        assert all(c.restart_count == 0 for c in now.status.container_statuses), now.status.container_statuses
        assert after <= idle + 4, f"RSS {idle:.1f} MiB before the flood, {after:.1f} MiB after"
        # Connections the flood began in its last seconds can still reach the agent after the flood
        # process has gone: a handshake whose last ACK the full accept queue dropped stays in the
        # pod's SYN-RECV and completes when the kernel resends its SYN-ACK (after 1, 2, 4, 8, 16 s,
        # tcp_synack_retries=5), and its request, resent the same way, may never come: the agent
        # answers it 408 after REQUEST_DEADLINE (5 s). So "no connection held" is waited for, bounded
        # by those timers (31 s + 5 s, and margin); a connection the agent leaks stays and fails it
        # (33 were open 4 s after the flood in one CI run, 2026-11-28).
        drained = time.monotonic()
        families = wait_for(
            "the agent's gauge back to this scrape alone",
            lambda: scrape_if(host, lambda f: value(f, "patchbay_agent_http_connections_open") == 1),
            90,
            every=1.0,
        )
        print(f"open connections back to 1 (this scrape) {time.monotonic() - drained:.1f} s after the checks")
        # The flood came from one address (the node's): it was held to its half of the cap.
        assert value(families, "patchbay_agent_http_connections_evicted_total", reason="address") > 0
    finally:
        with contextlib.suppress(client.ApiException):
            cluster.core.delete_namespaced_pod("during-flood", namespace, grace_period_seconds=0)
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-plugin": None})
