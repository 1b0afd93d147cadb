"""Two profiles, one resource name: the older one is applied, the newer one says why it is not."""

from __future__ import annotations

import json
import time
from typing import Any

from support.clusters import NAMESPACE, TEST_LABEL, Cluster, wait_for
from support.operator import Operator

R = "example.com/conflicted"
OWNER_KEY = "static.patchbay.dev/example.com_conflicted"


def static(tag: str, capacity: int) -> dict[str, Any]:
    return {
        "resourceName": R,
        "mode": "Static",
        "nodeSelector": {"matchLabels": {TEST_LABEL: tag}},
        "static": {"capacity": capacity},
    }


def plugin(tag: str) -> dict[str, Any]:
    return {
        "resourceName": R,
        "mode": "DevicePlugin",
        "nodeSelector": {"matchLabels": {TEST_LABEL: tag}},
        "plugin": {"discovery": {"virtual": {"count": 2}}},
        "agent": {"tolerations": [{"operator": "Exists"}]},
    }


def ready(cluster: Cluster, name: str) -> dict[str, Any] | None:
    return cluster.condition(name, "Ready")


def test_conflict_reported_then_resolved_when_the_first_goes(cluster: Cluster, operator: Operator) -> None:
    nodes = cluster.add_nodes(3)
    first, second = f"{cluster.prefix}first", f"{cluster.prefix}second"
    cluster.create_profile(first, static(cluster.tag, 2))
    wait_for("first applied", lambda: all(cluster.values(n, R) == ("2", "2") for n in nodes))
    time.sleep(1.1)  # creation timestamps have one-second resolution; make the order unambiguous
    cluster.create_profile(second, static(cluster.tag, 5))

    cond = wait_for(
        "conflict reported",
        lambda: (c := ready(cluster, second)) and c["reason"] == "ResourceNameConflict" and c,
    )
    assert cond["status"] == "False"
    assert first in cond["message"]
    assert (ready(cluster, first) or {}).get("status") == "True"
    assert all(cluster.values(n, R) == ("2", "2") for n in nodes)

    cluster.delete_profile(first)
    wait_for("second applied", lambda: all(cluster.values(n, R) == ("5", "5") for n in nodes))
    assert all(json.loads(cluster.annotations(n)[OWNER_KEY])["profile"] == second for n in nodes)
    wait_for("second Ready", lambda: (c := ready(cluster, second)) and c["status"] == "True")

    cluster.delete_profile(second)
    wait_for("second gone", lambda: cluster.profile(second) is None)
    assert all(cluster.values(n, R) == (None, None) for n in nodes)


def test_device_plugin_conflict_gets_its_agents_when_promoted(cluster: Cluster, operator: Operator) -> None:
    cluster.add_nodes(1)
    first, second = f"{cluster.prefix}first", f"{cluster.prefix}second"
    cluster.create_profile(first, plugin(cluster.tag))
    wait_for("first agents", lambda: _ds_exists(cluster, first))
    time.sleep(1.1)
    cluster.create_profile(second, plugin(cluster.tag))
    wait_for(
        "conflict reported", lambda: (c := ready(cluster, second)) and c["reason"] == "ResourceNameConflict"
    )
    assert not _ds_exists(cluster, second)

    cluster.delete_profile(first)
    wait_for("second agents", lambda: _ds_exists(cluster, second))
    wait_for("first agents gone", lambda: not _ds_exists(cluster, first))
    wait_for(
        "second no longer in conflict",
        lambda: (c := ready(cluster, second)) and c["reason"] != "ResourceNameConflict",
    )


def _ds_exists(cluster: Cluster, profile: str) -> bool:
    names = {d.metadata.name for d in cluster.apps.list_namespaced_daemon_set(NAMESPACE).items}
    return f"patchbay-{profile}" in names


def test_two_profiles_with_one_cdi_kind_the_newer_is_not_applied(
    cluster: Cluster, operator: Operator
) -> None:
    """Two DevicePlugin profiles, two resource names, ONE CDI kind: both agents would write the
    kind's spec and hand out each other's devices under the same CDI names. The older is applied;
    the newer is Stalled with CDIKindConflict, no agent of its own, until the older goes."""
    cluster.add_nodes(1)
    first, second = f"{cluster.prefix}cdi-a", f"{cluster.prefix}cdi-b"
    kind = f"example.com/{cluster.prefix}cdi"

    def spec(resource: str) -> dict[str, Any]:
        body = plugin(cluster.tag)
        body["resourceName"] = resource
        body["plugin"]["allocation"] = {"cdi": {"kind": kind}}
        return body

    cluster.create_profile(first, spec("example.com/cdi-a"))
    time.sleep(1.1)  # creation timestamps have one-second resolution
    cluster.create_profile(second, spec("example.com/cdi-b"))
    cond = wait_for(
        "the CDI kind conflict reported",
        lambda: (c := ready(cluster, second)) and c["reason"] == "CDIKindConflict" and c,
    )
    assert cond["status"] == "False" and f"CDI kind {kind}" in cond["message"] and first in cond["message"]
    stalled = cluster.condition(second, "Stalled") or {}
    assert stalled.get("status") == "True", stalled
    assert (ready(cluster, first) or {}).get("reason") != "CDIKindConflict"

    cluster.delete_profile(first)
    wait_for(
        "the newer one applied once the older is gone",
        lambda: (c := ready(cluster, second)) and c["reason"] != "CDIKindConflict",
    )
