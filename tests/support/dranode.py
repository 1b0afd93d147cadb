"""DRA on the real node: the helpers the e2e modules share (a DRA profile over FAKE devices, its
ResourceSlices and status, its DeviceReport's health, claim templates and the pods that use them).
They started in test_dra_on_real_node.py; every e2e module imports them from here, none from
another test module. A pod's log and scheduling conditions are support/realnode.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client
from support.clusters import Cluster, profile_spec
from support.realnode import DEVICES, OWN_AGENT, Installed, add_fake_device, busybox_pod

RESOURCE_GROUP, RESOURCE_VERSION = "resource.k8s.io", "v1"


def dra_profile(
    cluster: Cluster, fake_dev: Path, node: str, *, own_agent: bool = True
) -> tuple[str, str, str]:
    """A DRA profile over ``fake_dev``'s devices on ``node``: (name, resource, driver). Without
    ``own_agent`` the shared node agent serves it."""
    name, resource = f"{cluster.prefix}dra", f"e2e.patchbay.dev/{cluster.tag}-dra"
    for i in range(DEVICES):
        add_fake_device(fake_dev, f"ttyDRA{i}")
    cluster.set_labels(node, {"patchbay.dev/e2e-dra": cluster.tag})
    plugin = {
        "discovery": {"paths": {"globs": [f"{fake_dev}/ttyDRA*"]}},
        "health": {"periodSeconds": 1, "failureThreshold": 1, "successThreshold": 1},
        "allocation": {"permissions": "rw", "devicesEnvName": "SERIALS", "envs": {"E2E": "dra"}},
    }
    own = {"agent": OWN_AGENT} if own_agent else {}
    cluster.create_profile(
        name, profile_spec(resource, "DRA", {"patchbay.dev/e2e-dra": cluster.tag}, plugin=plugin, **own)
    )
    return name, resource, f"{name}.patchbay.dev"


def labelled_dra_profile(
    cluster: Cluster, label: str, suffix: str, plugin: dict[str, Any], **spec: Any
) -> tuple[str, str]:
    """A DRA profile ``<prefix><suffix>`` (resource ``e2e.patchbay.dev/<tag>-<suffix>``) on the
    nodes labelled ``label``, with ``plugin`` and any other ``spec`` fields: (name, driver)."""
    name = f"{cluster.prefix}{suffix}"
    resource = f"e2e.patchbay.dev/{cluster.tag}-{suffix}"
    cluster.create_profile(name, profile_spec(resource, "DRA", {label: cluster.tag}, plugin=plugin, **spec))
    return name, f"{name}.patchbay.dev"


def slices_of(cluster: Cluster, driver: str, node: str) -> list[dict[str, Any]]:
    """The ResourceSlices ``driver`` publishes for ``node``."""
    items = cluster.custom.list_cluster_custom_object(RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices")[
        "items"
    ]
    return [s for s in items if s["spec"]["driver"] == driver and s["spec"].get("nodeName") == node]


def slice_devices(cluster: Cluster, driver: str, node: str) -> dict[str, dict[str, Any]]:
    """Every device of those slices, by its name in the slice."""
    return {d["name"]: d for s in slices_of(cluster, driver, node) for d in s["spec"].get("devices", [])}


def profile_status(cluster: Cluster, name: str) -> dict[str, Any]:
    """The profile's status as stored ({} before the operator wrote one)."""
    return dict((cluster.profile(name) or {}).get("status") or {})


def dra_status(cluster: Cluster, name: str) -> dict[str, Any]:
    """The profile's `status.dra`: what the API server kept of the DeviceClass and the slices."""
    return dict(profile_status(cluster, name).get("dra") or {})


def _report_devices(cluster: Cluster, patchbay: Installed, profile: str, node: str) -> list[dict[str, Any]]:
    """The devices of the agent's DeviceReport for the node (none while it has no report)."""
    try:
        obj = cluster.custom.get_namespaced_custom_object(
            "patchbay.dev", "v1beta1", patchbay.namespace, "devicereports", f"{profile}.{node}"
        )
    except client.ApiException as e:
        if e.status == 404:
            return []
        raise
    return list(obj.get("devices") or [])


def report_health(cluster: Cluster, patchbay: Installed, profile: str, node: str) -> dict[str, str]:
    """Physical device ID -> health, as the agent's DeviceReport for the node says."""
    return {d["id"]: d["health"] for d in _report_devices(cluster, patchbay, profile, node)}


def report_holders(cluster: Cluster, patchbay: Installed, profile: str, node: str) -> dict[str, list[str]]:
    """Physical device ID -> the pods (namespace/name) the DeviceReport says hold it, sorted."""
    return {
        d["id"]: sorted({f"{p['namespace']}/{p['name']}" for p in d.get("pods") or []})
        for d in _report_devices(cluster, patchbay, profile, node)
    }


def claim_template(
    custom: client.CustomObjectsApi,
    namespace: str,
    name: str,
    driver: str,
    device_id: str | None = None,
    tolerations: list[dict[str, Any]] | None = None,
) -> None:
    """A ResourceClaimTemplate asking for one device of the class: the one whose `patchbay.dev/id`
    is ``device_id``, or any; tolerating the device taints ``tolerations`` names."""
    exactly: dict[str, Any] = {"deviceClassName": driver}
    if tolerations:
        exactly["tolerations"] = tolerations
    if device_id is not None:
        by_id = f'device.attributes["patchbay.dev"].id == "{device_id}"'
        exactly["selectors"] = [{"cel": {"expression": by_id}}]
    request = {"name": "serial", "exactly": exactly}
    custom.create_namespaced_custom_object(
        RESOURCE_GROUP,
        RESOURCE_VERSION,
        namespace,
        "resourceclaimtemplates",
        {
            "apiVersion": f"{RESOURCE_GROUP}/{RESOURCE_VERSION}",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [request]}}},
        },
    )


def claim_pod(name: str, node: str, template: str, fake_dev: Path) -> dict[str, Any]:
    """A busybox pod on ``node`` with a claim from ``template``; its log names the devices it got."""
    pod = busybox_pod(name, node, f"echo SERIALS=$SERIALS; ls {fake_dev}; sleep 3600")
    pod["spec"]["resourceClaims"] = [{"name": "serial", "resourceClaimTemplateName": template}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "serial"}]}
    return pod
