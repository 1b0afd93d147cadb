"""API writes per device health change, counted on the real agent's requests: the node agent (the
real program, a host process) serves a DevicePlugin profile over FAKE device files, registers with
the Python kubelet peer and writes its DeviceReport to a real local control plane in which nothing
else writes DeviceReports (no operator runs). Each round one device file is removed, the report is
waited Unhealthy, the file comes back, the report is waited Healthy: two health changes. Counted
over the round: the write requests on devicereports the API server served
(``apiserver_request_total``, every verb that writes) and the agent's own count of its report
writes (``patchbay_agent_report_writes_total`` on its /metrics, 127.0.0.1). A burst, every device
at once, is counted the same way. Each round uses another device: the same one removed again
within the flap window (30 s) is a flapping device, held Unhealthy by design."""

from __future__ import annotations

import functools
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml

from patchbay_bench.harness import Run, wait
from patchbay_bench.kube import Metrics, reports, writes
from patchbay_bench.setup import AGENT, IMAGE_ENV, Child, Cluster, HostNode, kwok_cluster
from patchbay_devcluster.procs import free_port

PROFILE, RESOURCE = "serial", "example.com/serial"


def unhealthy(cluster: Cluster, node: str) -> set[str]:
    """Device IDs the agent's DeviceReport does not call Healthy (every listed one: None)."""
    rep = cluster.api.get(f"{reports('default')}/{PROFILE}.{node}")
    if rep is None:
        return {"<no report>"}
    return {d["id"] for d in rep.get("devices") or [] if d.get("health") != "Healthy"}


def run(r: Run) -> None:
    rounds = r.rounds()
    burst_devices = 4
    devices = rounds + burst_devices
    port = free_port()
    with kwok_cluster(r, nodes=1) as cluster, HostNode(r.work, cluster.nodes[0]) as node:
        files = [node.device(f"ttyUSB{i}") for i in range(devices)]
        entry = {
            "profile": PROFILE,
            "mode": "DevicePlugin",
            "resourceName": RESOURCE,
            "nodeSelectorTerms": [[]],
            "plugin": {
                "discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}},
                "health": {"recoveryHoldSeconds": r.integer("recovery_hold")},
            },
        }
        (r.work / "node.yaml").write_text(yaml.safe_dump({"profiles": [entry]}))
        argv = [
            AGENT,
            "--node-config",
            str(r.work / "node.yaml"),
            *node.agent_args(cluster.kubeconfig, http=f"127.0.0.1:{port}"),
        ]

        def agent_writes() -> float:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
            return Metrics.parse(text).sum("patchbay_agent_report_writes_total")

        def count(change: Callable[[], None]) -> tuple[int, float]:
            """(API server's devicereports writes, the agent's report writes) over ``change()``,
            and ``quiet`` seconds after it (a late write would count)."""
            api0, agent0 = cluster.api.metrics(), agent_writes()
            change()
            time.sleep(r.number("quiet"))
            return writes(api0, cluster.api.metrics(), "devicereports"), agent_writes() - agent0

        r.log("cluster up; starting the agent")
        with Child(argv, r.work / "agent.log", IMAGE_ENV):
            wait("the report with every device Healthy", lambda: not unhealthy(cluster, node.name), 60, 0.05)
            r.log("the agent reported every device Healthy")
            time.sleep(1.0)
            api_writes, own_writes = [], []

            def gone_and_back(dev: Path) -> None:
                dev.unlink()
                wait(
                    "the report to say Unhealthy",
                    lambda: any(x.endswith(dev.name) for x in unhealthy(cluster, node.name)),
                    60,
                    0.02,
                )
                dev.write_text("")
                wait("the report to say Healthy again", lambda: not unhealthy(cluster, node.name), 60, 0.02)

            for i in range(rounds):
                a, o = count(functools.partial(gone_and_back, files[i]))
                api_writes.append(a / 2)
                own_writes.append(o / 2)

            def burst() -> None:
                """Devices no round touched (a device removed again within the flap window is held)."""
                for f in files[rounds:]:
                    f.unlink()
                wait(
                    "the burst's devices Unhealthy",
                    lambda: len(unhealthy(cluster, node.name)) == burst_devices,
                    60,
                    0.02,
                )
                for f in files[rounds:]:
                    f.write_text("")
                wait("every device Healthy again", lambda: not unhealthy(cluster, node.name), 60, 0.02)

            ba, bo = count(burst)
        r.figure(
            "API writes per device health change (the real agent, counted by the API server)",
            "writes",
            {"API server: devicereports writes": api_writes, "the agent's own count": own_writes},
            headline=True,
            note="a round: one device gone, then back (2 changes); nothing else writes DeviceReports",
        )
        r.figure(
            "API writes for a burst (4 devices gone at once, then back)",
            "writes",
            {"API server: devicereports writes": [ba], "the agent's own count": [bo]},
            note=f"{burst_devices} devices gone at once, then all back: 2 bursts of changes",
        )
