"""A minimal Kubernetes REST client on the standard library, for the dev cluster tool only.

Why not the official client: the tool must work before anything else is installed and wired up,
it needs only a handful of calls (health, create nodes, list nodes), and it must not pull the
operator's client into the import graph of every test helper. Everything it talks to is on
127.0.0.1.
"""

from __future__ import annotations

import http.client
import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ApiError(RuntimeError):
    """A non-2xx answer; ``status`` is the HTTP status code."""

    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status


@dataclass(frozen=True)
class Rest:
    """Talks HTTPS to one API server on loopback with a client certificate."""

    port: int
    ca: Path
    cert: Path
    key: Path
    host: str = "127.0.0.1"
    timeout: float = 10.0

    def _context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        ctx.load_cert_chain(str(self.cert), str(self.key))
        return ctx

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
    ) -> tuple[int, str]:
        """Send one request; return (status, text). Connection errors propagate as OSError."""
        conn = http.client.HTTPSConnection(
            self.host, self.port, context=self._context(), timeout=self.timeout
        )
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Accept": "application/json"}
            if data is not None:
                headers["Content-Type"] = content_type
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read().decode(errors="replace")
        finally:
            conn.close()

    def call(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = ()) -> Any:
        """Like ``request`` but raises ``ApiError`` on anything but 2xx or a status in ``ok``."""
        status, text = self.request(method, path, body)
        if 200 <= status < 300:
            return json.loads(text) if text else None
        if status in ok:
            return None
        raise ApiError(status, method, path, text)
