"""DRA mode end to end on the REAL node, on the user's path: a `spec.mode: DRA` profile makes the
operator pod render the agent DaemonSet (the agent registers with the real kubelet as a DRA
kubelet plugin) and a DeviceClass; the agent pod publishes the node's devices as a ResourceSlice;
the real scheduler allocates claims against it and the real kubelet has the agent prepare them
(CDI spec files resolved by the node's containerd 2.4).

- a pod with a ResourceClaimTemplate that picks ONE device by attribute (CEL) gets exactly that
  device's node and the env naming it;
- an unchanged pod that asks `limits: {<resourceName>: 1}` is served by DRA through the
  DeviceClass's extendedResourceName;
- a pod's claim is unprepared when the pod goes: its CDI spec file is removed.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from kubernetes import client
from support.clusters import Cluster
from support.realnode import DEVICES, Installed, add_fake_device, busybox_pod, limits, wait_for

from patchbay_devcluster import DevCluster

RESOURCE_GROUP, RESOURCE_VERSION = "resource.k8s.io", "v1"


def dra_profile(cluster: Cluster, fake_dev: Path, node: str) -> tuple[str, str, str]:
    """A DRA profile over ``fake_dev``'s devices on ``node``: (name, resource, driver)."""
    name, resource = f"{cluster.prefix}dra", f"e2e.patchbay.dev/{cluster.tag}-dra"
    for i in range(DEVICES):
        add_fake_device(fake_dev, f"ttyDRA{i}")
    cluster.set_labels(node, {"patchbay.dev/e2e-dra": cluster.tag})
    cluster.create_profile(
        name,
        {
            "resourceName": resource,
            "mode": "DRA",
            "nodeSelector": {"matchLabels": {"patchbay.dev/e2e-dra": cluster.tag}},
            "plugin": {
                "discovery": {"paths": {"globs": [f"{fake_dev}/ttyDRA*"]}},
                "health": {"periodSeconds": 1, "failureThreshold": 1, "successThreshold": 1},
                "allocation": {"permissions": "rw", "devicesEnvName": "SERIALS", "envs": {"E2E": "dra"}},
            },
        },
    )
    return name, resource, f"{name}.patchbay.dev"


def slices_of(cluster: Cluster, driver: str, node: str) -> list[dict[str, Any]]:
    items = cluster.custom.list_cluster_custom_object(RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices")[
        "items"
    ]
    return [s for s in items if s["spec"]["driver"] == driver and s["spec"].get("nodeName") == node]


def slice_devices(cluster: Cluster, driver: str, node: str) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices_of(cluster, driver, node) for d in s["spec"].get("devices", [])}


def pod_log(core: client.CoreV1Api, ns: str, name: str, marker: str) -> str | None:
    pod = core.read_namespaced_pod(name, ns)
    assert pod.status.phase not in ("Failed", "Succeeded"), pod.status
    if pod.status.phase != "Running":
        return None
    text = str(core.read_namespaced_pod_log(name, ns))
    return text if marker in text else None


def device_lines(logs: str) -> list[str]:
    return sorted(line for line in logs.splitlines() if line.startswith("ttyDRA"))


