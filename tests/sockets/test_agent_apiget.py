"""`patchbay_agent.apiget` on the wire: a loopback TCP server that answers each request with
exactly the bytes a test gives it, for what the real API server (tests/integration/agent) does not
do on demand: chunked answers, a kept connection closed while idle, no answer, a huge or broken
one. Each server runs in the test's event loop on 127.0.0.1 and is closed at the test's end."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable

import pytest

from patchbay_agent import apiget
from patchbay_agent.apiget import AsyncGetter, GetError

OBJ = {"kind": "ResourceClaim", "metadata": {"name": "c"}}
BODY = json.dumps(OBJ).encode()


def plain(body: bytes = BODY, status: str = "200 OK", extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


class Server:
    """Answers request N (counted over all connections) with `answers[N]`: bytes to write, or a
    callable that gets the writer (to close, stall, ...)."""

    def __init__(self, answers: list[bytes | Callable[[asyncio.StreamWriter], object]]) -> None:
        self.answers = answers
        self.requests: list[bytes] = []
        self.connections = 0
        self.closed_by_client = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    request = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    self.closed_by_client += 1
                    return
                self.requests.append(request)
                answer = self.answers[len(self.requests) - 1]
                if callable(answer):
                    result = answer(writer)
                    if asyncio.iscoroutine(result):
                        await result
                    if writer.is_closing():
                        return
                else:
                    writer.write(answer)
                    await writer.drain()
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def serving(
    answers: list[bytes | Callable[[asyncio.StreamWriter], object]],
) -> AsyncIterator[tuple[Server, AsyncGetter]]:
    server = Server(answers)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    getter = AsyncGetter(
        f"http://127.0.0.1:{port}/prefix",
        ssl_context=None,
        headers=lambda: {"Authorization": "Bearer t0k3n"},
    )
    try:
        yield server, getter
    finally:
        getter.close()
        listener.close()
        await listener.wait_closed()


async def test_a_get_is_one_request_line_and_its_headers_and_the_connection_is_kept() -> None:
    async with serving([plain(), plain()]) as (server, getter):
        assert await getter.get("/apis/x/v1/namespaces/n/things/c", seconds=5) == OBJ
        assert await getter.get("/apis/x/v1/namespaces/n/things/d", seconds=5) == OBJ
        assert server.connections == 1 and getter.connects == 1
        first = server.requests[0].decode()
        assert first.startswith("GET /prefix/apis/x/v1/namespaces/n/things/c HTTP/1.1\r\n")
        assert "\r\nAuthorization: Bearer t0k3n\r\n" in first
        assert "\r\nAccept: application/json\r\n" in first


async def test_a_chunked_answer_is_read_whole() -> None:
    half = len(BODY) // 2
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + f"{half:x}\r\n".encode()
        + BODY[:half]
        + b"\r\n"
        + f"{len(BODY) - half:x};ext=1\r\n".encode()
        + BODY[half:]
        + b"\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    async with serving([chunked, plain()]) as (server, getter):
        assert await getter.get("/a", seconds=5) == OBJ
        assert await getter.get("/b", seconds=5) == OBJ  # the trailer was consumed
        assert server.connections == 1


async def test_connection_close_is_honoured() -> None:
    async with serving([plain(extra="Connection: close\r\n"), plain()]) as (_server, getter):
        assert await getter.get("/a", seconds=5) == OBJ
        assert await getter.get("/b", seconds=5) == OBJ
        assert getter.connects == 2


async def test_a_kept_connection_the_server_closed_meanwhile_is_replaced_without_an_error() -> None:
    def answer_then_close(writer: asyncio.StreamWriter) -> None:
        writer.write(plain())  # no Connection: close, yet the server closes (its idle timeout)
        writer.close()

    async with serving([answer_then_close, plain()]) as (_server, getter):
        assert await getter.get("/a", seconds=5) == OBJ
        await asyncio.sleep(0.05)  # the close reaches the client's kept connection
        assert await getter.get("/b", seconds=5) == OBJ
        assert getter.connects == 2


async def test_a_new_connection_closed_without_an_answer_is_an_error() -> None:
    async with serving([lambda w: w.close()]) as (_server, getter):
        with pytest.raises(GetError, match="closed the connection without an answer") as e:
            await getter.get("/a", seconds=5)
        assert e.value.status == 0


async def test_no_answer_within_the_deadline_is_an_error_and_the_connection_is_dropped() -> None:
    async def stall(_writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(1)

    async with serving([stall, plain()]) as (_server, getter):
        with pytest.raises(GetError, match=r"no answer from the API server .* within 0.2s"):
            await getter.get("/a", seconds=0.2)
        assert not getter._idle  # half an exchange is never reused
        assert await getter.get("/b", seconds=5) == OBJ
        assert getter.connects == 2


async def test_refusals_carry_the_api_servers_message() -> None:
    status = json.dumps({"kind": "Status", "message": 'resourceclaims "c" is forbidden: no'}).encode()
    async with serving([plain(status, "403 Forbidden"), plain(b"<html>proxy</html>", "502 Bad Gateway")]) as (
        _server,
        getter,
    ):
        with pytest.raises(GetError) as refused:
            await getter.get("/a", seconds=5)
        assert (refused.value.status, refused.value.message) == (403, 'resourceclaims "c" is forbidden: no')
        with pytest.raises(GetError) as proxy:
            await getter.get("/b", seconds=5)
        assert (proxy.value.status, proxy.value.message) == (502, "<html>proxy</html>")


async def test_bad_answers_are_errors_that_say_what_was_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apiget, "MAX_BODY", 64)
    answers: list[bytes | Callable[[asyncio.StreamWriter], object]] = [
        plain(b"x" * 65),
        plain(b"not json"),
        plain(b"[1, 2]"),
        b"SSH-2.0-OpenSSH\r\n\r\n",
    ]
    for answer, words in zip(
        answers,
        ("an answer of 65 bytes", "not JSON", "not a JSON object", "not an HTTP/1.x answer"),
        strict=True,
    ):
        async with serving([answer]) as (_server, getter):
            with pytest.raises(GetError, match=words):
                await getter.get("/a", seconds=5)


async def test_a_header_with_a_line_break_is_never_sent() -> None:
    async with serving([plain()]) as (server, _getter):
        port = int(_getter.server.rsplit(":", 1)[1].split("/")[0])
        getter = AsyncGetter(
            f"http://127.0.0.1:{port}",
            ssl_context=None,
            headers=lambda: {"Authorization": "Bearer a\r\nX: y"},
        )
        with pytest.raises(GetError, match="line break"):
            await getter.get("/a", seconds=5)
        assert server.requests == []


def test_only_http_urls_and_https_with_a_context() -> None:
    with pytest.raises(ValueError, match="not an http"):
        AsyncGetter("unix:///x", ssl_context=None, headers=dict)
    with pytest.raises(ValueError, match="https needs an SSL context"):
        AsyncGetter("https://127.0.0.1:6443", ssl_context=None, headers=dict)
