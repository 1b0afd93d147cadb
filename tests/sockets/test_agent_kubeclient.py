"""The agent's API client (pykube's HTTPClient) on the wire, against a loopback HTTP server that
records each request and answers as the API server would: the exact server-side apply request,
the API server's messages in errors, the node lookup, and the in-cluster config with a token
that rotates. (The real API server: tests/integration/agent.)"""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from patchbay_agent.kubeclient import ApiError, ClientConfigError, KubeClient

REPORT = {
    "apiVersion": "patchbay.dev/v1beta1",
    "kind": "DeviceReport",
    "metadata": {"name": "serial.node-1", "namespace": "patchbay"},
    "profile": "serial",
    "nodeName": "node-1",
    "resourceName": "example.com/serial",
    "summary": {"total": 0, "healthy": 0, "unhealthy": 0, "allocated": 0},
    "devices": [],
}


class FakeApiServer(http.server.ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: list[dict[str, Any]] = []
        #: (status, content type, body) for the next requests, in order; then 200 {}
        self.answers: list[tuple[int, str, bytes]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(http.server.BaseHTTPRequestHandler):
    server: FakeApiServer

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.server.requests.append(
            {
                "method": self.command,
                "path": self.path,
                "headers": dict(self.headers),
                "body": self.rfile.read(length).decode() if length else "",
            }
        )
        status, ctype, body = (
            self.server.answers.pop(0) if self.server.answers else (200, "application/json", b"{}")
        )
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PATCH = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def fake_api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _kubeconfig(path: Path, server: str, token: str = "admin-token") -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def _status(code: int, message: str) -> tuple[int, str, bytes]:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}
    return code, "application/json", json.dumps(body).encode()


def test_apply_is_one_server_side_apply_patch(tmp_path: Path) -> None:
    with fake_api() as api:
        client = KubeClient(_kubeconfig(tmp_path / "kc", api.url))
        client.apply(REPORT)
    (req,) = api.requests
    assert req["method"] == "PATCH"
    assert req["path"] == (
        "/apis/patchbay.dev/v1beta1/namespaces/patchbay/devicereports/serial.node-1"
        "?fieldManager=patchbay-agent&force=true"
    )
    assert req["headers"]["Content-Type"] == "application/apply-patch+yaml"
    assert req["headers"]["Authorization"] == "Bearer admin-token"
    assert req["headers"]["User-Agent"].startswith("patchbay-agent")
    assert json.loads(req["body"]) == REPORT
    # JSON is YAML: what the API server parses the apply body with.
    assert yaml.safe_load(req["body"]) == REPORT


def test_errors_carry_the_api_servers_message(tmp_path: Path) -> None:
    with fake_api() as api:
        client = KubeClient(_kubeconfig(tmp_path / "kc", api.url))
        policy = (
            'devicereports.patchbay.dev "serial.node-1" is forbidden: ValidatingAdmissionPolicy '
            "'patchbay-agent-reports' denied request: an agent writes only its own node's report"
        )
        api.answers = [_status(403, policy), (404, "text/plain", b"404 page not found\n"), _status(500, "")]
        with pytest.raises(ApiError) as denied:
            client.apply(REPORT)
        assert (denied.value.status, denied.value.message) == (403, policy)
        assert str(denied.value) == f"403: {policy}"
        with pytest.raises(ApiError) as missing:
            client.apply(REPORT)
        assert (missing.value.status, missing.value.message) == (404, "404 page not found")
        with pytest.raises(ApiError) as empty:
            client.apply(REPORT)
        assert empty.value.status == 500


def test_node_uid_from_the_api_without_a_pod_bound_token(tmp_path: Path) -> None:
    with fake_api() as api:
        client = KubeClient(_kubeconfig(tmp_path / "kc", api.url))
        api.answers = [
            (200, "application/json", json.dumps({"metadata": {"name": "n1", "uid": "u-123"}}).encode()),
            _status(404, 'nodes "n2" not found'),
        ]
        assert client.node_uid("n1") == "u-123"
        with pytest.raises(ApiError, match='nodes "n2" not found'):
            client.node_uid("n2")
    assert [r["path"] for r in api.requests] == ["/api/v1/nodes/n1", "/api/v1/nodes/n2"]


def test_an_unreachable_api_server_is_an_api_error(tmp_path: Path) -> None:
    with fake_api() as api:
        url = api.url
    client = KubeClient(_kubeconfig(tmp_path / "kc", url), timeout=2)
    with pytest.raises(ApiError) as err:
        client.apply(REPORT)
    assert err.value.status == 0
    assert err.value.message.startswith(f"cannot reach the API server {url}")


def test_config_errors_name_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ClientConfigError, match=r"--kubeconfig .*not found"):
        KubeClient(tmp_path / "absent")
    (tmp_path / "broken").write_text("clusters: []\n")
    with pytest.raises(ClientConfigError, match=r"--kubeconfig .*broken: cannot use it"):
        KubeClient(tmp_path / "broken")
    with pytest.raises(ClientConfigError, match=r"KUBERNETES_SERVICE_HOST.*pass --kubeconfig FILE"):
        KubeClient(None, env={}, service_account_dir=tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(ClientConfigError, match=r"token is missing .*pass --kubeconfig FILE"):
        KubeClient(None, env=env, service_account_dir=tmp_path)


def _jwt(node: str, uid: str) -> str:
    def b64(d: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).decode().rstrip("=")

    return f"{b64({'alg': 'none'})}.{b64({'kubernetes.io': {'node': {'name': node, 'uid': uid}}})}.sig"


def test_in_cluster_the_node_uid_comes_from_the_token_read_again_after_rotation(tmp_path: Path) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "ca.crt").write_text("not used by these calls\n")
    (sa / "token").write_text(_jwt("node-1", "uid-1"))
    # Port 1 on loopback: a request would fail; the claims must answer without one.
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "1"}
    client = KubeClient(None, env=env, service_account_dir=sa, timeout=2)
    assert client.server == "https://127.0.0.1:1"
    assert client.node_uid("node-1") == "uid-1"
    # The kubelet rotates the token (a new file in its place).
    (sa / "token.new").write_text(_jwt("node-1", "uid-1b") + "\n")
    (sa / "token.new").replace(sa / "token")
    assert client.node_uid("node-1") == "uid-1b"
    # A token bound to another node is not believed: the API is asked (and here fails).
    with pytest.raises(ApiError, match="cannot reach the API server"):
        client.node_uid("node-2")
    (sa / "token").unlink()
    with pytest.raises(ApiError, match="cannot read the service-account token"):
        client.node_uid("node-1")


