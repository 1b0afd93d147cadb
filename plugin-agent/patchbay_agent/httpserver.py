"""The agent's HTTP endpoint: GET /metrics, /healthz, /readyz.

asyncio on the agent's own loop, one `asyncio.Protocol` per connection: no thread, no http.server
(docs/facts.md#client-memory). It binds to 127.0.0.1 unless told otherwise. /metrics: the
Prometheus text format (`metrics.py`).
/healthz: the gRPC server is serving. /readyz: registered with the kubelet (a device plugin: and
the kubelet holds the stream of its newest registration, so its devices count).

In a pod the port is open to everything on the pod network, so nothing a client does may cost the
agent more than a bounded amount of memory or time (docs/security.md#the-agents-http-port):

* one overall deadline for the request line and headers (`REQUEST_DEADLINE`; 408 after it), so a
  client that trickles a byte at a time cannot hold a connection open for long;
* bounded sizes: request line `MAX_REQUEST_LINE` (414), all headers `MAX_HEADER_BYTES` (431),
  checked as the bytes arrive, so no client makes the agent buffer more than that;
* a deadline for the client to take the answer (`WRITE_DEADLINE`), after which the connection is
  aborted (a reader that never reads would otherwise keep a /metrics body in memory);
* a cap on open connections (`--http-max-connections`, default `DEFAULT_HTTP_MAX_CONNECTIONS`), of
  which one peer address may hold at most half. At the cap, a new connection takes the place of
  the oldest one that is still sending its request, from its own address when that address holds
  its share, else from the address holding the most: idle connections are what a flood holds,
  and a client that sends its request at once from an address of its own (the kubelet's probe, a
  Prometheus scrape) is never the one closed while anyone holds more. Only when every open connection
  is already being answered is the newcomer closed at once, unread.

What was refused is counted on /metrics (`patchbay_agent_http_*`), with the open connections.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections import Counter as Tally
from collections.abc import Callable
from typing import Protocol

from patchbay_agent.constants import DEFAULT_HTTP_MAX_CONNECTIONS
from patchbay_agent.metrics import CONTENT_TYPE, Counter, Gauge, Registry, process_metrics

log = logging.getLogger(__name__)

#: How long a client may take to send its whole request line and headers.
REQUEST_DEADLINE = 5.0
#: How long a client may take to read the answer before the connection is aborted.
WRITE_DEADLINE = 10.0
#: The longest request line (method, path, version) the endpoint reads.
MAX_REQUEST_LINE = 8192
#: The most header bytes (all lines together) the endpoint reads.
MAX_HEADER_BYTES = 16384
#: Connections the kernel queues for the endpoint to accept (asyncio's default backlog).
LISTEN_QUEUE = 100
_TEXT = "text/plain; charset=utf-8"
_HEADERS_TOO_LARGE = "431 Request Header Fields Too Large"
_END_OF_HEADERS = (b"\r\n", b"\n")


class _Renders(Protocol):
    def render(self) -> bytes: ...


class _HasRegistry(Protocol):
    """`metrics.Metrics`, or the node agent's view of all its profiles' metrics."""

    @property
    def registry(self) -> _Renders: ...


class _RefusedError(Exception):
    """A request the endpoint answers with an error status and closes."""

    def __init__(self, status: str, body: str) -> None:
        super().__init__(status)
        self.status = status
        self.body = body


class HttpEndpoint:
    """GET /metrics, /healthz, /readyz on host:port (port 0: pick one; see `.port`)."""

    def __init__(
        self,
        metrics: _HasRegistry,
        healthy: Callable[[], bool],
        ready: Callable[[], bool],
        *,
        max_connections: int = DEFAULT_HTTP_MAX_CONNECTIONS,
    ) -> None:
        if max_connections < 2:
            raise ValueError(f"max_connections must be at least 2, not {max_connections}")
        self._metrics = metrics
        self._healthy = healthy
        self._ready = ready
        self._server: asyncio.Server | None = None
        self.port = 0
        self.max_connections = max_connections
        #: what one peer address may hold: half the cap, so others always find room
        self.max_per_address = max_connections // 2
        #: open connections, oldest first (eviction takes the oldest that is still sending)
        self._conns: dict[_Connection, None] = {}
        self._per_address: Tally[str] = Tally()
        # The endpoint's own figures: process-wide, like process_metrics(), never per profile.
        self.registry = Registry()
        self._open_gauge = Gauge(
            self.registry,
            "patchbay_agent_http_connections_open",
            "Open connections to /metrics, /healthz, /readyz.",
        )
        self._evicted = Counter(
            self.registry,
            "patchbay_agent_http_connections_evicted_total",
            "Connections still sending their request closed to make room for a new one, because the "
            "cap on open connections was reached (reason=limit) or their peer address held its share "
            "of it (reason=address).",
            ["reason"],
        )
        self._refused_connections = Counter(
            self.registry,
            "patchbay_agent_http_connections_refused_total",
            "Connections closed unread because the cap (reason=limit) or the peer address's share "
            "(reason=address) was reached and every open connection was already being answered.",
            ["reason"],
        )
        self._refused_requests = Counter(
            self.registry,
            "patchbay_agent_http_requests_refused_total",
            "Requests answered with an error before routing: 400 malformed, 408 not sent within "
            "the deadline, 414 request line too long, 431 headers too large.",
            ["code"],
        )

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        # asyncio accepts at most `backlog` connections per turn of the loop, and a connection's
        # request is read a turn or two after it is accepted. Were a turn's newcomers from one
        # address more than half its share, they could evict a connection of that address whose
        # complete request is already waiting unread (a kubelet probe, when a client on the node
        # floods: 12 of 27 /healthz from the node were reset with asyncio's default of 100 per
        # turn, none of 24 with half the share, tests/e2e/test_http_flood_on_real_node.py).
        per_turn = max(1, min(LISTEN_QUEUE, self.max_per_address // 2))
        self._server = await loop.create_server(lambda: _Connection(self), host, port, backlog=per_turn)
        # `backlog` is also the kernel's queue of connections waiting to be accepted: that stays
        # asyncio's default, so a small cap does not make clients' SYNs dropped (and retried after
        # 1 s). Longer queues made the probe wait longer (docs/benchmarks.md, the flood bench).
        for listening in self._server.sockets:
            with socket.socket(fileno=os.dup(listening.fileno())) as same:
                same.listen(LISTEN_QUEUE)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info(
            "Serving /metrics, /healthz, /readyz on http://%s:%d (at most %d connections)",
            host,
            self.port,
            self.max_connections,
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def _admit(self, conn: _Connection) -> bool:
        """Make room for `conn` within the cap and its address's share: the oldest connection
        that is still sending its request, of that address or else of the address holding the
        most, is closed for it, so a flood of idle connections never keeps out a client that
        sends its request at once (the kubelet's probe, a scrape). None to close: refused."""
        if self._per_address[conn.address] >= self.max_per_address:
            reason, victim = "address", self._oldest_reading(conn.address)
        elif len(self._conns) >= self.max_connections:
            reason, victim = "limit", self._oldest_reading(self._busiest_address())
        else:
            reason, victim = "", None
        if reason and victim is None:
            self._refused_connections.labels(reason).inc()
            return False
        if victim is not None:
            self._evicted.labels(reason).inc()
            self._release(victim)
            victim.abort()
        self._conns[conn] = None
        self._per_address[conn.address] += 1
        self._open_gauge.set(len(self._conns))
        return True

    def _busiest_address(self) -> str | None:
        """The address holding the most connections that are still sending: the flood's, never
        a client with one connection (a probe, a scrape) while anyone holds more."""
        reading: Tally[str] = Tally(c.address for c in self._conns if c.reading)
        return reading.most_common(1)[0][0] if reading else None

    def _oldest_reading(self, address: str | None) -> _Connection | None:
        if address is None:
            return None
        for conn in self._conns:
            if conn.reading and conn.address == address:
                return conn
        return None

    def _release(self, conn: _Connection) -> None:
        if self._conns.pop(conn, False) is not False:
            self._per_address[conn.address] -= 1
            if self._per_address[conn.address] <= 0:
                del self._per_address[conn.address]
            self._open_gauge.set(len(self._conns))

    def _refuse(self, refused: _RefusedError) -> tuple[str, str, bytes]:
        self._refused_requests.labels(refused.status.split()[0]).inc()
        return refused.status, _TEXT, refused.body.encode()

    def _route(self, method: str, path: str) -> tuple[str, str, bytes]:
        if method != "GET":
            return "405 Method Not Allowed", _TEXT, b"only GET\n"
        if path == "/metrics":
            return (
                "200 OK",
                CONTENT_TYPE,
                self._metrics.registry.render() + self.registry.render() + process_metrics(),
            )
        if path == "/healthz":
            return (
                ("200 OK", _TEXT, b"ok\n")
                if self._healthy()
                else ("503 Service Unavailable", _TEXT, b"unhealthy\n")
            )
        if path == "/readyz":
            return (
                ("200 OK", _TEXT, b"ready\n")
                if self._ready()
                else ("503 Service Unavailable", _TEXT, b"not registered\n")
            )
        return "404 Not Found", _TEXT, b"not found\n"


class _Connection(asyncio.Protocol):
    """One connection: its request is read, answered, and the connection closed.

    A bare `asyncio.Protocol` rather than streams: per connection the agent keeps the transport,
    this object, one timer and the request's bytes, no task, reader, writer or futures. Under a
    flood the connections being set up and torn down at any instant are several times the cap,
    and with streams each cost about 5 KiB of small objects: the pymalloc arenas that held them
    stayed resident after the flood (docs/benchmarks.md#the-agents-http-port-under-a-flood-benchhttp_floodpy).

    `reading`: still sending its request, so evictable (`HttpEndpoint._admit`). Every exit goes
    through `connection_lost`, which releases the slot.
    """

    __slots__ = (
        "_buf",
        "_endpoint",
        "_header_bytes",
        "_line",
        "_pos",
        "_searched",
        "_timer",
        "_transport",
        "address",
        "reading",
    )

    def __init__(self, endpoint: HttpEndpoint) -> None:
        self._endpoint = endpoint
        self._transport: asyncio.Transport | None = None
        self.address = "?"
        self.reading = True
        self._buf = bytearray()
        #: where the next unparsed line starts, and how far a newline was looked for
        self._pos = 0
        self._searched = 0
        #: (method, path) once the request line is parsed
        self._line: tuple[str, str] | None = None
        self._header_bytes = 0
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if not self._endpoint._admit(self):
            self.reading = False
            transport.abort()
            return
        self._timer = asyncio.get_running_loop().call_later(REQUEST_DEADLINE, self._request_deadline)

    def data_received(self, data: bytes) -> None:
        if not self.reading:
            return  # after the request: the endpoints take no input
        self._buf += data
        try:
            request = self._parse()
        except _RefusedError as e:
            self._answer(*self._endpoint._refuse(e))
            return
        if request is not None:
            self._answer(*self._endpoint._route(*request))

    def eof_received(self) -> bool:
        if self.reading:
            where = "headers" if self._line is not None else "request line"
            self._answer(
                *self._endpoint._refuse(
                    _RefusedError("400 Bad Request", f"connection closed before the {where} ended\n")
                )
            )
        return True  # the answer is still being written; _answer closes

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self.reading = False
        self._endpoint._release(self)
        self._buf = bytearray()
        if self._transport is not None:
            _break_transport_cycle(self._transport)
            self._transport = None

    def abort(self) -> None:
        """Close at once, unanswered (an evicted connection)."""
        self.reading = False
        if self._transport is not None:
            self._transport.abort()

    def _request_deadline(self) -> None:
        self._timer = None
        if self.reading:
            self._answer(
                *self._endpoint._refuse(_RefusedError("408 Request Timeout", "request not sent in time\n"))
            )

    def _answer(self, status: str, ctype: str, body: bytes) -> None:
        self.reading = False
        self._cancel_timer()
        self._buf = bytearray()
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        head = (
            f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        transport.write(head.encode() + body)
        if transport.get_write_buffer_size():
            # A reader that never reads would otherwise keep the body in memory.
            self._timer = asyncio.get_running_loop().call_later(WRITE_DEADLINE, transport.abort)
        transport.close()  # after what is buffered is written

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _parse(self) -> tuple[str, str] | None:
        """(method, path) once the request line and headers are in (the headers are checked for
        size and form, then dropped); None while incomplete. Raises `_RefusedError` for what is
        malformed or too long. Each byte is looked at once, so a client that sends one byte at a
        time costs linear work, and the buffer never holds more than the two limits."""
        buf = self._buf
        while True:
            newline = buf.find(b"\n", max(self._pos, self._searched))
            if newline < 0:
                self._searched = len(buf)
                pending = len(buf) - self._pos
                if self._line is None and pending > MAX_REQUEST_LINE:
                    raise _RefusedError("414 URI Too Long", f"request line over {MAX_REQUEST_LINE} bytes\n")
                if self._line is not None and self._header_bytes + pending > MAX_HEADER_BYTES:
                    raise _RefusedError(_HEADERS_TOO_LARGE, f"headers over {MAX_HEADER_BYTES} bytes\n")
                return None
            line = bytes(buf[self._pos : newline + 1])
            self._pos = newline + 1
            if self._line is None:
                self._line = _request_line(line)
                continue
            if line in _END_OF_HEADERS:
                return self._line
            self._header_bytes += len(line)
            if self._header_bytes > MAX_HEADER_BYTES:
                raise _RefusedError(_HEADERS_TOO_LARGE, f"headers over {MAX_HEADER_BYTES} bytes\n")


def _request_line(line: bytes) -> tuple[str, str]:
    """(method, path) of `METHOD TARGET HTTP/1.x`, the query dropped; `_RefusedError` otherwise."""
    if len(line) > MAX_REQUEST_LINE:
        raise _RefusedError("414 URI Too Long", f"request line over {MAX_REQUEST_LINE} bytes\n")
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise _RefusedError("400 Bad Request", "expected 'METHOD PATH HTTP/1.x'\n")
    return parts[0], parts[1].split("?", 1)[0]


def _break_transport_cycle(transport: asyncio.BaseTransport) -> None:
    """Let a closed connection's transport be freed by reference counting, not by the cyclic GC.

    Python 3.11's selector transport keeps its read callback as a bound method of itself
    (`_read_ready_cb`), a reference cycle that closing does not break (CPython gh-100348, fixed
    in 3.12 for close() only; Debian bookworm, the image's base, ships 3.11). Each closed
    connection then waits for a full collection with its socket objects: under a flood, thousands
    of transports at once
    (docs/benchmarks.md#the-agents-http-port-under-a-flood-benchhttp_floodpy). Clearing the
    attribute once the connection is lost, as CPython's fix does, frees each transport at once.
    The attribute is private: where it does not exist this does nothing.
    """
    if getattr(transport, "_read_ready_cb", None) is not None:
        transport._read_ready_cb = None  # type: ignore[attr-defined]
