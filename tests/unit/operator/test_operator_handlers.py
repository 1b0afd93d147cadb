"""The kopf glue: what the handlers register, and the node-cheap diff base."""

from __future__ import annotations

import kopf
from kopf._cogs.structs.references import Resource

from patchbay_operator import handlers


def test_diff_base_skips_nodes_but_keeps_profiles() -> None:
    storage = handlers.ProfileOnlyDiffBase(prefix="kopf.patchbay.dev", key="last-handled-configuration")
    node = kopf.Body(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "status": {"capacity": {}}}
    )
    assert storage.build(body=node) == {}
    profile = kopf.Body(
        {
            "apiVersion": "patchbay.dev/v1alpha1",
            "kind": "DevicePluginProfile",
            "metadata": {"name": "p", "labels": {"a": "b"}},
            "spec": {"resourceName": "example.com/x", "mode": "Static", "static": {"capacity": 1}},
            "status": {"observedGeneration": 1},
        }
    )
    essence = storage.build(body=profile)
    assert essence["spec"] == {"resourceName": "example.com/x", "mode": "Static", "static": {"capacity": 1}}
    assert "status" not in essence


def test_nodes_get_only_a_stateless_event_handler() -> None:
    registry = kopf.get_default_registry()
    verbs = ["list", "watch", "patch"]
    nodes = Resource("", "v1", "nodes", kind="Node", namespaced=False, verbs=verbs)
    profiles = Resource(
        "patchbay.dev",
        "v1alpha1",
        "devicepluginprofiles",
        kind="DevicePluginProfile",
        namespaced=False,
        verbs=verbs,
    )

    def ids(kind: str, resource: Resource) -> set[str]:
        return {h.id for h in getattr(registry, kind).get_all_handlers() if h.selector.check(resource)}

    assert ids("_watching", nodes) == {"nodes"}
    # No change handlers, daemons, timers or indexes on nodes: kopf would write to every node.
    assert ids("_changing", nodes) == set()
    assert ids("_spawning", nodes) == set()
    assert ids("_indexing", nodes) == set()
    assert {"reconcile", "release"} <= ids("_changing", profiles)
