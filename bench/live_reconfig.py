"""A profile change -> effective on the node, through the node agent's API watch: p50/p99 of 10.

The node agent (the real program, a host process) follows its ConfigMap and its Node on a real
local control plane (devcluster, no real node: no lock needed) and registers with a Python kubelet
peer. Each round patches the ConfigMap's `tokens` profile and measures until the peer's healthy
count of example.com/tokens is the new one: apply -> effective. Two series in one run: changes
of its virtual count, which the agent applies IN PLACE (same registration and stream), and, as
the baseline, changes of its `sharing.replicas` (new device IDs), which restart the profile's unit
(a new socket, a new registration: what every change did before in-place reconfiguration).
Meanwhile example.com/serial, which no round changes, is sampled every 5 ms: its minimum says
whether an untouched resource ever dipped. Devices are FAKE (files).

    python bench/live_reconfig.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

sys.path[:0] = [str(Path(__file__).resolve().parent)]
from node_memory import AGENT, ENV, NODE, Peers, wait  # noqa: E402

from patchbay_devcluster import DevCluster  # noqa: E402

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


def count(peers: Peers, name: str) -> int:
    return peers.healthy(f"example.com/{name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="livecfg", dir="/tmp") as tmp:
        work = Path(tmp)
        cluster = DevCluster(work / "cluster")
        cluster.up(nodes=1, timeout=120)
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        core = client.CoreV1Api(api)
        tree, plugin_dir = work / "host", work / "dp"
        (tree / "dev").mkdir(parents=True)
        plugin_dir.mkdir()
        for i in range(4):
            (tree / "dev" / f"ttyUSB{i}").write_text("")
        cfg = work / "node.yaml"
        cfg.write_text(node_config(2))
        core.create_namespaced_config_map(
            "default", {"metadata": {"name": NAME}, "data": {"node.yaml": node_config(2)}}
        )
        peers = Peers(plugin_dir, work / "pr.sock")
        argv = [
            AGENT, "--node-config", str(cfg), "--watch-config", NAME, "--node-name", NODE,
            "--device-plugin-dir", str(plugin_dir), "--host-root", str(tree), "--host-path-prefix", str(tree),
            "--kubeconfig", str(cluster.kubeconfig), "--report-namespace", "default",
            "--pod-resources-socket", str(work / "pr.sock"), "--http-address", "off",
        ]  # fmt: skip
        log = open(work / "agent.log", "wb")  # noqa: SIM115
        agent = subprocess.Popen(argv, env={**os.environ, **ENV}, stdout=log, stderr=log)
        samples: list[int] = []
        done = threading.Event()
        try:
            wait(
                "both registered",
                lambda: peers.healthy("example.com/serial") == 4 and peers.healthy("example.com/tokens") == 2,
            )

            def sample() -> None:
                while not done.is_set():
                    samples.append(peers.healthy("example.com/serial"))
                    time.sleep(0.005)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            series: dict[str, list[float]] = {}
            for kind in ("in place (virtual count)", "unit restarted (sharing.replicas)"):
                times = series[kind] = []
                for r in range(args.rounds):
                    tokens, replicas = (3 + r % 2, 1) if kind.startswith("in place") else (2, 2 - r % 2)
                    want = tokens * replicas  # 3, 4, 3, ... / 4, 2, 4, ...
                    t0 = time.perf_counter()
                    core.patch_namespaced_config_map(
                        NAME, "default", {"data": {"node.yaml": node_config(tokens, replicas)}}
                    )
                    # Polled every 1 ms: the figure is the change's, not the poll's (an earlier run
                    # of this bench polled every 200 ms and reported that).
                    wait(
                        f"tokens = {want}", lambda w=want: peers.healthy("example.com/tokens") == w, 30, 0.001
                    )
                    times.append(time.perf_counter() - t0)
                    time.sleep(0.5)
            done.set()
            sampler.join(2)
            regs = sum(r.request.resource_name == "example.com/serial" for r in peers.kubelet.registrations)
            print("apply -> effective (ConfigMap patch -> the kubelet peer's new count of tokens):")
            p50s = {}
            for kind, times in series.items():
                times.sort()
                p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
                p50s[kind] = statistics.median(times)
                print(
                    f"  {kind}, {len(times)} rounds: p50 {p50s[kind] * 1000:.0f} ms   "
                    f"p99 {p99 * 1000:.0f} ms   max {times[-1] * 1000:.0f} ms"
                )
            a, b = p50s.values()
            print(f"  in place / restarted (p50): {a / b:.2f}x")
            print(
                f"  example.com/serial (never changed): {len(samples)} samples every 5 ms, min {min(samples)}"
            )
            print(f"  max {max(samples)}; its registrations: {regs}")
        finally:
            done.set()
            agent.terminate()
            agent.wait(20)
            log.close()
            peers.stop()
            cluster.down()


if __name__ == "__main__":
    main()
