"""Bad input, tried: the agent's HTTP endpoint (the one surface open to the pod network) gets
random bytes and random request-shaped text over real loopback sockets, each sent whole and then
the sending side closed. Every answer is a well-formed status line with a status the endpoint
documents (or a close), nothing is logged at ERROR, no connection is left open, and the endpoint
answers /healthz after each batch."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.fuzzing import LoopThread, tally

from patchbay_agent.httpserver import HttpEndpoint
from patchbay_agent.metrics import Metrics

KNOWN = {b"200", b"400", b"404", b"405", b"408", b"414", b"431", b"503"}
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def endpoint(loop_thread: LoopThread) -> Iterator[HttpEndpoint]:
    http = HttpEndpoint(Metrics("example.com/fuzz", "node-1"), lambda: True, lambda: True)
    loop_thread.run(http.start("127.0.0.1", 0))
    try:
        yield http
    finally:
        loop_thread.run(http.stop())


def _exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:  # the endpoint closed (or reset) before all was sent: what it may do
            pass
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except OSError:
            pass
    return b"".join(chunks)


def _check(answer: bytes) -> None:
    if not answer:
        tally("http", "closed")
        return
    head = answer.split(b"\r\n", 1)[0].split()
    assert head[0] == b"HTTP/1.1" and head[1] in KNOWN, answer[:120]
    tally("http", head[1].decode())


_token = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x2FF), max_size=40)
_request = st.builds(
    lambda method, path, version, headers, end: (
        f"{method} {path} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + end
    ).encode("utf-8", "surrogatepass"),
    st.one_of(st.sampled_from(["GET", "POST", "HEAD", "get", ""]), _token),
    st.one_of(st.sampled_from(["/metrics", "/healthz", "/readyz", "/", "*", "/metrics?x=1"]), _token),
    st.one_of(st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2", ""]), _token),
    st.lists(st.tuples(_token, _token), max_size=20),
    st.sampled_from(["\r\n", "\n", "", "\r\n\r\n"]),
)


@FUZZ
@given(data=st.binary(max_size=4096))
def test_random_bytes(endpoint: HttpEndpoint, data: bytes, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        _check(_exchange(endpoint.port, data))
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@FUZZ
@given(data=_request)
def test_request_shaped_text(endpoint: HttpEndpoint, data: bytes, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        _check(_exchange(endpoint.port, data))
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(min_value=8_000, max_value=2_000_000), where=st.sampled_from(["line", "header"]))
def test_oversize(endpoint: HttpEndpoint, size: int, where: str) -> None:
    data = (
        b"GET /" + b"a" * size + b" HTTP/1.1\r\n\r\n"
        if where == "line"
        else (b"GET /metrics HTTP/1.1\r\nX: " + b"v" * size + b"\r\n\r\n")
    )
    _check(_exchange(endpoint.port, data))


def test_still_serving_and_nothing_left_open(endpoint: HttpEndpoint) -> None:
    """After the suites above (module order): /healthz answers and no connection lingers."""
    answer = _exchange(endpoint.port, b"GET /healthz HTTP/1.1\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert endpoint.open_connections <= 1
