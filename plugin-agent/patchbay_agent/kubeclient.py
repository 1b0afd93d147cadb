"""The agent's one way to the Kubernetes API, for a few requests: HTTP/1.1 with the standard
library's http.client, JSON in and out.

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
  (`successor.py`: it serves on until its successor is Ready);
* `get_object`/`watch_object`: one object followed by name (the node agent's NodeConfig);
* `list_objects`/`watch_objects`: the agent's own objects followed by an `ownwatch.Selection` (a
  field selector), so that a DeviceReport or ResourceSlice someone else deleted or edited is
  written again (`ownwatch.py`).

No client library: the agent runs on every node, and for these requests the stack it used before
(pykube-ng on requests and urllib3, with idna and certifi) cost 5.75 MiB of its RSS, where
http.client costs 1.0 (docs/facts.md#client-memory). The official client is heavier still (an
import-linter contract keeps it, pykube, requests and urllib3 out of the agent). The credentials
come from `kubeconfig.py`.

The methods are synchronous: the caller runs them off the event loop (`report/reporter.py`,
asyncio.to_thread), from any thread; connections are kept open between requests (at most
`MAX_IDLE`) and each request has one to itself. The one read on a pod's start path, the claim
NodePrepareResources needs, has a way on the loop: `getter()` gives an `apiget.AsyncGetter` with
the same server and credentials, and `resource_claim_async` uses it (docs/dra.md#prepare).

Two classes: `ApiConnection`, how the agent reaches the API server (credentials, one request,
an object read or watched by name, the on-loop getter), and `KubeClient`, what it asks of it.

This module is imported only when reports are on (`--profile`), so an agent without reports never
loads http.client.

A kept connection the API server closed meanwhile (its idle timeout) fails before any answer: the
request is sent once more on a new connection. Every request here may be sent twice safely: GETs
and LISTs read, an apply of the same object is the same apply, a DELETE of a gone object is
answered 404 (taken as done) and the dry-run create stores nothing.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from patchbay_agent import kubeconfig
from patchbay_agent.apiget import AsyncGetter, GetError
from patchbay_agent.constants import (
    DRA_GROUP_VERSION,
    FIELD_MANAGER,
    INVENTORY_PLURAL,
    REPORT_GROUP,
    REPORT_PLURAL,
    REPORT_VERSION,
    SERVICE_ACCOUNT_DIR,
)
from patchbay_agent.kubeconfig import ClientConfigError
from patchbay_agent.ownwatch import Opened, Selection
from patchbay_agent.satoken import jwt_claims, node_identity

__all__ = ["ApiConnection", "ApiError", "ClientConfigError", "KubeClient"]

log = logging.getLogger(__name__)

#: Seconds for one request (connect + answer); a write that hangs longer is retried later.
REQUEST_TIMEOUT = 10.0
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
#: Longest API error text kept in a log line.
_MAX_ERROR_TEXT = 500
#: Most connections kept open between requests (the agent makes a few at a time at most).
MAX_IDLE = 2


class ApiError(Exception):
    """A request the API server refused (status >= 400) or that never reached it (status 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


@dataclass
class Response:
    """An answer of the API server: its status and its body."""

    status: int
    reason: str
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class _HTTPSConnection(http.client.HTTPSConnection):
    """http.client's HTTPS connection, checking the certificate against `server_hostname` when
    the kubeconfig names one (`tls-server-name`) rather than the URL's host."""

    def __init__(self, host: str, port: int, *, context: Any, server_hostname: str | None, timeout: float):
        super().__init__(host, port, timeout=timeout, context=context)
        self._server_hostname = server_hostname

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(  # type: ignore[attr-defined]
            self.sock, server_hostname=self._server_hostname or self.host
        )


class ApiConnection:
    """How the agent reaches the API server: the credentials (a kubeconfig, or the pod's service
    account with its token re-read on rotation), one request with the agent's errors (`ApiError`),
    an object read or watched by name, and the same server and credentials on the event loop
    (`getter`). What the agent asks of it is `KubeClient`'s."""

    def __init__(
        self,
        kubeconfig_path: Path | None,
        *,
        timeout: float = REQUEST_TIMEOUT,
        service_account_dir: Path = Path(SERVICE_ACCOUNT_DIR),
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Raises ClientConfigError, naming --kubeconfig, when the config cannot be used."""
        if kubeconfig_path is not None:
            server = kubeconfig.load(kubeconfig_path)
        else:
            server = kubeconfig.in_cluster(service_account_dir, os.environ if env is None else env)
        url = urlsplit(server.url)
        if not url.hostname:
            raise ClientConfigError(f"{server.source}: cannot use it: server {server.url!r} names no host")
        self._server = server
        self._timeout = timeout
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._prefix = url.path.rstrip("/")
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        #: connections opened so far (a kept one is reused)
        self.connects = 0
        self.server = server.url
        log.info("Talking to the API server %s (credentials: %s)", self.server, server.source)

    def _headers(self) -> dict[str, str]:
        """The credentials of a request now (a rotated token is read again); ApiError when the
        token file cannot be read."""
        try:
            return self._server.authorization()
        except OSError as e:
            path = self._server.token_file.path if self._server.token_file else "?"
            raise ApiError(0, f"cannot read the token {path} ({self._server.source}): {e}") from None

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        self.connects += 1
        if self._server.ssl_context is None:
            return http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        return _HTTPSConnection(
            self._host,
            self._port,
            context=self._server.ssl_context,
            server_hostname=self._server.server_hostname,
            timeout=timeout,
        )

    def _path(self, version: str, url: str, namespace: str | None, params: Mapping[str, str] | None) -> str:
        root = "/api/v1" if version == "v1" else f"/apis/{version}"
        scope = f"/namespaces/{namespace}" if namespace is not None else ""
        path = quote(f"{self._prefix}{root}{scope}/{url}", safe="/")
        return f"{path}?{urlencode(params)}" if params else path

    def _send(
        self,
        method: str,
        *,
        version: str,
        url: str,
        namespace: str | None = None,
        params: Mapping[str, str] | None = None,
        data: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Response:
        """One request on a kept connection (or a new one); ApiError when refused or unanswered."""
        target = self._path(version, url, namespace, params)
        all_headers = {
            "User-Agent": FIELD_MANAGER,
            "Accept": "application/json",
            **self._headers(),
            **(headers or {}),
        }
        body = data.encode() if data is not None else None
        seconds = self._timeout if timeout is None else timeout
        for attempt in (1, 2):
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            reused = conn is not None
            if conn is None:
                conn = self._connection(seconds)
            elif conn.sock is not None:
                conn.sock.settimeout(seconds)
            try:
                conn.request(method, target, body=body, headers=all_headers)
                answer = conn.getresponse()
                response = Response(answer.status, answer.reason, answer.read())
            except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected) as e:
                conn.close()
                if reused and attempt == 1:
                    # A kept connection the server closed meanwhile (its idle timeout): the
                    # others kept as long are closed too; the request goes out on a new one.
                    self.close()
                    continue
                raise ApiError(0, f"cannot reach the API server {self.server}: {e}") from None
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise ApiError(0, f"cannot reach the API server {self.server}: {e}") from None
            except BaseException:
                conn.close()
                raise
            if answer.will_close:
                conn.close()
            else:
                with self._lock:
                    if len(self._idle) < MAX_IDLE:
                        self._idle.append(conn)
                        conn = None
                if conn is not None:
                    conn.close()
            break
        if response.status >= 400:
            raise ApiError(response.status, _error_text(response))
        return response

    def close(self) -> None:
        """Close the kept connections (a later request opens a new one)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def get_object(
        self, version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any]:
        """GET one object (ApiError 404 when it does not exist)."""
        response = self._send("GET", version=version, url=f"{plural}/{name}", namespace=namespace)
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
        can narrow to that object): `watch_objects` with that selector."""
        return self.watch_objects(
            Selection(version, plural, namespace, f"metadata.name={name}"),
            resource_version,
            timeout_seconds=timeout_seconds,
        )

    def list_objects(self, selection: Selection) -> tuple[list[dict[str, Any]], str]:
        """LIST the objects a `Selection` picks: (items, the list's resourceVersion, where a watch
        of the same selection starts). The agent's own objects only (`ownwatch.py`), so the
        answer is small however large the cluster."""
        sel = selection
        params = {"fieldSelector": sel.field_selector}
        response = self._send(
            "GET", version=sel.version, url=sel.plural, namespace=sel.namespace, params=params
        )
        body = response.json()
        items = [dict(i) for i in body.get("items") or []]
        return items, str((body.get("metadata") or {}).get("resourceVersion") or "")

    def watch_objects(
        self,
        selection: Selection,
        resource_version: str,
        *,
        timeout_seconds: int = 300,
        opened: Opened = None,
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """WATCH the objects a `Selection` picks, from `resource_version`, with bookmarks:
        (type, object) per event until the server ends the watch (`timeoutSeconds`) or fails;
        ApiError on an HTTP error, an ERROR event (410 Gone: list again) is yielded as is.
        Blocking: run it in a thread. A connection of its own, closed at the end (never kept: it
        is busy for the whole watch); `opened` is handed it first, so that another thread can
        end the watch at once by shutting its socket."""
        target = self._path(
            selection.version,
            selection.plural,
            selection.namespace,
            {
                "watch": "1",
                "fieldSelector": selection.field_selector,
                "resourceVersion": resource_version,
                "timeoutSeconds": str(timeout_seconds),
                "allowWatchBookmarks": "true",
            },
        )
        headers = {"User-Agent": FIELD_MANAGER, "Accept": "application/json", **self._headers()}
        conn = self._connection(REQUEST_TIMEOUT)
        try:
            try:
                conn.connect()
                assert conn.sock is not None
                if opened is not None:
                    opened(conn)
                # The server ends the watch after timeoutSeconds; silence much longer is a lost peer.
                conn.sock.settimeout(timeout_seconds + 30)
                conn.request("GET", target, headers=headers)
                answer = conn.getresponse()
                if answer.status >= 400:
                    raise ApiError(
                        answer.status, _error_text(Response(answer.status, answer.reason, answer.read()))
                    )
            except (OSError, http.client.HTTPException) as e:
                raise ApiError(0, f"cannot reach the API server {self.server}: {e}") from None
            while True:
                try:
                    line = answer.readline()
                except (OSError, http.client.HTTPException) as e:
                    raise ApiError(
                        0, f"the watch of {selection.plural} ({selection.field_selector}) broke: {e}"
                    ) from None
                if not line:
                    return
                if line.strip():
                    event = json.loads(line)
                    yield str(event.get("type")), dict(event.get("object") or {})
        finally:
            conn.close()

    def getter(self) -> AsyncGetter:
        """A GET on the event loop with this client's server and credentials (`apiget.py`). Call it
        on the loop that will use it."""

        def headers() -> Mapping[str, str]:
            return self._headers()

        return AsyncGetter(
            self._server.url,
            ssl_context=self._server.ssl_context,
            headers=headers,
            server_hostname=self._server.server_hostname,
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
            headers={"Content-Type": APPLY_CONTENT_TYPE},
        )
        return str((response.json().get("metadata") or {}).get("resourceVersion") or "")

    def apply_inventory(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of the node's whole NodeInventory (cluster-scoped); the object as
        stored (its resourceVersion and field managers tell the keeper's repairs its own writes
        from someone else's); ApiError on failure."""
        response = self._send(
            "PATCH",
            version=f"{REPORT_GROUP}/{REPORT_VERSION}",
            url=f"{INVENTORY_PLURAL}/{doc['metadata']['name']}",
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            data=json.dumps(doc, separators=(",", ":")),
            headers={"Content-Type": APPLY_CONTENT_TYPE},
        )
        stored: dict[str, Any] = response.json()
        return stored

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
                headers={"Content-Type": "application/json"},
            )
        except ApiError as e:
            if e.status != 404:
                raise

    def node_uid(self, node_name: str) -> str:
        """The Node's UID: from the token's claims when it is pod-bound to that node, else GET."""
        if self._server.token_file is not None:
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
        body: dict[str, Any] = self._send("GET", version="v1", url=f"nodes/{node_name}").json()
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

    def claim_read_async(self) -> Callable[[str, str, float], Awaitable[dict[str, Any]]]:
        """A ResourceClaim GET on the event loop, on keep-alive connections of its own
        (`getter()`; `dra.preparer.DraClient.claim_read_async`). Call it on the loop that will
        use it."""
        getter = self.getter()
        log.info("Claims are read on the event loop (keep-alive connections to %s)", getter.server)

        async def read(namespace: str, name: str, seconds: float) -> dict[str, Any]:
            return await self.resource_claim_async(getter, namespace, name, seconds=seconds)

        return read

    def resource_claim(self, namespace: str, name: str, *, timeout: float | None = None) -> dict[str, Any]:
        """GET a ResourceClaim; ApiError (404 when it is gone). `timeout` bounds the request (the
        kubelet gives a whole NodePrepareResources 45 s: docs/dra.md#kubelet-registration)."""
        kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        response = self._send(
            "GET",
            version=DRA_GROUP_VERSION,
            namespace=namespace,
            url=f"resourceclaims/{name}",
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
            headers={"Content-Type": APPLY_CONTENT_TYPE},
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
            headers={"Content-Type": APPLY_CONTENT_TYPE},
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
            headers={"Content-Type": "application/json"},
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
        )
        items = response.json().get("items") or []
        return sorted(str((i.get("metadata") or {}).get("name")) for i in items)

    def delete_slice(self, name: str) -> None:
        """DELETE a ResourceSlice; one that is gone already is fine. ApiError otherwise."""
        try:
            self._send("DELETE", version=DRA_GROUP_VERSION, url=f"resourceslices/{name}")
        except ApiError as e:
            if e.status != 404:
                raise


def _error_text(response: Response) -> str:
    """The API server's message (a Status object's `message`), else the body's start (as UTF-8,
    whatever the content type says: what API servers and the proxies before them send)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])[:_MAX_ERROR_TEXT]
    text = (response.body.decode("utf-8", "replace") or response.reason or "").strip()
    return text[:_MAX_ERROR_TEXT] or f"HTTP {response.status}"
