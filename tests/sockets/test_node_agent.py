"""One node agent serving several profiles in one process, on real sockets: the Python kubelet
peer, a PodResources server, a FAKE device tree and a recording API client (the real API server is
tests/integration). What is checked: every selected profile gets its own socket, registration and
DeviceReport; a profile the node's labels do not select is not served; one profile's refused
config, one profile whose discovery cannot work (restarted with backoff) and one whose first
health round hangs on a probe never keep the others from serving, and each says why in its own
report; /metrics carries every profile's series, labelled by profile."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import grpc
from support.agentparts import dra_of, registrar_of, servicer_of
from support.agentrun import plugin_client, until
from support.converge import running
from support.draapi import InMemoryApi
from support.fakehw import FakeHardware
from support.podresources_peer import PodResourcesPeer
from support.promtext import parse, value
from support.pykubelet import PyKubelet

from patchbay_agent.api import (
    api_pb2,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from patchbay_agent.dra.slices import device_name
from patchbay_agent.nodeagent import AGENT_FAILED, CONFIG_INVALID, NodeAgent, NodeOptions
from patchbay_agent.nodeconfig import ProfileEntry, parse_node_config
from patchbay_agent.options import AgentOptions, ReportOptions
from patchbay_agent.resourceagent import ResourceAgent

NODE_LABELS = {"kubernetes.io/hostname": "node-1", "serial": "yes"}


def _entry(profile: str, resource: str, plugin: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"profile": profile, "mode": "DevicePlugin", "resourceName": resource, "plugin": plugin, **extra}


CONFIG = {
    "profiles": [
        _entry(
            "serial",
            "example.com/serial",
            {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}, "health": {"periodSeconds": 3600}},
            nodeSelectorTerms=[[{"key": "serial", "operator": "In", "values": ["yes"]}]],
        ),
        _entry("tokens", "example.com/tokens", {"discovery": {"virtual": {"count": 3}}}),
        # Not this node's: its term needs a label the node lacks.
        _entry(
            "elsewhere",
            "example.com/elsewhere",
            {"discovery": {"virtual": {"count": 1}}},
            nodeSelectorTerms=[[{"key": "gpu", "operator": "Exists"}]],
        ),
        # A bad glob: refused at parse time, reported, never started.
        _entry("broken", "example.com/broken", {"discovery": {"paths": {"globs": ["/etc/passwd"]}}}),
        # Discovery that cannot work on this node (no NVIDIA driver): fails at every start.
        _entry("gpus", "example.com/gpu", {"discovery": {"nvml": {}}}),
        # A probe that hangs far longer than the test: this profile's first round never ends.
        _entry(
            "hung",
            "example.com/hung",
            {
                "discovery": {"virtual": {"count": 2}},
                "health": {"exec": {"command": ["sleep", "600"], "timeoutSeconds": 600}},
            },
        ),
    ]
}


def _options(
    short_dir: Path,
    plugin_dir: Path,
    hw: FakeHardware,
    *,
    report: ReportOptions | None = None,
    http: tuple[str, int] | None = None,
    **node: Any,
) -> NodeOptions:
    """The node agent's options for these tests: fast backoffs, the fake hardware's root."""
    return NodeOptions(
        AgentOptions(
            node_name="node-1",
            plugin_dir=plugin_dir,
            host_root=hw.root,
            http_address=http,
            shutdown_grace=1.0,
            backoff_initial=0.01,
            backoff_max=0.05,
            cdi_spec_dir=short_dir / "cdi",
            report=report,
        ),
        report_namespace="patchbay",
        **node,
    )


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


class RecordingClient:
    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []

    def apply(self, report: Mapping[str, Any]) -> None:
        self.applied.append(dict(report))

    def node_uid(self, node_name: str) -> str:
        return "node-uid"

    def node_labels(self, node_name: str) -> dict[str, str]:
        return dict(NODE_LABELS)

    def last(self, profile: str) -> dict[str, Any] | None:
        mine = [r for r in self.applied if r["profile"] == profile]
        return mine[-1] if mine else None


def test_one_process_serves_every_selected_profile_and_contains_each_failure(
    short_dir: Path, plugin_dir: Path, hw: FakeHardware
) -> None:
    hw.add_serials(2)
    client = RecordingClient()
    entries = parse_node_config(CONFIG)
    assert {e.profile: bool(e.error) for e in entries}["broken"]

    async def scenario() -> None:
        kubelet = PyKubelet(plugin_dir)
        async with _serving(
            short_dir,
            plugin_dir,
            hw,
            entries,
            client,
            kubelet=kubelet,
            pod_name="patchbay-agent-x1",
            http=("127.0.0.1", 0),
            restart_initial=0.05,
            restart_max=0.2,
        ) as (node, _):
            await kubelet.wait_for(
                lambda: (
                    kubelet.healthy("example.com/serial") == 2 and kubelet.healthy("example.com/tokens") == 3
                )
            )
            assert set(node.units) == {"serial", "tokens", "broken", "gpus", "hung"}
            # Each served profile: its own socket and registration, its own report.
            endpoints = {r.request.resource_name: r.request.endpoint for r in kubelet.registrations}
            assert endpoints["example.com/serial"] != endpoints["example.com/tokens"]
            await until(lambda: client.last("serial") is not None and client.last("tokens") is not None)
            serial = client.last("serial")
            assert serial is not None
            assert serial["metadata"]["name"] == "serial.node-1"
            assert serial["summary"]["total"] == 2 and "agentError" not in serial

            # The refused config and the failing discovery: reported, each in its own report.
            await until(lambda: client.last("broken") is not None and client.last("gpus") is not None)
            broken, gpus = client.last("broken"), client.last("gpus")
            assert broken is not None and gpus is not None
            assert broken["agentError"]["reason"] == CONFIG_INVALID
            assert "plugin.discovery.paths.globs[0]" in broken["agentError"]["message"]
            assert gpus["agentError"]["reason"] == AGENT_FAILED
            assert broken["devices"] == [] and gpus["summary"]["total"] == 0
            # ... and the failing one is started again, while the others keep their one registration.
            await until(lambda: node.units["gpus"].starts >= 3)
            assert sum(r.request.resource_name == "example.com/serial" for r in kubelet.registrations) == 1
            assert kubelet.healthy("example.com/serial") == 2

            # The hung probe holds its own profile's first round only.
            assert "example.com/hung" not in kubelet.devices
            assert node.units["hung"].agent is not None
            assert not node.units["hung"].agent.started.is_set()
            assert "example.com/elsewhere" not in {r.request.resource_name for r in kubelet.registrations}

            # One /metrics for the node, every running profile's series labelled by profile.
            families = parse(await asyncio.to_thread(_get, f"http://127.0.0.1:{node.http.port}/metrics"))
            assert value(families, "patchbay_agent_physical_devices", profile="serial") == 2
            assert value(families, "patchbay_agent_physical_devices", profile="tokens") == 3

    asyncio.run(scenario())
    # Every socket the node agent served is gone with it.
    assert [p.name for p in plugin_dir.iterdir() if p.name != "kubelet.sock"] == []


def test_a_profile_change_reaches_the_running_agent_and_leaves_the_others_alone(
    short_dir: Path, plugin_dir: Path, hw: FakeHardware
) -> None:
    """Live reconfiguration: a changed profile is applied alone (in place), a new one starts, a
    node label that moves stops one; the untouched profile keeps its one registration and its one
    ListAndWatch stream, and the kubelet's healthy count of it (sampled all along) never dips."""
    hw.add_serials(2)
    serial = CONFIG["profiles"][0]
    tokens = _entry("tokens", "example.com/tokens", {"discovery": {"virtual": {"count": 3}}})
    client = RecordingClient()

    async def scenario() -> None:
        lowest: list[int] = []
        kubelet = PyKubelet(plugin_dir)
        entries = parse_node_config({"profiles": [serial, tokens]})
        async with _serving(short_dir, plugin_dir, hw, entries, client, kubelet=kubelet) as (node, _):

            async def sample() -> None:
                while True:  # until cancelled
                    lowest.append(kubelet.healthy("example.com/serial"))
                    await asyncio.sleep(0.005)

            await kubelet.wait_for(
                lambda: (
                    kubelet.healthy("example.com/serial") == 2 and kubelet.healthy("example.com/tokens") == 3
                )
            )
            sampler = asyncio.create_task(sample())
            serial_agent = node.units["serial"].agent
            assert serial_agent is not None

            # tokens' plugin changes (3 -> 5) and a new profile appears.
            more = _entry("tokens", "example.com/tokens", {"discovery": {"virtual": {"count": 5}}})
            extra = _entry("extra", "example.com/extra", {"discovery": {"virtual": {"count": 1}}})
            done = await _apply(node, {"profiles": [serial, more, extra]})
            assert done == {"tokens": "reconfigured", "extra": "started"}
            await kubelet.wait_for(
                lambda: (
                    kubelet.healthy("example.com/tokens") == 5 and kubelet.healthy("example.com/extra") == 1
                )
            )
            # The same config again: nothing to do.
            assert await _apply(node, {"profiles": [serial, more, extra]}) == {}

            # The node's serial label goes: serial stops, the others stay.
            node.update(labels={"kubernetes.io/hostname": "node-1"})
            assert node._pending is not None
            assert await node._pending == {"serial": "stopped"}
            assert "serial" not in node.units
            assert node.units["tokens"].starts == 1

            # Serial was untouched until its label went: one registration, one stream, no dip.
            assert sum(r.request.resource_name == "example.com/serial" for r in kubelet.registrations) == 1
            assert servicer_of(serial_agent).streams_opened == 1
            sampler.cancel()
            assert lowest and min(lowest) == 2

    asyncio.run(scenario())


