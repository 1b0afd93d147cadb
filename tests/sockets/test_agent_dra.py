"""DRA mode on real Unix sockets: the kubelet's side played by a Python gRPC client.

The agent runs in-process in DRA mode. What it needs of the API server is a `DraClient`; here an
in-memory one (claims the test sets, slices it records), because this tier runs without a control
plane: tests/integration/agent/test_agent_dra_on_the_api_server.py covers the same calls against
the real kube-apiserver.

Checked: GetInfo over the registration socket names the driver, the service socket and the DRA
services; NotifyRegistrationStatus(true) makes /readyz ready and re-asserts the slices;
NodePrepareResources over v1 and v1beta1 answers CDI IDs and writes one spec per claim, twice the
same; errors are per claim; NodeUnprepareResources deletes the file, also for an unknown claim;
stopping removes only our two sockets; no device-plugin socket is ever served. The health streams
on the service socket, `v1.DRAResourceHealth` (kubelets from 1.37) and `v1alpha1.DRAResourceHealth`
(kubelets 1.34 to 1.36 dial only that one), both send the whole list, all healthy, then the
removed device unhealthy with its reason, and end with OK when the agent stops.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import grpc
from support.agentparts import dra_of
from support.agentrun import dra_agent, make_config, until
from support.draapi import InMemoryApi
from support.fakehw import FakeHardware, live_socket

from patchbay_agent.api import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from patchbay_agent.dra.slices import device_name
from patchbay_agent.options import AgentOptions, DraOptions
from patchbay_agent.resourceagent import ResourceAgent

DRIVER = "serial.patchbay.dev"
NODE = "node-1"


def _claim(
    uid: str,
    devices: list[str],
    pool: str = NODE,
    pod_claim_name: str | None = None,
    request: str = "serial",
) -> dict[str, Any]:
    results = [{"request": request, "driver": DRIVER, "pool": pool, "device": d} for d in devices]
    meta: dict[str, Any] = {"uid": uid}
    if pod_claim_name:
        meta["annotations"] = {"resource.kubernetes.io/pod-claim-name": pod_claim_name}
    return {"metadata": meta, "status": {"allocation": {"devices": {"results": results}}}}


def _metadata_stream(path: Path) -> list[dict[str, Any]]:
    """Every object of a device metadata file (a JSON stream), as a reader decodes it."""
    text, decoder, at, out = path.read_text(), json.JSONDecoder(), 0, []
    while text[at:].strip():
        obj, end = decoder.raw_decode(text[at:].lstrip())
        at = len(text) - len(text[at:].lstrip()) + end
        out.append(obj)
    return out


async def _get(port: int, path: str) -> int:
    def call() -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    return await asyncio.to_thread(call)


async def test_dra_plugin_registers_prepares_and_unprepares(short_dir: Path, hw: FakeHardware) -> None:
    for i in range(3):
        hw.add_dev(f"/dev/ttyUSB{i}")
    root = short_dir / "k"
    plugin_dir = short_dir / "dp"
    plugin_dir.mkdir()
    cdi_dir = short_dir / "cdi"
    api = InMemoryApi()
    agent = ResourceAgent(
        make_config(
            {
                "discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}},
                "allocation": {"envs": {"MODE": "raw"}, "devicesEnvName": "SERIALS"},
            }
        ),
        AgentOptions(
            node_name=NODE,
            plugin_dir=plugin_dir,
            host_root=hw.root,
            http_address=("127.0.0.1", 0),
            shutdown_grace=1.0,
            cdi_spec_dir=cdi_dir,
            dra=DraOptions(DRIVER, root),
        ),
        client=api,
    )
    dra_of(agent)  # a DRA agent (asserts it)
    registry = dra_of(agent).registry_socket
    service = dra_of(agent).service_socket
    assert registry == root / "plugins_registry" / f"{DRIVER}-{agent.instance}.sock"
    assert service == root / "plugins" / DRIVER / f"dra-{agent.instance}.sock"
    # Another agent of the driver (a rollout's other half) serves its own socket: it stays.
    root.joinpath("plugins_registry").mkdir(parents=True)
    other = live_socket(root / "plugins_registry" / f"{DRIVER}-other1.sock")

    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(agent.started.wait(), timeout=10)
        assert registry.exists() and service.exists()
        assert list(plugin_dir.iterdir()) == []  # never a device plugin
        port = agent.http.port
        assert await _get(port, "/healthz") == 200
        assert await _get(port, "/readyz") == 503
        await until(lambda: api.slices)
        (slice_doc,) = api.slices.values()
        assert slice_doc["metadata"]["name"] == f"{NODE}-{DRIVER}"
        assert [d["name"] for d in slice_doc["spec"]["devices"]] == [
            device_name(f"ttyUSB{i}") for i in range(3)
        ]
        applies = api.applies

        async with grpc.aio.insecure_channel(f"unix://{registry}") as channel:
            reg = pluginregistration_pb2_grpc.RegistrationStub(channel)
            info = await reg.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=1)
            assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == (
                "DRAPlugin",
                DRIVER,
                str(service),
                ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"],
            )
            await reg.NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=5
            )
        assert await _get(port, "/readyz") == 200
        # A registration re-asserts the slices (the kubelet deletes them when it starts).
        await until(lambda: api.applies > applies)

        tty1, tty2 = device_name("ttyUSB1"), device_name("ttyUSB2")
        api.claims["ns", "c1"] = _claim("uid-1", [tty1, tty2])
        api.claims["ns", "c2"] = _claim("uid-2", ["nope"])
        api.claims["ns", "c3"] = _claim("uid-other", [tty1])
        async with grpc.aio.insecure_channel(f"unix://{service}") as channel:
            v1 = dra_v1_pb2_grpc.DRAPluginStub(channel)
            request = dra_v1_pb2.NodePrepareResourcesRequest(
                claims=[
                    dra_v1_pb2.Claim(namespace="ns", uid="uid-1", name="c1"),
                    dra_v1_pb2.Claim(namespace="ns", uid="uid-2", name="c2"),
                    dra_v1_pb2.Claim(namespace="ns", uid="uid-3", name="c3"),
                    dra_v1_pb2.Claim(namespace="ns", uid="uid-4", name="gone"),
                ]
            )
            first = await v1.NodePrepareResources(request, timeout=45)
            spec_path = cdi_dir / f"patchbay_{DRIVER}_uid-1.json"
            written = spec_path.stat().st_mtime_ns
            second = await v1.NodePrepareResources(request, timeout=45)
            assert first == second
            assert spec_path.stat().st_mtime_ns == written  # prepared twice: written once
            ok = first.claims["uid-1"]
            assert ok.error == ""
            assert [
                (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
                for d in ok.devices
            ] == [
                # The request's first device also mounts its device metadata file.
                (["serial"], NODE, tty1, [f"{DRIVER}/device=uid-1-{tty1}", f"{DRIVER}/device=uid-1_serial"]),
                (["serial"], NODE, tty2, [f"{DRIVER}/device=uid-1-{tty2}"]),
            ]
            assert "'nope'" in first.claims["uid-2"].error
            assert "replaced" in first.claims["uid-3"].error
            assert "404" in first.claims["uid-4"].error
            # The three claims answered with an error, in both calls, are counted for the DRA
            # prepare alert.
            text = await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            )
            assert 'patchbay_agent_dra_claim_errors_total{method="NodePrepareResources"} 6.0' in text
            spec = json.loads(spec_path.read_text())
            assert spec["kind"] == f"{DRIVER}/device"
            assert [d["name"] for d in spec["devices"]] == [f"uid-1-{tty1}", f"uid-1-{tty2}", "uid-1_serial"]
            assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] == "/dev/ttyUSB1"
            # The device metadata (KEP-5304): upstream's host path, container path and stream.
            meta_file = service.parent / "dra-device-metadata" / "ns_c1" / "serial" / "metadata.json"
            assert spec["devices"][2]["containerEdits"] == {
                "mounts": [
                    {
                        "hostPath": str(meta_file),
                        "containerPath": "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/"
                        f"c1/serial/{DRIVER}-metadata.json",
                        "type": "bind",
                        "options": ["ro", "bind"],
                    }
                ]
            }
            beta1, alpha1 = _metadata_stream(meta_file)
            assert beta1["apiVersion"] == "metadata.resource.k8s.io/v1beta1"
            assert alpha1 == {**beta1, "apiVersion": "metadata.resource.k8s.io/v1alpha1"}
            assert beta1["kind"] == "DeviceMetadata"
            assert beta1["metadata"] == {"name": "c1", "namespace": "ns", "uid": "uid-1", "generation": 1}
            assert "podClaimName" not in beta1
            ((req,),) = [beta1["requests"]]
            assert req["name"] == "serial"
            assert [(d["driver"], d["pool"], d["name"]) for d in req["devices"]] == [
                (DRIVER, NODE, tty1),
                (DRIVER, NODE, tty2),
            ]
            attrs = req["devices"][0]["attributes"]
            assert attrs["patchbay.dev/id"] == {"string": "ttyUSB1"}
            assert attrs["patchbay.dev/path"] == {"string": "/dev/ttyUSB1"}
            assert attrs["patchbay.dev/healthy"] == {"bool": True}
            assert spec["containerEdits"]["env"] == ["MODE=raw", "SERIALS=ttyUSB1,ttyUSB2"]
            assert sorted(p.name for p in cdi_dir.iterdir()) == [spec_path.name]

            # The same handlers under v1beta1.
            beta = dra_v1beta1_pb2_grpc.DRAPluginStub(channel)
            b = await beta.NodePrepareResources(
                dra_v1beta1_pb2.NodePrepareResourcesRequest(
                    claims=[dra_v1beta1_pb2.Claim(namespace="ns", uid="uid-1", name="c1")]
                ),
                timeout=45,
            )
            assert [d.device_name for d in b.claims["uid-1"].devices] == [tty1, tty2]

            # Unprepare: the file goes; the claim object is not needed; unknown claims are fine.
            del api.claims["ns", "c1"]
            un = await v1.NodeUnprepareResources(
                dra_v1_pb2.NodeUnprepareResourcesRequest(
                    claims=[
                        dra_v1_pb2.Claim(namespace="ns", uid="uid-1", name="c1"),
                        dra_v1_pb2.Claim(namespace="ns", uid="uid-9", name="never"),
                    ]
                ),
                timeout=45,
            )
            assert {uid: r.error for uid, r in un.claims.items()} == {"uid-1": "", "uid-9": ""}
            assert not spec_path.exists()
            assert not meta_file.parent.parent.exists()  # its metadata too
            # Each call timed once, whatever its claims (v1 twice, v1beta1 once; one unprepare).
            prepared = agent.metrics.dra_prepare_seconds
            assert sum(prepared.counts) == 3 and prepared.sum > 0
            assert sum(agent.metrics.dra_unprepare_seconds.counts) == 1
            # Inside them, per claim: each GET answered (3 of 4 claims in each v1 call, c1 in the
            # v1beta1 one; the 404 is no read) and each CDI spec written (c1, three times).
            assert sum(agent.metrics.dra_claim_read_seconds.counts) == 7
            assert sum(agent.metrics.dra_cdi_write_seconds.counts) == 3

            # A claim made from a template: the container reads its file under the pod's own name
            # for the claim. Its device's health changes: the file follows, generation counted up.
            # Allocated by a subrequest (firstAvailable): the kubelet matches containers on the
            # request's own name, so the answer and the file's path drop the subrequest.
            api.claims["ns", "c6-x7k2p"] = _claim(
                "uid-6", [tty2], pod_claim_name="my-serial", request="serial/fast"
            )
            six = await v1.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(
                    claims=[dra_v1_pb2.Claim(namespace="ns", uid="uid-6", name="c6-x7k2p")]
                ),
                timeout=45,
            )
            assert list(six.claims["uid-6"].devices[0].cdi_device_ids)[1] == f"{DRIVER}/device=uid-6_serial"
            assert list(six.claims["uid-6"].devices[0].request_names) == ["serial"]
            spec6 = json.loads((cdi_dir / f"patchbay_{DRIVER}_uid-6.json").read_text())
            meta6 = service.parent / "dra-device-metadata" / "ns_c6-x7k2p" / "serial" / "metadata.json"
            assert spec6["devices"][1]["containerEdits"]["mounts"][0]["containerPath"] == (
                "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/"
                f"my-serial/serial/{DRIVER}-metadata.json"
            )
            first6 = _metadata_stream(meta6)[0]
            assert first6["podClaimName"] == "my-serial"
            assert first6["requests"][0]["name"] == "serial/fast"  # as the allocation names it
            assert first6["metadata"]["generation"] == 1
            inode = meta6.stat().st_ino

            # A device that turns unhealthy cannot be prepared.
            api.claims["ns", "c5"] = _claim("uid-5", [tty2])
            hw.remove_dev("/dev/ttyUSB2")
            await until(
                lambda: (
                    "ttyUSB2"
                    not in {agent.inventory.current.replica_of[r] for r in agent.inventory.current.healthy}
                ),
                within=20,
            )
            sick = await v1.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(
                    claims=[dra_v1_pb2.Claim(namespace="ns", uid="uid-5", name="c5")]
                ),
                timeout=45,
            )
            assert "unhealthy" in sick.claims["uid-5"].error
            # The prepared claim's metadata says so: rewritten in place (a bind mount holds the
            # inode), generation 2.
            await until(lambda: _metadata_stream(meta6)[0]["metadata"]["generation"] == 2, within=10)
            now6 = _metadata_stream(meta6)
            assert [o["requests"][0]["devices"][0]["attributes"]["patchbay.dev/healthy"] for o in now6] == [
                {"bool": False},
                {"bool": False},
            ]
            assert meta6.stat().st_ino == inode
            await until(
                lambda: any(
                    d.get("taints")
                    for s in api.slices.values()
                    for d in s["spec"]["devices"]
                    if d["name"] == tty2
                )
            )
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=15)
    assert not registry.exists() and not service.exists()
    assert (root / "plugins_registry" / f"{DRIVER}-other1.sock").exists()
    other.close()


class _GetsInFlight(InMemoryApi):
    """Counts the claim GETs in flight at once (`most`); each GET waits, at most `hold` seconds,
    until `together` of them were in flight, as a slow API server would keep them open."""

    def __init__(self, together: int, hold: float = 3.0) -> None:
        super().__init__()
        self.together, self.hold = together, hold
        self.in_flight = self.most = 0
        self._changed = threading.Condition()

    def resource_claim(self, namespace: str, name: str, *, timeout: float | None = None) -> dict[str, Any]:
        with self._changed:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self._changed.notify_all()
            self._changed.wait_for(lambda: self.most >= self.together, timeout=self.hold)
        try:
            return super().resource_claim(namespace, name, timeout=timeout)
        finally:
            with self._changed:
                self.in_flight -= 1


async def test_concurrent_prepares_of_different_claims_overlap_their_claim_gets(
    short_dir: Path, hw: FakeHardware
) -> None:
    """Two NodePrepareResources calls at once (the kubelet starts pods in parallel), one claim
    each: their GETs are in flight together, never queued behind the node lock, and both claims
    are prepared."""
    for i in range(2):
        hw.add_dev(f"/dev/ttyUSB{i}")
    (short_dir / "dp").mkdir()
    api = _GetsInFlight(together=2)
    for i in range(2):
        api.claims["ns", f"c{i}"] = _claim(f"uid-{i}", [device_name(f"ttyUSB{i}")])
    agent = dra_agent(short_dir, hw.root, api, DRIVER)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(agent.started.wait(), timeout=10)
        async with grpc.aio.insecure_channel(f"unix://{dra_of(agent).service_socket}") as channel:
            v1 = dra_v1_pb2_grpc.DRAPluginStub(channel)
            answers = await asyncio.gather(
                *(
                    v1.NodePrepareResources(
                        dra_v1_pb2.NodePrepareResourcesRequest(
                            claims=[dra_v1_pb2.Claim(namespace="ns", uid=f"uid-{i}", name=f"c{i}")]
                        ),
                        timeout=45,
                    )
                    for i in range(2)
                )
            )
        assert [a.claims[f"uid-{i}"].error for i, a in enumerate(answers)] == ["", ""]
        assert api.most == 2, "the two prepares' claim GETs never were in flight together"
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=15)


def _health(
    message: dra_health_v1_pb2.NodeWatchResourcesResponse
    | dra_health_v1alpha1_pb2.NodeWatchResourcesResponse,
) -> dict[tuple[str, str], str]:
    # The enum's value names are the same in both versions (the test checks the numbers agree).
    return {
        (d.device.pool_name, d.device.device_name): dra_health_v1_pb2.HealthStatus.Name(d.health)
        for d in message.devices
    }


async def test_dra_health_stream_reports_a_removed_device(short_dir: Path, hw: FakeHardware) -> None:
    for i in range(3):
        hw.add_dev(f"/dev/ttyUSB{i}")
    plugin_dir = short_dir / "dp"
    plugin_dir.mkdir()
    agent = ResourceAgent(
        make_config({"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}}),
        AgentOptions(
            node_name=NODE,
            plugin_dir=plugin_dir,
            host_root=hw.root,
            shutdown_grace=1.0,
            cdi_spec_dir=short_dir / "cdi",
            dra=DraOptions(DRIVER, short_dir / "k"),
        ),
        client=InMemoryApi(),
    )
    assert dra_of(agent).health is not None
    names = [device_name(f"ttyUSB{i}") for i in range(3)]
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await asyncio.wait_for(agent.started.wait(), timeout=10)
        # As the kubelet does: one connection to the endpoint GetInfo names, one stream on it.
        async with (
            grpc.aio.insecure_channel(f"unix://{dra_of(agent).service_socket}") as channel,
            grpc.aio.insecure_channel(f"unix://{dra_of(agent).service_socket}") as other,
        ):
            call = dra_health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                dra_health_v1_pb2.NodeWatchResourcesRequest()
            )
            first = await call.read()
            assert _health(first) == {(NODE, n): "HEALTHY" for n in names}
            assert {d.health_check_timeout_seconds for d in first.devices} == {30}
            # A second kubelet connection gets its own stream and the same list; over v1alpha1, the
            # only version kubelets before 1.37 dial (`/v1alpha1.DRAResourceHealth/...`).
            assert int(dra_health_v1alpha1_pb2.HEALTHY) == int(dra_health_v1_pb2.HEALTHY)
            assert int(dra_health_v1alpha1_pb2.UNHEALTHY) == int(dra_health_v1_pb2.UNHEALTHY)
            alpha = dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(other).NodeWatchResources(
                dra_health_v1alpha1_pb2.NodeWatchResourcesRequest()
            )
            alpha_first = await alpha.read()
            assert isinstance(alpha_first, dra_health_v1alpha1_pb2.NodeWatchResourcesResponse)
            assert _health(alpha_first) == _health(first)
            assert {d.health_check_timeout_seconds for d in alpha_first.devices} == {30}
            assert dra_of(agent).health.streams == 2
            assert dra_of(agent).health.opened == {"v1": 1, "v1alpha1": 1}

            hw.remove_dev("/dev/ttyUSB1")
            for stream in (call, alpha):
                message = await stream.read()
                while _health(message) == _health(first):  # a heartbeat came first: the same list
                    message = await stream.read()
                assert _health(message) == {
                    (NODE, names[0]): "HEALTHY",
                    (NODE, names[1]): "UNHEALTHY",
                    (NODE, names[2]): "HEALTHY",
                }
                (sick,) = [d for d in message.devices if d.device.device_name == names[1]]
                assert sick.message.startswith("Vanished")

            # Stopping the agent ends both streams cleanly (OK, not cancelled or unavailable).
            stop.set()
            for stream in (call, alpha):
                while await stream.read() is not grpc.aio.EOF:
                    pass
                assert await stream.code() == grpc.StatusCode.OK
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=15)
    assert dra_of(agent).health.streams == 0


def test_each_agent_builds_only_its_own_front_end(short_dir: Path) -> None:
    """A DRA agent builds no device-plugin part (no servicer, no registrar, none of their
    modules), and a device-plugin agent loads nothing of DRA: the composition builds the one
    front-end the options ask for (resourceagent.py)."""
    import subprocess
    import sys

    code = f"""
