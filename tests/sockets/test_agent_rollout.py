"""One socket per agent process: two agents of one resource side by side (a DaemonSet rollout),
stale sockets of dead agents removed at start, live and foreign ones never touched, a taken
instance refused, and a new socket when the kubelet refuses a path as "already connected"."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.agentparts import registrar_of, servicer_of
from support.agentrun import plugin_client, running_agent, until
from support.fakehw import FakeHardware, live_socket, stale_socket
from support.pykubelet import PyKubelet
from support.releases import has

from patchbay_agent.api import api_pb2
from patchbay_agent.kubelet.sockets import legacy_socket_name, socket_name
from patchbay_agent.resourceagent import ResourceAgent
from patchbay_devcluster.releases import matrix

SERIAL = {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}, "health": {"periodSeconds": 60}}
RESOURCE = "example.com/serial"
#: Releases of the matrix (hack/kube-releases) as the agent reads them from its Node: the newest,
#: and the oldest whose kubelet keeps one device-plugin client per resource (None: none does).
NEWEST = matrix()[-1]
ONE_CLIENT_RELEASE = next((r for r in matrix() if not has("device-plugin-endpoint-per-socket", r)), None)
NAME = re.compile(r"patchbay-example\.com_serial-[0-9a-f]{8}\.sock")
#: How long the Python kubelet holds a hand-over's dial-back: longer than the deadline the agent
#: once gave it (2 s), after which it counted as Ready while the kubelet still worked on it.
SLOWER_THAN_THE_OLD_DEADLINE = 2.5


class Rollout:
    """The old and the new agent of a rollout, each a SERIAL agent on the kubelet's plugin dir
    started by the test (``start_old``, ``start_new``) with the rollout's agent options, and
    stopped by closing its stack (``old.aclose()``: SIGTERM to that pod)."""

    def __init__(
        self,
        old: contextlib.AsyncExitStack,
        new: contextlib.AsyncExitStack,
        kubelet: PyKubelet,
        host: Path,
        **agent: Any,
    ) -> None:
        self.old, self.new = old, new
        self._kubelet, self._host, self._agent = kubelet, host, agent

    async def start_old(self) -> ResourceAgent:
        return await self.old.enter_async_context(self._running())

    async def start_new(self) -> ResourceAgent:
        return await self.new.enter_async_context(self._running())

    def _running(self) -> contextlib.AbstractAsyncContextManager[ResourceAgent]:
        return running_agent(SERIAL, self._kubelet.plugin_dir, self._host, **self._agent)


@pytest.fixture
def one_client_release() -> str:
    """The oldest release of the matrix whose kubelet keeps one device-plugin client per resource;
    the test is skipped where the matrix has none."""
    if ONE_CLIENT_RELEASE is None:
        pytest.skip("no release of the matrix (hack/kube-releases) keeps one client per resource")
    return ONE_CLIENT_RELEASE


def one_client_agent(
    plugin_dir: Path, hw: FakeHardware, release: str
) -> contextlib.AbstractAsyncContextManager[ResourceAgent]:
    """A SERIAL agent that reads its Node's release as ``release`` (one keeping one client per
    resource) and looks at the kubelet only when told (no backstop poll during the test)."""
    return running_agent(SERIAL, plugin_dir, hw.root, poll_interval=3600, kubelet_version=release)


@contextlib.asynccontextmanager
async def rollout(kubelet: PyKubelet, hw: FakeHardware, **agent: Any) -> AsyncIterator[Rollout]:
    """A rollout on ``kubelet`` (started here) of agents with the options ``agent`` on the host
    ``hw``; at the end the new agent stops, then the old one, then the kubelet."""
    async with kubelet, contextlib.AsyncExitStack() as old, contextlib.AsyncExitStack() as new:
        yield Rollout(old, new, kubelet, hw.root, **agent)


async def test_two_agents_of_one_resource_overlap_and_each_removes_only_its_own_socket(
    plugin_dir: Path, hw: FakeHardware
) -> None:
    hw.add_dev("/dev/ttyUSB0")
    kubelet = PyKubelet(plugin_dir)
    async with rollout(kubelet, hw) as agents:
        a = await agents.start_old()
        await kubelet.wait_for(lambda: len(kubelet.registrations) == 1)
        b = await agents.start_new()
        # Registered, and the kubelet's stream of it open (it opens after Register answers).
        await kubelet.wait_for(lambda: len(kubelet.first_lists) == 2)
        endpoints = [r.request.endpoint for r in kubelet.registrations]
        assert endpoints == [registrar_of(a).endpoint, registrar_of(b).endpoint]
        assert all(NAME.fullmatch(e) for e in endpoints), endpoints
        assert endpoints[0] != endpoints[1]
        assert registrar_of(a).socket_path.exists() and registrar_of(b).socket_path.exists()
        # The old agent stops (SIGTERM in a rollout): its socket goes, the new one's stays.
        await agents.old.aclose()
        assert not registrar_of(a).socket_path.exists()
        assert registrar_of(b).socket_path.exists()
        assert registrar_of(b).registered
        async with plugin_client(registrar_of(b).socket_path) as client:
            req = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["ttyUSB0"])]
            )
            resp = await client.Allocate(req)
            assert resp.container_responses[0].devices[0].host_path == "/dev/ttyUSB0"
        # No re-registration is needed: the kubelet still holds b's stream (an agent registers
        # again only after its last stream ended), and each agent registered once.
        assert servicer_of(b).open_streams == 1
        assert len(kubelet.registrations) == 2
        assert (registrar_of(a).registration_count, registrar_of(b).registration_count) == (1, 1)


async def test_stale_sockets_of_the_resource_go_at_start_live_and_foreign_ones_stay(
    plugin_dir: Path, hw: FakeHardware
) -> None:
    dead = socket_name(RESOURCE, "1111aaaa")
    legacy = legacy_socket_name(RESOURCE)
    live = socket_name(RESOURCE, "2222bbbb")
    foreign = socket_name("example.com/serial-x", "3333cccc")
    foreign_legacy = legacy_socket_name("example.com/serial2")
    for name in (dead, legacy, foreign, foreign_legacy):
        stale_socket(plugin_dir / name)
    (plugin_dir / "kubelet_internal_checkpoint").write_text("{}")
    with live_socket(plugin_dir / live):
        async with running_agent(SERIAL, plugin_dir, hw.root) as agent:
            left = sorted(os.listdir(plugin_dir))
            assert left == sorted(
                [
                    live,
                    foreign,
                    foreign_legacy,
                    "kubelet_internal_checkpoint",
                    registrar_of(agent).endpoint,
                ]
            )
        # Its own socket goes on shutdown; the rest stays as it was.
        assert sorted(os.listdir(plugin_dir)) == sorted(
            [live, foreign, foreign_legacy, "kubelet_internal_checkpoint"]
        )


def test_an_instance_another_process_serves_is_refused(plugin_dir: Path, hw: FakeHardware) -> None:
    taken = plugin_dir / socket_name(RESOURCE, "taken")

    async def scenario() -> None:
        async with running_agent(SERIAL, plugin_dir, hw.root, instance="taken"):
            pytest.fail("the agent started on a socket another process serves")

    with live_socket(taken), pytest.raises(ValueError, match="instance 'taken' is taken"):
        asyncio.run(scenario())
    assert taken.exists()


async def test_a_stale_socket_of_the_same_instance_is_taken_over(plugin_dir: Path, hw: FakeHardware) -> None:
    stale_socket(plugin_dir / socket_name(RESOURCE, "mine"))
    async with (
        PyKubelet(plugin_dir) as kubelet,
        running_agent(SERIAL, plugin_dir, hw.root, instance="mine") as agent,
    ):
        await kubelet.wait_for(lambda: len(kubelet.registrations) == 1)
        assert kubelet.registrations[0].request.endpoint == socket_name(RESOURCE, "mine")
        assert registrar_of(agent).server is not None and registrar_of(agent).server.socket_intact()


async def test_already_connected_moves_the_agent_to_a_new_socket(plugin_dir: Path, hw: FakeHardware) -> None:
    """The kubelet's answer when it still holds an endpoint for the path: that path may be blocked
    for good, so the agent serves and registers a NEW socket name."""
    hw.add_dev("/dev/ttyUSB0")
    kubelet = PyKubelet(
        plugin_dir,
        refuse=1,
        refuse_code=grpc.StatusCode.UNKNOWN,
        refuse_details="device plugin already connected: {path}",
    )
    await kubelet.start()
    try:
        async with running_agent(SERIAL, plugin_dir, hw.root, poll_interval=3600) as agent:
            await kubelet.wait_for(lambda: RESOURCE in kubelet.devices)
            first, second = kubelet.attempts
            assert first != second
            assert all(NAME.fullmatch(e) for e in (first, second))
            (reg,) = kubelet.registrations
            assert reg.request.endpoint == second == registrar_of(agent).endpoint
            assert reg.plugin_was_serving
            assert not (plugin_dir / first).exists()
            assert (plugin_dir / second).exists()
    finally:
        await kubelet.stop()


async def test_a_kubelet_with_one_client_per_resource_drops_the_new_agent_and_it_registers_again(
    plugin_dir: Path, hw: FakeHardware
) -> None:
    """Kubelets before v1.37 keep ONE client per resource: when the old agent of a maxSurge rollout
    leaves, its stream's end makes the kubelet drop the NEW agent's client and mark the resource
    unhealthy. The new agent must notice that its stream was dropped (not one that was never
    opened) and register again without waiting; the old agent never registers again."""
    hw.add_serials(2)
    kubelet = PyKubelet(plugin_dir, one_client_per_resource=True)
    async with rollout(kubelet, hw, poll_interval=3600) as agents:
        a = await agents.start_old()
        await kubelet.wait_for(lambda: kubelet.healthy(RESOURCE) == 2)
        b = await agents.start_new()
        await kubelet.wait_for(lambda: len(kubelet.registrations) == 2)
        await until(lambda: servicer_of(b).open_streams == 1)
        assert kubelet.dropped == []
        await agents.old.aclose()  # SIGTERM to the old pod
        await kubelet.wait_for(lambda: kubelet.dropped == [RESOURCE])
        await kubelet.wait_for(lambda: len(kubelet.registrations) == 3 and kubelet.healthy(RESOURCE) == 2)
        assert kubelet.registrations[-1].request.endpoint == registrar_of(b).endpoint
        assert (registrar_of(a).registration_count, registrar_of(b).registration_count) == (1, 2)
        assert registrar_of(b).streams.drops == 1
        await until(lambda: registrar_of(b).registered and servicer_of(b).open_streams == 1)


async def test_a_registration_dropped_before_its_stream_opened_is_made_again_and_never_ready_meanwhile(
    plugin_dir: Path, hw: FakeHardware
) -> None:
    """A kubelet before v1.37 can close a new client before its ListAndWatch opens (an older
    client's stream ended in that window): nothing of the agent ends, so only the agent's own
    check that every registration is followed by its stream brings the devices back. Until the
    kubelet holds that stream the agent is not Ready (a rollout would otherwise remove the
    previous agent while the kubelet counts none of the new one's devices)."""
    hw.add_dev("/dev/ttyUSB0")
    async with (
        PyKubelet(plugin_dir, one_client_per_resource=True, drop_before_stream=1) as kubelet,
        running_agent(SERIAL, plugin_dir, hw.root, poll_interval=3600) as agent,
    ):
        await kubelet.wait_for(lambda: kubelet.dropped_before_stream == 1)
        await until(lambda: registrar_of(agent).registered)
        assert len(kubelet.registrations) == 1
        assert not agent.ready  # registered, but the kubelet holds no stream of it
        await kubelet.wait_for(lambda: kubelet.healthy(RESOURCE) == 1)
        assert len(kubelet.registrations) == 2
        assert registrar_of(agent).streams.unopened == 1
        assert registrar_of(agent).streams.drops == 0
        await until(lambda: agent.ready)


async def test_after_a_drop_a_re_registration_dropped_before_its_stream_is_made_again(
    plugin_dir: Path, hw: FakeHardware
) -> None:
    """The rollout on a kubelet before v1.37 where the agent's re-registration after the drop is
    itself dropped before its stream opened (the dropped client's own runClient ended after it):
    the agent registers a third time and the kubelet has every device healthy again."""
    hw.add_serials(2)
    kubelet = PyKubelet(plugin_dir, one_client_per_resource=True)
    async with rollout(kubelet, hw, poll_interval=3600) as agents:
        await agents.start_old()
        await kubelet.wait_for(lambda: kubelet.healthy(RESOURCE) == 2)
        b = await agents.start_new()
        await until(lambda: b.ready)
        kubelet.drop_before_stream = 1
        await agents.old.aclose()
        await kubelet.wait_for(lambda: kubelet.dropped == [RESOURCE] and kubelet.dropped_before_stream == 1)
        # The agent counts a registration once the kubelet's answer is back, after the kubelet
        # counted it: under load the kubelet's count can be seen first (it was, 1 of 5 runs).
        await kubelet.wait_for(
            lambda: (
                len(kubelet.registrations) == 4
                and kubelet.healthy(RESOURCE) == 2
                and registrar_of(b).registration_count >= 3
            )
        )
        assert (
            registrar_of(b).streams.drops,
            registrar_of(b).streams.unopened,
            registrar_of(b).registration_count,
        ) == (1, 1, 3)
        await until(lambda: b.ready)


async def test_on_a_kubelet_with_one_client_per_resource_the_new_agent_hands_over_and_nothing_drops(
    plugin_dir: Path, hw: FakeHardware, one_client_release: str
) -> None:
    """Knowing its kubelet keeps one client per resource (its Node's release is before 1.37), the
    new agent of a rollout registers a socket that refuses the kubelet's dial-back once its own
    stream is open: the kubelet's failed connect deletes the resource's client entry, so the old
    agent's exit closes nothing and no device is ever marked unhealthy. The agent is Ready only
    after that. When the last agent goes, it registers again first, so the kubelet still sees the
    resource go."""
    hw.add_serials(2)
    kubelet = PyKubelet(plugin_dir, one_client_per_resource=True)
    async with rollout(kubelet, hw, poll_interval=3600, kubelet_version=one_client_release) as agents:
        a = await agents.start_old()
        await kubelet.wait_for(lambda: kubelet.healthy(RESOURCE) == 2)
        await until(lambda: a.ready)
        assert registrar_of(a).handover.count == 0  # alone: nothing to hand over from
        # A busy kubelet, slower than the agent's hand-over deadline once was (2 s): the new
        # agent is not Ready while its hand-over is unanswered (a rollout would remove the old
        # agent, whose exit closes the new one's stream), however long the answer takes.
        kubelet.hold_dial = lambda endpoint: endpoint.endswith("-handover.sock")
        b = await agents.start_new()
        await kubelet.wait_for(lambda: kubelet.held)
        await asyncio.sleep(SLOWER_THAN_THE_OLD_DEADLINE)  # the kubelet's delay, not a wait
        assert not b.ready
        assert registrar_of(b).handover.in_flight
        kubelet.release_dials()
        await until(lambda: b.ready)
        assert registrar_of(b).handover.count == 1
        (handover,) = kubelet.failed_connects
        assert handover == registrar_of(b).endpoint.removesuffix(".sock") + "-handover.sock"
        assert not (plugin_dir / handover).exists()  # the throw-away socket is gone
        assert RESOURCE not in kubelet.clients  # the kubelet holds no client to close
        ended = kubelet.streams_ended
        await agents.old.aclose()  # SIGTERM to the old pod
        await kubelet.wait_for(lambda: kubelet.streams_ended > ended)  # the old stream's end
        assert kubelet.dropped == []
        assert kubelet.healthy(RESOURCE) == 2
        assert registrar_of(b).registration_count == 1 and registrar_of(b).streams.drops == 0
        assert servicer_of(b).open_streams == 1
        # The last agent leaves: it registers again, so its exit makes the kubelet drop the
        # resource (nothing may keep advertising devices nobody serves).
        await agents.new.aclose()
        await kubelet.wait_for(lambda: kubelet.dropped == [RESOURCE])
        assert kubelet.healthy(RESOURCE) == 0


async def test_on_a_kubelet_with_an_endpoint_per_socket_nothing_is_handed_over(
    plugin_dir: Path, hw: FakeHardware
) -> None:
    """The newest release's Node: its kubelet keeps both agents' endpoints, so no hand-over."""
    hw.add_dev("/dev/ttyUSB0")
    kubelet = PyKubelet(plugin_dir)
    async with rollout(kubelet, hw, poll_interval=3600, kubelet_version=NEWEST) as agents:
        a = await agents.start_old()
        await until(lambda: a.ready)
        b = await agents.start_new()
        await until(lambda: b.ready)
        assert registrar_of(b).handover.count == 0
        assert kubelet.attempts == [r.request.endpoint for r in kubelet.registrations]


async def test_two_rollouts_in_a_row_on_a_one_client_kubelet_never_drop_the_newest_agent(
    plugin_dir: Path, hw: FakeHardware, one_client_release: str
) -> None:
    """A -> B -> C, each new agent handing over. When B leaves, it had handed over itself (when it
    replaced A), and C serves: B must NOT register again before it goes. It did (it looked only
    for OLDER agents): the kubelet then held B's client, B's exit closed it and marked every
    device unhealthy, and C's open stream, with nothing new to send, never set them back: the
    node stayed at 0 with every agent Ready (seen on a v1.34.4 node from the second rollout on)."""
    hw.add_serials(2)

    def start() -> contextlib.AbstractAsyncContextManager[ResourceAgent]:
        return one_client_agent(plugin_dir, hw, one_client_release)

    kubelet = PyKubelet(plugin_dir, one_client_per_resource=True)
    await kubelet.start()
    stacks = [contextlib.AsyncExitStack() for _ in range(3)]
    try:
        agents: list[ResourceAgent] = []
        for n, stack in enumerate(stacks):
            agents.append(await stack.enter_async_context(start()))
            await until(lambda: agents[-1].ready)
            await kubelet.wait_for(lambda: kubelet.healthy(RESOURCE) == 2)
            if n > 0:
                assert registrar_of(agents[-1]).handover.count == 1
                attempts, ended = len(kubelet.attempts), kubelet.streams_ended
                await stacks[n - 1].aclose()  # SIGTERM to the previous agent
                # Whatever it registered as it left was sent before it stopped; its stream's
                # end reached the kubelet (a drop, had it registered) once this is counted.
                await kubelet.wait_for(lambda e=ended: kubelet.streams_ended > e)
                assert kubelet.attempts[attempts:] == [], "a leaving agent registered again"
                assert kubelet.dropped == []
                assert kubelet.healthy(RESOURCE) == 2
        assert [registrar_of(a).registration_count for a in agents] == [1, 1, 1]
    finally:
        for stack in reversed(stacks):
            await stack.aclose()
        await kubelet.stop()


async def test_an_older_agent_never_registers_again_when_a_middle_one_leaves_and_a_newer_serves(
    plugin_dir: Path, hw: FakeHardware, one_client_release: str
) -> None:
    """A alone, then B and C a moment apart (two profiles changing a shared agent's template
    0.2 s apart, seen on a v1.34.4 node on 2026-12-02): B and C each handed over, so the kubelet
    holds no client and sends Allocate to C, which registered last. When the DaemonSet controller
    removes B, A (never handed over, B registered after it) must NOT register again: C, newer,
    still serves and holds the endpoint. It did: the kubelet then held A's client, A's exit
    closed it and marked every device unhealthy, and the holder pod was refused ("Allocate failed
    due to no healthy devices present"). The test waits a second after B's stream ended, many
    times what A took to register again (`LEAVE_SETTLE`), before it removes A."""
    hw.add_serials(2)

    def start() -> contextlib.AbstractAsyncContextManager[ResourceAgent]:
        return one_client_agent(plugin_dir, hw, one_client_release)

    kubelet = PyKubelet(plugin_dir, one_client_per_resource=True)
    await kubelet.start()
    stacks = [contextlib.AsyncExitStack() for _ in range(3)]
    try:
        agents: list[ResourceAgent] = []
        for stack in stacks:
            agents.append(await stack.enter_async_context(start()))
            await until(lambda: agents[-1].ready)
        a, b, c = (registrar_of(x) for x in agents)
        assert (b.handover.count, c.handover.count) == (1, 1)
        assert kubelet.endpoint(RESOURCE) == c.endpoint
        attempts, ended = len(kubelet.attempts), kubelet.streams_ended
        await stacks[1].aclose()  # the DaemonSet controller removes B
        await kubelet.wait_for(lambda: kubelet.streams_ended > ended)
        await asyncio.sleep(1.0)
        assert kubelet.attempts[attempts:] == [], "an agent registered again while C held the endpoint"
        ended = kubelet.streams_ended
        await stacks[0].aclose()  # ... then A
        await kubelet.wait_for(lambda: kubelet.streams_ended > ended)
        assert kubelet.dropped == []
        assert kubelet.healthy(RESOURCE) == 2
        assert kubelet.endpoint(RESOURCE) == c.endpoint
        got = await kubelet.allocate(RESOURCE, ["ttyUSB0"])
        (container,) = got.container_responses
        assert [d.host_path for d in container.devices] == ["/dev/ttyUSB0"]
        assert a.registration_count == 1
    finally:
        for stack in reversed(stacks):
            await stack.aclose()
        await kubelet.stop()


async def test_when_the_agent_that_registered_last_leaves_first_the_other_registers_again(
    plugin_dir: Path, hw: FakeHardware, one_client_release: str
) -> None:
    """Two template changes of a shared agent's DaemonSet a second apart (seen on a v1.34.4 node,
    2026-11-30): the newer pod's agent B served and registered first; the older pod's agent A,
    slower to start, registered after it and handed over (B's socket was the older one). The
    DaemonSet controller then removed A. A one-client kubelet sends Allocate to the endpoint of
    the resource's LAST registration, and a hand-over leaves it in place: A's removed socket.
    B's stream kept the devices counted, so pods were scheduled and refused at admission
    ("Allocate failed ... no such file or directory"). B must register again once A is gone:
    Allocate reaches B, and nothing was ever marked unhealthy."""
    hw.add_serials(2)

    def start() -> contextlib.AbstractAsyncContextManager[ResourceAgent]:
        return one_client_agent(plugin_dir, hw, one_client_release)

    kubelet = PyKubelet(plugin_dir, one_client_per_resource=True)
    async with kubelet, contextlib.AsyncExitStack() as first, contextlib.AsyncExitStack() as second:
        b = await first.enter_async_context(start())
        await until(lambda: b.ready)
        assert kubelet.endpoint(RESOURCE) == registrar_of(b).endpoint
        a = await second.enter_async_context(start())
        await until(lambda: a.ready)
        assert registrar_of(a).handover.count == 1  # B's socket is older: A handed over to it
        assert kubelet.endpoint(RESOURCE) == registrar_of(a).endpoint  # Allocate goes to A
        ended = kubelet.streams_ended
        await second.aclose()  # the DaemonSet controller removes A (SIGTERM)
        await kubelet.wait_for(lambda: kubelet.streams_ended > ended)
        await kubelet.wait_for(lambda: kubelet.endpoint(RESOURCE) == registrar_of(b).endpoint)
        got = await kubelet.allocate(RESOURCE, ["ttyUSB0"])
        (container,) = got.container_responses
        assert [d.host_path for d in container.devices] == ["/dev/ttyUSB0"]
        assert kubelet.dropped == []
        assert kubelet.healthy(RESOURCE) == 2
        assert registrar_of(b).check.endpoint_retakes == 1
        assert registrar_of(b).streams.drops == 0
        await until(lambda: b.ready)


async def test_the_newest_agent_takes_its_devices_back_after_a_leaving_agent_closed_its_client(
    plugin_dir: Path, hw: FakeHardware, one_client_release: str
) -> None:
    """A leaving agent of an older Patchbay release (0.1.0 registered again as it left, whatever
    served after it) makes a one-client kubelet mark every device unhealthy while the new agent's
    stream stays open. The new agent looks at the kubelet's count once the other agent's socket
    is gone, finds it short of what it advertises Healthy, and registers again: the devices come
    back without anything else happening. The count is read from the peer here, where the agent
    reads PodResources on a node."""
    hw.add_serials(2)
    from patchbay_agent.deviceplugin.registrationcheck import KubeletView

    kubelet = PyKubelet(plugin_dir, one_client_per_resource=True)
    async with rollout(kubelet, hw, poll_interval=3600, kubelet_version=one_client_release) as agents:
        a = await agents.start_old()
        await until(lambda: a.ready)
        b = await agents.start_new()
        await until(lambda: b.ready)

        async def kubelet_count(*, rpc_timeout: float) -> int:
            return kubelet.healthy(RESOURCE)

        registrar_of(b).check.view = KubeletView(kubelet_count, b.front.advertised_healthy)
        # What the old release did as it left: its socket registered again, then its exit.
        await registrar_of(a).socket.register()
        await kubelet.wait_for(lambda: len(kubelet.registrations) == 3)  # A, B, A (hand-over refused)
        await kubelet.wait_for(lambda: len(kubelet.first_lists) == 3)  # ... and its stream open
        await agents.old.aclose()
        await kubelet.wait_for(lambda: kubelet.dropped == [RESOURCE])
        await kubelet.wait_for(lambda: kubelet.healthy(RESOURCE) == 2)
        assert registrar_of(b).check.retakes == 1
        assert kubelet.registrations[-1].request.endpoint == registrar_of(b).endpoint
        await until(lambda: b.ready)
