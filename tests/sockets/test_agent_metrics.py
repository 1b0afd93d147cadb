"""The agent's /metrics as Prometheus reads it: the text its registry writes after known activity,
the HTTP endpoint over a real loopback socket, and a running agent scraped after real
registrations, streams and Allocate calls. Every scrape goes through prometheus-client's parser
and the checks in `promtext` (HELP, TYPE, names, histograms)."""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from support.agentparts import registrar_of, servicer_of
from support.agentrun import plugin_client, running_agent, until
from support.fakehw import FakeHardware
from support.promtext import histogram_parts, parse, value
from support.pykubelet import PyKubelet

from patchbay_agent.api import api_pb2
from patchbay_agent.core.health import CheckResult, DeviceHealthTracker
from patchbay_agent.core.inventory import Inventory
from patchbay_agent.deviceplugin.encoding import ListAndWatchEncoder
from patchbay_agent.discovery import PhysicalDevice
from patchbay_agent.httpserver import HttpEndpoint
from patchbay_agent.metrics import CONTENT_TYPE, Metrics

SERIAL = {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}, "health": {"periodSeconds": 60}}
RESOURCE = "example.com/serial"

#: Every family the agent exports, with its TYPE (counters without `_total`, as the parser names them).
FAMILIES = {
    "patchbay_agent_info": "gauge",
    "patchbay_agent_devices": "gauge",
    "patchbay_agent_physical_devices": "gauge",
    "patchbay_agent_registered": "gauge",
    "patchbay_agent_registrations": "counter",
    "patchbay_agent_rpcs": "counter",
    "patchbay_agent_allocate_seconds": "histogram",
    "patchbay_agent_list_and_watch_streams": "gauge",
    "patchbay_agent_health_round_seconds": "histogram",
    "patchbay_agent_list_and_watch_bytes": "gauge",
    "patchbay_agent_list_too_large": "counter",
    "patchbay_agent_device_healthy": "gauge",
    "patchbay_agent_allocated_devices": "gauge",
    "patchbay_agent_pod_resources_reads": "counter",
    "patchbay_agent_report_writes": "counter",
    "patchbay_agent_resource_slice_writes": "counter",
    "patchbay_agent_dra_claim_errors": "counter",
    "patchbay_agent_dra_claim_status_writes": "counter",
    "patchbay_agent_report_unchanged": "counter",
    "patchbay_agent_report_restores": "counter",
    "patchbay_agent_repairs": "counter",
    "patchbay_agent_dra_prepare_seconds": "histogram",
    "patchbay_agent_dra_unprepare_seconds": "histogram",
    "patchbay_agent_dra_claim_read_seconds": "histogram",
    "patchbay_agent_dra_cdi_write_seconds": "histogram",
    # the HTTP endpoint's own, once per process (httpserver.HttpEndpoint)
    "patchbay_agent_http_connections_open": "gauge",
    "patchbay_agent_http_connections_evicted": "counter",
    "patchbay_agent_http_connections_refused": "counter",
    "patchbay_agent_http_requests_refused": "counter",
    # the process's own, once per process (metrics.process_metrics)
    "process_resident_memory_bytes": "gauge",
    "process_cpu_seconds": "counter",
    "process_start_time_seconds": "gauge",
    "process_open_fds": "gauge",
}


