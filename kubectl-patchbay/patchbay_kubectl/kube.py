"""The one module of the plugin that talks to the Kubernetes API: kubeconfig in, plain JSON out.

The official client loads the kubeconfig (``--kubeconfig``, ``$KUBECONFIG``, ``--context``, exec
credentials, client certificates) and carries the requests; the plugin asks for raw JSON and
parses it with ``json.loads``, never into the client's model classes, which cost seconds at
5,000 nodes (docs/benchmarks.md#kubectl-patchbay). Lists are paged (``limit``/``continue``) as
kubectl pages them, so a huge cluster never needs one huge response.
"""

from __future__ import annotations

import json
import time
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
    """GET, paged LIST, WATCH, server-side apply, PATCH, create, replace and DELETE of raw JSON
    against the cluster a kubeconfig names. The plugin writes DeviceTaintRules (cordon, drain,
    uncordon) and a profile's rollout fields (``rollout pause|resume|undo``); ``diff`` only
    writes with ``dryRun=All``."""

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

    def apply(
        self, path: str, obj: Obj, field_manager: str, *, force: bool = True, dry_run: bool = False
    ) -> Obj:
        """Server-side apply of ``obj`` at ``path`` (the object's own URL); the stored object (the
        one the server would store, with ``dry_run``). Without ``force`` a field another manager
        owns with another value is the server's 409 Conflict, naming the field and the manager."""
        params = [("fieldManager", field_manager)]
        if force:
            params.append(("force", "true"))
        if dry_run:
            params.append(("dryRun", "All"))
        return self._send("PATCH", path, params, obj, "application/apply-patch+yaml")

    def patch(self, path: str, body: Any, content_type: str, *, dry_run: bool = False) -> Obj:
        """PATCH ``body`` (a merge patch, or a JSON patch list) at ``path``; the stored object (the
        one the server would store, with ``dry_run``)."""
        params = [("dryRun", "All")] if dry_run else []
        return self._send("PATCH", path, params, body, content_type)

    def create(self, collection: str, obj: Obj, *, dry_run: bool = False) -> Obj:
        return self._send("POST", collection, [("dryRun", "All")] if dry_run else [], obj)

    def replace(self, path: str, obj: Obj, *, dry_run: bool = False) -> Obj:
        return self._send("PUT", path, [("dryRun", "All")] if dry_run else [], obj)

    def watch(self, collection: str, name: str, seconds: float) -> Iterator[Obj]:
        """The object ``name`` of ``collection`` as it changes, for about ``seconds``: its current
        state first, then one per change (a WATCH from the LIST's resourceVersion, started again
        when the server ends it, listed again when the version is too old, as kubectl's watch
        does). The iteration ends at the deadline, or when the object is deleted or absent."""
        deadline = time.monotonic() + seconds
        field = f"metadata.name={name}"
        while True:
            page = self._get(collection, [("fieldSelector", field)])
            items = page.get("items") or []
            if not items:
                return
            yield items[0]
            version = str((page.get("metadata") or {}).get("resourceVersion") or "")
            while (left := deadline - time.monotonic()) > 0:
                params = [
                    ("watch", "true"),
                    ("fieldSelector", field),
                    ("resourceVersion", version),
                    ("timeoutSeconds", str(max(1, int(left)))),
                ]
                gone = False
                for event in self._stream(collection, params, left + 5):
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":  # e.g. 410 Gone: the version is too old, LIST again
                        gone = True
                        break
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if kind == "DELETED":
                        return
                    if kind in ("ADDED", "MODIFIED"):
                        yield obj
                if gone:
                    break
            else:
                return

    def _stream(self, path: str, params: list[tuple[str, str]], seconds: float) -> Iterator[Obj]:
        method, url, headers, _, _ = self._api.param_serialize(
            method="GET",
            resource_path=path + "?" + urlencode(params),
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        try:
            resp = self._api.call_api(method, url, header_params=headers, _request_timeout=seconds)
            if not 200 <= resp.status < 300:
                raise _api_error(resp.status, resp.read())  # type: ignore[no-untyped-call]
            buffered = b""
            for chunk in resp.response.stream(4096):
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        except (urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.ProtocolError):
            return
        except urllib3.exceptions.HTTPError as e:
            raise KubeError(f"Unable to connect to the server ({self.host}): {e}") from e

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


class ConflictError(KubeError):
    """The API server answered 409: an update pinned to a resourceVersion that is no longer the
    object's, or (server-side apply) a field another manager owns."""


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
    if status == 404:
        return NotFoundError(text)
    return ConflictError(text) if status == 409 else KubeError(text)


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


def revisions_path(namespace: str | None) -> str:
    return namespaced("/apis/apps/v1/controllerrevisions", namespace)


def profile_path(name: str) -> str:
    return f"{PROFILES}/{quote(name, safe='')}"


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{quote(name, safe='')}"