import sys
from pathlib import Path
from patchbay_agent.config import parse
from patchbay_agent.options import AgentOptions, DraOptions
from patchbay_agent.resourceagent import ResourceAgent


class NeverCalled:  # an API client nothing calls here: only asked whether it reads claims on the loop

    def claim_read_async(self):
        return None


config = parse({{"resourceName": "example.com/x", "plugin": {{"discovery": {{"virtual": {{"count": 1}}}}}}}})
options = dict(node_name="n", plugin_dir=Path({str(short_dir)!r}), host_root=Path("/"))
mode = sys.argv[1]
dra = DraOptions("x.patchbay.dev", Path({str(short_dir)!r})) if mode == "dra" else None
agent = ResourceAgent(config, AgentOptions(**options, dra=dra), NeverCalled() if dra else None)
parts = type(agent.front).__name__
other = "patchbay_agent.deviceplugin" if mode == "dra" else "patchbay_agent.dra"
print(parts, sorted(m for m in sys.modules if m == other or m.startswith(other + ".")))
"""
    run = [sys.executable, "-c", code]
    dra = subprocess.run([*run, "dra"], capture_output=True, text=True, timeout=30, check=True)
    assert dra.stdout.strip() == "DraFrontEnd []"
    plugin = subprocess.run([*run, "device-plugin"], capture_output=True, text=True, timeout=30, check=True)
    assert plugin.stdout.strip() == "DevicePluginFrontEnd []"
