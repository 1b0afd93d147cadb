"""SIGTERM to the agent process: it ends its streams, removes its socket and exits within its
grace (5 s by default), and nothing registers again after the signal, whatever the kubelet does
with the streams meanwhile: one kubelet peer closes them as the agent shuts down, the other keeps
them until the agent ends them. Both peers keep one client per resource, as kubelets before 1.37
do, so a stream's end is what a drop looks like to the agent's registration loop: the loop took
it for one and registered again while shutting down (seen with an independent fake kubelet:
still there 10 s after SIGTERM, its socket left behind, three runs of four)."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from support.fakehw import FakeHardware
from support.kubeletpeer import AgentProcess
from support.pykubelet import PyKubelet

RESOURCE = "example.com/serial"
#: The agent's default --shutdown-grace, and how long past it the test waits for the exit.
GRACE = 5.0
MARGIN = 3.0


def _config(short_dir: Path) -> Path:
    config = short_dir / "agent.yaml"
    config.write_text(
        f"resourceName: {RESOURCE}\nplugin:\n  discovery: {{paths: {{globs: ['/dev/ttyUSB*']}}}}\n"
    )
    return config


async def _exited(agent: AgentProcess, within: float) -> int | None:
    """The exit status once the process has exited, or None if it has not within `within` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if (rc := agent.proc.poll()) is not None:
            return rc
        await asyncio.sleep(0.02)
    return agent.proc.poll()


def _run(short_dir: Path, hw: FakeHardware, *, kubelet_closes: bool) -> None:
    for n in range(4):
        hw.add_dev(f"/dev/ttyUSB{n}")
    plugin_dir = short_dir / "dp"
    plugin_dir.mkdir()

    async def scenario() -> None:
        kubelet = PyKubelet(plugin_dir, one_client_per_resource=True)
        await kubelet.start()
        agent = AgentProcess(_config(short_dir), plugin_dir, hw.root, short_dir / "agent.log")
        try:
            await kubelet.wait_for(lambda: kubelet.healthy(RESOURCE) == 4, within=30)
            (socket,) = [p for p in plugin_dir.iterdir() if p.name != "kubelet.sock"]
            # From now on the kubelet answers Register slowly: a registration the agent sends
            # while it shuts down would hold it past its grace.
            kubelet.dial_delay = 2 * GRACE
            registrations, attempts = len(kubelet.registrations), len(kubelet.attempts)
            if kubelet_closes:
                # The kubelet closes the streams as the agent is told to go: to a kubelet that
                # keeps one client per resource, a drop. The agent's loop is registering again
                # (slowly: its Register is held in the kubelet) when SIGTERM arrives.
                await kubelet.drop_streams()
                await kubelet.wait_for(lambda: len(kubelet.attempts) > attempts)
            agent.proc.send_signal(signal.SIGTERM)
            rc = await _exited(agent, GRACE + MARGIN)
            waited = GRACE + MARGIN
            assert rc == 0, f"still running {waited:.0f} s after SIGTERM (rc {rc}):\n{agent.log_tail()}"
            await asyncio.sleep(0.2)
            assert len(kubelet.registrations) == registrations, f"registered as it left:\n{agent.log_tail()}"
            assert not socket.exists(), agent.log_tail()
        finally:
            agent.stop()
            await kubelet.stop()

    asyncio.run(scenario())


def test_sigterm_while_the_kubelet_closes_the_streams(short_dir: Path, hw: FakeHardware) -> None:
    _run(short_dir, hw, kubelet_closes=True)


def test_sigterm_while_the_kubelet_keeps_the_streams(short_dir: Path, hw: FakeHardware) -> None:
    _run(short_dir, hw, kubelet_closes=False)
