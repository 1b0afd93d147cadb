"""Prometheus metrics and the /metrics, /healthz, /readyz HTTP endpoint.

The agent runs on every node, so its memory is multiplied by the cluster size. Importing
`prometheus_client` costs 4.4 MiB of RSS on top of grpc (measured here: it pulls in http.server,
wsgiref and its process/platform collectors), more than everything else the agent adds. The
text exposition format for a dozen counters, gauges and one histogram is a few lines, so the agent
writes it itself (format 0.0.4, what every Prometheus scrapes).

The HTTP server is asyncio on the agent's own loop (no thread). It binds to 127.0.0.1 unless told
otherwise. /healthz: the gRPC server is serving. /readyz: registered with the kubelet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Sequence

from patchbay_agent.inventory import Snapshot

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Allocate sits on pod admission; buckets resolve the sub-millisecond range it should live in.
_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0)
_ROUND_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class _Value:
    """One labelled series of a counter or gauge."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)


class _Family:
    kind = "untyped"

    def __init__(self, registry: Registry, name: str, doc: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.doc = doc
        self.labelnames = tuple(labelnames)
        self._series: dict[tuple[str, ...], _Value] = {}
        if not self.labelnames:
            self._series[()] = _Value()
        registry.families.append(self)

    def labels(self, *values: str) -> _Value:
        series = self._series.get(values)
        if series is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}")
            series = self._series[values] = _Value()
        return series

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.doc}", f"# TYPE {self.name} {self.kind}"]
        for values, series in sorted(self._series.items()):
            lines.append(f"{self.name}{_labels(self.labelnames, values)} {_fmt(series.value)}")
        return lines


class Counter(_Family):
    kind = "counter"

    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)


class Gauge(_Family):
    kind = "gauge"

    def set(self, value: float) -> None:
        self.labels().set(value)

    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self.labels().dec(amount)


class Histogram:
    kind = "histogram"

    def __init__(self, registry: Registry, name: str, doc: str, buckets: Sequence[float]) -> None:
        self.name = name
        self.doc = doc
        self.bounds = (*sorted(buckets), math.inf)
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0
        registry.families.append(self)

    def observe(self, value: float) -> None:
        self.sum += value
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.doc}", f"# TYPE {self.name} histogram"]
        cumulative = 0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            cumulative += count
            lines.append(f'{self.name}_bucket{{le="{_fmt(bound)}"}} {cumulative}')
        lines.append(f"{self.name}_sum {_fmt(self.sum)}")
        lines.append(f"{self.name}_count {cumulative}")
        return lines


class Registry:
    def __init__(self) -> None:
        self.families: list[_Family | Histogram] = []

    def render(self) -> bytes:
        lines: list[str] = []
        for family in self.families:
            lines.extend(family.render())
        return ("\n".join(lines) + "\n").encode()


class Metrics:
    """Every metric the agent exports; one instance (and registry) per agent."""

    def __init__(self, resource_name: str, node_name: str) -> None:
        r = self.registry = Registry()
        info = Gauge(
            r,
            "patchbay_agent_info",
            "Constant 1, labelled with what this agent serves.",
            ["resource", "node"],
        )
        info.labels(resource_name, node_name).set(1)
        self.devices = Gauge(
            r, "patchbay_agent_devices", "Advertised devices (replicas included) by health.", ["health"]
        )
        self.physical_devices = Gauge(r, "patchbay_agent_physical_devices", "Physical devices discovered.")
        self.registered = Gauge(r, "patchbay_agent_registered", "1 while registered with the kubelet.")
        self.registrations = Counter(
            r, "patchbay_agent_registrations_total", "Register calls by result.", ["result"]
        )
        self.rpcs = Counter(
            r, "patchbay_agent_rpcs_total", "DevicePlugin calls by method and gRPC code.", ["method", "code"]
        )
        self.allocate_seconds = Histogram(
            r, "patchbay_agent_allocate_seconds", "Allocate handling time.", _LATENCY_BUCKETS
        )
        self.streams = Gauge(r, "patchbay_agent_list_and_watch_streams", "Open ListAndWatch streams.")
        self.round_seconds = Histogram(
            r, "patchbay_agent_health_round_seconds", "Discovery + health round duration.", _ROUND_BUCKETS
        )
        self.list_bytes = Gauge(
            r, "patchbay_agent_list_and_watch_bytes", "Encoded size of the advertised list."
        )
        self.list_too_large = Counter(
            r, "patchbay_agent_list_too_large_total", "Device lists not published because they exceed 4 MiB."
        )

    def observe_round(self, seconds: float, snap: Snapshot) -> None:
        self.round_seconds.observe(seconds)
        healthy = len(snap.healthy)
        self.devices.labels("Healthy").set(healthy)
        self.devices.labels("Unhealthy").set(snap.advertised - healthy)
        self.physical_devices.set(len(snap.physical))
        self.list_bytes.set(snap.size_bytes)


class HttpEndpoint:
    """GET /metrics, /healthz, /readyz on host:port (port 0: pick one; see `.port`)."""

    def __init__(self, metrics: Metrics, healthy: Callable[[], bool], ready: Callable[[], bool]) -> None:
        self._metrics = metrics
        self._healthy = healthy
        self._ready = ready
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._handle, host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("Serving /metrics, /healthz, /readyz on http://%s:%d", host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), timeout=5)
            # Drain headers; the endpoints take no input.
            while await asyncio.wait_for(reader.readline(), timeout=5) not in (b"\r\n", b"\n", b""):
                pass
            parts = request_line.decode("latin-1").split()
            path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
            status, ctype, body = self._route(parts[0] if parts else "", path)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def _route(self, method: str, path: str) -> tuple[str, str, bytes]:
        text = "text/plain; charset=utf-8"
        if method != "GET":
            return "405 Method Not Allowed", text, b"only GET\n"
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE, self._metrics.registry.render()
        if path == "/healthz":
            return (
                ("200 OK", text, b"ok\n")
                if self._healthy()
                else ("503 Service Unavailable", text, b"unhealthy\n")
            )
        if path == "/readyz":
            return (
                ("200 OK", text, b"ready\n")
                if self._ready()
                else ("503 Service Unavailable", text, b"not registered\n")
            )
        return "404 Not Found", text, b"not found\n"
