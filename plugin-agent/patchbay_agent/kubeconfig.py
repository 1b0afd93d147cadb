"""Where the agent's API server is and how it proves who it is: a kubeconfig file, or the pod's
service account. Both become one `ApiServer`: the server's URL, the TLS context to reach it
(the cluster's CA, a client certificate), and the bearer token of each request.

Why the agent reads kubeconfigs itself rather than through a client library: it runs on every
node, and the library stack it used for a handful of requests (pykube-ng on requests and urllib3)
cost 5.75 MiB of its RSS, an eighth of it (docs/facts.md#client-memory). What it reads is what a
pod or an administrator's kubeconfig needs, as kubectl reads it:

* cluster: `server`, `certificate-authority` or `certificate-authority-data`,
  `insecure-skip-tls-verify`, `tls-server-name`;
* user: `token` or `tokenFile` (read again when it changes, as the pod's token is), and
  `client-certificate`/`client-key` or their `-data` forms.

Relative file names are relative to the kubeconfig's directory, as kubectl has them. Anything
else a user entry may say (`exec` and `auth-provider` plugins, `username`/`password`, `as`
impersonation) and a cluster's `proxy-url` are refused at start with the field named: the agent
would otherwise talk to the API server as someone else, or not at all, and only find out at its
first write. An agent in a pod uses its service account, which needs none of them.
"""

from __future__ import annotations

import base64
import binascii
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchbay_agent.satoken import TokenFile

#: User fields the agent does not implement; each is refused by name.
UNSUPPORTED_USER_FIELDS = (
    "exec",
    "auth-provider",
    "username",
    "password",
    "as",
    "as-uid",
    "as-groups",
    "as-user-extra",
)


class ClientConfigError(ValueError):
    """No usable way to the API server; the message names the flag or field to fix."""


@dataclass
class ApiServer:
    """One API server and the agent's credentials for it."""

    #: `https://host:port[/prefix]` (or `http://`)
    url: str
    #: None for http://
    ssl_context: ssl.SSLContext | None
    #: the name the server's certificate is checked against, when not the URL's host
    server_hostname: str | None
    #: a token that never changes (a kubeconfig's `token`)
    token: str | None
    #: a token read again when it changes (the pod's, a kubeconfig's `tokenFile`)
    token_file: TokenFile | None
    #: what the agent says where it got them, for its log
    source: str

    def authorization(self) -> dict[str, str]:
        """The Authorization header of a request now (a rotated token is used at once); OSError
        when the token file cannot be read."""
        if self.token_file is not None:
            return {"Authorization": f"Bearer {self.token_file.read()}"}
        if self.token:
            return {"Authorization": f"Bearer {self.token}"}
        return {}


