"""An OCI registry for the local cluster, as real as a user's: images and the chart reach the
node the way clusters install them.

The registry is distribution's ``registry`` (the reference implementation), built from its Go
module by ``hack/registry-binary.sh`` into the cache. ``DevCluster.start_registry`` runs it as a
process of the cluster (recorded in ``state.json``, stopped by PID like the others):

- on ``127.0.0.1`` only, on a port picked at start; the real node's containerd runs on this
  machine's network, so loopback is where it reaches the registry, and nothing listens on any
  other address;
- over TLS with the cluster's own CA (``pki.py``): the server certificate names 127.0.0.1, and
  clients are told the CA as users tell theirs: containerd by a hosts file
  (``<config_path>/127.0.0.1:<port>/hosts.toml``, ``ca = ...``), podman by a certificate
  directory (``--cert-dir``), helm by ``--ca-file``;
- storing under the cluster's state directory (``<state>/registry/<name>/storage``), so ``down``
  with purge removes it;
- optionally with htpasswd auth (bcrypt, written here with the C library's ``crypt``), for the
  tests of ``imagePullSecrets``: a second registry of the same cluster (``name``), since one
  distribution process has one auth setting.
"""

from __future__ import annotations

import base64
import ctypes
import ctypes.util
import http.client
import json
import os
import shutil
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REGISTRY_VERSION = "v3.1.2"
"""hack/registry-binary.sh's pin (REGISTRY_VERSION there): the binary's cache path names it."""
BIN_ENV = "PATCHBAY_REGISTRY_BIN"
ENABLE_ENV = "PATCHBAY_REGISTRY"
"""``PATCHBAY_REGISTRY=1``: ``install.helm_install`` installs through the registry (see there);
``make demo`` does unless ``PATCHBAY_REGISTRY=0``."""
HOST = "127.0.0.1"
PROJECT = "kube-patchbay"
"""The images' path in the registry, as in the released names (``ghcr.io/kube-patchbay/...``)."""
CHARTS = "charts"
"""The chart's path: ``oci://<registry>/charts/patchbay``."""


class RegistryError(RuntimeError):
    """The registry cannot run or answer; the message says why and where to look."""


def binary() -> Path:
    """The registry binary: ``$PATCHBAY_REGISTRY_BIN``, else where hack/registry-binary.sh builds
    it (``$PATCHBAY_CACHE/tools/registry-<version>/registry``)."""
    raw = os.environ.get(BIN_ENV)
    if raw:
        path = Path(raw)
    else:
        cache = Path(os.environ.get("PATCHBAY_CACHE") or Path.home() / ".cache" / "patchbay")
        path = cache / "tools" / f"registry-{REGISTRY_VERSION}" / "registry"
    if not path.is_file():
        raise RegistryError(f"no registry binary at {path}: run hack/registry-binary.sh (make setup does)")
    return path


def enabled(default: bool = False) -> bool:
    """Whether ``PATCHBAY_REGISTRY`` asks for the registry: ``1``/``true``/``yes`` on,
    ``0``/``false``/``no`` off, unset or empty ``default`` (off for the test suite, which asks per
    test; on for ``make demo``, which installs the way clusters install)."""
    raw = os.environ.get(ENABLE_ENV, "").strip().lower()
    return default if raw == "" else raw not in ("0", "false", "no")


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    def basic(self) -> str:
        return base64.b64encode(f"{self.username}:{self.password}".encode()).decode()

    def docker_config(self, host: str) -> dict[str, Any]:
        """A ``.dockerconfigjson`` naming ``host``: what an imagePullSecret holds."""
        return {"auths": {host: {"username": self.username, "password": self.password, "auth": self.basic()}}}