class _Server(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


@contextlib.asynccontextmanager
async def _serving(
    short_dir: Path,
    plugin_dir: Path,
    hw: FakeHardware,
    entries: Sequence[ProfileEntry],
    client: RecordingClient,
    *,
    kubelet: _Server | None = None,
    pod_name: str | None = None,
    labels: Mapping[str, str] | None = None,
    **options: Any,
) -> AsyncIterator[tuple[NodeAgent, asyncio.Event]]:
    """A node agent of `entries` (the node's `labels`, else the client's) reporting to `client`,
    its holders from a PodResources peer: running for the block, which gets the agent and its
    stop event; at the end its run is ended (bounded), then the peer and `kubelet` (started here
    when given) stop. `pod_name`: the report's agent; `options`: more of `_options`'s."""
    peer = PodResourcesPeer(short_dir / "pr.sock")
    report = ReportOptions("unused", "patchbay", pod_name, peer.socket, pod_resources_period=3600)
    node = NodeAgent(
        entries, _options(short_dir, plugin_dir, hw, report=report, **options), client, labels=labels
    )
    servers = [peer] if kubelet is None else [kubelet, peer]
    for server in servers:
        await server.start()
    try:
        async with running(node.run, stop_within=20) as stop:
            yield node, stop
    finally:
        for server in reversed(servers):
            await server.stop()


def _healthy(kubelet: PyKubelet, *names: str) -> tuple[int, ...]:
    return tuple(kubelet.healthy(f"example.com/{n}") for n in names)


async def _apply(node: NodeAgent, config: dict[str, Any]) -> dict[str, str]:
    """What the ConfigMap follower does with a new node config, awaited."""
    node.update(entries=parse_node_config(config))
    pending = node._pending
    node._pending = None
    return {} if pending is None else await pending


def test_the_node_agent_waits_for_the_api_server_instead_of_exiting(
    short_dir: Path, plugin_dir: Path, hw: FakeHardware
) -> None:
    """Its Node's labels cannot be read at first (an API server not there yet): the agent asks
    again with backoff and serves once they come, rather than exiting into a crash loop."""

    class Late(RecordingClient):
        def __init__(self) -> None:
            super().__init__()
            self.asked = 0

        def node_labels(self, node_name: str) -> dict[str, str]:
            self.asked += 1
            if self.asked < 3:
                raise ConnectionError("the API server does not answer")
            return super().node_labels(node_name)

    client = Late()

    async def scenario() -> None:
        tokens = _entry("tokens", "example.com/tokens", {"discovery": {"virtual": {"count": 3}}})
        async with (
            PyKubelet(plugin_dir) as kubelet,
            _serving(short_dir, plugin_dir, hw, parse_node_config({"profiles": [tokens]}), client),
        ):
            await kubelet.wait_for(lambda: _healthy(kubelet, "tokens") == (3,), within=30)
            assert client.asked == 3

    asyncio.run(scenario())


def test_a_changed_profile_is_applied_in_place_on_kubelets_that_drop_a_resource_whose_stream_ends(
    short_dir: Path, plugin_dir: Path, hw: FakeHardware
) -> None:
    """Against a kubelet that behaves like those before v1.37 (one client per resource: any stream
    that ends drops the resource), a change of discovery, health and allocation reaches the running
    agent without a new registration or stream: the kubelet's healthy count, sampled all along,
    never dips below what the profile advertises, the narrower discovery forgets the device it no
    longer finds (not "vanished"), and Allocate answers with the new environment. A change the
    kubelet must hear of (a preStart hook: a registration option) starts a new agent instead."""
    hw.add_serials(3)
    resource = "example.com/serial"

    def serial(globs: list[str], **plugin: Any) -> dict[str, Any]:
        return _entry("serial", resource, {"discovery": {"paths": {"globs": globs}}, **plugin})

    async def scenario() -> None:
        kubelet = PyKubelet(plugin_dir, one_client_per_resource=True)
        client = RecordingClient()
        first = serial(
            ["/dev/ttyUSB*"], allocation={"envs": {"STAGE": "one"}}, health={"periodSeconds": 3600}
        )
        entries = parse_node_config({"profiles": [first]})
        lowest: list[int] = []

        async def sample() -> None:
            while not stop.is_set():
                lowest.append(kubelet.healthy(resource))
                await asyncio.sleep(0.002)

        async def allocate_env(device: str) -> dict[str, str]:
            agent = node.units["serial"].agent
            assert agent is not None
            async with plugin_client(registrar_of(agent).socket_path) as client:
                request = api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[device])]
                )
                response = await client.Allocate(request, timeout=5)
            return dict(response.container_responses[0].envs)

        async with _serving(
            short_dir, plugin_dir, hw, entries, client, kubelet=kubelet, labels=NODE_LABELS
        ) as (
            node,
            stop,
        ):
            await kubelet.wait_for(lambda: kubelet.healthy(resource) == 3)
            agent = node.units["serial"].agent
            assert agent is not None
            assert (await allocate_env("ttyUSB0"))["STAGE"] == "one"
            await until(lambda: client.last("serial") is not None)
            sampler = asyncio.create_task(sample())

            # Only the environment changes: in place, and the DeviceReport (unchanged) is not
            # written again.
            writes = len(client.applied)
            env_only = serial(
                ["/dev/ttyUSB*"], allocation={"envs": {"STAGE": "half"}}, health={"periodSeconds": 3600}
            )
            assert await _apply(node, {"profiles": [env_only]}) == {"serial": "reconfigured"}
            assert (await allocate_env("ttyUSB0"))["STAGE"] == "half"
            await asyncio.sleep(0.5)
            assert len(client.applied) == writes, client.applied[writes:]

            # Narrower discovery, new thresholds and period, a new environment: in place.
            second = serial(
                ["/dev/ttyUSB0", "/dev/ttyUSB1"],
                allocation={"envs": {"STAGE": "two"}},
                health={"periodSeconds": 1, "failureThreshold": 2},
            )
            assert await _apply(node, {"profiles": [second]}) == {"serial": "reconfigured"}
            await kubelet.wait_for(lambda: len(kubelet.devices.get(resource, [])) == 2)
            assert node.units["serial"].agent is agent
            assert (await allocate_env("ttyUSB1"))["STAGE"] == "two"
            # The device the new discovery leaves out is gone, not listed Unhealthy.
            assert sorted(d.ID for d in kubelet.devices[resource]) == ["ttyUSB0", "ttyUSB1"]
            assert kubelet.healthy(resource) == 2
            sampler.cancel()
            assert min(lowest) >= 2, f"the kubelet's count dipped to {min(lowest)}"
            assert sum(r.request.resource_name == resource for r in kubelet.registrations) == 1
            assert servicer_of(agent).streams_opened == 1
            assert kubelet.dropped == []

            # A preStart hook changes what the kubelet was told at registration: a new agent.
            third = serial(["/dev/ttyUSB0"], preStart={"command": ["true"]})
            assert await _apply(node, {"profiles": [third]}) == {"serial": "restarted"}
            await kubelet.wait_for(
                lambda: (
                    sum(r.request.resource_name == resource for r in kubelet.registrations) >= 2
                    and kubelet.healthy(resource) == 1
                )
            )
            assert node.units["serial"].agent is not agent
            assert kubelet.registrations[-1].options is not None
            assert kubelet.registrations[-1].options.pre_start_required

    asyncio.run(scenario())


