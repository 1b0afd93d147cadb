"""The DevicePlugin service over a real Unix socket with a real gRPC client: all five RPCs,
ListAndWatch updates, refusals, sharing and the 4 MiB cap. Devices come from FAKE hardware."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.agentparts import registrar_of
from support.agentrun import plugin_client, running_agent, until
from support.fakehw import FakeHardware

from patchbay_agent.api import api_pb2
from patchbay_agent.deviceplugin.encoding import ListTooLargeError

SERIAL = {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}, "health": {"periodSeconds": 60}}


def _ids(resp: api_pb2.ListAndWatchResponse) -> list[tuple[str, str]]:
    return [(d.ID, d.health) for d in resp.devices]


async def refused_allocate(client: Any, ids: list[str]) -> grpc.aio.AioRpcError:
    """The error of an Allocate of ``ids`` (one container) that the agent must refuse."""
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await client.Allocate(
            api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)])
        )
    return refused.value


def test_list_and_watch_full_list_then_every_change(plugin_dir: Path, hw: FakeHardware) -> None:
    hw.add_dev("/dev/ttyUSB0")
    hw.add_dev("/dev/ttyUSB1")

    # Recovery is advertised after a hold (10 s unless set): 1 s here.
    config = {**SERIAL, "health": {**SERIAL["health"], "recoveryHoldSeconds": 1}}  # type: ignore[dict-item]

    async def scenario() -> None:
        async with (
            running_agent(config, plugin_dir, hw.root) as agent,
            plugin_client(registrar_of(agent).socket_path) as client,
        ):
            stream = client.ListAndWatch(api_pb2.Empty())
            first = await asyncio.wait_for(stream.read(), 5)
            assert _ids(first) == [("ttyUSB0", "Healthy"), ("ttyUSB1", "Healthy")]
            # A device node appears: inotify on /dev makes the agent rescan at once
            # (the health period is 60 s, so only the event can explain the update).
            hw.add_dev("/dev/ttyUSB2")
            second = await asyncio.wait_for(stream.read(), 5)
            assert [i for i, _ in _ids(second)] == ["ttyUSB0", "ttyUSB1", "ttyUSB2"]
            # It vanishes: still listed (capacity), Unhealthy at once (allocatable drops).
            hw.remove_dev("/dev/ttyUSB0")
            third = await asyncio.wait_for(stream.read(), 5)
            assert _ids(third) == [("ttyUSB0", "Unhealthy"), ("ttyUSB1", "Healthy"), ("ttyUSB2", "Healthy")]
            hw.add_dev("/dev/ttyUSB0")
            # Back: Healthy once the hold is over (the period is 60 s: the agent wakes for it).
            fourth = await asyncio.wait_for(stream.read(), 5)
            assert _ids(fourth)[0] == ("ttyUSB0", "Healthy")
            stream.cancel()

    asyncio.run(scenario())


def test_options_tell_the_truth(plugin_dir: Path, hw: FakeHardware) -> None:
    async def scenario() -> None:
        plain = dict(SERIAL)
        async with (
            running_agent(plain, plugin_dir, hw.root) as agent,
            plugin_client(registrar_of(agent).socket_path) as client,
        ):
            opts = await client.GetDevicePluginOptions(api_pb2.Empty())
            assert (opts.pre_start_required, opts.get_preferred_allocation_available) == (False, False)
        rich = dict(SERIAL, preferredAllocation={"policy": "Spread"}, preStart={"command": ["/bin/true"]})
        async with (
            running_agent(rich, plugin_dir, hw.root) as agent,
            plugin_client(registrar_of(agent).socket_path) as client,
        ):
            opts = await client.GetDevicePluginOptions(api_pb2.Empty())
            assert (opts.pre_start_required, opts.get_preferred_allocation_available) == (True, True)

    asyncio.run(scenario())


def test_allocate_response_and_refusals(plugin_dir: Path, hw: FakeHardware) -> None:
    hw.add_dev("/dev/ttyUSB0")
    hw.add_dev("/dev/ttyUSB1")
    plugin = {
        "discovery": {
            "paths": {"globs": ["/dev/ttyUSB*"], "groups": [{"id": "pair", "paths": ["/dev/a", "/dev/b"]}]}
        },
        "sharing": {"replicas": 2},
        "health": {"periodSeconds": 60},
        "allocation": {
            "permissions": "rwm",
            "envs": {"FOO": "bar"},
            "mounts": [{"hostPath": "/opt/lib", "containerPath": "/usr/local/lib/dev", "readOnly": True}],
            "annotations": {"example.com/key": "value"},
            "cdi": {"kind": "example.com/serial"},
        },
    }

    async def scenario() -> None:
        async with (
            running_agent(plugin, plugin_dir, hw.root) as agent,
            plugin_client(registrar_of(agent).socket_path) as client,
        ):
            req = api_pb2.AllocateRequest(
                container_requests=[
                    api_pb2.ContainerAllocateRequest(devices_ids=["ttyUSB0::0", "ttyUSB0::1", "ttyUSB1::1"]),
                    api_pb2.ContainerAllocateRequest(devices_ids=["ttyUSB1::0"]),
                ]
            )
            resp = await client.Allocate(req)
            first, second = resp.container_responses
            # Two replicas of ttyUSB0 give ONE DeviceSpec for it.
            assert [(d.host_path, d.container_path, d.permissions) for d in first.devices] == [
                ("/dev/ttyUSB0", "/dev/ttyUSB0", "rwm"),
                ("/dev/ttyUSB1", "/dev/ttyUSB1", "rwm"),
            ]
            # The devices env names each physical device once, in allocation order.
            assert dict(first.envs) == {"FOO": "bar", "PATCHBAY_DEVICES": "ttyUSB0,ttyUSB1"}
            assert dict(second.envs) == {"FOO": "bar", "PATCHBAY_DEVICES": "ttyUSB1"}
            assert [(m.host_path, m.container_path, m.read_only) for m in first.mounts] == [
                ("/opt/lib", "/usr/local/lib/dev", True)
            ]
            assert dict(first.annotations) == {"example.com/key": "value"}
            assert [c.name for c in first.cdi_devices] == [
                "example.com/serial=ttyUSB0",
                "example.com/serial=ttyUSB1",
            ]
            # Every CDI name returned resolves in the spec file the agent wrote for the runtime.
            spec = json.loads((hw.root / "var/run/cdi/patchbay_example.com_serial.json").read_text())
            assert (spec["cdiVersion"], spec["kind"]) == ("0.5.0", "example.com/serial")
            nodes = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
            assert {c.name.split("=", 1)[1] for c in first.cdi_devices} <= set(nodes)
            assert nodes["ttyUSB1"] == [
                {"path": "/dev/ttyUSB1", "hostPath": "/dev/ttyUSB1", "permissions": "rwm"}
            ]
            assert [d.host_path for d in second.devices] == ["/dev/ttyUSB1"]

            unknown = await refused_allocate(client, ["nope"])
            assert unknown.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "unknown device IDs: 'nope'" in (unknown.details() or "")

            # The group's files do not exist: it is listed, and Unhealthy from its first check.
            unhealthy = await refused_allocate(client, ["pair::0"])
            assert unhealthy.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert "unhealthy device IDs: 'pair::0'" in (unhealthy.details() or "")

    asyncio.run(scenario())


def test_get_preferred_allocation_pack_over_rpc(plugin_dir: Path, hw: FakeHardware) -> None:
    for addr, numa in (("0000:01:00.0", 0), ("0000:02:00.0", 1), ("0000:03:00.0", 1), ("0000:04:00.0", 1)):
        hw.add_pci(addr, vendor="10de", device="2330", numa_node=numa)
    plugin = {
        "discovery": {"pci": {"vendor": "10de"}},
        "health": {"periodSeconds": 60},
        "preferredAllocation": {"policy": "Pack"},
    }

    async def scenario() -> None:
        async with (
            running_agent(plugin, plugin_dir, hw.root) as agent,
            plugin_client(registrar_of(agent).socket_path) as client,
        ):
            ids = ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0", "0000:04:00.0"]
            resp = await client.GetPreferredAllocation(
                api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=ids, allocation_size=2
                        ),
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=ids,
                            must_include_deviceIDs=["0000:01:00.0"],
                            allocation_size=2,
                        ),
                    ]
                )
            )
            a, b = resp.container_responses
            assert sorted(a.deviceIDs) == ["0000:02:00.0", "0000:03:00.0"]  # both on NUMA 1
            assert b.deviceIDs[0] == "0000:01:00.0"
            assert len(b.deviceIDs) == 2
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await client.GetPreferredAllocation(
                    api_pb2.PreferredAllocationRequest(
                        container_requests=[
                            api_pb2.ContainerPreferredAllocationRequest(
                                available_deviceIDs=ids, must_include_deviceIDs=ids[:3], allocation_size=2
                            )
                        ]
                    )
                )
            assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT

    asyncio.run(scenario())


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_pre_start_container_runs_the_command_only_when_configured_for_ids_it_serves(
    plugin_dir: Path, hw: FakeHardware, short_dir: Path
) -> None:
    hw.add_dev("/dev/ttyUSB0")
    seen = short_dir / "prestart.out"
    ok_cmd = _script(short_dir / "ok.sh", f'echo "$PATCHBAY_DEVICE_IDS" >> {seen}\n')
    bad_cmd = _script(short_dir / "bad.sh", 'echo "reset failed" >&2\nexit 4\n')

    async def scenario() -> None:
        for cmd, expect in ((ok_cmd, None), (bad_cmd, grpc.StatusCode.INTERNAL)):
            plugin = dict(SERIAL, preStart={"command": [cmd], "timeoutSeconds": 5})
            async with (
                running_agent(plugin, plugin_dir, hw.root) as agent,
                plugin_client(registrar_of(agent).socket_path) as client,
            ):
                req = api_pb2.PreStartContainerRequest(devices_ids=["ttyUSB0"])
                if expect is None:
                    await client.PreStartContainer(req)
                    # IDs it does not serve, or none: refused, and the command does not run.
                    for ids, words in (
                        (["ttyUSB0", "nope\x00"], "unknown device IDs: 'nope\\x00'"),
                        ([], "without"),
                    ):
                        with pytest.raises(grpc.aio.AioRpcError) as refused:
                            await client.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=ids))
                        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                        assert words in (refused.value.details() or "")
                else:
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await client.PreStartContainer(req)
                    assert err.value.code() is expect
                    assert "exited 4: reset failed" in (err.value.details() or "")
        hang = dict(
            SERIAL,
            preStart={"command": [sys.executable, "-c", "import time; time.sleep(30)"], "timeoutSeconds": 1},
        )
        async with (
            running_agent(hang, plugin_dir, hw.root) as agent,
            plugin_client(registrar_of(agent).socket_path) as client,
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await client.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=["ttyUSB0"]))
            assert err.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED

    asyncio.run(scenario())
    assert seen.read_text() == "ttyUSB0\n"


def test_allocate_is_not_blocked_by_a_hung_health_probe(
    plugin_dir: Path, hw: FakeHardware, short_dir: Path
) -> None:
    """The second probe run hangs until the test releases it. While that round is stuck,
    Allocate must still answer from the current snapshot."""
    hw.add_dev("/dev/ttyUSB0")
    probe = _script(
        short_dir / "probe.sh",
        f"cd {short_dir}\n"
        "n=$(cat count 2>/dev/null || echo 0); n=$((n + 1)); echo $n > count\n"
        'if [ "$n" -ge 2 ]; then touch blocked; while [ ! -f release ]; do sleep 0.02; done; fi\n',
    )
    plugin = {
        "discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}},
        "health": {"periodSeconds": 1, "exec": {"command": [probe], "timeoutSeconds": 60}},
    }

    async def scenario() -> None:
        async with (
            running_agent(plugin, plugin_dir, hw.root) as agent,
            plugin_client(registrar_of(agent).socket_path) as client,
        ):
            # The second probe started (and hangs).
            await until((short_dir / "blocked").exists)
            rounds = agent.monitor.rounds
            req = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["ttyUSB0"])]
            )
            resp = await asyncio.wait_for(client.Allocate(req), timeout=10)
            assert resp.container_responses[0].devices[0].host_path == "/dev/ttyUSB0"
            # The probe is still blocked, so the round cannot have finished.
            assert agent.monitor.rounds == rounds
            (short_dir / "release").touch()

    asyncio.run(scenario())


def test_replicas_that_exceed_the_kubelet_message_limit_are_refused(
    plugin_dir: Path, hw: FakeHardware
) -> None:
    plugin = {"discovery": {"virtual": {"count": 4000}}, "sharing": {"replicas": 100}}

    async def scenario() -> None:
        async with running_agent(plugin, plugin_dir, hw.root):
            pass

    with pytest.raises(ListTooLargeError, match=r"plugin\.sharing\.replicas"):
        asyncio.run(scenario())
    assert list(plugin_dir.iterdir()) == []  # nothing was served


def test_allocate_is_refused_when_the_cdi_spec_cannot_be_written(plugin_dir: Path, hw: FakeHardware) -> None:
    """The runtime would fail the container on a CDI name that resolves nowhere: Allocate fails
    first, naming the spec file and why."""
    hw.add_dev("/dev/ttyUSB0")
    blocker = hw.root / "not-a-dir"
    blocker.write_text("")
    plugin = {
        "discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}},
        "allocation": {"cdi": {"kind": "example.com/serial"}},
    }

    async def scenario() -> None:
        async with (
            running_agent(plugin, plugin_dir, hw.root, cdi_spec_dir=blocker / "cdi") as agent,
            plugin_client(registrar_of(agent).socket_path) as client,
        ):
            refused = await refused_allocate(client, ["ttyUSB0"])
            assert refused.code() is grpc.StatusCode.INTERNAL
            assert f"cannot write the CDI spec {blocker}/cdi/patchbay_example.com_serial.json" in (
                refused.details() or ""
            )

    asyncio.run(scenario())