@dataclass(frozen=True)
class Registry:
    """A running registry of the cluster: where it answers and how a client trusts it."""

    name: str
    port: int
    ca: Path  # the cluster CA's certificate
    cert_dir: Path  # holds only ca.crt: podman's --cert-dir
    credentials: Credentials | None = None

    @property
    def host(self) -> str:
        """``127.0.0.1:<port>``: the registry part of every reference to it."""
        return f"{HOST}:{self.port}"

    def repository(self, program: str) -> str:
        return f"{self.host}/{PROJECT}/patchbay-{program}"

    @property
    def charts(self) -> str:
        return f"oci://{self.host}/{CHARTS}"

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def request(
        self, method: str, path: str, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str]]:
        """One request to the registry API (``/v2/...``); (status, headers), never raising for an
        HTTP error status."""
        conn = http.client.HTTPSConnection(HOST, self.port, context=self.context(), timeout=5)
        headers = dict(headers or {})
        if self.credentials is not None:
            headers["Authorization"] = f"Basic {self.credentials.basic()}"
        try:
            conn.request(method, path, headers=headers)
            res = conn.getresponse()
            res.read()
            return res.status, dict(res.getheaders())
        finally:
            conn.close()

    def answers(self) -> bool:
        """The API's base endpoint answers (200, or 401 where auth is on and we send none)."""
        try:
            status, _ = self.request("GET", "/v2/")
        except OSError:
            return False
        return status in (200, 401)

    def manifest_digest(self, repository: str, reference: str) -> str | None:
        """The digest the registry serves for ``repository:reference`` (a tag), or None."""
        accept = ", ".join(
            (
                "application/vnd.oci.image.index.v1+json",
                "application/vnd.oci.image.manifest.v1+json",
                "application/vnd.docker.distribution.manifest.v2+json",
                "application/vnd.docker.distribution.manifest.list.v2+json",
            )
        )
        path = repository.removeprefix(self.host + "/")
        status, headers = self.request("HEAD", f"/v2/{path}/manifests/{reference}", {"Accept": accept})
        return headers.get("Docker-Content-Digest") if status == 200 else None


def htpasswd_line(credentials: Credentials) -> str:
    """``user:<bcrypt hash>`` as distribution's htpasswd auth reads it, hashed by the C library's
    ``crypt`` (libxcrypt does bcrypt, ``$2b$``); Python's own ``crypt`` module is deprecated."""
    name = ctypes.util.find_library("crypt")
    if not name:
        raise RegistryError("no libcrypt to hash the registry's password (apt-get install libcrypt1)")
    lib = ctypes.CDLL(name)
    lib.crypt_gensalt.restype = ctypes.c_char_p
    lib.crypt_gensalt.argtypes = [ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int]
    lib.crypt.restype = ctypes.c_char_p
    lib.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    salt = lib.crypt_gensalt(b"$2b$", 10, None, 0)
    hashed = lib.crypt(credentials.password.encode(), salt) if salt else None
    if not hashed or not hashed.startswith(b"$2"):
        raise RegistryError("libcrypt could not make a bcrypt hash for the registry's htpasswd file")
    return f"{credentials.username}:{hashed.decode()}\n"


def config(storage: Path, port: int, cert: Path, key: Path, htpasswd: Path | None = None) -> dict[str, Any]:
    """distribution's configuration (YAML is a superset of JSON, so it is written as JSON)."""
    doc: dict[str, Any] = {
        "version": 0.1,
        "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": False}},
        "storage": {"filesystem": {"rootdirectory": str(storage)}, "delete": {"enabled": True}},
        "http": {
            "addr": f"{HOST}:{port}",
            "tls": {"certificate": str(cert), "key": str(key)},
            "headers": {"X-Content-Type-Options": ["nosniff"]},
        },
    }
    if htpasswd is not None:
        doc["auth"] = {"htpasswd": {"realm": "patchbay-devcluster", "path": str(htpasswd)}}
    return doc


def env() -> dict[str, str]:
    """The registry's environment: no OpenTelemetry exporter reaching for a collector."""
    return {**os.environ, "OTEL_TRACES_EXPORTER": "none", "OTEL_SDK_DISABLED": "true"}


def hosts_toml(registry: Registry) -> str:
    """containerd's hosts file for the registry (``<config_path>/<host:port>/hosts.toml``), as users
    configure a registry with a private CA: pull and resolve, the CA to verify it."""
    url = f"https://{registry.host}"
    return (
        f'server = "{url}"\n\n[host."{url}"]\n  capabilities = ["pull", "resolve"]\n  ca = "{registry.ca}"\n'
    )


def write_cert_dir(ca: Path, directory: Path) -> Path:
    """A directory holding only the CA as ``ca.crt`` (podman reads every ``*.crt`` of a
    ``--cert-dir`` as a CA, and ``*.cert``/``*.key`` pairs as client certificates)."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ca, directory / "ca.crt")
    return directory


def save_record(path: Path, registry: Registry) -> None:
    doc: dict[str, Any] = {"name": registry.name, "port": registry.port, "ca": str(registry.ca)}
    doc["certDir"] = str(registry.cert_dir)
    if registry.credentials is not None:
        doc["credentials"] = {
            "username": registry.credentials.username,
            "password": registry.credentials.password,
        }
    path.write_text(json.dumps(doc))
    path.chmod(0o600)


def load_record(path: Path) -> Registry | None:
    try:
        raw = json.loads(path.read_text())
        creds = raw.get("credentials")
        return Registry(
            raw["name"],
            int(raw["port"]),
            Path(raw["ca"]),
            Path(raw["certDir"]),
            Credentials(creds["username"], creds["password"]) if creds else None,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
