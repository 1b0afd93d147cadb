"""The user's path on the real node (the chart installed with the images built here, the operator
and agents as pods), each figure against a baseline, interleaved round by round:

- ``kubectl apply`` of a Static profile -> the node's allocatable; baseline: ``kubectl patch``
  of the node's status (one command putting the value there);
- ``kubectl apply`` of a DevicePlugin profile -> the kubelet's device manager counts the
  devices (PodResources ``GetAllocatableResources``) and -> the node's allocatable; baseline: the
  same agent and config started as a process on the node (a bare device plugin without the
  operator, DaemonSet, image and pod around it);
- a device file removed -> the kubelet counts it out (the baseline: what the kubelet learns
  from the agent's ListAndWatch), the agent's DeviceReport says Unhealthy, the profile's status
  names it; pair by pair;
- the agent pod's memory: its process's RSS and PSS, what its memory cgroup is charged;
- one rollout of the agent DaemonSet: the lowest allocatable seen from the API server and the
  kubelet, registrations, time to complete.

Devices are FAKE: character devices that are the null device, under /dev/patchbay-bench.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from patchbay_agent.kubelet.podresources import get_allocatable_resources
from patchbay_bench.harness import Run, interleave, wait
from patchbay_bench.kube import MERGE_PATCH, NODES, PROFILES, profile, reports
from patchbay_bench.peers import run_rollout
from patchbay_bench.setup import (
    AGENTS_NS,
    NODE,
    SESSION,
    Cluster,
    agent_pods,
    fake_devices,
    pod_memory,
    restore,
    vanish,
)

FAKE_DEV, DEVICES, LABEL = Path("/dev/patchbay-bench"), 4, "patchbay.dev/bench"
PLUGIN: dict[str, Any] = {
    "discovery": {"paths": {"globs": [f"{FAKE_DEV}/ttyB*"]}},
    "health": {"periodSeconds": 5},
}


class UserPath:
    """The bench's handles on the real node."""

    def __init__(self, r: Run, cluster: Cluster) -> None:
        self.r, self.c, self.api = r, cluster, cluster.api
        self.socket = cluster.dev.real_node().paths.pod_resources_socket

    def allocatable(self, resource: str) -> str | None:
        node = self.api.get(f"{NODES}/{NODE}") or {}
        return ((node.get("status") or {}).get("allocatable") or {}).get(resource)

    def kubelet_count(self, resource: str) -> int:
        try:
            return asyncio.run(get_allocatable_resources(self.socket, rpc_timeout=2)).count(resource)
        except Exception:
            return 0

    def apply(self, body: dict[str, Any]) -> None:
        subprocess.run(
            self.c.kubectl("apply", "-f", "-"),
            input=json.dumps(body),
            text=True,
            check=True,
            capture_output=True,
        )

    def delete(self, name: str, resource: str) -> None:
        subprocess.run(self.c.kubectl("delete", "dpp", name, "--wait=true"), check=True, capture_output=True)
        wait("the resource gone from the node", lambda: self.allocatable(resource) in (None, "0"))

    def apply_to(self, name: str, spec: dict[str, Any], resource: str, want: int) -> tuple[float, float]:
        """``kubectl apply`` -> (the kubelet's count, the node's allocatable) in seconds; the
        allocatable is not waited for (nan) unless the scenario asks."""
        body = profile(name, spec)
        t0 = time.monotonic()
        self.apply(body)
        kubelet = float("nan")
        if spec["mode"] != "Static":
            wait("the kubelet's count", lambda: self.kubelet_count(resource) == want)
            kubelet = time.monotonic() - t0
        api = float("nan")
        if spec["mode"] == "Static" or self.r.flag("allocatable"):
            wait("the node's allocatable", lambda: self.allocatable(resource) == str(want))
            api = time.monotonic() - t0
        self.delete(name, resource)
        return kubelet, api

    def patch_status(self, resource: str) -> float:
        """The Static baseline: ``kubectl patch`` of the node's status."""
        esc = resource.replace("/", "~1")
        ops = [{"op": "add", "path": f"/status/{k}/{esc}", "value": "4"} for k in ("capacity", "allocatable")]
        argv = self.c.kubectl(
            "patch", "node", NODE, "--subresource=status", "--type=json", "-p", json.dumps(ops)
        )
        t0 = time.monotonic()
        subprocess.run(argv, check=True, capture_output=True)
        wait("the node's allocatable", lambda: self.allocatable(resource) == "4")
        took = time.monotonic() - t0
        self.api.json_patch(
            f"{NODES}/{NODE}/status",
            [{"op": "remove", "path": f"/status/{k}/{esc}"} for k in ("capacity", "allocatable")],
        )
        wait("the value gone", lambda: self.allocatable(resource) is None)
        return took

    def bare_agent(self, resource: str) -> tuple[float, float]:
        """The DevicePlugin baseline: the same agent and config as a process on the node."""
        cfg = self.r.work / "agent.yaml"
        cfg.write_text(yaml.safe_dump({"resourceName": resource, "plugin": PLUGIN}))
        argv = [
            sys.executable,
            "-m",
            "patchbay_agent.main",
            "--config",
            str(cfg),
            "--node-name",
            NODE,
            "--http-address",
            "off",
        ]
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait("the kubelet's count", lambda: self.kubelet_count(resource) == DEVICES)
            kubelet, api = time.monotonic() - t0, float("nan")
            if self.r.flag("allocatable"):
                wait("the node's allocatable", lambda: self.allocatable(resource) == str(DEVICES))
                api = time.monotonic() - t0
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)
        # The kubelet keeps a vanished plugin's resource at 0; the next run starts from there.
        wait(
            "the resource at 0",
            lambda: self.allocatable(resource) in (None, "0") or not self.r.flag("allocatable"),
        )
        return kubelet, api

    def vanish_to_status(self, profile: str, resource: str, device: Path) -> dict[str, float]:
        def report_unhealthy() -> bool:
            rep = self.api.get(f"{reports(AGENTS_NS)}/{profile}.{NODE}") or {}
            return any(
                d["id"].endswith(device.name) and d["health"] != "Healthy" for d in rep.get("devices", [])
            )

        def status_names() -> bool:
            problems = ((self.api.get(f"{PROFILES}/{profile}") or {}).get("status") or {}).get(
                "problems"
            ) or []
            return any(p.get("device", "").endswith(device.name) for p in problems)

        pending = {
            "kubelet": lambda: self.kubelet_count(resource) == DEVICES - 1,
            "report": report_unhealthy,
            "status": status_names,
        }
        out: dict[str, float] = {}
        t0 = time.monotonic()
        rdev = vanish(device)
        while pending and time.monotonic() < t0 + 120:
            for key, check in list(pending.items()):
                if check():
                    out[key] = time.monotonic() - t0
                    del pending[key]
            time.sleep(0.02)
        restore(device, rdev)
        if pending:
            raise TimeoutError(f"waiting for {sorted(pending)} after a device vanished")
        # The Node's allocatable too: it lags the kubelet by its 10 s status sync.
        wait(
            "everything healthy again",
            lambda: (
                (self.allocatable(resource) == str(DEVICES) or not self.r.flag("allocatable"))
                and self.kubelet_count(resource) == DEVICES
                and not report_unhealthy()
                and not status_names()
            ),
            180,
            0.1,
        )
        return out


