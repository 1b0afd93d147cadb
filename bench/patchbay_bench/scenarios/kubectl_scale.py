"""``kubectl patchbay`` at scale: a cluster of N kwok nodes holding what a real one of Patchbay
holds at that size (a DevicePlugin and a Static profile selecting every node, the DevicePlugin
profile's agent DaemonSet with its N pods run by kwok, no operator; N DeviceReports of 4 devices,
1% Unhealthy, a quarter held by a pod; the Static count in every node's status). Each command
runs as a user runs it (a fresh process), every command once per round, interleaved; beside each,
``kubectl get -o json`` of the objects it joins (the baseline, which leaves the joining to the
reader): for ``devices`` over both profiles the reports, the nodes and the pods (the Static
profile's capacity and holders; until 2026-12-03 the reports alone, which made the join look
twice the read: docs/benchmarks.md); for ``devices --node`` and ``why`` every report (more than
they read). Wall time and the process's CPU time (user + system: the steadier figure on a shared
machine)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from patchbay_bench.harness import Run, Value, interleave, wait
from patchbay_bench.kube import NODES, PROFILES, profile, reports
from patchbay_bench.setup import bin_dir, kwok_cluster

NAMESPACE = "patchbay-system"
LABEL = "bench.patchbay.dev/kubectl"
DP, STATIC = "serial", "dongle"
R_DP, R_STATIC = "example.com/serial", "example.com/dongle"
DEVICES = 4
BASE_REPORTS, BASE_NODES = "kubectl get devicereports -o json", "kubectl get nodes -o json"
#: what `devices` joins where a Static profile is listed (since c4d00cc): the reports, the nodes
#: (a Static row's capacity) and the pods (a Static row's holders), in one kubectl process
BASE_JOINED = "kubectl get devicereports,nodes,pods -A -o json"
#: each command of the plugin, and the baseline read of what it joins
COMMANDS = {
    "devices": BASE_JOINED,
    "devices --unhealthy": BASE_JOINED,
    "devices --node N": BASE_REPORTS,
    "nodes": BASE_NODES,
    "nodes --node N": BASE_NODES,
    f"why {DP}": BASE_REPORTS,
}


def report(node: str, i: int) -> dict[str, Any]:
    devices = []
    for d in range(DEVICES):
        dev: dict[str, Any] = {"id": f"ttyUSB{d}", "health": "Healthy", "since": "2026-11-01T00:00:00Z"}
        if (i * DEVICES + d) % 100 == 0:
            dev.update(health="Unhealthy", reason="Vanished", message=f"/dev/ttyUSB{d} is gone")
        if d == 0 and i % 4 == 0:
            dev["pods"] = [{"namespace": "apps", "name": f"modem-{i}", "container": "c"}]
        devices.append(dev)
    healthy = sum(1 for d in devices if d["health"] == "Healthy")
    summary = {
        "total": DEVICES,
        "healthy": healthy,
        "unhealthy": DEVICES - healthy,
        "allocated": sum(1 for d in devices if d.get("pods")),
    }
    return {
        "apiVersion": "patchbay.dev/v1beta1",
        "kind": "DeviceReport",
        "metadata": {"name": f"{DP}.{node}", "namespace": NAMESPACE, "labels": {"patchbay.dev/profile": DP}},
        "profile": DP,
        "nodeName": node,
        "resourceName": R_DP,
        "observedAt": "2026-11-01T00:00:00Z",
        "summary": summary,
        "devices": devices,
    }


def daemonset() -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": "patchbay-agent", "patchbay.dev/profile": DP}
    pod = {
        "nodeSelector": {LABEL: "1"},
        "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "agent", "image": "example.invalid/patchbay-agent:bench"}],
    }
    return {
        "metadata": {"name": f"patchbay-{DP}", "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def selecting(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return profile(name, {"nodeSelector": {"matchLabels": {LABEL: "1"}}, **spec})


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one command, which must succeed."""
    with tempfile.TemporaryFile() as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - t0
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code
    if code != 0:
        raise RuntimeError(f"{argv[0]} {' '.join(argv[1:3])} exited {code}")
    return wall, usage.ru_utime + usage.ru_stime


def run(r: Run) -> None:
    n = r.integer("nodes")
    with kwok_cluster(r, n, prefix="kb-", labels={LABEL: "1"}) as cluster:
        api = cluster.api
        cluster.namespace(NAMESPACE)
        api.create(
            PROFILES,
            selecting(
                DP,
                {
                    "resourceName": R_DP,
                    "mode": "DevicePlugin",
                    "plugin": {"discovery": {"virtual": {"count": 4}}},
                },
            ),
        )
        api.create(
            PROFILES,
            selecting(STATIC, {"resourceName": R_STATIC, "mode": "Static", "static": {"capacity": 3}}),
        )
        api.create(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets", daemonset())
        esc = R_STATIC.replace("/", "~1")

        def fill(item: tuple[int, str]) -> None:
            i, node = item
            api.create(reports(NAMESPACE), report(node, i))
            api.json_patch(
                f"{NODES}/{node}/status",
                [
                    {"op": "add", "path": f"/status/{k}/{esc}", "value": "3"}
                    for k in ("capacity", "allocatable")
                ],
            )

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(fill, enumerate(cluster.nodes)))
        ds = f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/patchbay-{DP}"
        wait(
            "the agent pods ready",
            lambda: ((api.get(ds) or {}).get("status") or {}).get("numberReady", 0) >= n,
            max(300, n * 0.2),
            2.0,
        )
        venv = Path(sys.executable).parent
        env = {
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "PATH": f"{venv}:{bin_dir()}:{os.environ['PATH']}",
        }
        plugin, kubectl, middle = (
            str(venv / "kubectl-patchbay"),
            str(bin_dir() / "kubectl"),
            cluster.nodes[n // 2],
        )
        argv = {label: [plugin, *label.replace(" N", f" {middle}").split()] for label in COMMANDS}
        argv[BASE_REPORTS] = [kubectl, "get", "devicereports", "-n", NAMESPACE, "-o", "json"]
        argv[BASE_NODES] = [kubectl, "get", "nodes", "-o", "json"]
        argv[BASE_JOINED] = [kubectl, "get", "devicereports,nodes,pods", "-A", "-o", "json"]

        def side(a: list[str]) -> Callable[[int], tuple[float, float]]:
            return lambda _i: timed(a, env)

        got = interleave(r.rounds(), {label: side(a) for label, a in argv.items()})
        note = f"{n} kwok nodes, {n} DeviceReports of {DEVICES} devices"
        for label, base in COMMANDS.items():
            for k, what in ((0, "wall"), (1, "CPU")):
                r.figure(
                    f"kubectl patchbay {label.replace(DP, '<profile>')}: {what} time",
                    "s",
                    {
                        f"kubectl patchbay {label}": [x[k] for x in got[label]],
                        base: [x[k] for x in got[base]],
                    },
                    headline=(label in ("devices", "nodes") or label.startswith("why")) and k == 0,
                    note=note,
                )


def figures(params: Mapping[str, Value]) -> list[str]:
    """The figures a run records (catalogue.toml): one per command."""
    return [f"kubectl patchbay {label.replace(DP, '<profile>')}: wall time" for label in COMMANDS]
