"""The agent with reports on, in-process, on real sockets: the Python kubelet peer, a PodResources
server the test sets, real Allocate calls, a FAKE device tree, and a fake API client that records
what would be applied (the real API server is tests/integration/agent). What is checked: the
first report names the holders, an Allocate makes the agent read PodResources again shortly after,
one vanished device costs one write, a quiet period none, and /metrics says so."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import urllib.request
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import grpc
from support.agentparts import registrar_of
from support.agentrun import make_config, plugin_client, until
from support.converge import running
from support.fakehw import FakeHardware
from support.podresources_peer import PodResourcesPeer
from support.promtext import parse, value
from support.pykubelet import PyKubelet

from patchbay_agent.api import api_pb2
from patchbay_agent.options import AgentOptions, ReportOptions
from patchbay_agent.resourceagent import ResourceAgent

RESOURCE = "example.com/serial"
PLUGIN = {
    "discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}},
    "health": {"periodSeconds": 3600},
    "sharing": {"replicas": 2},
}


class RecordingClient:
    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []
        self.uid_calls = 0

    def apply(self, report: Mapping[str, Any]) -> None:
        self.applied.append(dict(report))

    def node_uid(self, node_name: str) -> str:
        self.uid_calls += 1
        return "0b9e1f6c-node-uid"


def _agent(
    plugin_dir: Path, hw: FakeHardware, client: RecordingClient, report: ReportOptions, **options: Any
) -> ResourceAgent:
    """The serial agent reporting to ``client`` as ``report`` says; ``options``: more of its
    AgentOptions (its /metrics address)."""
    return ResourceAgent(
        make_config(PLUGIN, RESOURCE),
        AgentOptions(
            node_name="node-1",
            plugin_dir=plugin_dir,
            host_root=hw.root,
            shutdown_grace=1.0,
            report=report,
            **options,
        ),
        client,
    )


@contextlib.asynccontextmanager
async def reporting_agent(
    plugin_dir: Path, hw: FakeHardware, pod_resources: Path, client: RecordingClient
) -> AsyncIterator[ResourceAgent]:
    report = ReportOptions(
        profile="serial",
        namespace="patchbay",
        pod_name="patchbay-agent-serial-x1",
        pod_resources_socket=pod_resources,
        pod_resources_period=3600,
    )
    agent = _agent(
        plugin_dir,
        hw,
        client,
        report,
        http_address=("127.0.0.1", 0),
        metrics_holder_labels=True,  # --metrics-holder-labels: the holders are checked below
        backoff_initial=0.01,
        backoff_max=0.05,
    )
    async with running(agent.run, stop_within=15):
        await asyncio.wait_for(agent.started.wait(), timeout=10)
        yield agent


def _metrics(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return parse(r.read().decode())


def _devices(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["id"]: d for d in report["devices"]}


async def test_reports_follow_allocations_and_health_with_one_write_per_change(
    short_dir: Path, plugin_dir: Path, hw: FakeHardware
) -> None:
    hw.add_serials(3)
    client = RecordingClient()
    kubelet = PyKubelet(plugin_dir)
    peer = PodResourcesPeer(short_dir / "pr.sock")
    peer.hold("ml", "trainer", "main", RESOURCE, ["ttyUSB0::0", "ttyUSB0::1"])
    peer.hold("ml", "trainer", "main", "other.com/x", ["x0"])
    async with (
        kubelet,
        peer,
        reporting_agent(plugin_dir, hw, peer.socket, client) as agent,
        plugin_client(registrar_of(agent).socket_path) as stub,
    ):
        assert agent.reporter is not None
        assert agent.holders is not None
        await until(lambda: len(client.applied) == 1)
        first = client.applied[0]
        assert first["metadata"]["name"] == "serial.node-1"
        assert first["metadata"]["ownerReferences"][0]["uid"] == "0b9e1f6c-node-uid"
        assert first["agent"] == "patchbay-agent-serial-x1"
        assert first["summary"] == {"total": 3, "healthy": 3, "unhealthy": 0, "allocated": 1}
        assert _devices(first)["ttyUSB0"]["pods"] == [
            {"namespace": "ml", "name": "trainer", "container": "main"}
        ]
        assert peer.list_calls == 1

        # The kubelet allocates ttyUSB1's replica to a new pod: our Allocate answers, the
        # kubelet records it; about a second later the agent reads PodResources again.
        await until(lambda: RESOURCE in kubelet.devices)
        peer.hold("ml", "eval", "job", RESOURCE, ["ttyUSB1::1"])
        await stub.Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["ttyUSB1::1"])]
            )
        )
        await until(lambda: len(client.applied) == 2, within=5)
        assert peer.list_calls == 2
        second = client.applied[1]
        assert second["summary"]["allocated"] == 2
        assert _devices(second)["ttyUSB1"]["pods"] == [
            {"namespace": "ml", "name": "eval", "container": "job"}
        ]

        # A device vanishes (inotify: a round at once): one write, Unhealthy, Vanished.
        rounds = agent.monitor.rounds
        hw.remove_dev("/dev/ttyUSB2")
        await until(lambda: len(client.applied) == 3)
        third = _devices(client.applied[2])["ttyUSB2"]
        assert third["health"] == "Unhealthy"
        assert third["reason"] == "Vanished"
        assert "/dev/ttyUSB2" in third["message"]
        assert third["since"] >= first["devices"][0]["since"]
        assert client.applied[2]["summary"]["unhealthy"] == 1
        assert agent.monitor.rounds > rounds

        # A quiet period: rounds publish no new snapshot, so nothing is even compared;
        # a reporter told anyway compares and writes nothing.
        version, unchanged = agent.inventory.current.version, agent.reporter.unchanged
        for _ in range(3):
            await agent.monitor.round(periodic=True)
        assert agent.inventory.current.version == version
        agent.reporter.notify()
        await until(lambda: agent.reporter.unchanged > unchanged)
        await asyncio.sleep(0.7)  # more than the coalescing window
        assert len(client.applied) == 3
        assert client.uid_calls == 1

        families = await asyncio.to_thread(_metrics, agent.http.port)
        assert value(families, "patchbay_agent_device_healthy", device="ttyUSB0") == 1
        assert value(families, "patchbay_agent_device_healthy", device="ttyUSB2") == 0
        allocated = {
            (
                s.labels["holder_namespace"],
                s.labels["holder_pod"],
                s.labels["holder_container"],
            ): s.value
            for s in families["patchbay_agent_allocated_devices"].samples
        }
        assert allocated == {("ml", "trainer", "main"): 2, ("ml", "eval", "job"): 1}
        assert value(families, "patchbay_agent_report_writes_total", result="ok") == 3
        assert value(families, "patchbay_agent_pod_resources_reads_total", result="ok") == 2
        assert value(families, "patchbay_agent_report_unchanged_total") == agent.reporter.unchanged

        # The trainer ends: its series goes, and the report says ttyUSB0 is free.
        peer.remove_pod("ml", "trainer")
        await agent.holders.read()
        await until(lambda: len(client.applied) == 4)
        assert "pods" not in _devices(client.applied[3])["ttyUSB0"]
        families = await asyncio.to_thread(_metrics, agent.http.port)
        assert [s.labels["holder_pod"] for s in families["patchbay_agent_allocated_devices"].samples] == [
            "eval"
        ]

        # Refused Allocates (an ID the agent does not advertise: the pod is refused
        # admission) count at once and the report carries the count and the last message
        # (allocationFailures, a staged rollout's gate); the storm goes through the change
        # writer, so it costs fewer writes than failures.
        assert "allocationFailures" not in client.applied[-1]
        writes = len(client.applied)
        for _ in range(3):
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.Allocate(
                    api_pb2.AllocateRequest(
                        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["nope::0"])]
                    )
                )
        assert agent.failures.count == 3
        await until(lambda: client.applied[-1].get("allocationFailures", {}).get("count") == 3)
        failures = client.applied[-1]["allocationFailures"]
        assert failures["since"] and failures["last"]["time"]
        assert failures["last"]["message"].startswith("Allocate: ")
        assert "nope::0" in failures["last"]["message"]
        assert len(client.applied) - writes < 3


async def test_a_kubelet_without_podresources_does_not_stop_the_report(
    short_dir: Path, plugin_dir: Path, hw: FakeHardware
) -> None:
    hw.add_dev("/dev/ttyUSB0")
    client = RecordingClient()
    async with reporting_agent(plugin_dir, hw, short_dir / "absent.sock", client) as agent:
        await until(lambda: len(client.applied) == 1, within=15)
        assert agent.holders is not None
        assert agent.holders.failures >= 1
        assert client.applied[0]["summary"] == {"total": 1, "healthy": 1, "unhealthy": 0, "allocated": 0}


class HangingClient(RecordingClient):
    """An API server that does not answer: apply blocks until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def apply(self, report: Mapping[str, Any]) -> None:
        self.entered.set()
        self.release.wait(30)
        super().apply(report)


async def test_a_hanging_write_delays_neither_allocate_nor_the_socket_removal_at_shutdown(
    short_dir: Path, plugin_dir: Path, hw: FakeHardware
) -> None:
    hw.add_dev("/dev/ttyUSB0")
    client = HangingClient()
    report = ReportOptions("serial", "patchbay", pod_resources_socket=short_dir / "absent.sock")
    agent = _agent(plugin_dir, hw, client, report, http_address=None)
    async with PyKubelet(plugin_dir):
        try:
            async with running(agent.run, stop_within=15) as stop:
                await until(client.entered.is_set, within=15)
                await until(lambda: registrar_of(agent).registered)
                socket_path = registrar_of(agent).socket_path
                async with plugin_client(socket_path) as stub:
                    response = await stub.Allocate(
                        api_pb2.AllocateRequest(
                            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["ttyUSB0::0"])]
                        )
                    )
                assert response.container_responses[0].envs["PATCHBAY_DEVICES"] == "ttyUSB0"
                stop.set()
                # The write still hangs, and the socket is already gone.
                await until(lambda: not socket_path.exists())
                assert not client.release.is_set()
            # The agent's run has ended, the write still hanging.
            assert client.applied == []
        finally:
            client.release.set()
