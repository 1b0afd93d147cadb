"""Agents of one resource overlapping on the real node's kubelet, in orders a rollout does not
usually take: the agent that registered LAST leaves FIRST; three agents, the middle one leaving
first. On every release of the matrix.

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


class Agents:
    """Agents of the test's own resource on the real node's kubelet, each started by the test
    (`start`), and what a pod of that resource meets (`admitted`)."""

    def __init__(self, on_node: OnNode, kube_release: str, tmp_path: Path) -> None:
        _patchbay, cluster, _e2e_cluster, self.node, self.namespace, fake_dev = on_node
        self.core = cluster.core
        self.resource = f"e2e.patchbay.dev/{cluster.tag}-overlap"
        for i in range(DEVICES):
            add_fake_device(fake_dev, f"ttyE2E{i}")
        self._plugin = {
            "discovery": {"paths": {"globs": [f"{fake_dev}/ttyE2E*"]}},
            "health": {"periodSeconds": 60},
            "allocation": {"permissions": "rw"},
        }
        self._release, self._tmp = kube_release, tmp_path
        self.one_client = not has("device-plugin-endpoint-per-socket", kube_release)

    def start(self, name: str) -> contextlib.AbstractAsyncContextManager[ResourceAgent]:
        return running_agent(
            self._plugin,
            KUBELET_ROOT / "device-plugins",
            Path("/"),
            resource=self.resource,
            poll_interval=3600,
            cdi_spec_dir=self._tmp / name / "cdi",
            kubelet_version=self._release,
        )

    def allocatable(self) -> str | None:
        return (self.core.read_node(self.node).status.allocatable or {}).get(self.resource)

    async def admitted(self, holder: str) -> None:
        """The node counts the devices (the Node object follows the kubelet within its status
        sync); a pod asking for one is admitted and runs (a refused one fails at once)."""
        counted = lambda: self.allocatable() == str(DEVICES)  # noqa: E731
        await asyncio.to_thread(wait_for, "the devices on the Node", counted, 60)
        pod = limits(busybox_pod(holder, self.node, "echo held; sleep 3600"), self.resource, 1)
        await asyncio.to_thread(self.core.create_namespaced_pod, self.namespace, pod)
        core, ns = self.core, self.namespace
        running = lambda: pod_log(core, ns, holder, "held")  # noqa: E731
        await asyncio.to_thread(wait_for, "the holder running", running, 120)

    async def delete(self, holder: str) -> None:
        with contextlib.suppress(client.ApiException):
            await asyncio.to_thread(
                self.core.delete_namespaced_pod, holder, self.namespace, grace_period_seconds=0
            )


async def test_when_the_agent_that_registered_last_leaves_first_pods_are_still_admitted(
    on_node: OnNode, kube_release: str, tmp_path: Path
) -> None:
    agents = Agents(on_node, kube_release, tmp_path)
    start, one_client = agents.start, agents.one_client

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
            await agents.admitted(holder)
            assert registrar_of(newer).streams.drops == 0
        finally:
            await agents.delete(holder)


async def test_three_agents_overlapping_the_middle_then_the_oldest_leaving_leave_pods_admitted(
    on_node: OnNode, kube_release: str, tmp_path: Path
) -> None:
    """A alone, then B, then C (two profiles changing the shared node agent's template 0.2 s
    apart: seen on a v1.34.4 node in CI, 2026-12-02): B and C each hand over on kubelets before
    1.37, and Allocate goes to C. The DaemonSet controller removes B, then A. A must not register
    again when B goes (C, newer, serves): it did, the kubelet held A's client, A's exit closed
    it, every device went unhealthy under C's open stream, and the next pod was refused ("Allocate
    failed due to no healthy devices present"). The second between B's exit and A's is many times
    what A took to register again."""
    agents = Agents(on_node, kube_release, tmp_path)
    holder = "overlap-three-holder"
    stacks = [contextlib.AsyncExitStack() for _ in range(3)]
    try:
        started: list[ResourceAgent] = []
        for stack, name in zip(stacks, "abc", strict=True):
            started.append(await stack.enter_async_context(agents.start(name)))
            await until(lambda: started[-1].ready, 30)
        a, b, c = (registrar_of(x) for x in started)
        assert (b.handover.count, c.handover.count) == ((1, 1) if agents.one_client else (0, 0))
        await stacks[1].aclose()  # B removed (SIGTERM)
        await asyncio.sleep(1.0)
        assert (a.registration_count, c.registration_count) == (1, 1)
        await stacks[0].aclose()  # ... then A
        await asyncio.sleep(1.0)
        await until(lambda: started[2].ready, 10)
        await agents.admitted(holder)
        assert (c.streams.drops, c.registration_count, c.check.retakes) == (0, 1, 0)
    finally:
        await agents.delete(holder)
        for stack in reversed(stacks):
            await stack.aclose()