class DraRecordingClient(RecordingClient, InMemoryApi):
    """The node agent's API for a DRA profile: reports recorded, claims and slices in memory,
    claim status applies recorded."""

    def __init__(self) -> None:
        RecordingClient.__init__(self)
        InMemoryApi.__init__(self)
        self.claim_status: list[dict[str, Any]] = []

    def apply_claim_status(self, doc: Mapping[str, Any], field_manager: str) -> None:
        self.claim_status.append(dict(doc))


def test_a_dra_profile_of_the_node_agent_keeps_its_driver_inside_the_node_agents_own_directory(
    short_dir: Path, plugin_dir: Path, hw: FakeHardware
) -> None:
    """The shared node agent's pod mounts only `<kubelet root>/plugins/patchbay_node-agent`
    (docs/security.md#host-access): its DRA unit must announce its service socket, take its lock
    and record its prepared claims in its driver's directory INSIDE that one, never beside the
    other drivers' in `<kubelet root>/plugins`. Registration still goes to `plugins_registry`."""
    hw.add_dev("/dev/ttyUSB0")
    driver, root = "serial.patchbay.dev", short_dir / "k"
    own = root / "plugins" / "patchbay_node-agent"
    entry = {
        "profile": "serial",
        "mode": "DRA",
        "driver": driver,
        "resourceName": "example.com/serial",
        "plugin": {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}, "health": {"periodSeconds": 3600}},
    }

    async def scenario() -> None:
        client = DraRecordingClient()
        entries = parse_node_config({"profiles": [entry]})
        async with _serving(
            short_dir, plugin_dir, hw, entries, client, labels=NODE_LABELS, kubelet_root_dir=root
        ) as (node, _):

            def dra_agent() -> ResourceAgent | None:
                unit = node.units.get("serial")
                return unit.agent if unit is not None else None

            await until(dra_agent)
            agent = dra_agent()
            assert agent is not None
            plugin = dra_of(agent)
            await until(lambda: plugin.registry_socket.exists() and plugin.service_socket.exists())
            assert plugin.registry_socket.parent == root / "plugins_registry"
            assert plugin.service_socket == own / driver / f"dra-{agent.instance}.sock"
            async with grpc.aio.insecure_channel(f"unix://{plugin.registry_socket}") as channel:
                info = await pluginregistration_pb2_grpc.RegistrationStub(channel).GetInfo(
                    pluginregistration_pb2.InfoRequest(), timeout=1
                )
            assert info.endpoint == str(plugin.service_socket)

            device = device_name("ttyUSB0")
            results = [{"request": "serial", "driver": driver, "pool": "node-1", "device": device}]
            client.claims["ns", "c1"] = {
                "metadata": {"uid": "uid-1"},
                "status": {"allocation": {"devices": {"results": results}}},
            }
            async with grpc.aio.insecure_channel(f"unix://{plugin.service_socket}") as channel:
                got = await dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                    dra_v1_pb2.NodePrepareResourcesRequest(
                        claims=[dra_v1_pb2.Claim(namespace="ns", uid="uid-1", name="c1")]
                    ),
                    timeout=45,
                )
            assert got.claims["uid-1"].error == ""
            await until((own / driver / "claim-uid-1.json").exists)
            assert (own / driver / "calls.lock").exists()
            # Nothing of this agent's beside the other drivers' directories.
            assert [p.name for p in (root / "plugins").iterdir()] == ["patchbay_node-agent"]
            assert [p.name for p in own.iterdir()] == [driver]

    asyncio.run(scenario())


