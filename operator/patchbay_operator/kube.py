"""The one module that talks to the Kubernetes API (import-linter keeps it that way).

Everything here is synchronous and thread-safe: the operator runs these calls in its own
bounded thread pool, so the event loop never blocks and the number of requests in flight is
a setting. Requests go through the official client's transport (auth, TLS, connection pool)
but skip its typed models: bodies in and out are plain JSON dicts, which is what the pure
modules work with, and decoding a 5000-node list into ``V1Node`` objects would cost seconds.

``KubeAPI`` is the protocol the rest of the operator is written against; ``Kube`` implements it
over one API server; ``Pool`` is that thread pool. Unit tests drive the controller's error paths
(409, 422, 404, 410) through a fake of the protocol, without a cluster; the integration tests run
the real thing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import quote, urlencode

import urllib3
from kubernetes import client, config

from patchbay_operator.constants import (
    API_GROUP,
    API_VERSION,
    DEVICE_CLASS_API_VERSION,
    FIELD_MANAGER,
    PLURAL,
)
from patchbay_operator.inventorylabels import INVENTORY_LABELS_MANAGER, apply_body

log = logging.getLogger(__name__)
T = TypeVar("T")

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

PROFILES_PATH = f"/apis/{API_GROUP}/{API_VERSION}/{PLURAL}"
NODES_PATH = "/api/v1/nodes"
INVENTORIES_PATH = f"/apis/{API_GROUP}/{API_VERSION}/nodeinventories"
PEERINGS_PATH = "/apis/kopf.dev/v1/clusterkopfpeerings"


class KubeError(RuntimeError):
    """A non-2xx answer from the API server; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:400]}")
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Ref:
    """Where an object lives in the REST API: enough to apply, get or delete it."""

    collection: str  # e.g. /apis/apps/v1/namespaces/ns/daemonsets
    name: str

    @property
    def path(self) -> str:
        return f"{self.collection}/{quote(self.name, safe='')}"


_COLLECTIONS = {
    ("v1", "ConfigMap"): "/api/v1/namespaces/{ns}/configmaps",
    ("apps/v1", "DaemonSet"): "/apis/apps/v1/namespaces/{ns}/daemonsets",
    ("apps/v1", "ControllerRevision"): "/apis/apps/v1/namespaces/{ns}/controllerrevisions",
    ("v1", "ServiceAccount"): "/api/v1/namespaces/{ns}/serviceaccounts",
    ("v1", "Pod"): "/api/v1/namespaces/{ns}/pods",
    ("v1", "Event"): "/api/v1/namespaces/{ns}/events",
    (
        f"{API_GROUP}/{API_VERSION}",
        "DeviceReport",
    ): f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{{ns}}/devicereports",
}


_CLUSTER_COLLECTIONS = {
    (DEVICE_CLASS_API_VERSION, "DeviceClass"): f"/apis/{DEVICE_CLASS_API_VERSION}/deviceclasses",
}
"""The cluster-scoped kinds the operator owns (a DRA profile's DeviceClass)."""


PAGE_BYTES = 8 * 2**20
"""What a LIST page's body is kept near (``KubeAPI.list_pages``): the objects of one kind differ
in size by hundreds of times (a DeviceReport of 4 devices is 1 KB of JSON; one at the CRD's bounds
0.75 MB, 1.5 MB once decoded), so a fixed count per page is either many requests or, at 500
reports at the bounds, 375 MB of body and 750 MB of objects at once (docs/benchmarks.md, "Operator
memory at the report bounds")."""


@dataclass(frozen=True)
class Page:
    """One page of a chunked LIST, with the resourceVersion of the list's snapshot and the
    ``limit`` it was asked with."""

    items: list[Any]
    resource_version: str
    limit: int = 0


PageDecoder = Callable[[bytes], tuple[list[Any], str, str]]
"""A LIST page's body -> its items, its resourceVersion and its continue token."""


def json_page(raw: bytes) -> tuple[list[Any], str, str]:
    """The plain reading of a LIST page: its items as dicts (``PageDecoder``)."""
    page = json.loads(raw)
    meta = page.get("metadata") or {}
    return page.get("items") or [], str(meta.get("resourceVersion") or ""), str(meta.get("continue") or "")