def test_dra_profile_serves_claims_and_unchanged_pods_on_the_real_node(
    patchbay: Installed,
    cluster: Cluster,
    e2e_cluster: DevCluster,
    real_node: str,
    namespace: str,
    fake_dev: Path,
) -> None:
    name, resource, driver = dra_profile(cluster, fake_dev, real_node)
    core, custom = cluster.core, cluster.custom
    cdi_dir = e2e_cluster.real_node().paths.cdi_spec_dir
    pods = ("dra-claim", "dra-unchanged")
    try:
        wait_for("the DRA agent pod Ready (registered)", lambda: patchbay.ready_agents(name), 120)
        devices = wait_for(
            "the node's devices in a ResourceSlice",
            lambda: (d := slice_devices(cluster, driver, real_node)) and len(d) == DEVICES and d,
            60,
        )
        ids = {d["attributes"]["patchbay.dev/id"]["string"]: n for n, d in devices.items()}
        chosen_id = sorted(ids)[2]
        by_id = f'device.attributes["patchbay.dev"].id == "{chosen_id}"'
        device_class = custom.get_cluster_custom_object(
            RESOURCE_GROUP, RESOURCE_VERSION, "deviceclasses", driver
        )
        assert device_class["spec"]["extendedResourceName"] == resource

        # 1. A claim template that picks exactly one device by attribute.
        custom.create_namespaced_custom_object(
            RESOURCE_GROUP,
            RESOURCE_VERSION,
            namespace,
            "resourceclaimtemplates",
            {
                "apiVersion": f"{RESOURCE_GROUP}/{RESOURCE_VERSION}",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "one-serial"},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [
                                {
                                    "name": "serial",
                                    "exactly": {
                                        "deviceClassName": driver,
                                        "selectors": [{"cel": {"expression": by_id}}],
                                    },
                                }
                            ]
                        }
                    }
                },
            },
        )
        pod = busybox_pod(
            "dra-claim", real_node, f"echo SERIALS=$SERIALS; echo E2E=$E2E; ls {fake_dev}; sleep 3600"
        )
        pod["spec"]["resourceClaims"] = [{"name": "serial", "resourceClaimTemplateName": "one-serial"}]
        pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "serial"}]}
        core.create_namespaced_pod(namespace, pod)
        logs = wait_for("the claim's pod running", lambda: pod_log(core, namespace, "dra-claim", "E2E="), 120)
        lines = logs.splitlines()
        assert lines[0] == f"SERIALS={chosen_id}", logs
        assert lines[1] == "E2E=dra", logs
        assert device_lines(logs) == [chosen_id.rsplit("_", 1)[-1]], logs
        claim_specs = sorted(p.name for p in cdi_dir.glob(f"patchbay_{driver}_*.json"))
        assert len(claim_specs) == 1, claim_specs

        # 2. An unchanged pod asking for the extended resource: served by DRA via the DeviceClass.
        core.create_namespaced_pod(
            namespace,
            limits(
                busybox_pod("dra-unchanged", real_node, f"echo SERIALS=$SERIALS; ls {fake_dev}; sleep 3600"),
                resource,
                1,
            ),
        )
        logs = wait_for(
            "the unchanged pod running", lambda: pod_log(core, namespace, "dra-unchanged", "SERIALS="), 120
        )
        (other,) = logs.splitlines()[0].removeprefix("SERIALS=").split(",")
        assert other in ids and other != chosen_id, logs
        assert device_lines(logs) == [other.rsplit("_", 1)[-1]], logs
        assert len(list(cdi_dir.glob(f"patchbay_{driver}_*.json"))) == 2

        # The agent's report names the pods that hold the devices (from the kubelet's PodResources,
        # the claims' devices of its driver), and the profile counts them.
        def allocated() -> bool:
            st = (cluster.profile(name) or {}).get("status") or {}
            return (st.get("devices") or {}).get("allocated") == 2

        wait_for("the profile counting 2 devices allocated through claims", allocated, 60)

        # 3. Pods gone -> claims unprepared -> their CDI specs removed.
        for p in pods:
            core.delete_namespaced_pod(p, namespace, grace_period_seconds=0)
        wait_for(
            "the claims' CDI specs removed", lambda: not list(cdi_dir.glob(f"patchbay_{driver}_*.json")), 90
        )
    finally:
        for p in pods:
            with contextlib.suppress(client.ApiException):
                core.delete_namespaced_pod(p, namespace, grace_period_seconds=0)
        with contextlib.suppress(client.ApiException):
            custom.delete_namespaced_custom_object(
                RESOURCE_GROUP, RESOURCE_VERSION, namespace, "resourceclaimtemplates", "one-serial"
            )
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-dra": None})