def test_a_label_change_that_moves_the_node_to_another_node_group_reconfigures_its_unit_live(
    short_dir: Path, plugin_dir: Path, hw: FakeHardware
) -> None:
    """Node groups (docs/api.md#node-groups): the node serves the first group its labels select,
    else the profile's own settings (`default`); a label change that moves it to a group whose
    change can be made in place (another discovery) keeps the registration and the stream, one
    the kubelet must hear of (sharing replicas) registers again, like a changed profile; the
    DeviceReport names the group each time."""
    base = {"discovery": {"virtual": {"count": 2}}}
    entry = _entry(
        "gpus",
        "example.com/gpus",
        base,
        nodeGroups=[
            {
                "name": "many",
                "nodeSelectorTerms": [[{"key": "many", "operator": "In", "values": ["yes"]}]],
                "plugin": {"discovery": {"virtual": {"count": 5}}},
            },
            {
                "name": "shared",
                "nodeSelectorTerms": [[{"key": "shared", "operator": "Exists"}]],
                "plugin": {**base, "sharing": {"replicas": 2}},
            },
        ],
    )
    client = RecordingClient()

    def group() -> str | None:
        last = client.last("gpus")
        return None if last is None else str(last.get("nodeGroup"))

    async def scenario() -> None:
        kubelet = PyKubelet(plugin_dir)
        entries = parse_node_config({"profiles": [entry]})
        async with _serving(short_dir, plugin_dir, hw, entries, client, kubelet=kubelet, labels={}) as (
            node,
            _,
        ):

            async def relabel(labels: dict[str, str]) -> dict[str, str]:
                node.update(labels=labels)
                assert node._pending is not None
                return await node._pending

            await kubelet.wait_for(lambda: kubelet.healthy("example.com/gpus") == 2)
            await until(lambda: group() == "default")
            agent = node.units["gpus"].agent
            assert agent is not None

            assert await relabel({"many": "yes"}) == {"gpus": "reconfigured"}
            await kubelet.wait_for(lambda: kubelet.healthy("example.com/gpus") == 5)
            await until(lambda: group() == "many")
            assert node.units["gpus"].agent is agent and servicer_of(agent).streams_opened == 1
            assert sum(r.request.resource_name == "example.com/gpus" for r in kubelet.registrations) == 1

            # Both groups select the node now: the first listed (many) stays; nothing to do.
            assert await relabel({"many": "yes", "shared": ""}) == {}

            assert await relabel({"shared": ""}) == {"gpus": "restarted"}
            await kubelet.wait_for(lambda: kubelet.healthy("example.com/gpus") == 4)  # 2 devices x 2
            await until(lambda: group() == "shared")

            assert await relabel({}) == {"gpus": "restarted"}
            await kubelet.wait_for(lambda: kubelet.healthy("example.com/gpus") == 2)
            await until(lambda: group() == "default")

    asyncio.run(scenario())


