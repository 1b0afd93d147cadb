"""GET of one API object on the event loop: HTTP/1.1 keep-alive over asyncio streams.

Only for the one read on a pod's start path, the ResourceClaim that NodePrepareResources needs
(`dra/preparer.py`). The agent's client for everything else (`kubeclient.py`, synchronous, on
http.client) runs in a worker thread; measured in one run of the dra_path benchmark
(docs/benchmarks.md#dra-mode-on-the-real-node-benchdra_pathpy) that read cost the prepare call
more than half its time, of which the thread hop and the client stack then used (requests) were
about 1 ms. This module does the same GET with no thread: a request line and a few headers written
to a connection kept open (TLS as the client's config says), the answer's status line and
headers read, the body read by Content-Length or chunks, json.loads.

What it leaves out on purpose, so that it stays small enough to read: any method but GET, any
body but JSON, redirects, compression, HTTP/2 and proxies. Credentials are the agent client's
(`kubeconfig.ApiServer`: a bearer token, re-read when it rotates, and a client certificate), so the
same credentials reach the same API server either way (`kubeclient.KubeClient.getter()`).

Connections: at most `max_idle` are kept between requests; more run at once when the kubelet
prepares several claims together, and the extra ones are closed after their answer. A kept
connection the server closed meanwhile (its idle timeout) fails before any answer byte: the GET
is sent once more on a new connection (GETs are idempotent). A request cut short (its deadline,
a cancelled call) closes its connection rather than leave half an answer in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

#: Longest answer accepted (a ResourceClaim is a few KiB; the API server's own limit on a stored
#: object is about 1.5 MiB).
MAX_BODY = 8 * 1024 * 1024
#: Most header lines accepted in an answer.
MAX_HEADERS = 100
#: Longest error text kept from an answer (as the agent's other client keeps).
_MAX_ERROR_TEXT = 500


class GetError(Exception):
    """A GET the API server refused (status >= 400) or that never got an answer (status 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


class _StaleConnectionError(Exception):
    """A kept connection was closed before its answer began: try a new one."""


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class AsyncGetter:
    """GETs of JSON objects from one API server (see the module doc)."""

    def __init__(
        self,
        server: str,
        *,
        ssl_context: ssl.SSLContext | None,
        headers: Callable[[], Mapping[str, str]],
        server_hostname: str | None = None,
        user_agent: str = "patchbay-agent",
        max_idle: int = 4,
    ) -> None:
        """`server`: `https://host:port[/prefix]` (or `http://`); `headers()`: the credentials of
        each request, called per request (a rotated token is used at once)."""
        url = urlsplit(server)
        if url.scheme not in ("https", "http") or not url.hostname:
            raise ValueError(f"server {server!r}: not an http(s) URL")
        if url.scheme == "https" and ssl_context is None:
            raise ValueError(f"server {server!r}: https needs an SSL context")
        self.server = server
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl = ssl_context if url.scheme == "https" else None
        self._server_hostname = server_hostname
        self._prefix = url.path.rstrip("/")
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = host if url.port is None else f"{host}:{url.port}"
        self._headers = headers
        self._user_agent = user_agent
        self._max_idle = max_idle
        self._idle: list[_Connection] = []
        self.connects = 0

    async def get(self, path: str, *, seconds: float) -> dict[str, Any]:
        """The JSON object at `path` (e.g. `/apis/resource.k8s.io/v1/namespaces/n/resourceclaims/c`);
        GetError when refused or unanswered within `seconds`."""
        request = self._request(path)
        try:
            async with asyncio.timeout(seconds):
                while True:
                    reused = bool(self._idle)
                    conn = self._idle.pop() if reused else await self._connect()
                    try:
                        status, body, keep = await _exchange(conn, request, fresh=not reused)
                    except _StaleConnectionError:
                        conn.close()
                        continue
                    except BaseException:
                        conn.close()
                        raise
                    if keep and len(self._idle) < self._max_idle:
                        self._idle.append(conn)
                    else:
                        conn.close()
                    break
        except TimeoutError:
            raise GetError(0, f"no answer from the API server {self.server} within {seconds:g}s") from None
        except (OSError, asyncio.IncompleteReadError, ValueError) as e:
            raise GetError(0, f"cannot reach the API server {self.server}: {e}") from None
        if status >= 400:
            raise GetError(status, _error_text(body))
        try:
            obj = json.loads(body)
        except ValueError as e:
            raise GetError(status, f"the answer is not JSON: {e}") from None
        if not isinstance(obj, dict):
            raise GetError(status, "the answer is not a JSON object")
        return obj

    def close(self) -> None:
        """Close the kept connections."""
        for conn in self._idle:
            conn.close()
        self._idle.clear()

    async def _connect(self) -> _Connection:
        reader, writer = await asyncio.open_connection(
            self._host,
            self._port,
            ssl=self._ssl,
            server_hostname=(self._server_hostname or self._host) if self._ssl is not None else None,
        )
        self.connects += 1
        return _Connection(reader, writer)

    def _request(self, path: str) -> bytes:
        lines = [
            f"GET {quote(self._prefix + path, safe='/')} HTTP/1.1",
            f"Host: {self._host_header}",
            f"User-Agent: {self._user_agent}",
            "Accept: application/json",
        ]
        for name, value in self._headers().items():
            if any(c in name or c in value for c in "\r\n"):
                raise GetError(0, f"header {name!r} has a line break in it")
            lines.append(f"{name}: {value}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _exchange(conn: _Connection, request: bytes, *, fresh: bool) -> tuple[int, bytes, bool]:
    """Send `request` and read its answer: (status, body, whether the connection may be reused).
    On a kept (not `fresh`) connection that closes before the answer's first byte: _StaleConnectionError."""
    conn.writer.write(request)
    try:
        await conn.writer.drain()
        status_line = await conn.reader.readline()
    except (ConnectionError, ssl.SSLError):
        if fresh:
            raise
        raise _StaleConnectionError() from None
    if not status_line:
        if fresh:
            raise ConnectionResetError("the API server closed the connection without an answer")
        raise _StaleConnectionError()
    version, _, rest = status_line.decode("latin-1").partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise ValueError(f"not an HTTP/1.x answer: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS + 1):
        line = await conn.reader.readline()
        if line in (b"\r\n", b"\n"):
            break
        if not line:
            raise asyncio.IncompleteReadError(b"", None)
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    else:
        raise ValueError(f"more than {MAX_HEADERS} header lines")
    keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _chunks(conn.reader)
    elif "content-length" in headers:
        length = int(headers["content-length"])
        if not 0 <= length <= MAX_BODY:
            raise ValueError(f"an answer of {length} bytes (at most {MAX_BODY})")
        body = await conn.reader.readexactly(length)
    else:
        body = await conn.reader.read(MAX_BODY + 1)
        keep = False
    if len(body) > MAX_BODY:
        raise ValueError(f"an answer of more than {MAX_BODY} bytes")
    return int(code), body, keep


async def _chunks(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        size_line = await reader.readline()
        size = int(size_line.split(b";", 1)[0].strip() or b"x", 16)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(parts)
        total += size
        if total > MAX_BODY:
            raise ValueError(f"an answer of more than {MAX_BODY} bytes")
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)


def _error_text(body: bytes) -> str:
    """The API server's Status message, else the body's start."""
    with contextlib.suppress(ValueError, AttributeError):
        message = json.loads(body).get("message")
        if message:
            return str(message)[:_MAX_ERROR_TEXT]
    return body[:_MAX_ERROR_TEXT].decode("utf-8", "replace") or "no message"
