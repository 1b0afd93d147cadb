"""The agent's HTTP endpoint: GET /metrics, /healthz, /readyz.

asyncio on the agent's own loop: no thread, no http.server (docs/facts.md#client-memory). It binds
to 127.0.0.1 unless told otherwise. /metrics: the Prometheus text format (`metrics.py`).
/healthz: the gRPC server is serving. /readyz: registered with the kubelet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from patchbay_agent.metrics import CONTENT_TYPE, process_metrics

log = logging.getLogger(__name__)

#: How long a client may take to send its request line and headers.
REQUEST_TIMEOUT = 5.0
_END_OF_HEADERS = (b"\r\n", b"\n", b"")


class _Renders(Protocol):
    def render(self) -> bytes: ...


class _HasRegistry(Protocol):
    """`metrics.Metrics`, or the node agent's view of all its profiles' metrics."""

    @property
    def registry(self) -> _Renders: ...


class HttpEndpoint:
    """GET /metrics, /healthz, /readyz on host:port (port 0: pick one; see `.port`)."""

    def __init__(self, metrics: _HasRegistry, healthy: Callable[[], bool], ready: Callable[[], bool]) -> None:
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
            request = await _read_request(reader)
            if request is not None:
                status, ctype, body = self._route(*request)
                head = (
                    f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n"
                )
                writer.write(head.encode() + body)
                await writer.drain()
        except ConnectionError:
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
            return "200 OK", CONTENT_TYPE, self._metrics.registry.render() + process_metrics()
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


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str] | None:
    """(method, path) of one request, its headers drained (the endpoints take no input); None
    when the client sends nothing in time or a line over the stream's limit (64 KiB)."""
    try:
        request_line = await asyncio.wait_for(reader.readline(), timeout=REQUEST_TIMEOUT)
        while await asyncio.wait_for(reader.readline(), timeout=REQUEST_TIMEOUT) not in _END_OF_HEADERS:
            pass
    except (TimeoutError, ValueError):
        return None
    parts = request_line.decode("latin-1").split()
    method = parts[0] if parts else ""
    path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
    return method, path
