"""Repairs against the real API server: a DRA profile with an agent of its own has a ConfigMap, a
DaemonSet and a DeviceClass; each deleted is recreated, an edit of the DaemonSet's image (JSON
patch, as `kubectl set image` updates it) and of the ConfigMap's data is undone, each with ONE
Normal Event on the profile; an image taken over by server-side apply with force is left to its
new manager with ONE Warning; and when the profile is deleted, its objects stay deleted.

The bounds are the issue's (10 s); nothing times the repair beyond them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from support.clusters import NAMESPACE, Cluster, wait_for
from support.operator import Operator, agent_object

BOUND = 10.0
"""Seconds within which a repair must be seen (docs/operations.md#what-patchbay-repairs)."""


def spec(cluster: Cluster) -> dict[str, Any]:
    # An agent of its own: its ConfigMap and DaemonSet are this test's alone.
    return cluster.agent_spec("repaired", "DRA", {"virtual": {"count": 2}})


def events(cluster: Cluster, profile: str, reason: str) -> list[str]:
    found = cluster.core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={profile}"
    ).items
    return sorted(e.message for e in found if e.reason == reason)


def image(cluster: Cluster, profile: str) -> str:
    ds = agent_object(cluster, "DaemonSet", profile) or {}
    return str(ds["spec"]["template"]["spec"]["containers"][0]["image"]) if ds else ""


def repaired(
    cluster: Cluster, profile: str, reason: str, message: str, back: Callable[[], object], before: int
) -> None:
    """Within BOUND: ``back()`` true and exactly one more ``reason`` Event saying ``message``."""
    wait_for(
        f"{message} (Event {reason})", lambda: back() and message in events(cluster, profile, reason), BOUND
    )
    assert len(events(cluster, profile, reason)) == before + 1, events(cluster, profile, reason)


def test_deleted_and_edited_objects_are_put_back_and_a_take_over_is_left_alone(
    cluster: Cluster, operator: Operator
) -> None:
    name = f"{cluster.prefix}repaired"
    driver, own = f"{name}.patchbay.dev", f"patchbay-{name}"
    cluster.create_profile(name, spec(cluster))
    wait_for(
        "the agent objects",
        lambda: agent_object(cluster, "ConfigMap", name) and cluster.device_class(driver),
    )
    ds = wait_for("the DaemonSet", lambda: agent_object(cluster, "DaemonSet", name))
    rendered = ds["spec"]["template"]["spec"]["containers"][0]["image"]

    cluster.custom.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", driver)
    repaired(
        cluster,
        name,
        "Recreated",
        f"DeviceClass {driver} was deleted; recreated",
        lambda: cluster.device_class(driver),
        0,
    )
    cluster.core.delete_namespaced_config_map(own, NAMESPACE)
    back = lambda: agent_object(cluster, "ConfigMap", name)  # noqa: E731
    repaired(cluster, name, "Recreated", f"ConfigMap {own} was deleted; recreated", back, 1)
    cluster.apps.delete_namespaced_daemon_set(own, NAMESPACE)
    back = lambda: agent_object(cluster, "DaemonSet", name)  # noqa: E731
    repaired(cluster, name, "Recreated", f"DaemonSet {own} was deleted; recreated", back, 2)

    # Edits by an update (as kubectl set image and kubectl edit write): restored.
    patch = [
        {"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "example.invalid/x:1"}
    ]
    cluster.apps.patch_namespaced_daemon_set(own, NAMESPACE, patch, field_manager="kubectl-set")
    back = lambda: image(cluster, name) == rendered  # noqa: E731
    repaired(cluster, name, "Restored", f"DaemonSet {own} was edited; restored", back, 0)
    cm = agent_object(cluster, "ConfigMap", name) or {}
    data = dict(cm["data"])
    edit = [{"op": "replace", "path": "/data", "value": {"node.yaml": "profiles: []\n"}}]
    cluster.core.patch_namespaced_config_map(own, NAMESPACE, edit, field_manager="kubectl-edit")
    back = lambda: (agent_object(cluster, "ConfigMap", name) or {}).get("data") == data  # noqa: E731
    repaired(cluster, name, "Restored", f"ConfigMap {own} was edited; restored", back, 1)

    # Taken over by server-side apply with force: the new manager keeps it; one Warning.
    body = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": own, "namespace": NAMESPACE},
        "spec": {
            "template": {"spec": {"containers": [{"name": "agent", "image": "example.invalid/gitops:1"}]}}
        },
    }
    cluster.apps.patch_namespaced_daemon_set(
        own, NAMESPACE, body, field_manager="gitops", force=True, _content_type="application/apply-patch+yaml"
    )
    wait_for("the take-over's Warning", lambda: events(cluster, name, "FieldsTakenOver"), BOUND)
    assert image(cluster, name) == "example.invalid/gitops:1"
    (warning,) = events(cluster, name, "FieldsTakenOver")
    assert "gitops" in warning and f"DaemonSet {own}" in warning
    wait_for(
        "the take-over in the status",
        lambda: any(
            p.get("reason") == "FieldsTakenOver"
            for p in ((cluster.profile(name) or {}).get("status") or {}).get("problems") or []
        ),
        BOUND,
    )
    stats = operator.stats()
    assert stats["fieldsTakenOver"].get("DaemonSet", 0) >= 1, stats
    assert stats["repairs"].get("DeviceClass", 0) >= 1, stats

    # The profile deleted: its objects go and stay gone (nothing recreates them meanwhile).
    cluster.delete_profile(name)
    wait_for(
        "the profile and its objects gone",
        lambda: (
            cluster.profile(name) is None
            and agent_object(cluster, "DaemonSet", name) is None
            and agent_object(cluster, "ConfigMap", name) is None
            and cluster.device_class(driver) is None
        ),
        60,
    )
    # Another profile's objects applied after it: the operator has handled the deletion events.
    later = f"{cluster.prefix}after"
    cluster.create_profile(later, {**spec(cluster), "resourceName": f"example.com/{cluster.prefix}after"})
    wait_for("the next profile's DaemonSet", lambda: agent_object(cluster, "DaemonSet", later), 30)
    assert (
        agent_object(cluster, "DaemonSet", name) is None and agent_object(cluster, "ConfigMap", name) is None
    )
    assert cluster.device_class(driver) is None
    assert len(events(cluster, name, "Recreated")) == 3
