"""The one module that talks to the Kubernetes API (import-linter keeps it that way).

Everything here is synchronous and thread-safe: the controller runs these calls in its own
bounded thread pool, so the event loop never blocks and the number of requests in flight is
a setting. Requests go through the official client's transport (auth, TLS, connection pool)
but skip its typed models: bodies in and out are plain JSON dicts, which is what the pure
modules work with, and decoding a 5000-node list into ``V1Node`` objects would cost seconds.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
from kubernetes import client, config

from patchbay_operator.constants import API_GROUP, API_VERSION, FIELD_MANAGER, PLURAL

log = logging.getLogger(__name__)

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

PROFILES_PATH = f"/apis/{API_GROUP}/{API_VERSION}/{PLURAL}"


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
    ("v1", "ServiceAccount"): "/api/v1/namespaces/{ns}/serviceaccounts",
}


def ref_of(obj: dict[str, Any]) -> Ref:
    """The REST location of a namespaced object the operator owns (ConfigMap, DaemonSet)."""
    key = (obj["apiVersion"], obj["kind"])
    if key not in _COLLECTIONS:
        raise ValueError(f"the operator does not manage {key[1]} objects ({key[0]})")
    meta = obj["metadata"]
    return Ref(_COLLECTIONS[key].format(ns=quote(meta["namespace"], safe="")), meta["name"])


def load_configuration(kubeconfig: str | None, pool_size: int) -> client.Configuration:
    """Client configuration from a kubeconfig file, $KUBECONFIG, ~/.kube/config or the pod's account.

    ``pool_size`` matches the controller's thread pool so no request waits for a connection.
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
        self._timeout = timeout

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
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        full = path + ("?" + urlencode(query) if query else "")
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
        if 200 <= resp.status < 300:
            return json.loads(raw) if raw else None
        if resp.status in ok:
            return None
        raise KubeError(resp.status, method, full, raw.decode(errors="replace") if raw else "")

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

    def list_nodes(self, chunk: int = 500) -> list[dict[str, Any]]:
        """Every node, listed in chunks so a big cluster is never one giant response."""
        return self._list("/api/v1/nodes", chunk)

    def _list(self, path: str, chunk: int) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cont = ""
        while True:
            query = {"limit": str(chunk)}
            if cont:
                query["continue"] = cont
            page = self.request("GET", path, query=query)
            items.extend(page.get("items") or [])
            cont = (page.get("metadata") or {}).get("continue") or ""
            if not cont:
                return items

    # --- profiles ----------------------------------------------------------------------------

    def list_profiles(self) -> list[dict[str, Any]]:
        return self._list(PROFILES_PATH, 500)

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

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply with the operator's field manager, forcing ownership of its fields."""
        ref = ref_of(obj)
        result: dict[str, Any] = self.request(
            "PATCH",
            ref.path,
            obj,
            content_type=APPLY_PATCH,
            query={"fieldManager": FIELD_MANAGER, "force": "true"},
        )
        return result

    def get(self, ref: Ref) -> dict[str, Any] | None:
        obj: dict[str, Any] | None = self.request("GET", ref.path, ok=(404,))
        return obj

    def delete(self, ref: Ref) -> bool:
        """Delete in the background (dependents go too); False when it was already gone."""
        res = self.request("DELETE", ref.path, {"propagationPolicy": "Background"}, ok=(404,))
        return res is not None

    def ensure_cluster_peering(self, name: str) -> None:
        """kopf pauses and resumes replicas through this object but never creates it itself."""
        body = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}}
        self.request("POST", "/apis/kopf.dev/v1/clusterkopfpeerings", body, ok=(409,))

    def namespace_exists(self, namespace: str) -> bool:
        return self.request("GET", f"/api/v1/namespaces/{quote(namespace, safe='')}", ok=(404,)) is not None
