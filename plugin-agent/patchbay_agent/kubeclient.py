"""The agent's one way to the Kubernetes API: pykube-ng's low-level HTTPClient, for a few requests.

* `apply(report)`: server-side apply of the whole DeviceReport, `PATCH .../devicereports/<name>
  ?fieldManager=patchbay-agent&force=true` with `application/apply-patch+yaml` (the object as
  JSON, which is YAML). One request creates or updates, so one change costs exactly one write,
  and no read comes before it;
* `node_uid(name)`: the owner reference's UID, from the pod-bound token's claims (`satoken.py`)
  or, without them (a kubeconfig), from GET /api/v1/nodes/<name>;
* DRA mode (`--dra-driver`, docs/dra.md#api-access): `resource_claim` (GET of a ResourceClaim,
  for NodePrepareResources), `apply_slice` (server-side apply of a ResourceSlice, field manager
  patchbay-agent), `dry_run_slice` (a create with `dryRun=All`: does this API server keep device
  taints?), `slice_names` (LIST of this node's slices of the driver, by field selector) and
  `delete_slice` (DELETE of a slice the pool no longer needs);
* `daemon_pods`: the pods of the agent's own DaemonSet on its node, read once as it leaves
  (`successor.py`: it serves on until its successor is Ready).

pykube-ng rather than the official client: the agent runs on every node and pykube is about half
the memory (docs/facts.md#client-memory; an import-linter contract forbids the official client).
Its object layer has no server-side apply, so this uses its HTTPClient directly. pykube is
synchronous: the caller runs these methods off the event loop (`report/reporter.py`, asyncio.to_thread).
The one read on a pod's start path, the claim NodePrepareResources needs, has a way on the loop:
`getter()` gives an `apiget.AsyncGetter` with the same server and credentials, and
`resource_claim_async` uses it (docs/dra.md#prepare).

Two classes: `ApiConnection`, how the agent reaches the API server (credentials, one request,
an object read or watched by name, the on-loop getter), and `KubeClient`, what it asks of it.

This module is imported only when reports are on (`--profile`), so an agent without reports never
loads pykube, requests or urllib3.

In a pod the token is re-read when the kubelet rotated it (`satoken.TokenFile`) and sent as the
request's own Authorization header, which pykube then leaves alone.

requests is imported WITHOUT a character-set detector (`_import_requests`): it loads
charset_normalizer at import only to guess the encoding of text bodies that name none, which costs
the agent 2.6-3.2 MiB of RSS (docs/facts.md#client-memory). The API server answers JSON in UTF-8
(`Response.json()` decodes the bytes itself) and the agent reads other bodies (a proxy's error
page) as UTF-8 itself, so it never asks requests to guess and loses nothing by it.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from patchbay_agent.apiget import AsyncGetter, GetError
from patchbay_agent.constants import (
    DRA_GROUP_VERSION,
    FIELD_MANAGER,
    REPORT_GROUP,
    REPORT_PLURAL,
    REPORT_VERSION,
    SERVICE_ACCOUNT_DIR,
)
from patchbay_agent.satoken import TokenFile, jwt_claims, node_identity

#: What requests would load to guess a body's character set; see the module doc.
_CHARSET_DETECTORS = ("charset_normalizer", "chardet")


def _import_requests() -> ModuleType:
    """requests, imported with no detector when this process has not loaded one already.

    A None entry in sys.modules makes `import charset_normalizer` raise ImportError, which
    requests handles (its `chardet` becomes None; it warns once, silenced here). The entries are
    removed afterwards, so anything else in the same process may still import the detectors.
    """
    if "requests" in sys.modules:
        return sys.modules["requests"]
    blocked = [name for name in _CHARSET_DETECTORS if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Unable to find acceptable character detection")
            import requests as module
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
    return module


requests = _import_requests()

import pykube  # noqa: E402  (after requests, so that pykube's import of it is the one above)

log = logging.getLogger(__name__)

#: Seconds for one request (connect + answer); a write that hangs longer is retried later.
REQUEST_TIMEOUT = 10.0
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
#: Longest API error text kept in a log line.
_MAX_ERROR_TEXT = 500


class ClientConfigError(ValueError):
    """No usable way to the API server; the message names the flag to fix."""


class ApiError(Exception):
    """A request the API server refused (status >= 400) or that never reached it (status 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


def _in_cluster_config(sa_dir: Path, env: Mapping[str, str]) -> tuple[Any, TokenFile]:
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
    doc = {
        "clusters": [
            {
                "name": "self",
                "cluster": {"server": f"https://{server_host}:{port}", "certificate-authority": str(ca)},
            }
        ],
        # No token here: each request carries the token as it is now (see TokenFile).
        "users": [{"name": "self", "user": {}}],
        "contexts": [{"name": "self", "context": {"cluster": "self", "user": "self"}}],
        "current-context": "self",
    }
    return pykube.KubeConfig(doc), TokenFile(token)


class ApiConnection:
    """How the agent reaches the API server: the credentials (a kubeconfig, or the pod's service
    account with its token re-read on rotation), one request with the agent's errors (`ApiError`),
    an object read or watched by name, and the same server and credentials on the event loop
    (`getter`). What the agent asks of it is `KubeClient`'s."""

    def __init__(
        self,
        kubeconfig: Path | None,
        *,
        timeout: float = REQUEST_TIMEOUT,
        service_account_dir: Path = Path(SERVICE_ACCOUNT_DIR),
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Raises ClientConfigError, naming --kubeconfig, when the config cannot be used."""
        self._token: TokenFile | None = None
        try:
            if kubeconfig is not None:
                config = pykube.KubeConfig.from_file(str(kubeconfig))
                where = f"--kubeconfig {kubeconfig}"
            else:
                config, self._token = _in_cluster_config(
                    service_account_dir, os.environ if env is None else env
                )
                where = "the in-cluster service account"
            # Resolve the current context now (file references, embedded certificates), so a
            # broken config fails the start, not the first write.
            _ = config.cluster, config.user
            self._http = pykube.HTTPClient(config, timeout=timeout)
        except ClientConfigError:
            raise
        except Exception as e:
            raise ClientConfigError(f"--kubeconfig {kubeconfig}: cannot use it: {e}") from None
        self._http.session.headers["User-Agent"] = f"{FIELD_MANAGER} (pykube-ng)"
        self._config = config
        self.server = self._http.url
        log.info("Talking to the API server %s (credentials: %s)", self.server, where)

    def _headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = dict(extra or {})
        if self._token is not None:
            try:
                headers["Authorization"] = f"Bearer {self._token.read()}"
            except OSError as e:
                raise ApiError(0, f"cannot read the service-account token {self._token.path}: {e}") from None
        return headers

    def _send(self, method: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, **kwargs)
        except requests.RequestException as e:
            raise ApiError(0, f"cannot reach the API server {self.server}: {e}") from None
        if response.status_code >= 400:
            raise ApiError(response.status_code, _error_text(response))
        return response

    def get_object(
        self, version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any]:
        """GET one object (ApiError 404 when it does not exist)."""
        kwargs: dict[str, Any] = {} if namespace is None else {"namespace": namespace}
        url = f"{plural}/{name}"
        response = self._send("GET", version=version, url=url, headers=self._headers(), **kwargs)
        body: dict[str, Any] = response.json()
        return body

    def watch_object(
        self,
        version: str,
        plural: str,
        name: str,
        resource_version: str,
        *,
        namespace: str | None = None,
        timeout_seconds: int = 300,
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """WATCH one object by name (a `metadata.name` field selector, which RBAC's resourceNames
        can narrow to that object): (type, object) per event until the server ends the watch
        (`timeoutSeconds`) or fails; ApiError on an HTTP error, an ERROR event (410 Gone: list
        again) is yielded as is. Blocking: run it in a thread."""
        kwargs: dict[str, Any] = {} if namespace is None else {"namespace": namespace}
        response = self._send(
            "GET",
            version=version,
            url=plural,
            params={
                "watch": "1",
                "fieldSelector": f"metadata.name={name}",
                "resourceVersion": resource_version,
                "timeoutSeconds": str(timeout_seconds),
                "allowWatchBookmarks": "true",
            },
            headers=self._headers(),
            stream=True,
            timeout=(10, timeout_seconds + 30),
            **kwargs,
        )
        try:
            for line in response.iter_lines():
                if line:
                    event = json.loads(line)
                    yield str(event.get("type")), dict(event.get("object") or {})
        finally:
            response.close()

    def getter(self) -> AsyncGetter | None:
        """A GET on the event loop with this client's server and credentials (`apiget.py`), or
        None where the config needs more than apiget does (exec plugins, auth providers, basic
        auth, `PYKUBE_SSL_CERTIFICATE_AUTHORITY`): those keep the thread path. Call it on the loop
        that will use it."""
        cluster, user = self._config.cluster, self._config.user
        if set(user) - {"token", "client-certificate", "client-key"} or (
            "PYKUBE_SSL_CERTIFICATE_AUTHORITY" in os.environ
        ):
            return None
        context: ssl.SSLContext | None = None
        if str(cluster["server"]).startswith("https:"):
            if "certificate-authority" in cluster:
                context = ssl.create_default_context(cafile=cluster["certificate-authority"].filename())
            elif cluster.get("insecure-skip-tls-verify"):
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            else:
                context = ssl.create_default_context()
            if "client-certificate" in user:
                context.load_cert_chain(user["client-certificate"].filename(), user["client-key"].filename())
            context.set_alpn_protocols(["http/1.1"])
        static = {"Authorization": f"Bearer {user['token']}"} if user.get("token") else {}

        def headers() -> Mapping[str, str]:
            return self._headers() if self._token is not None else static

        return AsyncGetter(
            str(cluster["server"]),
            ssl_context=context,
            headers=headers,
            server_hostname=cluster.get("tls-server-name"),
            user_agent=f"{FIELD_MANAGER} (apiget)",
        )


class KubeClient(ApiConnection):
    """The API server as the agent needs it (see the module doc); construct, then call off-loop."""

    def apply(self, report: Mapping[str, Any]) -> str:
        """Server-side apply of a whole DeviceReport (creates or updates it); the stored report's
        resourceVersion; ApiError on failure."""
        meta = report["metadata"]
        response = self._send(
            "PATCH",
            version=f"{REPORT_GROUP}/{REPORT_VERSION}",
            namespace=meta["namespace"],
            url=f"{REPORT_PLURAL}/{meta['name']}",
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            data=json.dumps(report, separators=(",", ":")),
            headers=self._headers({"Content-Type": APPLY_CONTENT_TYPE}),
        )
        return str((response.json().get("metadata") or {}).get("resourceVersion") or "")

    def read_report(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored DeviceReport, None when there is none; ApiError else."""
        try:
            return self.get_object(f"{REPORT_GROUP}/{REPORT_VERSION}", REPORT_PLURAL, name, namespace)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def delete_report(self, namespace: str, name: str, resource_version: str) -> None:
        """Delete the DeviceReport if it is still at ``resource_version`` (a precondition: a
        report written again meanwhile stays); a report already gone is fine; ApiError else."""
        body = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "preconditions": {"resourceVersion": resource_version},
        }
        try:
            self._send(
                "DELETE",
                version=f"{REPORT_GROUP}/{REPORT_VERSION}",
                namespace=namespace,
                url=f"{REPORT_PLURAL}/{name}",
                data=json.dumps(body),
                headers=self._headers({"Content-Type": "application/json"}),
            )
        except ApiError as e:
            if e.status != 404:
                raise

    def node_uid(self, node_name: str) -> str:
        """The Node's UID: from the token's claims when it is pod-bound to that node, else GET."""
        if self._token is not None:
            token = self._headers()["Authorization"].removeprefix("Bearer ")
            try:
                named = node_identity(jwt_claims(token))
            except ValueError:
                named = None
            if named is not None and named[0] == node_name:
                return named[1]
            if named is not None:
                log.warning(
                    "The service-account token is bound to node %s, not %s: asking the API server",
                    named[0],
                    node_name,
                )
        uid = (self._node(node_name).get("metadata") or {}).get("uid")
        if not isinstance(uid, str) or not uid:
            raise ApiError(200, f"node {node_name} has no metadata.uid")
        return uid

    def _node(self, node_name: str) -> dict[str, Any]:
        """GET the Node (its uid, labels, kubelet version); ApiError on failure."""
        body: dict[str, Any] = self._send(
            "GET", version="v1", url=f"nodes/{node_name}", headers=self._headers()
        ).json()
        return body

    def kubelet_version(self, node_name: str) -> str:
        """The Node's `status.nodeInfo.kubeletVersion` (e.g. "v1.34.4"); ApiError on failure."""
        info = (self._node(node_name).get("status") or {}).get("nodeInfo") or {}
        return str(info.get("kubeletVersion") or "")

    def node_labels(self, node_name: str) -> dict[str, str]:
        """The Node's labels (GET; the node agent decides from them which profiles select it)."""
        labels = (self._node(node_name).get("metadata") or {}).get("labels") or {}
        return {str(k): str(v) for k, v in labels.items()}

    async def resource_claim_async(
        self, getter: AsyncGetter, namespace: str, name: str, *, seconds: float
    ) -> dict[str, Any]:
        """`resource_claim` through `getter` (from `getter()`), on the loop; ApiError as there."""
        try:
            return await getter.get(
                f"/apis/{DRA_GROUP_VERSION}/namespaces/{namespace}/resourceclaims/{name}", seconds=seconds
            )
        except GetError as e:
            raise ApiError(e.status, e.message) from None

    def resource_claim(self, namespace: str, name: str, *, timeout: float | None = None) -> dict[str, Any]:
        """GET a ResourceClaim; ApiError (404 when it is gone). `timeout` bounds the request (the
        kubelet gives a whole NodePrepareResources 45 s: docs/dra.md#kubelet-registration)."""
        kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        response = self._send(
            "GET",
            version=DRA_GROUP_VERSION,
            namespace=namespace,
            url=f"resourceclaims/{name}",
            headers=self._headers(),
            **kwargs,
        )
        body: dict[str, Any] = response.json()
        return body

    def apply_claim_status(self, doc: Mapping[str, Any], field_manager: str) -> None:
        """Server-side apply to a ResourceClaim's `status` (`dra/claimstatus.py`); the UID in
        `doc` makes it a precondition (409 when the claim was replaced); ApiError on failure."""
        meta = doc["metadata"]
        self._send(
            "PATCH",
            version=DRA_GROUP_VERSION,
            namespace=meta["namespace"],
            url=f"resourceclaims/{meta['name']}/status",
            params={"fieldManager": field_manager, "force": "true"},
            data=json.dumps(doc, separators=(",", ":")),
            headers=self._headers({"Content-Type": APPLY_CONTENT_TYPE}),
        )

    def apply_slice(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of a whole ResourceSlice (cluster-scoped); the slice as the API server
        stored it (which may lack fields it dropped); ApiError on failure."""
        response = self._send(
            "PATCH",
            version=DRA_GROUP_VERSION,
            url=f"resourceslices/{doc['metadata']['name']}",
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            data=json.dumps(doc, separators=(",", ":")),
            headers=self._headers({"Content-Type": APPLY_CONTENT_TYPE}),
        )
        body: dict[str, Any] = response.json()
        return body

    def dry_run_slice(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """POST a ResourceSlice with `dryRun=All`: validated, admitted and answered as it would be
        stored, but not stored; ApiError on failure (authorized as `create`)."""
        response = self._send(
            "POST",
            version=DRA_GROUP_VERSION,
            url="resourceslices",
            params={"dryRun": "All", "fieldManager": FIELD_MANAGER},
            data=json.dumps(doc, separators=(",", ":")),
            headers=self._headers({"Content-Type": "application/json"}),
        )
        body: dict[str, Any] = response.json()
        return body

    def daemon_pods(
        self, namespace: str, selector: str, node_name: str, *, timeout: float
    ) -> list[dict[str, Any]]:
        """The pods in `namespace` matching the label `selector` on node `node_name` (one LIST by
        label and field selector; `successor.py`); ApiError on failure."""
        response = self._send(
            "GET",
            version="v1",
            url="pods",
            namespace=namespace,
            params={"labelSelector": selector, "fieldSelector": f"spec.nodeName={node_name}"},
            headers=self._headers(),
            timeout=timeout,
        )
        items: list[dict[str, Any]] = response.json().get("items") or []
        return items

    def slice_names(self, driver: str, node_name: str) -> list[str]:
        """Names of the ResourceSlices of `driver` on `node_name` (the field selectors the kubelet
        uses itself); ApiError on failure."""
        response = self._send(
            "GET",
            version=DRA_GROUP_VERSION,
            url="resourceslices",
            params={"fieldSelector": f"spec.driver={driver},spec.nodeName={node_name}"},
            headers=self._headers(),
        )
        items = response.json().get("items") or []
        return sorted(str((i.get("metadata") or {}).get("name")) for i in items)

    def delete_slice(self, name: str) -> None:
        """DELETE a ResourceSlice; one that is gone already is fine. ApiError otherwise."""
        try:
            self._send(
                "DELETE", version=DRA_GROUP_VERSION, url=f"resourceslices/{name}", headers=self._headers()
            )
        except ApiError as e:
            if e.status != 404:
                raise


def _error_text(response: Any) -> str:
    """The API server's message (a Status object's `message`), else the body's start."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])[:_MAX_ERROR_TEXT]
    # The bytes as UTF-8, not `response.text`: requests reads text/* without a charset as
    # ISO-8859-1 (and would otherwise ask a detector), which garbles what API servers send.
    text = (response.content.decode("utf-8", "replace") or response.reason or "").strip()
    return text[:_MAX_ERROR_TEXT] or f"HTTP {response.status_code}"
