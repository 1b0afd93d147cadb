"""The kopf glue: what the handlers register (profiles only; nodes are the informer's)."""

from __future__ import annotations

import kopf
from kopf._cogs.structs.references import Resource

from patchbay_operator import handlers  # noqa: F401 - importing registers the handlers


def test_kopf_registers_nothing_on_nodes() -> None:
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

    # Nothing at all on nodes: the operator's own informer watches them, and kopf's change
    # handlers, daemons, timers or indexes would write to (or index) every node.
    assert ids("_watching", nodes) == set()
    assert ids("_changing", nodes) == set()
    assert ids("_spawning", nodes) == set()
    assert ids("_indexing", nodes) == set()
    assert {"reconcile", "release"} <= ids("_changing", profiles)
