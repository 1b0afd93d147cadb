"""A profile change -> effective on the node, through the node agent's API watch: the node agent
(the real program, a host process) follows its ConfigMap on a real local control plane and
registers with the Python kubelet peer. Each round patches the ConfigMap's ``tokens`` profile and
times until the peer's healthy count of example.com/tokens is the new one (polled every 1 ms).
Sides, interleaved: a change of its virtual count, applied IN PLACE (same registration and stream),
and as the baseline a change of ``sharing.replicas`` (new device IDs), which restarts the
profile's unit (a new socket and registration: what every change did before in-place
reconfiguration). Meanwhile example.com/serial, which no round changes, is sampled every 5 ms."""

from __future__ import annotations

import threading
import time
from typing import Any

import yaml

from patchbay_bench.harness import Run, interleave, wait
from patchbay_bench.kube import ns_path
from patchbay_bench.setup import AGENT, IMAGE_ENV, Child, HostNode, kwok_cluster

NAME = "patchbay-node-agent"


def node_config(tokens: int, replicas: int = 1) -> str:
    profiles: list[dict[str, Any]] = [
        {
            "profile": "serial",
            "mode": "DevicePlugin",
            "resourceName": "example.com/serial",
            "plugin": {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}},
            "nodeSelectorTerms": [[]],
        },
        {
            "profile": "tokens",
            "mode": "DevicePlugin",
            "resourceName": "example.com/tokens",
            "plugin": {"discovery": {"virtual": {"count": tokens}}, "sharing": {"replicas": replicas}},
            "nodeSelectorTerms": [[]],
        },
    ]
    return yaml.safe_dump({"profiles": profiles})


def run(r: Run) -> None:
    with kwok_cluster(r, nodes=1, crds=False) as cluster, HostNode(r.work) as node:
        for i in range(4):
            node.device(f"ttyUSB{i}")
        cm = f"{ns_path('default', 'configmaps')}/{NAME}"
        cluster.api.create(
            ns_path("default", "configmaps"),
            {"metadata": {"name": NAME}, "data": {"node.yaml": node_config(2)}},
        )
        (r.work / "node.yaml").write_text(node_config(2))
        argv = [
            AGENT,
            "--node-config",
            str(r.work / "node.yaml"),
            "--watch-config",
            NAME,
            *node.agent_args(cluster.kubeconfig),
        ]
        samples: list[int] = []
        done = threading.Event()
        with Child(argv, r.work / "agent.log", IMAGE_ENV):
            wait(
                "both registered",
                lambda: node.healthy("example.com/serial") == 4 and node.healthy("example.com/tokens") == 2,
                60,
                0.05,
            )

            def sample() -> None:
                while not done.is_set():
                    samples.append(node.healthy("example.com/serial"))
                    time.sleep(0.005)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()

            def change(tokens: int, replicas: int) -> float:
                want = tokens * replicas
                t0 = time.perf_counter()
                cluster.api.merge(cm, {"data": {"node.yaml": node_config(tokens, replicas)}})
                wait(f"tokens = {want}", lambda: node.healthy("example.com/tokens") == want, 30, 0.001)
                took = time.perf_counter() - t0
                time.sleep(0.5)
                return took * 1000

            try:
                got = interleave(
                    r.rounds(),
                    {
                        "in place (virtual count)": lambda i: change(3 + i % 2, 1),  # 3, 4, 3, ...
                        "unit restarted (sharing.replicas)": lambda i: change(2, 2 - i % 2),  # 4, 2, 4, ...
                    },
                )
            finally:
                done.set()
                sampler.join(2)
        regs = sum(x.request.resource_name == "example.com/serial" for x in node.kubelet.registrations)
        r.figure(
            "profile change -> effective on the node (ConfigMap patch -> the kubelet's new count)",
            "ms",
            got,
            headline=True,
            note="the node agent as a host process, the Python kubelet peer",
        )
        r.figure(
            "the untouched resource during the changes: lowest count (of 4)",
            "devices",
            {"example.com/serial": [min(samples)]},
            note=f"{len(samples)} samples every 5 ms, max {max(samples)}",
        )
        r.figure("the untouched resource: its registrations", "count", {"example.com/serial": [regs]})