def in_cluster(sa_dir: Path, env: Mapping[str, str]) -> ApiServer:
    """The pod's API server (KUBERNETES_SERVICE_HOST/PORT) with its service account's token and CA."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ClientConfigError(
            "--kubeconfig not given and KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not set "
            "(not in a pod?): pass --kubeconfig FILE"
        )
    token, ca = sa_dir / "token", sa_dir / "ca.crt"
    for path in (token, ca):
        if not path.is_file():
            raise ClientConfigError(
                f"--kubeconfig not given and {path} is missing (no service-account token mounted?): "
                "pass --kubeconfig FILE"
            )
    server_host = f"[{host}]" if ":" in host else host
    url = f"https://{server_host}:{port}"
    try:
        context = _tls_context(ca_file=ca)
    except (OSError, ssl.SSLError) as e:
        # Read again at the first request's handshake would be too late to say which file.
        raise ClientConfigError(f"the service account's CA {ca}: cannot use it: {e}") from None
    return ApiServer(url, context, None, None, TokenFile(token), "the in-cluster service account")


def load(path: Path) -> ApiServer:
    """The current context of the kubeconfig at `path`; ClientConfigError naming the file and the
    field when it cannot be used."""
    import yaml  # only with --kubeconfig: in a pod the agent reads the service account's files

    where = f"--kubeconfig {path}"
    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ClientConfigError(f"{where}: file not found") from None
    except (OSError, yaml.YAMLError) as e:
        raise ClientConfigError(f"{where}: cannot read it: {e}") from None
    try:
        return _from_doc(doc if isinstance(doc, dict) else {}, path.parent, where)
    except ClientConfigError:
        raise
    except (OSError, ssl.SSLError, ValueError) as e:
        raise ClientConfigError(f"{where}: cannot use it: {e}") from None


def _from_doc(doc: dict[str, Any], base: Path, where: str) -> ApiServer:
    current = doc.get("current-context")
    if not current:
        raise ClientConfigError(f"{where}: cannot use it: no current-context")
    context = _named(doc, "contexts", "context", current, where)
    cluster_name, user_name = context.get("cluster"), context.get("user")
    if not cluster_name:
        raise ClientConfigError(f"{where}: cannot use it: context {current!r} names no cluster")
    cluster = _named(doc, "clusters", "cluster", cluster_name, where)
    user = _named(doc, "users", "user", user_name, where) if user_name else {}
    refused = [f for f in UNSUPPORTED_USER_FIELDS if user.get(f)]
    if refused:
        raise ClientConfigError(
            f"{where}: user {user_name!r}: {', '.join(refused)} is not supported by the agent "
            "(use a token, a token file or a client certificate; in a pod, leave --kubeconfig out)"
        )
    if cluster.get("proxy-url"):
        raise ClientConfigError(f"{where}: cluster {cluster_name!r}: proxy-url is not supported by the agent")
    url = str(cluster.get("server") or "")
    if not url.startswith(("https://", "http://")):
        raise ClientConfigError(
            f"{where}: cannot use it: cluster {cluster_name!r} has no https:// or http:// server"
        )
    ssl_context = None
    if url.startswith("https://"):
        ssl_context = _tls_context(
            ca_file=_file(cluster, "certificate-authority", base),
            ca_data=_data(cluster, "certificate-authority-data"),
            insecure=bool(cluster.get("insecure-skip-tls-verify")),
            cert=(_file(user, "client-certificate", base), _data(user, "client-certificate-data")),
            key=(_file(user, "client-key", base), _data(user, "client-key-data")),
        )
    token_file = _file(user, "tokenFile", base)
    return ApiServer(
        url=url,
        ssl_context=ssl_context,
        server_hostname=cluster.get("tls-server-name") or None,
        token=str(user["token"]) if user.get("token") else None,
        token_file=TokenFile(token_file) if token_file is not None else None,
        source=where,
    )


def _named(doc: dict[str, Any], section: str, key: str, name: str, where: str) -> dict[str, Any]:
    for entry in doc.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(key) or {}
            if not isinstance(value, dict):
                break
            return value
    raise ClientConfigError(f"{where}: cannot use it: no {key} named {name!r} in {section}")


def _file(section: Mapping[str, Any], field: str, base: Path) -> Path | None:
    value = section.get(field)
    if not value:
        return None
    path = Path(str(value)).expanduser()
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise ValueError(f"{field} {path}: no such file")
    return path


def _data(section: Mapping[str, Any], field: str) -> bytes | None:
    value = section.get(field)
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{field} is not base64") from None


def _tls_context(
    *,
    ca_file: Path | None = None,
    ca_data: bytes | None = None,
    insecure: bool = False,
    cert: tuple[Path | None, bytes | None] = (None, None),
    key: tuple[Path | None, bytes | None] = (None, None),
) -> ssl.SSLContext:
    """A client TLS context: the cluster's CA (else the system's), a client certificate if given.
    HTTP/1.1 is offered by ALPN: the agent's requests are HTTP/1.1 only."""
    if insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif ca_file is not None or ca_data is not None:
        context = ssl.create_default_context(
            cafile=str(ca_file) if ca_file else None,
            cadata=ca_data.decode("ascii") if ca_data else None,
        )
    else:
        context = ssl.create_default_context()
    if any(cert) or any(key):
        if not any(cert) or not any(key):
            raise ValueError("a client certificate needs both client-certificate and client-key")
        _load_cert_chain(context, cert, key)
    context.set_alpn_protocols(["http/1.1"])
    return context


def _load_cert_chain(
    context: ssl.SSLContext, cert: tuple[Path | None, bytes | None], key: tuple[Path | None, bytes | None]
) -> None:
    """ssl loads a certificate and key only from files: `-data` forms go through files in a private
    directory, removed once loaded (the context keeps them in memory)."""
    import tempfile  # only for these (and it brings random and shutil)

    with tempfile.TemporaryDirectory(prefix="patchbay-agent-tls-") as tmp:
        paths = []
        for (given, data), name in ((cert, "cert.pem"), (key, "key.pem")):
            path = given if given is not None else Path(tmp) / name
            if given is None:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data or b"")
            paths.append(path)
        context.load_cert_chain(str(paths[0]), str(paths[1]))
