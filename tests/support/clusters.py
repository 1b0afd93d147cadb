"""Helpers every cluster-facing test shares: one ``wait_for``, a read that may find nothing
(``or_none``), a control plane for a block, kstatus, a ResourceClaim, and ``Cluster``, small
assertion helpers over the official client.

Every test package imports these as ``support.clusters`` (tests/ is on sys.path: pytest puts the
rootdir's conftest folder there).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from patchbay_devcluster import DevCluster
from patchbay_devcluster.poll import poll_until

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "patchbay.dev_devicepluginprofiles.yaml"
REPORT_CRD_FILE = REPO / "crds" / "patchbay.dev_devicereports.yaml"
GROUP, VERSION, PLURAL = "patchbay.dev", "v1beta1", "devicepluginprofiles"
NAMESPACE = "patchbay-it"
TEST_LABEL = "patchbay.dev/test"

T = TypeVar("T")


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout: float = 60.0,
    every: float = 0.2,
    detail: Callable[[], str] | None = None,
) -> Any:
    """Poll ``check`` until it returns something truthy and return that; fail (AssertionError)
    naming ``what`` and the last value seen, or ``detail()`` when given (what a reader of a CI
    log needs to explain the timeout). A bounded wait for the cluster to converge, never a
    timing assertion."""
    return poll_until(what, check, timeout=timeout, interval=every, error=AssertionError, detail=detail)


class AgentNode(NamedTuple):
    """An agent test's world on the session's cluster: its API server (as admin), the cluster, a
    kwok node of the test's own, the agent's directory and the prefix of the test's names."""

    custom: client.CustomObjectsApi
    devcluster: DevCluster
    name: str
    uid: str
    workdir: Path
    prefix: str


def profile_spec(resource: str, mode: str, labels: dict[str, str], **fields: Any) -> dict[str, Any]:
    """A profile's spec: ``resource`` in ``mode`` on the nodes with ``labels``; ``fields``: the rest."""
    return {"resourceName": resource, "mode": mode, "nodeSelector": {"matchLabels": labels}, **fields}


def or_none(read: Callable[[], T]) -> T | None:
    """What ``read`` returns; None when the object is not there (404)."""
    try:
        return read()
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def served(call: Callable[[], object]) -> bool:
    """Whether ``call`` (a LIST of a new CRD's objects) is answered: its API is served."""
    try:
        call()
    except ApiException:
        return False
    return True


def apply_crd(api: client.ApiClient, path: Path) -> dict[str, Any]:
    """Create or replace the CRD in ``path`` and wait until it is Established; returns its body."""
    body: dict[str, Any] = yaml.safe_load(path.read_text())
    return apply_crd_body(api, body)


def apply_crd_body(api: client.ApiClient, body: dict[str, Any]) -> dict[str, Any]:
    """Create or replace the CRD ``body`` and wait until it is Established; returns the body."""
    ext = client.ApiextensionsV1Api(api)
    name = body["metadata"]["name"]
    try:
        current = ext.read_custom_resource_definition(name)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(name, body)
    except ApiException as e:
        if e.status != 404:
            raise
        ext.create_custom_resource_definition(body)

    def established() -> bool:
        c = ext.read_custom_resource_definition(name)
        return any(x.type == "Established" and x.status == "True" for x in c.status.conditions or [])

    wait_for(f"the CRD {name} to be Established", established)
    return body


@contextlib.contextmanager
def running_devcluster(state_dir: Path, bin_dir: Path) -> Iterator[DevCluster]:
    """A control plane (etcd, API server, controllers, kwok) for as long as the block runs."""
    cluster = DevCluster(state_dir, bin_dir)
    cluster.up(timeout=120)
    try:
        yield cluster
    finally:
        # Keep certificates and logs under pytest's tmp dir for post-mortems; stop every PID.
        cluster.down(purge=False)


