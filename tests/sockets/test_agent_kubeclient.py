"""The agent's API client (`kubeclient.py` on http.client, credentials from `kubeconfig.py`) on the
wire, against a loopback HTTP(S) server that records each request and answers as the API server
would: the exact server-side apply request, the API server's messages in errors, the node lookup,
kept connections (and one the server closed meanwhile), the kubeconfig forms kubectl reads (file
and `-data` certificates, relative paths, a token file, `tls-server-name`), the fields the agent
refuses by name, and the in-cluster config with a token that rotates. (The real API server:
tests/integration/agent.)"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import http.server
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from patchbay_agent.kubeclient import ApiError, ClientConfigError, KubeClient
from patchbay_agent.ownwatch import Selection
from patchbay_devcluster.pki import CertificateAuthority

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
    daemon_threads = True

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: list[dict[str, Any]] = []
        #: (status, content type, body) for the next requests, in order; then 200 {}
        self.answers: list[tuple[int, str, bytes]] = []
        #: close the connection after the next answer WITHOUT saying so (an idle timeout)
        self.drop_after_answer = False
        #: client connections accepted
        self.connections = 0
        self.tls = tls
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True)

    def get_request(self) -> tuple[Any, Any]:
        self.connections += 1
        return super().get_request()

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.server_address[1]}"


class Handler(http.server.BaseHTTPRequestHandler):
    server: FakeApiServer
    protocol_version = "HTTP/1.1"  # keep-alive, as the API server

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
        if self.server.drop_after_answer:
            self.server.drop_after_answer = False
            self.close_connection = True

    do_GET = do_PATCH = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def fake_api(tls: ssl.SSLContext | None = None) -> Iterator[FakeApiServer]:
    server = FakeApiServer(tls)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _kubeconfig(
    path: Path,
    server: str,
    token: str | None = "admin-token",
    *,
    cluster: dict[str, Any] | None = None,
    user: dict[str, Any] | None = None,
) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server, **(cluster or {})}}],
                "users": [{"name": "u", "user": {**({"token": token} if token else {}), **(user or {})}}],
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
    (sa / "ca.crt").write_bytes(CertificateAuthority(tmp_path / "pki").pair.cert.read_bytes())
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
    with pytest.raises(ApiError, match=r"cannot read the token .*token \(the in-cluster service account\)"):
        client.node_uid("node-1")


def test_connections_are_kept_and_one_the_server_closed_meanwhile_is_replaced(tmp_path: Path) -> None:
    with fake_api() as api:
        client = KubeClient(_kubeconfig(tmp_path / "kc", api.url))
        for _ in range(5):
            client.apply(REPORT)
        assert (client.connects, api.connections) == (1, 1)
        # The server closes the kept connection after an answer without saying so (as an idle
        # timeout does between two writes): the next write goes out again on a new connection.
        api.drop_after_answer = True
        client.apply(REPORT)
        client.apply(REPORT)
        assert (client.connects, api.connections) == (2, 2)
        assert [r["method"] for r in api.requests] == ["PATCH"] * 7
        # Two kept connections, both gone meanwhile: one new connection, no error.
        client.close()
        for _ in range(2):
            conn = client._connection(10)
            conn.connect()
            assert conn.sock is not None
            conn.sock.shutdown(socket.SHUT_RDWR)
            client._idle.append(conn)
        client.apply(REPORT)
        assert (client.connects, len(client._idle)) == (5, 1)


def test_a_watch_yields_each_event_of_the_stream_until_the_server_ends_it(tmp_path: Path) -> None:
    events = [
        {"type": "ADDED", "object": {"metadata": {"name": "cfg", "resourceVersion": "5"}}},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "6"}}},
        {"type": "ERROR", "object": {"kind": "Status", "code": 410}},
    ]
    stream = b"".join(json.dumps(e).encode() + b"\n" for e in events)
    with fake_api() as api:
        client = KubeClient(_kubeconfig(tmp_path / "kc", api.url))
        api.answers = [(200, "application/json", stream), _status(403, "watch is forbidden")]
        got = list(client.watch_object("patchbay.dev/v1beta1", "nodeconfigs", "cfg", "4", namespace="ns"))
        assert got == [(str(e["type"]), e["object"]) for e in events]
        with pytest.raises(ApiError) as denied:
            list(client.watch_object("v1", "configmaps", "cfg", "4", namespace="ns"))
        assert (denied.value.status, denied.value.message) == (403, "watch is forbidden")
    path = api.requests[0]["path"]
    assert path.startswith("/apis/patchbay.dev/v1beta1/namespaces/ns/nodeconfigs?watch=1&")
    assert "fieldSelector=metadata.name%3Dcfg" in path and "resourceVersion=4" in path


def test_the_agents_own_objects_are_listed_and_watched_by_field_selector(tmp_path: Path) -> None:
    """`ownwatch.py`'s requests: a LIST narrowed by a field selector (items and the list's version),
    then a WATCH of the same selector from that version; the watch's connection is handed out
    first, and shutting its socket from another thread ends a blocked watch at once."""
    listed = {
        "metadata": {"resourceVersion": "41"},
        "items": [{"metadata": {"name": "n1-d", "resourceVersion": "40"}}],
    }
    event = {"type": "DELETED", "object": {"metadata": {"name": "n1-d", "resourceVersion": "42"}}}
    selector = "spec.driver=d,spec.nodeName=n1"
    with fake_api() as api:
        client = KubeClient(_kubeconfig(tmp_path / "kc", api.url))
        api.answers = [(200, "application/json", json.dumps(listed).encode())]
        slices = Selection("resource.k8s.io/v1", "resourceslices", None, selector)
        items, version = client.list_objects(slices)
        assert (items, version) == (listed["items"], "41")
        api.answers = [(200, "application/json", json.dumps(event).encode() + b"\n")]
        opened: list[Any] = []
        got = list(client.watch_objects(slices, version, opened=opened.append))
        assert got == [("DELETED", event["object"])] and len(opened) == 1
    first, second = (r["path"] for r in api.requests)
    assert (
        first == "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver%3Dd%2Cspec.nodeName%3Dn1"
    )
    assert second.startswith("/apis/resource.k8s.io/v1/resourceslices?watch=1&fieldSelector=spec.driver%3Dd")
    assert "resourceVersion=41" in second and "allowWatchBookmarks=true" in second


#: The only name the test server's certificate carries: not the address the client dials.
SERVER_NAME = "api.patchbay.test"


def _tls_server(tmp_path: Path) -> tuple[CertificateAuthority, ssl.SSLContext]:
    """A CA, and a server context whose certificate names SERVER_NAME only and that requires a
    client certificate from that CA."""
    ca = CertificateAuthority(tmp_path / "pki")
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVER_NAME)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME)]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    (tmp_path / "served.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "served.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "served.crt", tmp_path / "served.key")
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cafile=ca.pair.cert)
    return ca, context


def test_tls_with_the_kubeconfig_forms_kubectl_reads(tmp_path: Path) -> None:
    """A CA file named relative to the kubeconfig, a client certificate given as -data, and
    `tls-server-name` (the URL's address is not what the certificate names)."""
    ca, tls = _tls_server(tmp_path)
    client_pair = ca.issue("admin", "admin", client=True)
    b64 = lambda p: base64.b64encode(p.read_bytes()).decode()  # noqa: E731
    other = CertificateAuthority(tmp_path / "other-ca")
    with fake_api(tls) as api:
        kc = _kubeconfig(
            tmp_path / "pki" / "kc",
            api.url,
            token=None,
            cluster={"certificate-authority": "ca.crt", "tls-server-name": SERVER_NAME},
            user={"client-certificate-data": b64(client_pair.cert), "client-key-data": b64(client_pair.key)},
        )
        KubeClient(kc).apply(REPORT)
        assert api.requests[-1]["method"] == "PATCH"
        assert "Authorization" not in api.requests[-1]["headers"]  # the certificate is the credential
        # Without tls-server-name the certificate does not name 127.0.0.1: refused, and said so.
        doc = yaml.safe_load(kc.read_text())
        del doc["clusters"][0]["cluster"]["tls-server-name"]
        kc.write_text(yaml.safe_dump(doc))
        with pytest.raises(
            ApiError, match=r"cannot reach the API server .*(certificate|IP address mismatch)"
        ):
            KubeClient(kc).apply(REPORT)
        # A CA that did not sign the server's certificate: refused.
        doc["clusters"][0]["cluster"] = {
            "server": api.url,
            "certificate-authority-data": b64(other.pair.cert),
            "tls-server-name": SERVER_NAME,
        }
        kc.write_text(yaml.safe_dump(doc))
        with pytest.raises(ApiError, match="certificate verify failed"):
            KubeClient(kc).apply(REPORT)
    assert len(api.requests) == 1


def test_a_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("first\n")
    with fake_api() as api:
        client = KubeClient(_kubeconfig(tmp_path / "kc", api.url, token=None, user={"tokenFile": "token"}))
        client.apply(REPORT)
        (tmp_path / "token.new").write_text("second-longer\n")
        (tmp_path / "token.new").replace(tmp_path / "token")
        client.apply(REPORT)
    assert [r["headers"]["Authorization"] for r in api.requests] == ["Bearer first", "Bearer second-longer"]


@pytest.mark.parametrize(
    ("cluster_fields", "user", "message"),
    [
        (
            {},
            {"exec": {"command": "aws", "apiVersion": "client.authentication.k8s.io/v1"}},
            "exec is not supported",
        ),
        ({}, {"auth-provider": {"name": "oidc"}}, "auth-provider is not supported"),
        ({}, {"username": "admin", "password": "pw"}, "username, password is not supported"),
        ({}, {"as": "someone-else"}, "as is not supported"),
        ({"proxy-url": "http://127.0.0.1:3128"}, {}, "proxy-url is not supported"),
        ({"certificate-authority": "absent.crt"}, {}, "certificate-authority .*absent.crt: no such file"),
        ({"certificate-authority-data": "not base64!"}, {}, "certificate-authority-data is not base64"),
        ({}, {"client-certificate-data": "Yw=="}, "needs both client-certificate and client-key"),
        ({}, {"tokenFile": "absent-token"}, "tokenFile .*absent-token: no such file"),
    ],
)
def test_what_the_agent_cannot_use_is_refused_at_start_with_the_field_named(
    tmp_path: Path, cluster_fields: dict[str, Any], user: dict[str, Any], message: str
) -> None:
    kc = _kubeconfig(tmp_path / "kc", "https://127.0.0.1:1", token=None, cluster=cluster_fields, user=user)
    with pytest.raises(ClientConfigError, match=rf"--kubeconfig {kc}: .*{message}"):
        KubeClient(kc)


def test_no_client_library_is_loaded_and_a_text_error_reads_as_utf8(tmp_path: Path) -> None:
    """In a fresh interpreter, as in the agent: the client loads neither pykube nor requests nor
    urllib3 (nor a character-set detector), and a proxy's text error page with no charset still
    reads as UTF-8."""
    code = f"""
import http.server, sys, threading
import patchbay_agent.kubeclient as kc

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
libraries = ("pykube", "requests", "urllib3", "charset_normalizer", "chardet", "idna", "certifi")
print(sorted(m for m in libraries if m in sys.modules))
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
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["502 Bad gateway \u2014 upstream gone", "[]"], out.stderr
