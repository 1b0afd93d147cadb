"""Repairs on the REAL node with the chart's defaults: what an administrator's mistake or a careless
cleanup script does to the objects the operator renders is undone within 10 s, each with ONE
Event on the profile, and the node keeps serving:

- `kubectl delete deviceclass <profile>.patchbay.dev`: recreated;
- `kubectl delete cm patchbay-node-agent`, then the agent pod right after (a reboot, an eviction):
  the ConfigMap is back, so the new agent pod mounts it and the node is back at its full device
  count, while the pod that holds a device is never restarted;
- `kubectl delete ds patchbay-node-agent`: recreated, the node back at full count;
- an edit of the DaemonSet's image (as `kubectl set image` writes it) and of the ConfigMap's
  content (as `kubectl edit`): restored.

Devices are FAKE (character devices the fixture makes under /dev). Each bound is a bounded wait,
not a timing assertion."""

from __future__ import annotations

from typing import Any

from kubernetes.client.rest import ApiException
from support.clusters import Cluster
from support.dranode import RESOURCE_GROUP, RESOURCE_VERSION, dra_profile, slice_devices
from support.realnode import (
    DEVICES,
    SHARED_SELECTOR,
    OnNode,
    busybox_pod,
    limits,
    pod_log,
    serial_profile,
    wait_for,
)

SHARED = "patchbay-node-agent"
BOUND = 10.0
"""Seconds within which each object must be back (docs/operations.md#what-patchbay-repairs)."""


def events(cluster: Cluster, profile: str, reason: str) -> list[str]:
    found = cluster.core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={profile}"
    ).items
    return [e.message for e in found if e.reason == reason]


def present(read: Any, *args: Any) -> Any:
    try:
        return read(*args)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def test_deleted_and_edited_objects_are_put_back_and_the_node_keeps_serving(on_node: OnNode) -> None:
    patchbay, cluster, _e2e_cluster, real_node, namespace, fake_dev = on_node
    ns, core, apps = patchbay.namespace, cluster.core, cluster.apps
    serial, resource = serial_profile(cluster, fake_dev, real_node, agent=None)
    dra, _dra_resource, driver = dra_profile(cluster, fake_dev, real_node, own_agent=False)
    full = (str(DEVICES), str(DEVICES))

    def serving() -> bool:
        """The node at its full count both ways: the kubelet's and the DRA slice's."""
        return (
            cluster.values(real_node, resource) == full
            and len(slice_devices(cluster, driver, real_node)) == DEVICES
        )

    def once_more(profile: str, reason: str, message: str, before: list[str]) -> None:
        """Exactly one more ``reason`` Event on ``profile``, saying ``message``."""
        got = wait_for(
            f"the {reason} Event on {profile}",
            lambda: (e := events(cluster, profile, reason)) != before and e,
            BOUND,
        )
        assert sorted(got) == sorted([*before, message]), got

    def agent_pods() -> list[Any]:
        pods = core.list_namespaced_pod(ns, label_selector=SHARED_SELECTOR).items
        return [p for p in pods if p.spec.node_name == real_node and not p.metadata.deletion_timestamp]

    holder = "repair-holder"
    try:
        wait_for("the node serving both profiles", serving, 180)
        core.create_namespaced_pod(
            namespace, limits(busybox_pod(holder, real_node, "echo held; sleep 3600"), resource, 1)
        )
        wait_for("the holder running", lambda: pod_log(core, namespace, holder, "held"), 120)
        uid = core.read_namespaced_pod(holder, namespace).metadata.uid

        # kubectl delete deviceclass
        before = events(cluster, dra, "Recreated")
        cluster.custom.delete_cluster_custom_object(RESOURCE_GROUP, RESOURCE_VERSION, "deviceclasses", driver)
        read_class = cluster.custom.get_cluster_custom_object
        wait_for(
            "the DeviceClass back",
            lambda: present(read_class, RESOURCE_GROUP, RESOURCE_VERSION, "deviceclasses", driver),
            BOUND,
        )
        once_more(dra, "Recreated", f"DeviceClass {driver} was deleted; recreated", before)

        # kubectl delete cm patchbay-node-agent, then the agent pod right after
        before = events(cluster, serial, "Recreated")
        (pod,) = wait_for("one agent pod", lambda: len(p := agent_pods()) == 1 and p, 60)
        core.delete_namespaced_config_map(SHARED, ns)
        core.delete_namespaced_pod(pod.metadata.name, ns)
        wait_for("the ConfigMap back", lambda: present(core.read_namespaced_config_map, SHARED, ns), BOUND)
        once_more(serial, "Recreated", f"ConfigMap {SHARED} was deleted; recreated", before)
        wait_for("the node back at full count", serving, 180)

        # kubectl delete ds patchbay-node-agent
        before = events(cluster, serial, "Recreated")
        apps.delete_namespaced_daemon_set(SHARED, ns)
        wait_for("the DaemonSet back", lambda: present(apps.read_namespaced_daemon_set, SHARED, ns), BOUND)
        once_more(serial, "Recreated", f"DaemonSet {SHARED} was deleted; recreated", before)
        wait_for("the node back at full count", serving, 180)

        # kubectl set image (an update by another field manager)
        image = apps.read_namespaced_daemon_set(SHARED, ns).spec.template.spec.containers[0].image
        before = events(cluster, serial, "Restored")
        edit = [
            {
                "op": "replace",
                "path": "/spec/template/spec/containers/0/image",
                "value": "example.invalid/edited:1",
            }
        ]
        apps.patch_namespaced_daemon_set(SHARED, ns, edit, field_manager="kubectl-set")
        current = lambda: apps.read_namespaced_daemon_set(SHARED, ns).spec.template.spec.containers[0].image  # noqa: E731
        wait_for("the image restored", lambda: current() == image, BOUND)
        once_more(serial, "Restored", f"DaemonSet {SHARED} was edited; restored", before)
        wait_for("the node back at full count", serving, 180)

        # kubectl edit cm (its content)
        data = dict(core.read_namespaced_config_map(SHARED, ns).data)
        before = events(cluster, serial, "Restored")
        edit = [{"op": "replace", "path": "/data", "value": {"node.yaml": "profiles: []\n"}}]
        core.patch_namespaced_config_map(SHARED, ns, edit, field_manager="kubectl-edit")
        wait_for(
            "the content restored",
            lambda: dict(core.read_namespaced_config_map(SHARED, ns).data) == data,
            BOUND,
        )
        once_more(serial, "Restored", f"ConfigMap {SHARED} was edited; restored", before)
        wait_for("the node serving", serving, 180)

        held = core.read_namespaced_pod(holder, namespace)
        assert held.metadata.uid == uid and held.status.phase == "Running"
        assert sum(c.restart_count for c in held.status.container_statuses or []) == 0
        stats = patchbay.operator_stats()
        print(f"repairs by kind: {stats.get('repairs')}")
        assert {"ConfigMap", "DaemonSet", "DeviceClass"} <= set(stats.get("repairs") or {}), stats
    finally:
        present(core.delete_namespaced_pod, holder, namespace)
        for name in (serial, dra):
            cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-plugin": None, "patchbay.dev/e2e-dra": None})