def test_a_dra_profiles_node_group_changes_what_its_slices_publish_when_a_label_moves_the_node(
    short_dir: Path, plugin_dir: Path, hw: FakeHardware
) -> None:
    """Node groups in DRA mode (docs/dra.md#node-groups): the node publishes its devices with its
    group's settings (here sharing: consumable capacity, 2 shares a device) and unshared outside
    the group; a label change restarts the DRA unit (any DRA change does) and the slices follow;
    the DeviceReport names the group."""
    driver = "gpus.patchbay.dev"
    entry = {
        "profile": "gpus",
        "mode": "DRA",
        "driver": driver,
        "resourceName": "example.com/gpus",
        "plugin": {"discovery": {"virtual": {"count": 2}}},
        "nodeGroups": [
            {
                "name": "shared",
                "nodeSelectorTerms": [[{"key": "shared", "operator": "Exists"}]],
                "plugin": {"discovery": {"virtual": {"count": 2}}, "sharing": {"replicas": 2}},
            }
        ],
    }
    client = DraRecordingClient()

    def devices() -> list[dict[str, Any]]:
        return [d for s in client.slices.values() for d in s["spec"].get("devices") or []]

    def group() -> str | None:
        last = client.last("gpus")
        return None if last is None else str(last.get("nodeGroup"))

    def shares() -> set[str]:
        return {
            str(((d.get("capacity") or {}).get("patchbay.dev/shares") or {}).get("value", "-"))
            for d in devices()
        }

    async def scenario() -> None:
        entries = parse_node_config({"profiles": [entry]})
        async with _serving(
            short_dir, plugin_dir, hw, entries, client, labels={}, kubelet_root_dir=short_dir / "k"
        ) as (node, _):
            await until(lambda: len(devices()) == 2 and group() == "default")
            assert shares() == {"-"} and not any(d.get("allowMultipleAllocations") for d in devices())

            node.update(labels={"shared": ""})
            assert node._pending is not None
            assert await node._pending == {"gpus": "restarted"}
            await until(lambda: group() == "shared" and shares() == {"2"}, within=20)
            assert len(devices()) == 2 and all(d.get("allowMultipleAllocations") for d in devices())

            node.update(labels={})
            assert node._pending is not None
            assert await node._pending == {"gpus": "restarted"}
            await until(lambda: group() == "default" and shares() == {"-"}, within=20)

    asyncio.run(scenario())
