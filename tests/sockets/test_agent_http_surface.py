"""The agent's HTTP port as anything on the pod network may use it: over real loopback sockets,
a client that trickles its request, oversize lines and headers, garbage, a flood of idle
connections from one address and from several, and a reader that never reads. Each is answered or
cut off within its bound, counted on /metrics, and the endpoint keeps serving the others
(docs/security.md#the-agents-http-port)."""

from __future__ import annotations

import asyncio
import gc
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from support.promtext import parse, value

from patchbay_agent import httpserver
from patchbay_agent.httpserver import HttpEndpoint
from patchbay_agent.metrics import Metrics


class _Big:
    """A registry whose text is `size` bytes: a /metrics body larger than the sockets' buffers."""

    def __init__(self, size: int) -> None:
        self.text = b"# " + b"x" * (size - 3) + b"\n"

    @property
    def registry(self) -> _Big:
        return self

    def render(self) -> bytes:
        return self.text


def _get(port: int, path: str, source: str = "127.0.0.1") -> tuple[int, str]:
    """(status, body) of GET path from `source` (another loopback address is another peer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0)) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = _read_all(s)
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def _read_all(s: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := s.recv(65536):
            chunks.append(chunk)
    except (ConnectionResetError, BrokenPipeError):
        pass
    return b"".join(chunks)


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(data)
        except (ConnectionResetError, BrokenPipeError):
            return b""
        return _read_all(s)


def _metrics(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return parse(r.read().decode())


@contextmanager
def _idle(port: int, n: int, source: str) -> Iterator[list[socket.socket]]:
    """`n` connections from `source` that send nothing (what a flood holds open)."""
    socks = [
        socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0)) for _ in range(n)
    ]
    try:
        yield socks
    finally:
        for s in socks:
            s.close()


def _closed_unread(s: socket.socket) -> bool:
    """Whether the server closed this connection without answering (EOF or reset)."""
    s.settimeout(5)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


async def _until(check: object, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.02)


def _endpoint(**kw: int) -> HttpEndpoint:
    return HttpEndpoint(Metrics("example.com/serial", "node-1"), lambda: True, lambda: True, **kw)


def test_a_request_must_arrive_whole_within_one_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that sends one header line every 0.2 s (each line well within any per-line
    timeout) is answered 408 when the overall deadline passes, long before it would finish."""
    monkeypatch.setattr(httpserver, "REQUEST_DEADLINE", 1.0)

    def trickle(port: int) -> tuple[bytes, int]:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\n")
            sent = 0
            try:
                for i in range(50):  # 10 s of headers if nobody stopped it
                    s.sendall(f"X-Slow-{i}: 1\r\n".encode())
                    sent += 1
                    time.sleep(0.2)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return _read_all(s), sent

    async def scenario() -> None:
        http = _endpoint()
        await http.start("127.0.0.1", 0)
        try:
            answer, sent = await asyncio.to_thread(trickle, http.port)
            assert sent < 50, "the trickling client was never cut off"
            # The 408 may be lost to a reset when the client's later lines arrive unread.
            assert answer == b"" or answer.startswith(b"HTTP/1.1 408 "), answer[:80]
            families = await asyncio.to_thread(_metrics, http.port)
            assert value(families, "patchbay_agent_http_requests_refused_total", code="408") == 1
            # Nothing sent at all: 408 too, and the connection is gone.
            silent = await asyncio.to_thread(_raw, http.port, b"")
            assert silent.startswith(b"HTTP/1.1 408 "), silent
            assert await asyncio.to_thread(_get, http.port, "/healthz") == (200, "ok\n")
            assert http.open_connections == 0
        finally:
            await http.stop()

    asyncio.run(scenario())