def run(r: Run) -> None:
    PLUGIN["health"]["recoveryHoldSeconds"] = r.integer("recovery_hold")
    cluster = SESSION.chart_cluster(r)
    b = UserPath(r, cluster)
    cluster.label_node(NODE, {LABEL: "yes"})
    selector = {"matchLabels": {LABEL: "yes"}}
    rounds = r.rounds()
    with fake_devices(FAKE_DEV, [f"ttyB{i}" for i in range(DEVICES)]):
        static: dict[str, Any] = {
            "resourceName": "bench.patchbay.dev/dongle",
            "mode": "Static",
            "nodeSelector": selector,
            "static": {"capacity": 4},
        }
        got = interleave(
            rounds,
            {
                "kubectl apply of a Static profile": lambda i: b.apply_to(
                    f"bench-static-{i}", static, static["resourceName"], 4
                )[1],
                "kubectl patch of the node's status": lambda _i: b.patch_status("bench.patchbay.dev/direct"),
            },
        )
        r.figure("user's path: apply -> node allocatable, Static", "s", got, headline=True)
        dp: dict[str, Any] = {
            "resourceName": "bench.patchbay.dev/serial",
            "mode": "DevicePlugin",
            "nodeSelector": selector,
            "plugin": PLUGIN,
        }
        got2 = interleave(
            rounds,
            {
                "kubectl apply of a DevicePlugin profile": lambda i: b.apply_to(
                    f"bench-serial-{i}", dp, dp["resourceName"], DEVICES
                ),
                "the same agent as a process on the node": lambda _i: b.bare_agent("bench.patchbay.dev/bare"),
            },
        )
        r.figure(
            "user's path: apply -> the kubelet has the devices (PodResources), DevicePlugin",
            "s",
            {k: [x[0] for x in v] for k, v in got2.items()},
            headline=True,
            note="the operator renders the DaemonSet, the kubelet starts the pod, the agent registers",
        )
        if r.flag("allocatable"):
            r.figure(
                "user's path: apply -> node allocatable, DevicePlugin",
                "s",
                {k: [x[1] for x in v] for k, v in got2.items()},
                note="waits for the kubelet's node status update (10 s by default), for any device plugin",
            )
        else:
            r.missing(
                "user's path: apply -> node allocatable, DevicePlugin",
                "allocatable=false (the kubelet's 10 s status sync)",
            )
        # The shared node agent (a profile without agent settings: the default) serving one profile.
        shared = "bench-shared"
        b.apply(profile(shared, {**dp, "resourceName": "bench.patchbay.dev/shared"}))
        wait(
            "the node agent's devices",
            lambda: b.kubelet_count("bench.patchbay.dev/shared") == DEVICES,
            180,
            0.1,
        )
        time.sleep(r.number("settle"))  # start-up garbage settles before memory is read
        (pod,) = agent_pods(cluster, "app.kubernetes.io/component=node-agent")
        memory(r, cluster, pod, "the node agent pod, one DevicePlugin profile", headline=True)
        b.delete(shared, "bench.patchbay.dev/shared")
        # A profile with agent settings of its own: a DaemonSet of its own, rolled below.
        name, resource = "bench-roll", "bench.patchbay.dev/roll"
        own = {
            **dp,
            "resourceName": resource,
            "agent": {"updateStrategy": {"maxSurge": 1, "maxUnavailable": 0}},
        }
        b.apply(profile(name, own))
        wait("the profile's devices at the kubelet", lambda: b.kubelet_count(resource) == DEVICES, 180, 0.1)
        if r.flag("allocatable"):
            wait(
                "the profile's devices in the node's allocatable",
                lambda: b.allocatable(resource) == str(DEVICES),
            )
        time.sleep(r.number("settle"))
        (pod,) = agent_pods(cluster, f"app.kubernetes.io/name=patchbay-agent,patchbay.dev/profile={name}")
        memory(r, cluster, pod, "an agent pod of a profile's own, one DevicePlugin profile")
        vanishes = [b.vanish_to_status(name, resource, FAKE_DEV / "ttyB1") for _ in range(rounds)]
        r.figure(
            "a device vanishes -> the profile's status names it",
            "s",
            {
                "profile status": [x["status"] for x in vanishes],
                "DeviceReport says Unhealthy": [x["report"] for x in vanishes],
                "the kubelet counts it out (baseline)": [x["kubelet"] for x in vanishes],
            },
            headline=True,
            note="the operator's status debounce 0.3 s here (the chart's default is 1 s)",
        )
        core = client.CoreV1Api(cluster.api.official())
        result = run_rollout(
            api=cluster.api.official(),
            namespace=AGENTS_NS,
            daemonset=f"patchbay-{name}",
            agent_pods=lambda: (
                core.list_namespaced_pod(AGENTS_NS, label_selector=f"patchbay.dev/profile={name}").items
            ),
            change=lambda: cluster.api.call(
                "PATCH",
                f"{PROFILES}/{name}",
                # A change of the agent's own settings rolls its DaemonSet (a plugin change is
                # staged through its ConfigMap and rolls no pod).
                {"spec": {"agent": {"resources": {"requests": {"cpu": "11m"}}}}},
                content_type=MERGE_PATCH,
            ),
            node=NODE,
            resource=resource,
            pod_resources=b.socket,
            kubelet_log=cluster.dev.log_dir / "kubelet.log",
            settle=r.number("rollout_settle"),
        )
        f = result.figures()
        r.figure(
            "a rollout of the agent DaemonSet: lowest allocatable, API / kubelet (of 4)",
            "devices",
            {"API": [f["minAllocatableApi"]], "kubelet": [f["minAllocatableKubelet"]]},
            ratio=False,
            note=(
                f"{f['registrations']} registration(s), done in {f['rolloutSeconds']} s, "
                f"{f['samples']} samples"
            ),
        )
        subprocess.run(cluster.kubectl("delete", "dpp", name, "--wait=true"), capture_output=True)
        cluster.label_node(NODE, {LABEL: None})


def memory(r: Run, cluster: Cluster, pod: dict[str, Any], what: str, headline: bool = False) -> None:
    mem = pod_memory(cluster, pod["metadata"]["uid"])
    r.figure(
        f"{what}: process RSS / PSS",
        "MiB",
        {"RSS": [mem["rss"]], "PSS": [mem["pss"]]},
        headline=headline,
        ratio=False,
        note="reports on; smaps_rollup of the agent's processes",
    )
    r.figure(
        f"{what}: what its memory cgroup is charged (rss / usage)",
        "MiB",
        {"cgroup rss": [mem["cgroup_rss"]], "cgroup usage": [mem["cgroup_usage"]]},
        ratio=False,
    )
