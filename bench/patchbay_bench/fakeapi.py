"""A stand-in for the API server that answers only what the node agent asks when it serves
DevicePlugin profiles: GET of its Node (labels, UID, kubelet version), and the server-side apply,
GET and DELETE of its DeviceReports, which it keeps in memory. Everything else is a 404.

Why: the node agent (``--node-config``) reads its Node's labels before it starts any profile and
writes a DeviceReport per profile, so measuring its memory needs something that answers; the
``agent_memory`` scenario runs on the Go kubelet peer without a cluster, and this keeps it so.
What it does not stand in for: DRA (ResourceSlices, claims), watches (``--watch-config``), any
validation or admission. It speaks HTTPS with a certificate of its own CA and a kubeconfig with a
client certificate (``patchbay_devcluster.pki``), so the agent's http.client/TLS path is the
one it takes against a real API server. Listens on 127.0.0.1 only, in a thread of the bench.
"""

from __future__ import annotations

import http.server
import json
import re
import ssl
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from patchbay_devcluster.pki import CertificateAuthority, write_kubeconfig
from patchbay_devcluster.releases import matrix

NODE = re.compile(r"^/api/v1/nodes/(?P<name>[^/?]+)$")
REPORT = re.compile(r"^/apis/patchbay\.dev/v1beta1/namespaces/(?P<ns>[^/]+)/devicereports/(?P<name>[^/?]+)$")


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive, as the API server: one TLS session per client

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the bench's output is its figures."""

    def _answer(self, status: int, body: Mapping[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _not_found(self) -> None:
        self._answer(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        loaded = json.loads(self.rfile.read(length) or b"{}")
        return loaded if isinstance(loaded, dict) else {}

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if m := NODE.match(path):
            self.server.api.node_reads += 1
            node = self.server.api.node(m["name"])
            return self._answer(200, node) if node else self._not_found()
        if m := REPORT.match(path):
            report = self.server.api.reports.get((m["ns"], m["name"]))
            return self._answer(200, report) if report else self._not_found()
        return self._not_found()

    def do_PATCH(self) -> None:
        m = REPORT.match(self.path.split("?", 1)[0])
        if m:
            self._answer(200, self.server.api.apply(m["ns"], m["name"], self._body()))
        else:
            self._not_found()

    def do_DELETE(self) -> None:
        m = REPORT.match(self.path.split("?", 1)[0])
        if m:
            self.server.api.reports.pop((m["ns"], m["name"]), None)
            self._answer(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
        else:
            self._not_found()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, api: FakeApi) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.api = api


class FakeApi:
    """The stand-in (see the module doc): ``kubeconfig`` reaches it; ``reports`` holds what the
    agents applied, by (namespace, name); ``nodes`` names the Nodes it knows, with their labels."""

    def __init__(self, directory: Path, nodes: Mapping[str, Mapping[str, str]]) -> None:
        """``nodes``: node name -> labels. The server starts at once; ``close()`` stops it."""
        self.nodes = {name: dict(labels) for name, labels in nodes.items()}
        self._uids = {name: str(uuid.uuid4()) for name in nodes}
        self.reports: dict[tuple[str, str], dict[str, Any]] = {}
        #: GETs of a Node so far (the node agent's first request: it has started)
        self.node_reads = 0
        self._lock = threading.Lock()
        self._version = 0
        ca = CertificateAuthority(directory)
        serving = ca.issue("fakeapi", "fakeapi", server=True)
        client = ca.issue("agent", "patchbay-agent", client=True)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(serving.cert, serving.key)
        self._server = _Server(self)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.kubeconfig = directory / "kubeconfig"
        write_kubeconfig(
            self.kubeconfig, f"https://127.0.0.1:{self._server.server_address[1]}", ca.pair.cert, client
        )
        self._thread = threading.Thread(target=self._server.serve_forever, name="fakeapi", daemon=True)
        self._thread.start()

    def node(self, name: str) -> dict[str, Any] | None:
        if name not in self.nodes:
            return None
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "uid": self._uids[name], "labels": self.nodes[name]},
            "status": {"nodeInfo": {"kubeletVersion": matrix()[-1]}},
        }

    def apply(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """A server-side apply, as far as the agent can tell: the object as sent, stored, with a
        new resourceVersion."""
        with self._lock:
            self._version += 1
            body.setdefault("metadata", {})["resourceVersion"] = str(self._version)
            self.reports[(namespace, name)] = body
        return body

    def profiles(self) -> set[str]:
        """The profiles whose DeviceReport is stored and says no agent error."""
        with self._lock:
            return {str(r.get("profile")) for r in self.reports.values() if not r.get("agentError")}

    def clear(self) -> None:
        with self._lock:
            self.reports.clear()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
