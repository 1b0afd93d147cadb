"""`patchbay-agent` as a process: --help, exit codes that name the problem, SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest
import yaml
from support.agentrun import AGENT, agent_argv
from support.fakehw import FakeHardware
from support.pykubelet import PyKubelet

from patchbay_agent.kubelet.sockets import legacy_socket_name, socket_name


def _write(path: Path, doc: object) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def _run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AGENT, *args], capture_output=True, text=True, timeout=timeout, check=False)


def _serve(cfg: Path, plugin_dir: Path, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """The agent as a node runs it, without its HTTP endpoint: for what makes it exit at start."""
    argv = agent_argv(cfg, "n1", device_plugin_dir=plugin_dir, http_address="off")
    return _run(*argv[len(AGENT) :], timeout=timeout)


def test_help_explains_every_flag() -> None:
    out = _run("--help")
    assert out.returncode == 0
    for flag in (
        "--config",
        "--node-name",
        "--device-plugin-dir",
        "--host-root",
        "--http-address",
        "--http-max-connections",
        "--instance",
        "--log-format",
    ):
        assert flag in out.stdout
    assert "/var/lib/kubelet/device-plugins" in out.stdout


def test_bad_config_exits_2_naming_the_field(short_dir: Path) -> None:
    cfg = _write(
        short_dir / "c.yaml",
        {"resourceName": "example.com/x", "plugin": {"discovery": {"pci": {"vendor": "nvidia"}}}},
    )
    out = _run("--config", str(cfg), "--node-name", "n1", "--device-plugin-dir", str(short_dir))
    assert out.returncode == 2
    assert "plugin.discovery.pci.vendor" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_connection_cap_below_two_exits_2_naming_the_flag(short_dir: Path) -> None:
    out = _run("--config", "/nonexistent.yaml", "--node-name", "n1", "--http-max-connections", "1")
    assert out.returncode == 2
    assert "--http-max-connections" in out.stderr and "at least 2" in out.stderr
    assert "Traceback" not in out.stderr


def test_missing_required_flag_exits_2() -> None:
    out = _run("--config", "/nonexistent.yaml")
    assert out.returncode == 2
    assert "--node-name" in out.stderr


def test_nvml_without_driver_exits_3_with_a_clear_message(short_dir: Path) -> None:
    cfg = _write(
        short_dir / "c.yaml", {"resourceName": "nvidia.com/gpu", "plugin": {"discovery": {"nvml": {}}}}
    )
    out = _serve(cfg, short_dir)
    assert out.returncode == 3
    assert "nvidia-ml-py" in out.stderr or "NVIDIA driver" in out.stderr
    assert "Traceback" not in out.stderr


def _agent_argv(cfg: Path, plugin_dir: Path, hw: FakeHardware, *extra: str) -> list[str]:
    return agent_argv(
        cfg,
        "n1",
        *extra,
        device_plugin_dir=plugin_dir,
        host_root=hw.root,
        http_address="127.0.0.1:0",
        log_format="json",
    )


def test_sigterm_removes_only_its_own_socket_and_exits_0(
    short_dir: Path, plugin_dir: Path, hw: FakeHardware
) -> None:
    """Two agent processes of one resource (a rollout), plus another resource's sockets: SIGTERM
    to the first removes its socket and nothing else."""
    hw.add_dev("/dev/ttyUSB0")
    cfg = _write(
        short_dir / "c.yaml",
        {
            "resourceName": "example.com/serial",
            "plugin": {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}},
        },
    )
    # Another resource's sockets, one served and one stale: neither is the agent's business.
    foreign_live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    foreign_live.bind(str(plugin_dir / socket_name("example.com/serial-x", "1234abcd")))
    foreign_live.listen()
    foreign_stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    foreign_stale.bind(str(plugin_dir / legacy_socket_name("example.com/other")))
    foreign_stale.close()

    async def scenario() -> None:
        kubelet = PyKubelet(plugin_dir)
        await kubelet.start()
        procs = []
        try:
            for n in (1, 2):
                procs.append(
                    await asyncio.create_subprocess_exec(
                        *_agent_argv(cfg, plugin_dir, hw), stderr=asyncio.subprocess.PIPE
                    )
                )
                await kubelet.wait_for(lambda n=n: len(kubelet.registrations) == n, within=20)
            first, second = (plugin_dir / r.request.endpoint for r in kubelet.registrations)
            assert first != second
            before = set(os.listdir(plugin_dir))
            assert {first.name, second.name} <= before
            procs[0].send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(procs[0].communicate(), 20)
            assert procs[0].returncode == 0
            assert set(os.listdir(plugin_dir)) == before - {first.name}
            stderr = err.decode()
            assert '"msg": "Registered example.com/serial' in stderr
            assert '"msg": "Stopped"' in stderr
            procs[1].send_signal(signal.SIGTERM)
            await asyncio.wait_for(procs[1].communicate(), 20)
            assert procs[1].returncode == 0
            assert set(os.listdir(plugin_dir)) == before - {first.name, second.name}
        finally:
            for proc in procs:
                if proc.returncode is None:
                    os.kill(proc.pid, signal.SIGKILL)
                    await proc.wait()
            await kubelet.stop()

    try:
        asyncio.run(scenario())
    finally:
        foreign_live.close()


def test_instance_flag_names_the_socket_and_a_bad_one_is_refused(
    short_dir: Path, plugin_dir: Path, hw: FakeHardware
) -> None:
    out = _run("--config", "x", "--node-name", "n", "--instance", "Not-OK")
    assert out.returncode == 2
    assert "lowercase letters or digits" in out.stderr
    cfg = _write(
        short_dir / "c.yaml",
        {"resourceName": "example.com/serial", "plugin": {"discovery": {"virtual": {"count": 1}}}},
    )
    taken = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    taken.bind(str(plugin_dir / socket_name("example.com/serial", "rollout2")))
    taken.listen()
    try:
        refused = _run(*_agent_argv(cfg, plugin_dir, hw, "--instance", "rollout2")[len(AGENT) :])
    finally:
        taken.close()
    assert refused.returncode == 3
    assert "instance 'rollout2' is taken" in refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.mark.parametrize("flag", ["--http-address=nonsense", "--http-address=:80"])
def test_bad_http_address_is_refused(flag: str, short_dir: Path) -> None:
    out = _run("--config", "x", "--node-name", "n", flag)
    assert out.returncode == 2
    assert "HOST:PORT" in out.stderr


def test_a_list_over_the_kubelet_limit_exits_3_before_serving(short_dir: Path, plugin_dir: Path) -> None:
    cfg = _write(
        short_dir / "c.yaml",
        {
            "resourceName": "example.com/token",
            "plugin": {"discovery": {"virtual": {"count": 5000}}, "sharing": {"replicas": 100}},
        },
    )
    out = _serve(cfg, plugin_dir, timeout=120)
    assert out.returncode == 3
    assert "4194304-byte ListAndWatch limit" in out.stderr
    assert "plugin.sharing.replicas" in out.stderr
    assert list(plugin_dir.iterdir()) == []
