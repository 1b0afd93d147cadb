"""Bad input, tried: the agent's HTTP endpoint (the one surface open to the pod network) gets
random bytes and random request-shaped text over real loopback sockets, each sent whole and then
the sending side closed. Every answer is a well-formed status line with a status the endpoint
documents (or a close), nothing is logged at ERROR, no connection is left open, and the endpoint
answers /healthz after each batch. No answer and no close within `DEADLINE` is a hang, and a hang
fails the test. A valid request (a well-formed GET of /metrics, /healthz or /readyz) must be
answered 200: a close without a status line fails it. `test_the_judge_fails_an_endpoint_that_never_answers`
and `test_the_judge_fails_an_endpoint_that_closes_valid_requests_unanswered` run the same
fuzzers against an endpoint broken on purpose (one reads the request and never answers, one's
handlers raise) and see them fail."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.fuzzing import PROVE, LoopThread, tally

from patchbay_agent import httpserver
from patchbay_agent.httpserver import HttpEndpoint
from patchbay_agent.metrics import Metrics

KNOWN = {b"200", b"400", b"404", b"405", b"408", b"414", b"431", b"503"}
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
#: How long a client waits for the answer, or the close, to all it sent: twice the endpoint's own
#: deadline for a request (after which it answers 408). Past it the exchange is a hang.
DEADLINE = 2 * httpserver.REQUEST_DEADLINE


@pytest.fixture(scope="module")
def endpoint(loop_thread: LoopThread) -> Iterator[HttpEndpoint]:
    http = HttpEndpoint(Metrics("example.com/fuzz", "node-1"), lambda: True, lambda: True)
    loop_thread.run(http.start("127.0.0.1", 0))
    try:
        yield http
    finally:
        loop_thread.run(http.stop())


def _exchange(port: int, data: bytes, deadline: float = DEADLINE) -> bytes | None:
    """What the endpoint answers to `data`, sent whole and then the sending side closed: the bytes
    it sent before it closed (none: closed unanswered), or None when it neither answered in full
    nor closed within `deadline` seconds of the connect (a hang). A socket timeout is an OSError
    too: it is caught first, so a hang is never taken for a close."""
    end = time.monotonic() + deadline
    chunks: list[bytes] = []
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=deadline) as s:
            s.settimeout(max(end - time.monotonic(), 0.001))
            try:
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)
            except TimeoutError:
                raise
            except OSError:  # the endpoint closed (or reset) before all was sent: what it may do
                pass
            while True:
                s.settimeout(max(end - time.monotonic(), 0.001))
                try:
                    chunk = s.recv(65536)
                except TimeoutError:
                    raise
                except OSError:  # reset after (or instead of) its answer
                    break
                if not chunk:
                    break
                chunks.append(chunk)
    except TimeoutError:
        return None
    return b"".join(chunks)


def _check(answer: bytes | None, surface: str = "http", valid: bool = False) -> None:
    """An answer with a documented status, or a close; never a hang. `valid`: the request was a
    well-formed GET of /metrics, /healthz or /readyz, which must be answered 200 (the fixture's
    endpoint is healthy and ready): a close without a status line fails it."""
    if answer is None:
        tally(surface, "hang")
        raise AssertionError("hang: no answer and no close within the deadline")
    if not answer:
        tally(surface, "closed unanswered" if valid else "closed")
        assert not valid, "closed without a status line: a valid request must be answered"
        return
    head = answer.split(b"\r\n", 1)[0].split()
    assert len(head) >= 2 and head[0] == b"HTTP/1.1" and head[1] in KNOWN, answer[:120]
    tally(surface, head[1].decode())
    assert not valid or head[1] == b"200", f"a valid request answered {answer[:120]!r}"


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


#: A valid request: a GET of an endpoint's path (a query is allowed and ignored), HTTP/1.1 or
#: 1.0, a few well-formed headers (a token, a visible value), the blank line that ends them.
_header_name = st.text(
    alphabet="!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    min_size=1,
    max_size=20,
)
_header_value = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40)
_valid_request = st.builds(
    lambda path, query, version, headers: (
        f"GET {path}{query} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    ).encode(),
    st.sampled_from(["/metrics", "/healthz", "/readyz"]),
    st.one_of(st.just(""), st.text(alphabet="abcxyz019=&", max_size=12).map(lambda q: "?" + q)),
    st.sampled_from(["HTTP/1.1", "HTTP/1.0"]),
    st.lists(st.tuples(_header_name, _header_value), max_size=6),
)


def _fuzz_one(
    port: int, data: bytes, caplog: pytest.LogCaptureFixture, surface: str = "http", valid: bool = False
) -> None:
    with caplog.at_level(logging.ERROR):
        _check(_exchange(port, data), surface, valid)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@FUZZ
@given(data=st.binary(max_size=4096))
def test_random_bytes(endpoint: HttpEndpoint, data: bytes, caplog: pytest.LogCaptureFixture) -> None:
    _fuzz_one(endpoint.port, data, caplog)


@FUZZ
@given(data=_request)
def test_request_shaped_text(endpoint: HttpEndpoint, data: bytes, caplog: pytest.LogCaptureFixture) -> None:
    _fuzz_one(endpoint.port, data, caplog)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_valid_request)
def test_valid_requests(endpoint: HttpEndpoint, data: bytes, caplog: pytest.LogCaptureFixture) -> None:
    _fuzz_one(endpoint.port, data, caplog, "http (valid requests)", valid=True)


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


class _Silent(httpserver._Connection):
    """Broken on purpose: reads and parses the request like the endpoint's own connection, then
    never answers and never closes (a handler stuck past every deadline)."""

    __slots__ = ()

    def _answer(self, status: str, ctype: str, body: bytes) -> None:
        self.reading = False
        self._cancel_timer()


def test_the_judge_fails_an_endpoint_that_never_answers(
    endpoint: HttpEndpoint,
    loop_thread: LoopThread,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The fuzzer above, against an endpoint whose connections never answer: it fails, naming a
    hang (before, a socket timeout was an OSError, swallowed, and the hang counted as a close).
    Then the endpoint is restored and the same judge passes again."""
    monkeypatch.setattr(httpserver, "_Connection", _Silent)
    broken = HttpEndpoint(Metrics("example.com/fuzz", "node-1"), lambda: True, lambda: True)
    loop_thread.run(broken.start("127.0.0.1", 0))

    @PROVE
    @given(data=st.binary(max_size=4096))
    def fuzz_broken(data: bytes) -> None:
        _check(_exchange(broken.port, data, deadline=1.0), "http, broken on purpose")

    try:
        with pytest.raises(AssertionError, match="hang"):
            fuzz_broken()
    finally:
        loop_thread.run(broken.stop())
    monkeypatch.undo()
    _fuzz_one(endpoint.port, b"GET /healthz HTTP/1.1\r\n\r\n", caplog)


