"""Sharing in DRA mode on the REAL node: `sharing.replicas: 2` on a `mode: DRA` profile over ONE
fake device (mknod 1:3) is consumable capacity (docs/dra.md#sharing).

Where the API server keeps it (DRAConsumableCapacity, 1.36 on): the slice device allows multiple
allocations and has 2 `patchbay.dev/shares`; two pods whose claims take one share each run at
once on the same device, each with its own claim's CDI spec; a third waits (the scheduler finds no
share left) until one of them goes, then runs. Each claim's status names its share (`shareID`).

Where it drops it (before 1.36): the profile says so (Degraded, SharingNotServed, and
`status.dra.consumableCapacity: Dropped`), the device goes to one claim at a time: the second pod
waits until the first goes.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from kubernetes import client
from support.clusters import Cluster
from support.dranode import claim_pod, claim_template, dra_status, slice_devices
from support.realnode import OWN_AGENT, OnNode, add_fake_device, pod_log, unschedulable, wait_for
from support.releases import has

RG, RV = "resource.k8s.io", "v1"


def shared_profile(cluster: Cluster, fake_dev: Path, node: str) -> tuple[str, str]:
    """A DRA profile over one fake device, shared by 2 claims: (name, driver)."""
    name = f"{cluster.prefix}shared"
    add_fake_device(fake_dev, "ttySH0")
    cluster.set_labels(node, {"patchbay.dev/e2e-shared": cluster.tag})
    cluster.create_profile(
        name,
        {
            "resourceName": f"e2e.patchbay.dev/{cluster.tag}-shared",
            "mode": "DRA",
            "nodeSelector": {"matchLabels": {"patchbay.dev/e2e-shared": cluster.tag}},
            "plugin": {
                "discovery": {"paths": {"globs": [f"{fake_dev}/ttySH*"]}},
                "sharing": {"replicas": 2},
                "allocation": {"permissions": "rw", "devicesEnvName": "SERIALS"},
            },
            "agent": OWN_AGENT,
        },
    )
    return name, f"{name}.patchbay.dev"


def running(core: client.CoreV1Api, ns: str, name: str) -> str | None:
    return pod_log(core, ns, name, "SERIALS=")


def pod_claim(cluster: Cluster, ns: str, pod: str) -> dict[str, Any]:
    (status,) = cluster.core.read_namespaced_pod(pod, ns).status.resource_claim_statuses
    claim: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
        RG, RV, ns, "resourceclaims", status.resource_claim_name
    )
    return claim


def test_two_claims_share_one_device_by_capacity_and_a_third_waits(
    on_node: OnNode, kube_release: str
) -> None:
    patchbay, cluster, e2e_cluster, real_node, namespace, fake_dev = on_node
    name, driver = shared_profile(cluster, fake_dev, real_node)
    core, custom = cluster.core, cluster.custom
    served = has("dra-consumable-capacity", kube_release)
    pods = ["share-1", "share-2", "share-3"]
    try:
        wait_for("the DRA agent pod Ready", lambda: patchbay.ready_agents(name), 120)
        (device,) = wait_for(
            "the device in a ResourceSlice",
            lambda: list(slice_devices(cluster, driver, real_node).values()),
            60,
        )
        expected = "Kept" if served else "Dropped"
        wait_for(
            f"the profile saying consumableCapacity {expected}",
            lambda: dra_status(cluster, name).get("consumableCapacity") == expected,
            60,
        )
        claim_template(custom, namespace, "one-share", driver)
        core.create_namespaced_pod(namespace, claim_pod("share-1", real_node, "one-share", fake_dev))
        first = wait_for("the first pod running", lambda: running(core, namespace, "share-1"), 120)
        serial = first.splitlines()[0]
        assert serial.startswith("SERIALS=") and serial.endswith("ttySH0"), first
        core.create_namespaced_pod(namespace, claim_pod("share-2", real_node, "one-share", fake_dev))
        if served:
            assert device["allowMultipleAllocations"] is True, device
            assert device["capacity"]["patchbay.dev/shares"]["value"] == "2", device
            second = wait_for(
                "the second pod running on the same device", lambda: running(core, namespace, "share-2"), 120
            )
            assert second.splitlines()[0] == serial, second
            # Two claims, each prepared with a CDI spec of its own, each naming its share.
            cdi_dir = e2e_cluster.real_node().paths.cdi_spec_dir
            assert len(list(cdi_dir.glob(f"patchbay_{driver}_*.json"))) == 2
            shares = set()
            for pod in ("share-1", "share-2"):
                claim = pod_claim(cluster, namespace, pod)
                (result,) = claim["status"]["allocation"]["devices"]["results"]
                assert result["consumedCapacity"] == {"patchbay.dev/shares": "1"}, result
                shares.add(result["shareID"])
                entry = wait_for(
                    f"{pod}'s claim status naming its share",
                    lambda c=claim["metadata"]["name"]: [
                        e
                        for e in custom.get_namespaced_custom_object(RG, RV, namespace, "resourceclaims", c)
                        .get("status", {})
                        .get("devices", [])
                        if e.get("driver") == driver
                    ],
                    60,
                )
                assert [e.get("shareID") for e in entry] == [result["shareID"]], entry
            assert len(shares) == 2
            # No share left: the third waits, then runs when one of the first two goes.
            core.create_namespaced_pod(namespace, claim_pod("share-3", real_node, "one-share", fake_dev))
            message = wait_for(
                "the third pod unschedulable", lambda: unschedulable(core, namespace, "share-3"), 60
            )
            assert "cannot allocate all claims" in message, message
            core.delete_namespaced_pod("share-1", namespace, grace_period_seconds=0)
            wait_for(
                "the third pod running once a share is free", lambda: running(core, namespace, "share-3"), 120
            )
        else:
            degraded = cluster.condition(name, "Degraded") or {}
            assert (degraded.get("status"), degraded.get("reason")) == ("True", "SharingNotServed"), degraded
            assert "allowMultipleAllocations" not in device, device
            message = wait_for(
                "the second pod unschedulable", lambda: unschedulable(core, namespace, "share-2"), 60
            )
            assert "cannot allocate all claims" in message, message
            core.delete_namespaced_pod("share-1", namespace, grace_period_seconds=0)
            wait_for(
                "the second pod running once the device is free",
                lambda: running(core, namespace, "share-2"),
                120,
            )
        print(f"sharing: consumableCapacity {expected} on {kube_release}")
    finally:
        for p in pods:
            with contextlib.suppress(client.ApiException):
                core.delete_namespaced_pod(p, namespace, grace_period_seconds=0)
        with contextlib.suppress(client.ApiException):
            custom.delete_namespaced_custom_object(RG, RV, namespace, "resourceclaimtemplates", "one-share")
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-shared": None})
        (fake_dev / "ttySH0").unlink(missing_ok=True)