def _get(port: int, path: str) -> tuple[int, str, str]:
    """(status, Content-Type, body) of GET http://127.0.0.1:port/path."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def _answer(port: int, path: str) -> tuple[int, str]:
    status, _, body = _get(port, path)
    return status, body


def _request(port: int, data: bytes) -> bytes:
    """Send raw bytes, return everything the server answers before it closes (or resets: it
    closes with our unread bytes still queued)."""
    chunks = []
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(data)
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except (ConnectionResetError, BrokenPipeError):
            pass
    return b"".join(chunks)


def _inventory_of(devices: list[PhysicalDevice], healthy: set[str], replicas: int) -> Inventory:
    inventory = Inventory(replicas, "rw")
    tracker = DeviceHealthTracker(1, 1)
    tracker.observe({d.id: CheckResult(d.id in healthy) for d in devices})
    inventory.update(devices, tracker)
    return inventory


def test_the_registry_text_parses_with_the_values_that_were_caused() -> None:
    async def build() -> Inventory:
        devices = [PhysicalDevice(f"tty{i}", (f"/dev/tty{i}",), (f"/dev/tty{i}",)) for i in range(3)]
        return _inventory_of(devices, {"tty0", "tty2"}, replicas=2)

    inventory = asyncio.run(build())
    # A resource name with every character the label escaping must handle.
    odd = 'example.com/odd"name\\with\nall'
    m = Metrics(odd, "node-1")
    snap = inventory.current
    devices = {pid: pid in snap.healthy_physical for pid in snap.physical}
    m.observe_round(0.004, devices, snap.advertised, len(snap.healthy))
    m.observe_round(0.2, devices, snap.advertised, len(snap.healthy))
    encoder = ListAndWatchEncoder(2, on_size=m.list_bytes.set)
    encoder.check(snap)
    m.registrations.labels("failure").inc()
    m.registrations.labels("failure").inc()
    m.registrations.labels("success").inc()
    m.registered.set(1)
    m.streams.inc()
    m.streams.inc()
    m.streams.dec()
    m.rpcs.labels("Allocate", "OK").inc(3)
    m.rpcs.labels("Allocate", "INVALID_ARGUMENT").inc()
    # On a bound counts in that bucket (le means <=); past the last finite bound only in +Inf.
    observations = [0.00005, 0.0005, 0.0007, 2.0]
    for seconds in observations:
        m.allocate_seconds.observe(seconds)

    families = parse(m.registry.render().decode())

    # The registry alone: the agent's families; the HTTP endpoint adds its own and the process's.
    assert {name: f.type for name, f in families.items()} == {
        k: v for k, v in FAMILIES.items() if k.startswith("patchbay_") and "_http_" not in k
    }
    assert value(families, "patchbay_agent_info", resource=odd, node="node-1") == 1
    assert value(families, "patchbay_agent_devices", health="Healthy") == 4
    assert value(families, "patchbay_agent_devices", health="Unhealthy") == 2
    assert value(families, "patchbay_agent_physical_devices") == 3
    assert value(families, "patchbay_agent_list_and_watch_bytes") == encoder.size_bytes > 0
    assert value(families, "patchbay_agent_registered") == 1
    assert value(families, "patchbay_agent_registrations_total", result="failure") == 2
    assert value(families, "patchbay_agent_registrations_total", result="success") == 1
    assert value(families, "patchbay_agent_list_and_watch_streams") == 1
    assert value(families, "patchbay_agent_rpcs_total", method="Allocate", code="OK") == 3
    assert value(families, "patchbay_agent_rpcs_total", method="Allocate", code="INVALID_ARGUMENT") == 1
    assert value(families, "patchbay_agent_list_too_large_total") == 0
    # Per PHYSICAL device (two replicas each), whatever the replicas.
    assert {s.labels["device"]: s.value for s in families["patchbay_agent_device_healthy"].samples} == {
        "tty0": 1,
        "tty1": 0,
        "tty2": 1,
    }
    # Families of reports off: declared, without series.
    assert families["patchbay_agent_allocated_devices"].samples == []
    assert families["patchbay_agent_report_writes"].samples == []
    assert value(families, "patchbay_agent_report_restores_total") == 0
    for kind in ("DeviceReport", "ResourceSlice"):
        for cause in ("deleted", "edited"):
            assert value(families, "patchbay_agent_repairs_total", kind=kind, cause=cause) == 0
    assert value(families, "patchbay_agent_report_unchanged_total") == 0

    buckets, total, count = histogram_parts(families["patchbay_agent_allocate_seconds"])
    assert dict(buckets) == {
        0.0001: 1,
        0.00025: 1,
        0.0005: 2,
        0.001: 3,
        0.0025: 3,
        0.005: 3,
        0.01: 3,
        0.025: 3,
        0.1: 3,
        1.0: 3,
        math.inf: 4,
    }
    assert count == len(observations)
    assert total == pytest.approx(math.fsum(observations), rel=1e-12)

    buckets, total, count = histogram_parts(families["patchbay_agent_health_round_seconds"])
    assert (count, dict(buckets)[0.005], dict(buckets)[0.1], dict(buckets)[0.5]) == (2, 1, 1, 2)
    assert total == pytest.approx(0.204, rel=1e-12)


def test_the_http_endpoint_over_loopback(caplog: pytest.LogCaptureFixture) -> None:
    state = {"healthy": False, "ready": False}

    async def scenario() -> None:
        metrics = Metrics(RESOURCE, "node-1")
        metrics.allocate_seconds.observe(0.0003)
        http = HttpEndpoint(metrics, lambda: state["healthy"], lambda: state["ready"])
        await http.start("127.0.0.1", 0)
        try:
            status, ctype, body = await asyncio.to_thread(_get, http.port, "/metrics")
            assert (status, ctype) == (200, CONTENT_TYPE)
            families = parse(body)
            assert value(families, "patchbay_agent_allocate_seconds_count") == 1
            # The process's own metrics (the dashboard's Agent RSS panel reads the first) follow.
            assert value(families, "process_resident_memory_bytes") > 0
            assert value(families, "process_cpu_seconds_total") > 0
            again = (await asyncio.to_thread(_get, http.port, "/metrics?name[]=x"))[2]
            assert again.split("# HELP process_")[0] == body.split("# HELP process_")[0]

            assert await asyncio.to_thread(_answer, http.port, "/healthz") == (503, "unhealthy\n")
            assert await asyncio.to_thread(_answer, http.port, "/readyz") == (503, "not registered\n")
            state.update(healthy=True, ready=True)
            assert await asyncio.to_thread(_answer, http.port, "/healthz") == (200, "ok\n")
            assert await asyncio.to_thread(_answer, http.port, "/readyz") == (200, "ready\n")
            assert (await asyncio.to_thread(_get, http.port, "/nope"))[0] == 404

            posted = await asyncio.to_thread(_request, http.port, b"POST /metrics HTTP/1.1\r\n\r\n")
            assert posted.startswith(b"HTTP/1.1 405 ")
            # A request line over the stream's buffer limit is refused (or reset) and breaks
            # nothing (tests/sockets/test_agent_http_surface.py tries the rest of the surface).
            with caplog.at_level(logging.ERROR):
                huge = await asyncio.to_thread(_request, http.port, b"GET /" + b"a" * 70_000 + b"\r\n\r\n")
                assert huge == b"" or huge.startswith(b"HTTP/1.1 414 "), huge[:80]
                assert (await asyncio.to_thread(_get, http.port, "/healthz"))[0] == 200
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        finally:
            await http.stop()

    asyncio.run(scenario())


def test_a_running_agent_exports_what_it_did(plugin_dir: Path, hw: FakeHardware) -> None:
    hw.add_dev("/dev/ttyUSB0")
    hw.add_dev("/dev/ttyUSB1")
    allocates = 25

    async def scenario() -> None:
        async with (
            PyKubelet(plugin_dir, refuse=2) as kubelet,
            running_agent(SERIAL, plugin_dir, hw.root, backoff=(0.01, 0.05)) as agent,
            plugin_client(registrar_of(agent).socket_path) as client,
        ):
            await kubelet.wait_for(lambda: RESOURCE in kubelet.devices)
            await until(lambda: registrar_of(agent).registered and servicer_of(agent).open_streams == 1)
            ok = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["ttyUSB1"])]
            )
            # Each call's server-side handling happens inside the client's round trip, on
            # the same clock (the agent runs in this process).
            round_trips = 0.0
            for _ in range(allocates):
                started = time.perf_counter()
                await client.Allocate(ok)
                round_trips += time.perf_counter() - started
            unknown = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["nope"])]
            )
            for _ in range(2):
                with pytest.raises(grpc.aio.AioRpcError):
                    await client.Allocate(unknown)

            status, ctype, body = await asyncio.to_thread(_get, agent.http.port, "/metrics")
            assert (status, ctype) == (200, CONTENT_TYPE)
            families = parse(body)
            assert {name: f.type for name, f in families.items()} == FAMILIES

            assert value(families, "patchbay_agent_info", resource=RESOURCE, node="node-1") == 1
            assert value(families, "patchbay_agent_registered") == 1
            assert value(families, "patchbay_agent_registrations_total", result="failure") == 2
            assert value(families, "patchbay_agent_registrations_total", result="success") == 1
            assert value(families, "patchbay_agent_list_and_watch_streams") == 1
            assert value(families, "patchbay_agent_devices", health="Healthy") == 2
            assert value(families, "patchbay_agent_devices", health="Unhealthy") == 0
            assert value(families, "patchbay_agent_physical_devices") == 2
            assert value(families, "patchbay_agent_list_and_watch_bytes") == (
                servicer_of(agent).encoder.size_bytes
            )
            rpcs = {
                (s.labels["method"], s.labels["code"]): s.value
                for s in families["patchbay_agent_rpcs"].samples
            }
            assert rpcs == {
                ("GetDevicePluginOptions", "OK"): len(kubelet.registrations),
                ("ListAndWatch", "OK"): 1,
                ("Allocate", "OK"): allocates,
                ("Allocate", "INVALID_ARGUMENT"): 2,
            }

            # The histogram counts the Allocate calls answered OK, and no more time than
            # the client waited for them.
            _, total, count = histogram_parts(families["patchbay_agent_allocate_seconds"])
            assert count == allocates
            assert 0 < total <= round_trips

            _, total, count = histogram_parts(families["patchbay_agent_health_round_seconds"])
            assert count == agent.monitor.rounds >= 1
            assert total > 0

    asyncio.run(scenario())
