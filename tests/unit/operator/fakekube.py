"""FAKE: an in-memory ``KubeAPI`` for the controller's unit tests.

It exists so unit tests can drive the controller's error paths (409, 422, 404, 410) on demand,
fast and without a cluster; the integration tests run the same controller against a real API
server and etcd. Node patches are applied with a real JSON-patch implementation (``jsonpatch``),
so a ``remove`` of a missing path fails as the API server's would (422). Watches block until
closed, like a quiet real watch, after delivering any scripted batches.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from typing import Any

import jsonpatch

from patchbay_operator.kube import (
    NO_SELECTORS,
    NODES_PATH,
    KubeError,
    Page,
    Ref,
    Selectors,
    json_page,
    ref_of,
)


class FakeWatch:
    """Scripted batches, then blocks until ``close()``; or raises the scripted error at once."""

    def __init__(self, batches: list[list[dict[str, Any]]], error: KubeError | None = None) -> None:
        self._batches, self._error = batches, error
        self._closed = threading.Event()

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        if self._error is not None:
            raise self._error
        yield from self._batches
        self._closed.wait()

    def close(self) -> None:
        self._closed.set()


class FakeKube:
    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.profiles: dict[str, dict[str, Any]] = {}
        self.peering: dict[str, Any] | None = None
        self.errors: dict[str, list[KubeError]] = defaultdict(list)
        self.watch_errors: list[KubeError] = []
        self.calls: list[str] = []
        self.status_writes: list[tuple[str, dict[str, Any]]] = []
        self.applied: list[dict[str, Any]] = []
        self.deleted: list[Ref] = []
        #: objects applied (by REST path), so get and delete see them
        self.objects: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.inventory_owned: dict[str, set[str]] = {}
        self._rv = 100
        self._lock = threading.Lock()

    # --- test setup ----------------------------------------------------------------------------

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> None:
        self.nodes[name] = {
            "metadata": {"name": name, "resourceVersion": self._next_rv(), "labels": labels or {}},
            "status": {"capacity": {"cpu": "4"}, "allocatable": {"cpu": "4"}},
        }

    def fail_next(self, method: str, *statuses: int) -> None:
        self.errors[method] += [KubeError(s, method, "/fake", f"scripted {s}") for s in statuses]

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _call(self, method: str) -> None:
        with self._lock:
            self.calls.append(method)
            if self.errors[method]:
                raise self.errors[method].pop(0)

    # --- KubeAPI -------------------------------------------------------------------------------

    def patch_node_status(self, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        self._call("patch_node_status")
        if name not in self.nodes:
            raise KubeError(404, "PATCH", name, "not found")
        try:
            patched = jsonpatch.apply_patch(self.nodes[name], ops)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
            raise KubeError(422, "PATCH", name, str(e)) from None
        patched["metadata"]["resourceVersion"] = self._next_rv()
        self.nodes[name] = patched
        return copy.deepcopy(patched)

    def get_node(self, name: str) -> dict[str, Any] | None:
        self._call("get_node")
        node = self.nodes.get(name)
        return copy.deepcopy(node) if node is not None else None

    def apply_node_labels(self, name: str, labels: dict[str, str]) -> dict[str, Any]:
        """The manager's labels replace those it owned (recorded in ``inventory_owned``)."""
        self._call("apply_node_labels")
        if name not in self.nodes:
            raise KubeError(404, "PATCH", name, "not found")
        node = self.nodes[name]
        node_labels = node["metadata"].setdefault("labels", {})
        for key in self.inventory_owned.get(name, set()) - set(labels):
            node_labels.pop(key, None)
        node_labels.update(labels)
        self.inventory_owned[name] = set(labels)
        node["metadata"]["managedFields"] = [
            {
                "manager": "patchbay-inventory-labels",
                "operation": "Apply",
                "fieldsV1": {"f:metadata": {"f:labels": {f"f:{k}": {} for k in labels}}},
            }
        ]
        node["metadata"]["resourceVersion"] = self._next_rv()
        return copy.deepcopy(node)

    def list_pages(
        self,
        path: str,
        chunk: int,
        selectors: Selectors = NO_SELECTORS,
        *,
        first: int | None = None,
        page_bytes: int = 0,
        decode: Any = None,
    ) -> Iterator[Page]:
        self._call("list")
        items = list(self.nodes.values()) if path == NODES_PATH else []
        # The page as the server sends it, read the way the caller asked (the informer's decoder).
        body = json.dumps({"metadata": {"resourceVersion": str(self._rv)}, "items": items}).encode()
        decoded, rv, _ = (decode or json_page)(body)
        yield Page(decoded, rv)

    def watch(
        self,
        path: str,
        resource_version: str,
        timeout_seconds: int = 300,
        selectors: Selectors = NO_SELECTORS,
        read: Any = None,
    ) -> Any:
        self._call("watch")
        if path == NODES_PATH and self.watch_errors:
            return FakeWatch([], self.watch_errors.pop(0))
        return FakeWatch([])

    def list_profiles(self) -> list[dict[str, Any]]:
        self._call("list_profiles")
        return [copy.deepcopy(p) for p in self.profiles.values()]

    def patch_profile_status(self, name: str, status: dict[str, Any]) -> None:
        self._call("patch_profile_status")
        self.status_writes.append((name, copy.deepcopy(status)))

    def apply(self, obj: dict[str, Any], force: bool = True) -> dict[str, Any]:
        self._call("apply")
        self.applied.append(obj)
        ref = ref_of(obj)
        old = self.objects.get(ref.path)
        uid = old["metadata"]["uid"] if old else f"uid-{self._next_rv()}"
        meta = {**obj["metadata"], "generation": 1, "uid": uid, "resourceVersion": self._next_rv()}
        stored = {**obj, "metadata": meta, "status": {}}
        self.objects[ref.path] = stored
        return copy.deepcopy(stored)

    def get(self, ref: Ref) -> dict[str, Any] | None:
        self._call("get")
        obj = self.objects.get(ref.path)
        return copy.deepcopy(obj) if obj is not None else None

    def delete(self, ref: Ref, uid: str = "", resource_version: str = "") -> bool:
        self._call("delete")
        self.deleted.append(ref)
        obj = self.objects.get(ref.path)
        if obj is not None and uid and obj["metadata"]["uid"] != uid:
            raise KubeError(409, "DELETE", ref.path, "Precondition failed: UID in precondition")
        if (
            obj is not None
            and resource_version
            and obj["metadata"].get("resourceVersion") != resource_version
        ):
            raise KubeError(409, "DELETE", ref.path, "Precondition failed: ResourceVersion in precondition")
        return self.objects.pop(ref.path, None) is not None

    def annotate(self, ref: Ref, annotations: dict[str, str]) -> bool:
        self._call("annotate")
        obj = self.objects.get(ref.path)
        if obj is None:
            return False
        obj["metadata"]["annotations"] = {**(obj["metadata"].get("annotations") or {}), **annotations}
        return True

    def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        self._call("create_event")
        self.events.append(copy.deepcopy(body))

    def get_cluster_peering(self, name: str) -> dict[str, Any] | None:
        self._call("get_cluster_peering")
        return copy.deepcopy(self.peering)


@contextlib.asynccontextmanager
async def started(controller: Any) -> AsyncIterator[Any]:
    """A controller (on a FakeKube) started for a test, and stopped after it."""
    await controller.start()
    try:
        yield controller
    finally:
        await controller.stop()


def profile(name: str, resource: str, capacity: int = 2, **selector: str) -> dict[str, Any]:
    """A Static profile body as kopf hands it over."""
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "resourceName": resource,
            "mode": "Static",
            "nodeSelector": {"matchLabels": selector},
            "static": {"capacity": capacity},
        },
    }
