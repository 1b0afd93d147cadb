"""The one module of the plugin that talks to the Kubernetes API: kubeconfig in, plain JSON out.

The official client loads the kubeconfig (``--kubeconfig``, ``$KUBECONFIG``, ``--context``, exec
credentials, client certificates) and carries the requests; the plugin asks for raw JSON and
parses it with ``json.loads``, never into the client's model classes, which cost seconds at
5,000 nodes (docs/benchmarks.md#kubectl-patchbay). Lists are paged (``limit``/``continue``) as
kubectl pages them, so a huge cluster never needs one huge response.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

Obj = dict[str, Any]

GROUP, VERSION = "patchbay.dev", "v1beta1"
PROFILES = f"/apis/{GROUP}/{VERSION}/devicepluginprofiles"
INVENTORIES = f"/apis/{GROUP}/{VERSION}/nodeinventories"
RESOURCE_API = "/apis/resource.k8s.io/v1"
PAGE = 1000
"""Objects per LIST page: 5,000 nodes in five requests; kubectl's own chunk is 500."""


class KubeError(Exception):
    """A request failed or the kubeconfig is unusable; the message is what kubectl would print."""


@dataclass(frozen=True)
class Target:
    """Which cluster to talk to, from the kubectl-style flags."""

    kubeconfig: str | None = None
    context: str | None = None
    request_timeout: float = 30.0


class Kube:
    """GET, paged LIST, server-side apply and DELETE of raw JSON against the cluster a kubeconfig
    names (the plugin writes only DeviceTaintRules: cordon, drain, uncordon)."""

    def __init__(self, target: Target) -> None:
        cfg = client.Configuration()
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=target.kubeconfig, context=target.context, client_configuration=cfg
            )
        except (ConfigException, OSError) as e:
            raise KubeError(f"invalid kubeconfig: {e}") from e
        self._api = client.ApiClient(cfg)
        self._timeout = target.request_timeout
        self.host = cfg.host

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]

    def _get(self, path: str, params: list[tuple[str, str]]) -> Obj:
        return self._send("GET", path, params)

    def _send(
        self,
        verb: str,
        path: str,
        params: list[tuple[str, str]],
        body: Obj | None = None,
        content_type: str = "",
    ) -> Obj:
        full = path + ("?" + urlencode(params) if params else "")
        header_params = {"Accept": "application/json"}
        if content_type:
            header_params["Content-Type"] = content_type
        method, url, headers, _, _ = self._api.param_serialize(
            method=verb,
            resource_path=full,
            header_params=header_params,
            auth_settings=["BearerToken"],
        )
        try:
            # A dict body: the client serializes it as JSON (also for apply-patch+yaml: JSON is YAML).
            resp = self._api.call_api(
                method, url, header_params=headers, body=body, _request_timeout=self._timeout
            )
            raw = resp.read()  # type: ignore[no-untyped-call]
        except urllib3.exceptions.HTTPError as e:
            raise KubeError(f"Unable to connect to the server ({self.host}): {e}") from e
        if 200 <= resp.status < 300:
            answer: Obj = json.loads(raw)
            return answer
        raise _api_error(resp.status, raw)

    def apply(self, path: str, obj: Obj, field_manager: str) -> Obj:
        """Server-side apply of ``obj`` at ``path`` (the object's own URL); the stored object."""
        params = [("fieldManager", field_manager), ("force", "true")]
        return self._send("PATCH", path, params, obj, "application/apply-patch+yaml")

    def delete(self, path: str) -> bool:
        """Delete the object at ``path``; False when it was not there."""
        try:
            self._send("DELETE", path, [])
        except NotFoundError:
            return False
        return True

    def get(self, path: str) -> Obj | None:
        """One object; None when it does not exist (404)."""
        try:
            return self._get(path, [])
        except NotFoundError:
            return None

    def list(self, path: str, *, label_selector: str = "", field_selector: str = "") -> list[Obj]:
        """Every item of a collection, page by page; [] when the API (a group, a CRD) is not
        served, so a cluster without DRA or without Patchbay's CRDs answers with nothing."""
        return list(self._iter(path, label_selector, field_selector))

    def _iter(self, path: str, label_selector: str, field_selector: str) -> Iterator[Obj]:
        cont = ""
        while True:
            params = [("limit", str(PAGE))]
            if label_selector:
                params.append(("labelSelector", label_selector))
            if field_selector:
                params.append(("fieldSelector", field_selector))
            if cont:
                params.append(("continue", cont))
            try:
                page = self._get(path, params)
            except NotFoundError:
                return
            yield from page.get("items") or []
            cont = (page.get("metadata") or {}).get("continue") or ""
            if not cont:
                return


class NotFoundError(KubeError):
    """The API server answered 404."""


def _api_error(status: int, raw: bytes | None) -> KubeError:
    """kubectl's wording: ``Error from server (Forbidden): <the server's message>``."""
    message, reason = (raw or b"").decode(errors="replace"), ""
    try:
        body = json.loads(raw or b"{}")
        message = body.get("message") or message
        reason = body.get("reason") or ""
    except (ValueError, AttributeError):
        pass
    text = f"Error from server ({reason or status}): {message}"
    return NotFoundError(text) if status == 404 else KubeError(text)


def contexts(kubeconfig: str | None) -> list[str]:
    """The kubeconfig's context names (for completion); [] when it cannot be read."""
    try:
        found, _ = config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError):
        return []
    return [str(c["name"]) for c in found]


def namespaced(collection: str, namespace: str | None) -> str:
    """``/apis/g/v/<plural>`` in one namespace, or across all of them when ``namespace`` is None."""
    if namespace is None:
        return collection
    head, _, plural = collection.rpartition("/")
    return f"{head}/namespaces/{quote(namespace, safe='')}/{plural}"


def reports_path(namespace: str | None) -> str:
    return namespaced(f"/apis/{GROUP}/{VERSION}/devicereports", namespace)


def pods_path(namespace: str | None) -> str:
    return namespaced("/api/v1/pods", namespace)


def configmaps_path(namespace: str | None) -> str:
    return namespaced("/api/v1/configmaps", namespace)


def events_path(namespace: str | None) -> str:
    return namespaced("/api/v1/events", namespace)


def profile_path(name: str) -> str:
    return f"{PROFILES}/{quote(name, safe='')}"


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{quote(name, safe='')}"