class _RaisingMetrics:
    """Broken on purpose: a registry whose rendering raises, as a handler bug would."""

    class registry:  # the attribute `HttpEndpoint` reads
        @staticmethod
        def render() -> bytes:
            raise RuntimeError("broken on purpose")


def _raise() -> bool:
    raise RuntimeError("broken on purpose")


def test_the_judge_fails_an_endpoint_that_closes_valid_requests_unanswered(
    endpoint: HttpEndpoint, loop_thread: LoopThread, caplog: pytest.LogCaptureFixture
) -> None:
    """The valid-request fuzzer against an endpoint whose handlers raise (a metrics registry and
    health checks given to its constructor): asyncio drops each such connection without a word,
    which the old judge tallied as a close and passed. It fails, then the real endpoint passes."""
    broken = HttpEndpoint(_RaisingMetrics(), _raise, _raise)
    loop_thread.run(broken.start("127.0.0.1", 0))

    @PROVE
    @given(data=_valid_request)
    def fuzz_broken(data: bytes) -> None:
        _check(
            _exchange(broken.port, data, deadline=2.0), "http (valid requests), broken on purpose", valid=True
        )

    try:
        with pytest.raises(AssertionError, match="closed without a status line"):
            fuzz_broken()
    finally:
        loop_thread.run(broken.stop())
    caplog.clear()  # asyncio's word on each dropped connection of the broken endpoint
    _fuzz_one(endpoint.port, b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n", caplog, valid=True)