def create_resource_claim(
    custom: client.CustomObjectsApi, namespace: str, name: str, requests: list[dict[str, Any]]
) -> dict[str, Any]:
    """A ResourceClaim (resource.k8s.io/v1) asking for ``requests``, as the API server stored it."""
    group, version = "resource.k8s.io", "v1"
    claim: dict[str, Any] = custom.create_namespaced_custom_object(
        group,
        version,
        namespace,
        "resourceclaims",
        {
            "apiVersion": f"{group}/{version}",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": requests}},
        },
    )
    return claim


def kstatus(obj: dict[str, Any]) -> str:
    """kstatus's verdict on one object (sigs.k8s.io/cli-utils, what Flux and Argo read), for the
    generic conditions rules our CR follows: Terminating, InProgress, Failed or Current."""
    meta, st = obj.get("metadata") or {}, obj.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "Terminating"
    if st.get("observedGeneration") is not None and st["observedGeneration"] != meta.get("generation"):
        return "InProgress"
    conds = {c["type"]: c["status"] for c in st.get("conditions") or []}
    if conds.get("Reconciling") == "True":
        return "InProgress"
    if conds.get("Stalled") == "True":
        return "Failed"
    if "Ready" in conds:
        return "Current" if conds["Ready"] == "True" else "InProgress"
    return "Current"


