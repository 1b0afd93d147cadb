"""Two agents of one resource overlapping on the real node's kubelet, in the order a rollout does
not usually take: the agent that registered LAST leaves FIRST. On every release of the matrix.

Seen on a v1.34.4 node (2026-11-30): the shared node agent's DaemonSet changed twice within a
second; the newer pod's agent registered first, the older pod's agent after it and handed over
(the newer agent's socket was the older file); the DaemonSet controller then removed the older
pod. Kubelets before v1.37 send Allocate to the endpoint of the resource's last registration,
which a hand-over leaves in place: every pod asking for the resource was refused at admission
("Allocate failed ... no such file or directory") while the node counted 4 of 4 allocatable. The
agent that stays now registers again (docs/facts.md#kubelet-endpoints).

The two agents here are the agent's own code run by the test (`support.agentrun.running_agent`),
on the kubelet's real device-plugin directory, so that the order of their registrations is the
test's to choose; what is under test is the real kubelet's device manager and what it does with
a pod. The resource is the test's own; the devices are FAKE (null device nodes).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from kubernetes import client
from support.agentparts import registrar_of
from support.agentrun import running_agent, until
from support.realnode import DEVICES, OnNode, add_fake_device, busybox_pod, limits, pod_log, wait_for
from support.releases import has

from patchbay_agent.resourceagent import ResourceAgent
from patchbay_devcluster.hostdirs import KUBELET_ROOT


async def test_when_the_agent_that_registered_last_leaves_first_pods_are_still_admitted(
    on_node: OnNode, kube_release: str, tmp_path: Path
) -> None:
    _patchbay, cluster, _e2e_cluster, real_node, namespace, fake_dev = on_node
    core = cluster.core
    resource = f"e2e.patchbay.dev/{cluster.tag}-overlap"
    for i in range(DEVICES):
        add_fake_device(fake_dev, f"ttyE2E{i}")
    plugin = {
        "discovery": {"paths": {"globs": [f"{fake_dev}/ttyE2E*"]}},
        "health": {"periodSeconds": 60},
        "allocation": {"permissions": "rw"},
    }
    one_client = not has("device-plugin-endpoint-per-socket", kube_release)

    def start(name: str) -> contextlib.AbstractAsyncContextManager[ResourceAgent]:
        return running_agent(
            plugin,
            KUBELET_ROOT / "device-plugins",
            Path("/"),
            resource=resource,
            poll_interval=3600,
            cdi_spec_dir=tmp_path / name / "cdi",
            kubelet_version=kube_release,
        )

    def allocatable() -> str | None:
        return (core.read_node(real_node).status.allocatable or {}).get(resource)

    holder = "overlap-holder"
    async with contextlib.AsyncExitStack() as first, contextlib.AsyncExitStack() as second:
        try:
            newer = await first.enter_async_context(start("newer"))
            await until(lambda: newer.ready, 30)
            older = await second.enter_async_context(start("older"))
            await until(lambda: older.ready, 30)
            # It registered after the other one, whose socket is the older file: on kubelets
            # before 1.37 it handed over, and the kubelet's Allocate goes to it.
            assert registrar_of(older).handover.count == (1 if one_client else 0)
            await second.aclose()  # the DaemonSet controller removes the older pod (SIGTERM)
            await until(lambda: registrar_of(newer).check.endpoint_retakes == (1 if one_client else 0), 10)
            await until(lambda: newer.ready, 10)
            # The node counts the devices (the Node object follows the kubelet within its status
            # sync); a pod asking for one is admitted and runs.
            counted = lambda: allocatable() == str(DEVICES)  # noqa: E731
            await asyncio.to_thread(wait_for, "the devices on the Node", counted, 60)
            pod = limits(busybox_pod(holder, real_node, "echo held; sleep 3600"), resource, 1)
            await asyncio.to_thread(core.create_namespaced_pod, namespace, pod)
            await asyncio.to_thread(
                wait_for, "the holder running", lambda: pod_log(core, namespace, holder, "held"), 120
            )
            assert registrar_of(newer).streams.drops == 0
        finally:
            with contextlib.suppress(client.ApiException):
                await asyncio.to_thread(core.delete_namespaced_pod, holder, namespace, grace_period_seconds=0)