def test_oversize_and_malformed_requests_get_the_status_that_names_them() -> None:
    async def scenario() -> None:
        http = _endpoint()
        await http.start("127.0.0.1", 0)
        try:
            port = http.port
            long_line = b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n"
            assert (await asyncio.to_thread(_raw, port, long_line)).startswith(b"HTTP/1.1 414 ")
            many = b"GET /metrics HTTP/1.1\r\n" + b"".join(
                f"X-H{i}: {'v' * 200}\r\n".encode() for i in range(100)
            )
            assert (await asyncio.to_thread(_raw, port, many + b"\r\n")).startswith(b"HTTP/1.1 431 ")
            assert (await asyncio.to_thread(_raw, port, b"HELLO\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
            assert (await asyncio.to_thread(_raw, port, b"GET / SMTP/1.0\r\n\r\n")).startswith(
                b"HTTP/1.1 400 "
            )
            # A line far over the stream's buffer limit: never buffered whole; refused or reset.
            huge = await asyncio.to_thread(_raw, port, b"GET /" + b"a" * 200_000 + b"\r\n\r\n")
            assert huge == b"" or huge.startswith(b"HTTP/1.1 414 "), huge[:80]
            assert await asyncio.to_thread(_get, port, "/readyz") == (200, "ready\n")
            families = await asyncio.to_thread(_metrics, port)
            refused = {
                s.labels["code"]: s.value for s in families["patchbay_agent_http_requests_refused"].samples
            }
            assert refused["414"] >= 1 and refused["431"] == 1 and refused["400"] == 2, refused
        finally:
            await http.stop()

    asyncio.run(scenario())


def test_a_flood_of_idle_connections_never_keeps_a_real_request_out() -> None:
    """Cap 8, 4 per address. A 5th idle connection from 127.0.0.1 takes the place of that
    address's oldest (closed), never more than 4 held; 4 more from 127.0.0.2 fill the cap, and a
    real request from a third address is still answered (the oldest idle connection is closed
    for it); when the flood goes the gauge is back to the scrape alone."""

    async def scenario() -> None:
        http = _endpoint(max_connections=8)
        await http.start("127.0.0.1", 0)
        port = http.port
        try:
            with _idle(port, 4, "127.0.0.1") as first:
                await _until(lambda: http.open_connections == 4)
                with _idle(port, 1, "127.0.0.1"):
                    assert await asyncio.to_thread(_closed_unread, first[0])  # the oldest made room
                    await _until(lambda: http.open_connections == 4)
                    with _idle(port, 4, "127.0.0.2"):
                        await _until(lambda: http.open_connections == 8)
                        for source in ("127.0.0.3", "127.0.0.2", "127.0.0.1"):
                            assert await asyncio.to_thread(_get, port, "/healthz", source) == (200, "ok\n")
                        assert http.open_connections <= 8
            await _until(lambda: http.open_connections == 0)
            families = await asyncio.to_thread(_metrics, port)
            evicted = {
                s.labels["reason"]: s.value
                for s in families["patchbay_agent_http_connections_evicted"].samples
            }
            assert evicted["address"] >= 2 and evicted["limit"] >= 1, evicted
            assert families["patchbay_agent_http_connections_refused"].samples == []
            assert value(families, "patchbay_agent_http_connections_open") == 1  # this scrape
        finally:
            await http.stop()

    asyncio.run(scenario())


def test_when_every_connection_is_being_answered_a_newcomer_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cap 4: four clients that asked for a large /metrics and do not read it hold the cap (an
    answer in progress is never evicted); a fifth connection is closed unread (reason=limit) until
    the write deadline frees them."""
    monkeypatch.setattr(httpserver, "WRITE_DEADLINE", 2.0)

    async def scenario() -> None:
        http = HttpEndpoint(_Big(8 << 20), lambda: True, lambda: True, max_connections=4)
        await http.start("127.0.0.1", 0)
        slow: list[socket.socket] = []
        try:
            for i in range(4):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.bind((f"127.0.0.{10 + i}", 0))
                s.connect(("127.0.0.1", http.port))
                s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
                slow.append(s)
            await _until(lambda: http.open_connections == 4)
            with _idle(http.port, 1, "127.0.0.20") as (newcomer,):
                assert await asyncio.to_thread(_closed_unread, newcomer)
            await _until(lambda: http.open_connections == 0)  # the write deadline
            status, _ = await asyncio.to_thread(_get, http.port, "/healthz")
            assert status == 200
            assert http._refused_connections.labels("limit").value == 1
        finally:
            for s in slow:
                s.close()
            await http.stop()

    asyncio.run(scenario())


def test_a_reader_that_never_reads_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 32 MiB /metrics answer to a client that never reads: after the write deadline the
    connection is aborted and the endpoint holds nothing for it."""
    monkeypatch.setattr(httpserver, "WRITE_DEADLINE", 1.0)

    async def scenario() -> None:
        http = HttpEndpoint(_Big(32 << 20), lambda: True, lambda: True)
        await http.start("127.0.0.1", 0)
        try:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", http.port))
            s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            await _until(lambda: http.open_connections == 1)
            await _until(lambda: http.open_connections == 0)  # aborted: nothing read, nothing held
            s.close()
            status, _ = await asyncio.to_thread(_get, http.port, "/healthz")
            assert status == 200
        finally:
            await http.stop()

    asyncio.run(scenario())


def test_the_cap_is_checked() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        _endpoint(max_connections=1)


def test_a_plain_client_still_works() -> None:
    """urllib (what a curl or a probe does) gets every endpoint as before."""

    async def scenario() -> None:
        http = _endpoint()
        await http.start("127.0.0.1", 0)
        try:

            def fetch(path: str) -> int:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{http.port}{path}", timeout=5) as r:
                        return int(r.status)
                except urllib.error.HTTPError as e:
                    return int(e.code)

            assert [await asyncio.to_thread(fetch, p) for p in ("/metrics", "/healthz", "/readyz", "/x")] == [
                200,
                200,
                200,
                404,
            ]
        finally:
            await http.stop()

    asyncio.run(scenario())


def _transports() -> int:
    """Selector transports alive in this process (the endpoint's; the test opens no others)."""
    return sum(1 for o in gc.get_objects() if type(o).__name__ == "_SelectorSocketTransport")


def test_closed_connections_are_freed_without_the_cyclic_gc() -> None:
    """Answered, evicted and refused connections leave no transport behind with the cyclic GC off.

    Python 3.11's transports are reference cycles (CPython gh-100348): left to the collector, a
    flood's thousands of closed connections stayed in memory at once and the agent's RSS did not
    come back after it (docs/benchmarks.md#the-agents-http-port-under-a-flood-benchhttp_floodpy).
    Fails without `_break_transport_cycle` on 3.11 (checked)."""

    async def scenario() -> None:
        http = _endpoint(max_connections=4)
        await http.start("127.0.0.1", 0)
        try:
            gc.collect()
            before = _transports()
            gc.disable()
            for _ in range(20):  # answered
                assert await asyncio.to_thread(_get, http.port, "/healthz") == (200, "ok\n")
            for i in range(5):  # 10 idle connections from one address: its share (2) evicted in turn
                with _idle(http.port, 2, f"127.0.0.{30 + i}"), _idle(http.port, 2, f"127.0.0.{30 + i}"):
                    await _until(lambda: http.open_connections >= 2)
            for _ in range(10):  # malformed: 400
                assert (await asyncio.to_thread(_raw, http.port, b"NOT HTTP\r\n\r\n")).startswith(
                    b"HTTP/1.1 400"
                )
            await _until(lambda: http.open_connections == 0)
            await _until(lambda: _transports() == before, within=5)
            assert http._evicted.labels("address").value >= 5
        finally:
            gc.enable()
            await http.stop()

    asyncio.run(scenario())