def test_requests_is_loaded_without_a_charset_detector(tmp_path: Path) -> None:
    """charset_normalizer costs the agent about 3 MiB and it never decodes text of unknown charset:
    the client loads requests without it, silently (warnings are errors here), a text error body
    with no charset (a proxy's page) still reads as UTF-8, and the process can still import the
    detector later for anyone else. In a fresh interpreter, as in the agent."""
    code = f"""
import http.server, sys, threading
import patchbay_agent.kubeclient as kc
print("charset_normalizer" in sys.modules, "chardet" in sys.modules, kc.requests.compat.chardet)

class H(http.server.BaseHTTPRequestHandler):
    def do_PATCH(self):
        body = "Bad gateway \\u2014 upstream gone".encode()
        self.send_response(502)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass

srv = http.server.HTTPServer(("127.0.0.1", 0), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
from pathlib import Path
import tests_kubeconfig
client = kc.KubeClient(tests_kubeconfig.write(Path({str(tmp_path)!r}) / "kc", srv.server_address[1]))
try:
    client.apply({REPORT!r})
except kc.ApiError as e:
    print(e.status, e.message)
srv.shutdown()
srv.server_close()
import charset_normalizer
print(charset_normalizer.__name__)
"""
    (tmp_path / "tests_kubeconfig.py").write_text(
        "import yaml\n"
        "def write(path, port):\n"
        "    cluster = {'name': 'c', 'cluster': {'server': f'http://127.0.0.1:{port}'}}\n"
        "    context = {'name': 'x', 'context': {'cluster': 'c', 'user': 'u'}}\n"
        "    doc = {'clusters': [cluster], 'users': [{'name': 'u', 'user': {'token': 't'}}],\n"
        "           'contexts': [context], 'current-context': 'x'}\n"
        "    path.write_text(yaml.safe_dump(doc))\n"
        "    return path\n"
    )
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "False False None",
        "502 Bad gateway \u2014 upstream gone",
        "charset_normalizer",
    ], out.stderr