@dataclass(frozen=True)
class WatchEvent:
    """One line of a WATCH stream: its type (ADDED, MODIFIED, DELETED, BOOKMARK or ERROR), the
    resourceVersion of its object, and the object as the stream's reader gives it (a dict from
    ``json_event``; for ERROR, the Status as a dict)."""

    type: str
    resource_version: str
    object: Any


EventReader = Callable[[bytes], WatchEvent]
"""A WATCH stream's line -> its event."""


def json_event(line: bytes) -> WatchEvent:
    """The plain reading of a WATCH line: its object as a dict (``EventReader``)."""
    ev = json.loads(line)
    obj = ev.get("object") or {}
    rv = (obj.get("metadata") or {}).get("resourceVersion") if isinstance(obj, dict) else None
    return WatchEvent(str(ev.get("type") or ""), str(rv or ""), obj)


class Watch:
    """An open WATCH stream: iterate it for batches of decoded events, ``close()`` it from any thread.

    A batch is every complete event line of one read from the socket, so a burst of events
    costs one hand-off to the consumer instead of one per event. An ``ERROR`` event (for
    example 410 Gone: the resourceVersion is older than the server still remembers) raises
    ``KubeError`` with the status it carries; ``BOOKMARK`` events are passed on, since they
    only move the resourceVersion on. The iteration ends when the server closes the stream.
    """

    def __init__(self, raw: urllib3.BaseHTTPResponse, path: str, read: EventReader = json_event) -> None:
        self._raw = raw
        self._path = path
        self._read = read
        self._closed = threading.Event()

    def __iter__(self) -> Iterator[list[WatchEvent]]:
        buf = b""
        try:
            while not self._closed.is_set():
                chunk = self._raw.read1(1 << 16)
                if not chunk:
                    return
                buf += chunk
                if b"\n" not in chunk:
                    continue
                *lines, buf = buf.split(b"\n")
                events: list[WatchEvent] = []
                for line in lines:
                    if not line.strip():
                        continue
                    ev = self._read(line)
                    if ev.type == "ERROR":
                        if events:
                            yield events
                        st = ev.object if isinstance(ev.object, dict) else {}
                        raise KubeError(int(st.get("code") or 0), "WATCH", self._path, str(st.get("message")))
                    events.append(ev)
                if events:
                    yield events
        except KubeError:
            raise
        except Exception as e:
            if self._closed.is_set():
                return  # close() from another thread; http.client may fail in odd ways then
            if isinstance(e, urllib3.exceptions.HTTPError | OSError | ValueError):
                raise KubeError(0, "WATCH", self._path, f"{type(e).__name__}: {e}") from e
            raise
        finally:
            self.close()

    def close(self) -> None:
        """End the stream now, also while another thread is blocked reading it."""
        if self._closed.is_set():
            return
        self._closed.set()
        # shutdown() interrupts a blocked read (close() alone does not); the connection is
        # then dropped rather than returned to the pool half-read. A stream the server ended
        # has already gone back to the pool, and urllib3 refuses to shut that one down.
        with contextlib.suppress(RuntimeError, ValueError, OSError):
            self._raw.shutdown()
        self._raw.close()


def collection(api_version: str, kind: str, namespace: str = "") -> str:
    """The REST collection of a kind the operator manages: namespaced (ConfigMap, DaemonSet...,
    ``namespace`` required) or cluster-scoped (DeviceClass, ``namespace`` empty)."""
    key = (api_version, kind)
    if key in _CLUSTER_COLLECTIONS:
        if namespace:
            raise ValueError(f"{kind} ({api_version}) is cluster-scoped; got namespace {namespace!r}")
        return _CLUSTER_COLLECTIONS[key]
    if key not in _COLLECTIONS:
        raise ValueError(f"the operator does not manage {kind} objects ({api_version})")
    if not namespace:
        raise ValueError(f"{kind} ({api_version}) is namespaced: a namespace is required")
    return _COLLECTIONS[key].format(ns=quote(namespace, safe=""))


def ref_of(obj: dict[str, Any]) -> Ref:
    """The REST location of an object the operator owns (no namespace: cluster-scoped)."""
    meta = obj["metadata"]
    return Ref(collection(obj["apiVersion"], obj["kind"], meta.get("namespace") or ""), meta["name"])


