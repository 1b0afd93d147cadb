"""Registration against a Python kubelet peer on a real kubelet.sock: order, waiting, backoff,
kubelet restarts (event-driven), the poll backstop, and the HTTP health endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from support.agentparts import registrar_of, servicer_of
from support.agentrun import agent_options, make_config, running_agent, until
from support.fakehw import FakeHardware
from support.pykubelet import PyKubelet

from patchbay_agent.resourceagent import ResourceAgent

SERIAL = {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}, "health": {"periodSeconds": 60}}
RESOURCE = "example.com/serial"


def _http(agent: ResourceAgent, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{agent.http.port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def _get(agent: ResourceAgent, path: str) -> tuple[int, str]:
    return await asyncio.to_thread(_http, agent, path)


@contextlib.asynccontextmanager
async def serving(plugin_dir: Path, hw: FakeHardware) -> AsyncIterator[tuple[PyKubelet, ResourceAgent]]:
    """ttyUSB0 served by an agent that only inotify wakes (no poll backstop) to a kubelet that
    lists it; both stopped at the end."""
    hw.add_dev("/dev/ttyUSB0")
    async with (
        PyKubelet(plugin_dir) as kubelet,
        running_agent(SERIAL, plugin_dir, hw.root, poll_interval=3600) as agent,
    ):
        await kubelet.wait_for(lambda: RESOURCE in kubelet.devices)
        yield kubelet, agent


def test_registers_only_after_serving_with_the_right_request(plugin_dir: Path, hw: FakeHardware) -> None:
    hw.add_dev("/dev/ttyUSB0")

    async def scenario() -> None:
        async with PyKubelet(plugin_dir) as kubelet:
            plugin = dict(SERIAL, preferredAllocation={"policy": "Pack"})
            async with running_agent(plugin, plugin_dir, hw.root) as agent:
                await kubelet.wait_for(lambda: RESOURCE in kubelet.devices)
                (reg,) = kubelet.registrations
                assert reg.plugin_was_serving
                assert reg.request.version == "v1beta1"
                # Its own socket: the resource plus this process's instance.
                assert re.fullmatch(r"patchbay-example\.com_serial-[0-9a-f]{8}\.sock", reg.request.endpoint)
                assert (
                    reg.request.endpoint
                    == registrar_of(agent).endpoint
                    == registrar_of(agent).socket_path.name
                )
                assert reg.request.resource_name == RESOURCE
                assert reg.request.options.get_preferred_allocation_available
                assert not reg.request.options.pre_start_required
                assert reg.options == reg.request.options
                assert [d.ID for d in kubelet.devices[RESOURCE]] == ["ttyUSB0"]

    asyncio.run(scenario())


def test_waits_for_a_kubelet_then_registers_and_reports_ready(plugin_dir: Path, hw: FakeHardware) -> None:
    hw.add_dev("/dev/ttyUSB0")

    async def scenario() -> None:
        # A one-hour poll: only inotify can notice the kubelet arriving.
        async with running_agent(SERIAL, plugin_dir, hw.root, poll_interval=3600) as agent:
            assert await _get(agent, "/healthz") == (200, "ok\n")
            assert (await _get(agent, "/readyz"))[0] == 503
            assert registrar_of(agent).registration_count == 0
            async with PyKubelet(plugin_dir) as kubelet:
                await kubelet.wait_for(lambda: RESOURCE in kubelet.devices)
                await until(lambda: registrar_of(agent).registered)
                assert await _get(agent, "/readyz") == (200, "ready\n")
                status, metrics = await _get(agent, "/metrics")
                assert status == 200
                assert "patchbay_agent_registered 1.0" in metrics
                assert 'patchbay_agent_devices{health="Healthy"} 1.0' in metrics
                assert 'patchbay_agent_registrations_total{result="success"} 1.0' in metrics
            # The kubelet went away: not ready any more.
            await until(lambda: not registrar_of(agent).registered)
            assert (await _get(agent, "/readyz"))[0] == 503

    asyncio.run(scenario())


def test_backs_off_while_the_kubelet_refuses(plugin_dir: Path, hw: FakeHardware) -> None:
    async def scenario() -> None:
        async with (
            PyKubelet(plugin_dir, refuse=3) as kubelet,
            running_agent(SERIAL, plugin_dir, hw.root, backoff=(0.05, 0.2)) as agent,
        ):
            await kubelet.wait_for(lambda: len(kubelet.registrations) == 1)
            assert kubelet.refused == 3
            await until(lambda: registrar_of(agent).registered)
            _, metrics = await _get(agent, "/metrics")
            assert 'patchbay_agent_registrations_total{result="failure"} 3.0' in metrics

    asyncio.run(scenario())


def test_reregisters_after_a_kubelet_restart_through_inotify(plugin_dir: Path, hw: FakeHardware) -> None:
    async def scenario() -> None:
        async with serving(plugin_dir, hw) as (kubelet, agent):
            first_identity = registrar_of(agent).server.identity if registrar_of(agent).server else None
            for _ in range(2):
                # Stop, delete every socket (ours too), listen again: what a new kubelet does.
                # At least one new registration each time (under load the stream's end may be
                # taken for a drop before the old kubelet's sockets go: one more, harmless).
                before = len(kubelet.registrations)
                await kubelet.restart()
                await kubelet.wait_for(
                    lambda before=before: len(kubelet.registrations) > before and RESOURCE in kubelet.devices
                )
                assert kubelet.registrations[-1].plugin_was_serving
            assert registrar_of(agent).server is not None
            assert registrar_of(agent).server.identity != first_identity
            assert registrar_of(agent).socket_path.exists()

    asyncio.run(scenario())


def test_serves_again_when_its_own_socket_is_deleted(plugin_dir: Path, hw: FakeHardware) -> None:
    async def scenario() -> None:
        async with (
            PyKubelet(plugin_dir) as kubelet,
            running_agent(SERIAL, plugin_dir, hw.root, poll_interval=3600) as agent,
        ):
            await kubelet.wait_for(lambda: len(kubelet.registrations) == 1)
            # The kubelet records a registration before it answers, and opens the stream after:
            # a socket deleted before then is served again while Register is in flight (a
            # kubelet restart's case, registration.py), the kubelet's stream comes through the
            # new one, and no second registration is needed. Here the agent stands registered.
            await until(lambda: registrar_of(agent).streaming)
            registrar_of(agent).socket_path.unlink()
            await kubelet.wait_for(lambda: len(kubelet.registrations) == 2)
            assert kubelet.registrations[-1].plugin_was_serving
            assert registrar_of(agent).server is not None and registrar_of(agent).server.socket_intact()

    asyncio.run(scenario())


def test_registers_again_when_the_kubelet_drops_the_stream(plugin_dir: Path, hw: FakeHardware) -> None:
    async def scenario() -> None:
        async with serving(plugin_dir, hw) as (kubelet, agent):
            await kubelet.drop_streams()
            await kubelet.wait_for(lambda: len(kubelet.registrations) == 2 and RESOURCE in kubelet.devices)
            await until(lambda: registrar_of(agent).registered and servicer_of(agent).open_streams == 1)

    asyncio.run(scenario())


def test_poll_backstop_recovers_when_the_directory_itself_is_replaced(
    plugin_dir: Path, hw: FakeHardware
) -> None:
    """rm -rf + mkdir of the plugin directory drops the inotify watch (the new directory is
    another inode): only the slow identity-comparing poll can notice, and it must. Meanwhile the
    agent cannot bind its socket at all, and must survive that."""

    async def scenario() -> None:
        kubelet = PyKubelet(plugin_dir)
        await kubelet.start()
        try:
            async with running_agent(SERIAL, plugin_dir, hw.root, poll_interval=0.3) as agent:
                await kubelet.wait_for(lambda: len(kubelet.registrations) == 1)
                await kubelet.stop()

                # The agent may bind its socket again while rmtree empties the directory
                # ("Directory not empty"): remove until it is gone, as a re-run of rm -rf would.
                def remove() -> bool:
                    shutil.rmtree(plugin_dir, ignore_errors=True)
                    return not plugin_dir.exists()

                for _ in range(50):
                    if await asyncio.to_thread(remove):
                        break
                else:
                    raise AssertionError(f"{plugin_dir} could not be removed")
                # While the directory is gone the agent cannot serve; it must keep trying, not die.
                tried = registrar_of(agent).socket.serve_failures
                await until(lambda: registrar_of(agent).socket.serve_failures >= tried + 2)
                assert not registrar_of(agent).registered
                await asyncio.to_thread(plugin_dir.mkdir)
                kubelet = PyKubelet(plugin_dir)
                await kubelet.start()
                await kubelet.wait_for(
                    lambda: len(kubelet.registrations) == 1 and RESOURCE in kubelet.devices
                )
                assert registrar_of(agent).socket_path.exists()
        finally:
            await kubelet.stop()

    asyncio.run(scenario())


def test_shutdown_removes_the_socket_and_ends_streams(plugin_dir: Path, hw: FakeHardware) -> None:
    async def scenario() -> None:
        async with PyKubelet(plugin_dir) as kubelet:
            async with running_agent(SERIAL, plugin_dir, hw.root) as agent:
                await kubelet.wait_for(lambda: len(kubelet.registrations) == 1)
                socket = registrar_of(agent).socket_path
                assert socket.exists()
            assert not socket.exists()
            assert sorted(os.listdir(plugin_dir)) == ["kubelet.sock"]

    asyncio.run(scenario())


def test_every_registration_across_kubelet_restarts_in_a_row_starts_with_the_whole_list(
    short_dir: Path, hw: FakeHardware
) -> None:
    """Thirty kubelet restarts in a row, each as the device manager does it (the old kubelet gone,
    killed every other time so its socket file stays; every socket in the directory deleted; a new
    kubelet.sock), against the agent as its own process. The peer dials the agent back as the Go
    kubelet does (blocking, up to 10 s, until the socket answers). Every stream the new kubelets
    open must carry all 8 devices Healthy in its FIRST list, and no dial-back may time out: a
    Register sent while the agent's socket was wiped, and not served again until Register
    returned, left the kubelet dialing a missing file for 10 s with none of the devices (the
    list seen short in the held-out runs). Fails without the fixes in registration.py: a stream
    end of a killed kubelet taken for a drop, the drop's wait then a Register without serving
    again first."""
    from support.kubeletpeer import AgentProcess

    for n in range(8):
        hw.add_dev(f"/dev/ttyUSB{n}")
    plugin_dir = short_dir / "dp"
    plugin_dir.mkdir()
    config = short_dir / "agent.yaml"
    config.write_text(
        f"resourceName: {RESOURCE}\nplugin:\n  discovery: {{paths: {{globs: ['/dev/ttyUSB*']}}}}\n"
    )

    async def scenario() -> None:
        kubelet = PyKubelet(plugin_dir, blocking_dial=10.0)
        await kubelet.start()
        agent = AgentProcess(config, plugin_dir, hw.root, short_dir / "agent.log")
        try:
            await kubelet.wait_for(lambda: kubelet.healthy(RESOURCE) == 8, within=30)
            for n in range(30):
                streams_before = len(kubelet.first_lists)
                await kubelet.restart(crash=n % 2 == 0)
                await kubelet.wait_for(
                    lambda before=streams_before: len(kubelet.first_lists) > before, within=30
                )
                await kubelet.wait_for(lambda: kubelet.healthy(RESOURCE) == 8, within=30)
            short = [
                (i, sum(d.health == "Healthy" for d in devices))
                for i, (_, devices) in enumerate(kubelet.first_lists)
                if sum(d.health == "Healthy" for d in devices) != 8
            ]
            assert short == [], f"first lists not whole: {short}; agent log:\n{agent.log_tail(4000)}"
            assert kubelet.failed_connects == [], agent.log_tail(4000)
        finally:
            assert agent.stop() == 0
            await kubelet.stop()

    asyncio.run(scenario())


def test_a_loop_that_ends_by_itself_stops_the_agent_with_an_error_that_names_it(
    plugin_dir: Path, hw: FakeHardware
) -> None:
    """No loop of a running agent ends before its stop; one that does (a bug) must not leave the
    agent stopped in silence, or a standalone agent exiting 0: run() raises, naming the loop, and
    the agent still shuts down (its socket removed)."""
    hw.add_dev("/dev/ttyUSB0")

    async def scenario() -> None:
        async with PyKubelet(plugin_dir) as kubelet:
            agent = ResourceAgent(make_config(SERIAL), agent_options(plugin_dir, hw.root, poll_interval=3600))
            ended = asyncio.Event()

            async def monitor_that_returns(stop: asyncio.Event) -> None:
                await ended.wait()

            agent.monitor.run = monitor_that_returns  # type: ignore[method-assign]
            runner = asyncio.create_task(agent.run(asyncio.Event()))
            await kubelet.wait_for(lambda: RESOURCE in kubelet.devices)
            socket = registrar_of(agent).socket_path
            assert socket.exists() and not runner.done()
            ended.set()
            with pytest.raises(RuntimeError, match=r"the agent's monitor loop ended by itself"):
                await asyncio.wait_for(runner, timeout=15)
            assert not socket.exists()

    asyncio.run(scenario())
