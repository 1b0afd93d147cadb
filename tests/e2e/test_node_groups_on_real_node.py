"""Settings per node group on the real node, through the chart's shared node agent: one
DevicePlugin profile whose group `big` (chosen by a node label) shares each device 3 ways, and one
DRA profile whose group `big` finds 3 devices instead of 2. A label that moves the node into the
group and out again is followed live: the kubelet's allocatable (device plugin) and the node's
ResourceSlice (DRA) change, the DeviceReports name the group, the profiles' `status.nodeGroups`
count the node, and the DevicePlugin profile is served by the same agent pod throughout (no
restart). Nothing here depends on the release: the same on every release of the matrix."""

from __future__ import annotations

from typing import Any

from support.clusters import Cluster
from support.dranode import slice_devices
from support.realnode import SHARED_SELECTOR, Installed, wait_for

from patchbay_devcluster import DevCluster

GROUP_LABEL = "patchbay.dev/e2e-node-group"


def groups(status: dict[str, Any]) -> dict[str, tuple[int, int]]:
    return {g["name"]: (g.get("nodes", 0), g.get("matching", 0)) for g in status.get("nodeGroups") or []}


def test_a_node_label_moves_the_node_between_groups_live(
    patchbay: Installed, cluster: Cluster, e2e_cluster: DevCluster, real_node: str
) -> None:
    dp, dra = f"{cluster.prefix}groups", f"{cluster.prefix}groups-dra"
    dp_res, dra_res = f"e2e.patchbay.dev/{cluster.tag}-grouped", f"e2e.patchbay.dev/{cluster.tag}-grouped-dra"
    select = "patchbay.dev/e2e-groups"
    cluster.set_labels(real_node, {select: cluster.tag, GROUP_LABEL: None})
    big = {"matchLabels": {GROUP_LABEL: "big"}}

    def report(profile: str) -> dict[str, Any]:
        try:
            got: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
                "patchbay.dev", "v1beta1", patchbay.namespace, "devicereports", f"{profile}.{real_node}"
            )
            return got
        except Exception:
            return {}

    def status(profile: str) -> dict[str, Any]:
        return (cluster.profile(profile) or {}).get("status") or {}

    def agent_pod_uid() -> str | None:
        pods = cluster.core.list_namespaced_pod(patchbay.namespace, label_selector=SHARED_SELECTOR).items
        live = [p for p in pods if p.spec.node_name == real_node and not p.metadata.deletion_timestamp]
        return live[0].metadata.uid if len(live) == 1 else None

    driver = f"{dra}.patchbay.dev"
    try:
        cluster.create_profile(
            dp,
            {
                "resourceName": dp_res,
                "mode": "DevicePlugin",
                "nodeSelector": {"matchLabels": {select: cluster.tag}},
                "plugin": {"discovery": {"virtual": {"count": 2}}},
                "nodeGroups": [{"name": "big", "nodeSelector": big, "plugin": {"sharing": {"replicas": 3}}}],
            },
        )
        cluster.create_profile(
            dra,
            {
                "resourceName": dra_res,
                "mode": "DRA",
                "nodeSelector": {"matchLabels": {select: cluster.tag}},
                "plugin": {"discovery": {"virtual": {"count": 2}}},
                "nodeGroups": [
                    {"name": "big", "nodeSelector": big, "plugin": {"discovery": {"virtual": {"count": 3}}}}
                ],
            },
        )
        # Not in the group: spec.plugin alone.
        wait_for("2 devices, unshared", lambda: cluster.values(real_node, dp_res) == ("2", "2"), 120)
        wait_for("2 DRA devices", lambda: len(slice_devices(cluster, driver, real_node) or {}) == 2, 120)
        wait_for("the reports say default", lambda: report(dp).get("nodeGroup") == "default", 60)
        assert report(dra).get("nodeGroup") == "default", report(dra)
        wait_for("the status counts default", lambda: groups(status(dp)).get("default") == (1, 1), 60)
        pod = agent_pod_uid()
        assert pod is not None

        # Into the group: each device shared 3 ways; 3 DRA devices.
        cluster.set_labels(real_node, {GROUP_LABEL: "big"})
        wait_for("6 allocatable (2 x 3)", lambda: cluster.values(real_node, dp_res) == ("6", "6"), 120)
        wait_for("3 DRA devices", lambda: len(slice_devices(cluster, driver, real_node) or {}) == 3, 120)
        wait_for("the reports say big", lambda: report(dp).get("nodeGroup") == "big", 60)
        wait_for("the DRA report says big", lambda: report(dra).get("nodeGroup") == "big", 60)
        wait_for("the status counts big", lambda: groups(status(dp)).get("big") == (1, 1), 60)
        wait_for("the DRA status counts big", lambda: groups(status(dra)).get("big") == (1, 1), 60)

        # Out again.
        cluster.set_labels(real_node, {GROUP_LABEL: None})
        wait_for("back to 2", lambda: cluster.values(real_node, dp_res) == ("2", "2"), 120)
        wait_for(
            "back to 2 DRA devices", lambda: len(slice_devices(cluster, driver, real_node) or {}) == 2, 120
        )
        wait_for("the reports say default again", lambda: report(dp).get("nodeGroup") == "default", 60)
        assert agent_pod_uid() == pod, "the node agent pod was replaced"
    finally:
        for name in (dp, dra):
            cluster.delete_profile(name)
        cluster.set_labels(real_node, {select: None, GROUP_LABEL: None})