@dataclass(frozen=True)
class Selectors:
    """A LIST/WATCH's label and field selectors (empty: everything)."""

    label: str = ""
    field: str = ""

    def query(self) -> dict[str, str]:
        out = {}
        if self.label:
            out["labelSelector"] = self.label
        if self.field:
            out["fieldSelector"] = self.field
        return out


NO_SELECTORS = Selectors()


class KubeAPI(Protocol):
    """The calls the controller makes (blocking; run them off the event loop)."""

    def patch_node_status(self, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]: ...
    def get_node(self, name: str) -> dict[str, Any] | None: ...
    def apply_node_labels(self, name: str, labels: dict[str, str]) -> dict[str, Any]: ...
    def list_pages(
        self,
        path: str,
        chunk: int,
        selectors: Selectors = NO_SELECTORS,
        *,
        first: int | None = None,
        page_bytes: int = PAGE_BYTES,
        decode: PageDecoder = json_page,
    ) -> Iterator[Page]: ...
    def watch(
        self,
        path: str,
        resource_version: str,
        timeout_seconds: int = 300,
        selectors: Selectors = NO_SELECTORS,
        read: EventReader = json_event,
    ) -> Watch: ...
    def create_event(self, namespace: str, body: dict[str, Any]) -> None: ...
    def list_profiles(self) -> list[dict[str, Any]]: ...
    def patch_profile_status(self, name: str, status: dict[str, Any]) -> None: ...
    def apply(self, obj: dict[str, Any], force: bool = True) -> dict[str, Any]: ...
    def get(self, ref: Ref) -> dict[str, Any] | None: ...
    def delete(self, ref: Ref, uid: str = "", resource_version: str = "") -> bool: ...
    def annotate(self, ref: Ref, annotations: dict[str, str]) -> bool: ...
    def get_cluster_peering(self, name: str) -> dict[str, Any] | None: ...


