"""The shared node agent on the real node: two profiles without agent settings of their own are
served by ONE agent pod; a change of one profile's plugin section, then a node label that moves,
reach that pod live: no pod restarts, the changed resource follows, and the other resource's
allocatable, read from the kubelet's own PodResources GetAllocatableResources every 10 ms all
along, never dips. Devices are FAKE (character devices the fixture makes under /dev)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from support.clusters import Cluster
from support.realnode import DEVICES, SHARED_SELECTOR, Installed, add_fake_device, wait_for

from patchbay_agent.kubelet.podresources import get_allocatable_resources
from patchbay_devcluster import DevCluster


class Sampler(threading.Thread):
    """The kubelet's allocatable count of one resource, every 10 ms, until stopped."""

    def __init__(self, socket: Path, resource: str) -> None:
        super().__init__(daemon=True)
        self.socket, self.resource = socket, resource
        self.samples: list[int] = []
        self.done = threading.Event()

    def run(self) -> None:
        async def loop() -> None:
            while not self.done.is_set():
                got = await get_allocatable_resources(self.socket, rpc_timeout=2.0)
                self.samples.append(got.count(self.resource))
                await asyncio.sleep(0.01)

        asyncio.run(loop())


def test_one_agent_pod_serves_both_profiles_and_reconfigures_live(
    patchbay: Installed, cluster: Cluster, e2e_cluster: DevCluster, real_node: str, fake_dev: Path
) -> None:
    serial, tokens = f"{cluster.prefix}serial", f"{cluster.prefix}tokens"
    serial_res, tokens_res = f"e2e.patchbay.dev/{cluster.tag}-serial", f"e2e.patchbay.dev/{cluster.tag}-token"
    for i in range(DEVICES):
        add_fake_device(fake_dev, f"ttyNA{i}")
    serial_label, tokens_label = "patchbay.dev/e2e-na-serial", "patchbay.dev/e2e-na-tokens"
    cluster.set_labels(real_node, {serial_label: cluster.tag, tokens_label: cluster.tag})

    def spec(resource: str, label: str, plugin: dict[str, Any]) -> dict[str, Any]:
        return {
            "resourceName": resource,
            "mode": "DevicePlugin",
            "nodeSelector": {"matchLabels": {label: cluster.tag}},
            "plugin": plugin,
        }

    def agent_pods() -> list[Any]:
        pods = cluster.core.list_namespaced_pod(patchbay.namespace, label_selector=SHARED_SELECTOR).items
        return [p for p in pods if p.spec.node_name == real_node and not p.metadata.deletion_timestamp]

    def one_ready_pod() -> Any:
        pods = agent_pods()
        ready = [
            c for p in pods for c in p.status.conditions or [] if c.type == "Ready" and c.status == "True"
        ]
        return pods[0] if len(pods) == 1 and ready else None

    sampler = Sampler(e2e_cluster.real_node().paths.pod_resources_socket, serial_res)
    try:
        cluster.create_profile(
            serial,
            spec(serial_res, serial_label, {"discovery": {"paths": {"globs": [f"{fake_dev}/ttyNA*"]}}}),
        )
        cluster.create_profile(
            tokens, spec(tokens_res, tokens_label, {"discovery": {"virtual": {"count": 2}}})
        )
        full = (str(DEVICES), str(DEVICES))
        wait_for("serial adapters on the node", lambda: cluster.values(real_node, serial_res) == full, 120)
        wait_for("tokens on the node", lambda: cluster.values(real_node, tokens_res) == ("2", "2"), 120)
        pod = wait_for("ONE agent pod serving both", one_ready_pod, 120)
        restarts = sum(c.restart_count for c in pod.status.container_statuses or [])
        # No DaemonSet of their own.
        names = {d.metadata.name for d in cluster.apps.list_namespaced_daemon_set(patchbay.namespace).items}
        assert not {f"patchbay-{serial}", f"patchbay-{tokens}"} & names

        sampler.start()
        wait_for("samples", lambda: len(sampler.samples) > 10, 30)
        # A change of the tokens profile's plugin section reaches the running pod.
        cluster.patch_spec(tokens, {"plugin": {"discovery": {"virtual": {"count": 3}}}})
        wait_for("3 tokens", lambda: cluster.values(real_node, tokens_res) == ("3", "3"), 120)
        # The tokens label leaves the node: that profile stops there, serial stays.
        cluster.set_labels(real_node, {tokens_label: None})
        wait_for(
            "no tokens allocatable", lambda: cluster.values(real_node, tokens_res)[1] in (None, "0"), 120
        )
        sampler.done.set()
        sampler.join(10)

        after = one_ready_pod()
        assert after is not None and after.metadata.uid == pod.metadata.uid
        assert sum(c.restart_count for c in after.status.container_statuses or []) == restarts
        assert sampler.samples and min(sampler.samples) == DEVICES, sampler.samples
        n, low = len(sampler.samples), min(sampler.samples)
        print(f"serial allocatable across both changes: {n} samples, min {low}")
    finally:
        sampler.done.set()
        for name in (serial, tokens):
            cluster.delete_profile(name)
        cluster.set_labels(real_node, {serial_label: None, tokens_label: None})