class Cluster:
    """Small helpers over the official client for the assertions tests make."""

    def __init__(self, api: client.ApiClient, devcluster: DevCluster, prefix: str) -> None:
        self.api = api
        self.devcluster = devcluster
        self.prefix = prefix
        self.tag = prefix.rstrip("-")  # label values must end alphanumeric
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.profiles: list[str] = []
        self.nodes: list[str] = []
        #: The API version profiles are written and read under (the upgrade test writes them as a
        #: cluster of 0.1.0 did, under v1alpha1).
        self.version = VERSION

    # profiles
    def create_profile(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        body = {
            "apiVersion": f"{GROUP}/{self.version}",
            "kind": "DevicePluginProfile",
            "metadata": {"name": name},
            "spec": spec,
        }
        self.profiles.append(name)
        obj: dict[str, Any] = self.custom.create_cluster_custom_object(GROUP, self.version, PLURAL, body)
        return obj

    def agent_spec(self, resource: str, mode: str, discovery: dict[str, Any] | None = None) -> dict[str, Any]:
        """A profile of ``mode`` with an agent of its own (tolerating every taint) on this test's
        nodes, advertising a resource name of this test's own (other tests' profiles never share
        it); its devices /dev/ttyUSB* unless ``discovery`` says otherwise."""
        return {
            "resourceName": f"example.com/{self.prefix}{resource}",
            "mode": mode,
            "nodeSelector": {"matchLabels": {TEST_LABEL: self.tag}},
            "plugin": {"discovery": discovery or {"paths": {"globs": ["/dev/ttyUSB*"]}}},
            "agent": {"tolerations": [{"operator": "Exists"}]},
        }

    def _cluster_object(self, group: str, version: str, plural: str, name: str) -> dict[str, Any] | None:
        """A cluster-scoped object, or None when there is none."""
        try:
            obj: dict[str, Any] = self.custom.get_cluster_custom_object(group, version, plural, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return obj

    def profile(self, name: str) -> dict[str, Any] | None:
        return self._cluster_object(GROUP, self.version, PLURAL, name)

    def device_class(self, name: str) -> dict[str, Any] | None:
        return self._cluster_object("resource.k8s.io", "v1", "deviceclasses", name)

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_cluster_custom_object(GROUP, self.version, PLURAL, name, {"spec": spec})

    def delete_profile(self, name: str) -> None:
        try:
            self.custom.delete_cluster_custom_object(GROUP, self.version, PLURAL, name)
        except ApiException as e:
            if e.status != 404:
                raise

    def condition(self, name: str, type_: str) -> dict[str, Any] | None:
        obj = self.profile(name) or {}
        for c in (obj.get("status") or {}).get("conditions") or []:
            if c["type"] == type_:
                return dict(c)
        return None

    # reports
    def apply_report(
        self,
        name: str,
        node: str,
        agent: str,
        devices: list[dict[str, Any]],
        resource: str,
        **fields: Any,
    ) -> None:
        """What an agent pod does: server-side apply of profile `name`'s DeviceReport for `node`,
        naming its writer `agent`, with `devices`, their summary and any other report `fields`
        (`nodeGroup=...`)."""
        healthy = sum(d["health"] == "Healthy" for d in devices)
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "DeviceReport",
            "metadata": {"name": f"{name}.{node}", "namespace": NAMESPACE},
            "profile": name,
            "nodeName": node,
            "agent": agent,
            "resourceName": resource,
            **fields,
            "summary": {
                "total": len(devices),
                "healthy": healthy,
                "unhealthy": len(devices) - healthy,
                "allocated": 0,
            },
            "devices": devices,
        }
        self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            NAMESPACE,
            "devicereports",
            f"{name}.{node}",
            body,
            field_manager="patchbay-agent",
            force=True,
            _content_type="application/apply-patch+yaml",
        )

    # nodes
    def shared_entry(self, name: str, namespace: str = NAMESPACE) -> dict[str, Any] | None:
        """Profile `name`'s entry in the shared node agent's config (None: no ConfigMap, or no
        entry)."""
        try:
            cm = self.core.read_namespaced_config_map("patchbay-node-agent", namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        doc = yaml.safe_load((cm.data or {}).get("node.yaml") or "{}") or {}
        return next((e for e in doc.get("profiles") or [] if e.get("profile") == name), None)

    def shared_agent_pod(self, node: str) -> str:
        """The shared node agent's pod on `node` (kwok runs it): the writer a report must name."""
        pods = self.core.list_namespaced_pod(
            NAMESPACE, label_selector="patchbay.dev/agent=shared", field_selector=f"spec.nodeName={node}"
        ).items
        return str(pods[0].metadata.name) if pods else ""

    def add_nodes(self, count: int, labels: dict[str, str] | None = None, start: int = 0) -> list[str]:
        names = self.devcluster.add_kwok_nodes(
            count, prefix=f"{self.prefix}n", labels={TEST_LABEL: self.tag, **(labels or {})}, start=start
        )
        self.nodes.extend(names)
        return names

    def node(self, name: str) -> dict[str, Any]:
        raw = self.core.read_node(name, _preload_content=False)
        return dict(json.loads(raw.data))

    def values(self, name: str, resource: str) -> tuple[str | None, str | None]:
        st = self.node(name).get("status") or {}
        return (st.get("capacity") or {}).get(resource), (st.get("allocatable") or {}).get(resource)

    def annotations(self, name: str) -> dict[str, str]:
        return dict(self.node(name)["metadata"].get("annotations") or {})

    def set_labels(self, name: str, labels: dict[str, str | None]) -> None:
        self.core.patch_node(name, {"metadata": {"labels": labels}})

    def set_status_value(self, name: str, resource: str, value: str | None) -> None:
        """What a kubelet (or a person) would do: change the advertised value behind our back."""
        esc = resource.replace("~", "~0").replace("/", "~1")
        if value is None:
            ops = [
                {"op": "remove", "path": f"/status/capacity/{esc}"},
                {"op": "remove", "path": f"/status/allocatable/{esc}"},
            ]
        else:
            ops = [
                {"op": "add", "path": f"/status/capacity/{esc}", "value": value},
                {"op": "add", "path": f"/status/allocatable/{esc}", "value": value},
            ]
        self.core.patch_node_status(name, ops, _content_type="application/json-patch+json")

    def cleanup(self) -> None:
        for p in self.profiles:
            self.delete_profile(p)
        for p in self.profiles:
            try:
                wait_for(f"profile {p} to go", lambda p=p: self.profile(p) is None, timeout=60)
            except AssertionError:
                # The operator is not running (a test stopped it): do not leave a stuck finalizer.
                self.custom.patch_cluster_custom_object(
                    GROUP, self.version, PLURAL, p, {"metadata": {"finalizers": None}}
                )
        for n in self.nodes:
            try:
                self.core.delete_node(n)
            except ApiException as e:
                if e.status != 404:
                    raise