def in_cluster_server(env: Mapping[str, str] | None = None) -> str | None:
    """The API server's URL as a pod is told it (``KUBERNETES_SERVICE_HOST``/``PORT``), or None.

    The kubelet sets both for the ``kubernetes`` Service; the chart's ``apiServer`` value may
    override them (clusters without kube-proxy). The official client reads the same two.
    """
    env = os.environ if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def load_configuration(kubeconfig: str | None, pool_size: int) -> client.Configuration:
    """Client configuration from a kubeconfig file, $KUBECONFIG, ~/.kube/config or the pod's account.

    ``pool_size`` matches the operator's thread pool (``Pool``) so no request waits for a connection.
    """
    cfg = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if not path and (Path.home() / ".kube" / "config").is_file():
        path = str(Path.home() / ".kube" / "config")
    if path:
        config.load_kube_config(config_file=path, client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    cfg.connection_pool_maxsize = max(pool_size, 1)
    return cfg


class Kube:
    """Blocking, thread-safe calls to one API server."""

    def __init__(self, cfg: client.Configuration, timeout: float = 30.0) -> None:
        self._api = client.ApiClient(cfg)
        # The API server names the field manager of an update after the User-Agent's first
        # word: without this, `kubectl get -o yaml --show-managed-fields` and audit logs credit
        # the operator's status and node writes to "OpenAPI-Generator".
        self._api.user_agent = f"{FIELD_MANAGER}/python"
        self._timeout = timeout
        #: requests sent, by verb (WATCH: each watch opened); /metrics reads it
        self.requests: dict[str, int] = {}
        self._count_lock = threading.Lock()

    def _count(self, verb: str) -> None:
        with self._count_lock:
            self.requests[verb] = self.requests.get(verb, 0) + 1

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]

    # --- transport ---------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str | None = None,
        query: dict[str, str] | None = None,
        ok: tuple[int, ...] = (),
    ) -> Any:
        """Send one request; return the decoded JSON (None for an allowed non-2xx in ``ok``)."""
        status, raw, full = self._send(method, path, body, content_type=content_type, query=query)
        if 200 <= status < 300:
            return json.loads(raw) if raw else None
        if status in ok:
            return None
        raise KubeError(status, method, full, raw.decode(errors="replace") if raw else "")

    def _send(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str | None = None,
        query: dict[str, str] | None = None,
    ) -> tuple[int, bytes, str]:
        """One request: its status, its body as sent, and the path with its query (for errors)."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        full = path + ("?" + urlencode(query) if query else "")
        self._count(method)
        m, url, hdrs, data, _ = self._api.param_serialize(
            method=method,
            resource_path=full,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            resp = self._api.call_api(m, url, header_params=hdrs, body=data, _request_timeout=self._timeout)
            raw = resp.read()  # type: ignore[no-untyped-call]
        except urllib3.exceptions.HTTPError as e:
            # No answer at all (connection refused, reset, timeout): status 0, callers retry.
            raise KubeError(0, method, full, f"{type(e).__name__}: {e}") from e
        return int(resp.status), bytes(raw or b""), full

    # --- nodes -------------------------------------------------------------------------------

    def patch_node_status(self, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """One JSON patch on nodes/<name>/status; returns the node as the server stored it."""
        result: dict[str, Any] = self.request(
            "PATCH", f"/api/v1/nodes/{quote(name, safe='')}/status", ops, content_type=JSON_PATCH
        )
        return result

    def get_node(self, name: str) -> dict[str, Any] | None:
        node: dict[str, Any] | None = self.request("GET", f"/api/v1/nodes/{quote(name, safe='')}", ok=(404,))
        return node

    def apply_node_labels(self, name: str, labels: dict[str, str]) -> dict[str, Any]:
        """Server-side apply of the node's inventory labels (exactly ``labels``) with their own
        field manager, never forced: a label another manager holds with another value is a 409.
        Returns the node as stored."""
        result: dict[str, Any] = self.request(
            "PATCH",
            f"{NODES_PATH}/{quote(name, safe='')}",
            apply_body(name, labels),
            content_type=APPLY_PATCH,
            query={"fieldManager": INVENTORY_LABELS_MANAGER, "force": "false"},
        )
        return result

    def list_pages(
        self,
        path: str,
        chunk: int,
        selectors: Selectors = NO_SELECTORS,
        *,
        first: int | None = None,
        page_bytes: int = PAGE_BYTES,
        decode: PageDecoder = json_page,
    ) -> Iterator[Page]:
        """A chunked LIST, a page at a time (a big cluster is never one giant response, nor one
        giant list of dicts in memory: callers keep what they need of each page and drop it).
        Every page carries the resourceVersion of the first, the snapshot the whole list was
        served from (the one to start a watch from).

        The first page asks for ``first`` objects (default ``chunk``); every later one for as
        many as ``page_bytes`` holds at the mean size seen so far, at most ``chunk`` (the
        server's continue token does not depend on the limit). ``decode`` reads each page's body:
        plain JSON by default, or straight into what the caller keeps (``devicereports.decode_page``)."""
        cont, snapshot = "", ""
        limit = max(1, min(chunk, first or chunk))
        seen_bytes = seen_items = 0
        while True:
            query = {"limit": str(limit), **selectors.query()}
            if cont:
                query["continue"] = cont
            status, raw, full = self._send("GET", path, query=query)
            if not 200 <= status < 300:
                raise KubeError(status, "GET", full, raw.decode(errors="replace"))
            seen_bytes += len(raw)
            items, rv, cont = decode(raw)
            del raw  # the body goes before the caller decodes the page's items
            snapshot = snapshot or rv
            seen_items += len(items)
            yield Page(items, snapshot, limit)
            if not cont:
                return
            if seen_items:
                limit = max(1, min(chunk, page_bytes * seen_items // seen_bytes))

    def watch(
        self,
        path: str,
        resource_version: str,
        timeout_seconds: int = 300,
        selectors: Selectors = NO_SELECTORS,
        read: EventReader = json_event,
    ) -> Watch:
        """Open a WATCH from ``resource_version`` (with bookmarks); iterate the result for events,
        each line read by ``read`` (plain JSON by default, or straight into what the caller keeps:
        ``devicereports.read_event``).

        The server ends the stream after ``timeout_seconds``; the read timeout is longer than
        that by a margin, so a silently dead connection is noticed too.
        """
        query = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
            **selectors.query(),
        }
        full = f"{path}?{urlencode(query)}"
        self._count("WATCH")
        m, url, hdrs, _body, _ = self._api.param_serialize(
            method="GET",
            resource_path=full,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        try:
            resp = self._api.call_api(m, url, header_params=hdrs, _request_timeout=(10, timeout_seconds + 60))
        except urllib3.exceptions.HTTPError as e:
            raise KubeError(0, "WATCH", full, f"{type(e).__name__}: {e}") from e
        raw: urllib3.BaseHTTPResponse = resp.response
        if resp.status != 200:
            body = raw.read()
            raw.release_conn()
            raise KubeError(resp.status, "WATCH", full, body.decode(errors="replace"))
        return Watch(raw, full, read)

    # --- profiles ----------------------------------------------------------------------------

    def list_profiles(self) -> list[dict[str, Any]]:
        return [item for page in self.list_pages(PROFILES_PATH, 500) for item in page.items]

    def patch_profile_status(self, name: str, status: dict[str, Any]) -> None:
        """A merge patch of the status subresource (lists such as conditions are replaced whole)."""
        self.request(
            "PATCH",
            f"{PROFILES_PATH}/{quote(name, safe='')}/status",
            {"status": status},
            content_type=MERGE_PATCH,
            ok=(404,),
        )

    # --- owned objects -----------------------------------------------------------------------

    def apply(self, obj: dict[str, Any], force: bool = True) -> dict[str, Any]:
        """Server-side apply with the operator's field manager, forcing ownership of its fields;
        without ``force``, a field another manager owns with another value is a 409 (a repair
        asks first: repairs.py)."""
        ref = ref_of(obj)
        result: dict[str, Any] = self.request(
            "PATCH",
            ref.path,
            obj,
            content_type=APPLY_PATCH,
            query={"fieldManager": FIELD_MANAGER, "force": "true" if force else "false"},
        )
        return result

    def get(self, ref: Ref) -> dict[str, Any] | None:
        obj: dict[str, Any] | None = self.request("GET", ref.path, ok=(404,))
        return obj

    def delete(self, ref: Ref, uid: str = "", resource_version: str = "") -> bool:
        """Delete in the background (dependents go too); False when it was already gone.

        With ``uid``, only that very object (a precondition: 409 if the name now belongs to
        another object), for deletes decided on a read, such as a DeviceClass found owned by us.
        With ``resource_version``, only that version of it (409 if it was written since): for a
        delete decided on what the object said, such as a report naming a writer that is gone.
        """
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if preconditions := {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}:
            body["preconditions"] = preconditions
        res = self.request("DELETE", ref.path, body, ok=(404,))
        return res is not None

    def annotate(self, ref: Ref, annotations: dict[str, str]) -> bool:
        """Set annotations on an object by a merge patch (no read, no spec or status touched);
        False when it is gone. Used to make a controller look at its object again."""
        body = {"metadata": {"annotations": annotations}}
        query = {"fieldManager": FIELD_MANAGER}
        res = self.request("PATCH", ref.path, body, content_type=MERGE_PATCH, query=query, ok=(404,))
        return res is not None

    def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        """Post a core/v1 Event (the operator's transitions of a profile)."""
        self.request("POST", f"/api/v1/namespaces/{quote(namespace, safe='')}/events", body)

    def ensure_cluster_peering(self, name: str) -> None:
        """kopf pauses and resumes replicas through this object but never creates it itself."""
        body = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}}
        self.request("POST", PEERINGS_PATH, body, ok=(409,))

    def get_cluster_peering(self, name: str) -> dict[str, Any] | None:
        obj: dict[str, Any] | None = self.request("GET", f"{PEERINGS_PATH}/{quote(name, safe='')}", ok=(404,))
        return obj

    def namespace_exists(self, namespace: str) -> bool:
        return self.request("GET", f"/api/v1/namespaces/{quote(namespace, safe='')}", ok=(404,)) is not None


class Pool:
    """Runs the blocking ``KubeAPI`` calls in ``size`` threads: the event loop never blocks, and
    the number of requests in flight is a setting (``--concurrency``)."""

    def __init__(self, size: int) -> None:
        self._executor = ThreadPoolExecutor(size, thread_name_prefix="kube")

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
