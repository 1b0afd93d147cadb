"""A profile's revisions on the real API server (issue 45, step 1): a ControllerRevision
``<profile>-<hash>`` per change of what the agents act on, owned by the profile and labelled as
the design says; a no-op edit (a label) makes none; the history is pruned to
``spec.revisionHistoryLimit``; the status names the revisions and counts the nodes whose agent
reports the update revision; the shared node agent's entry carries the revision and the rollout
stanza (every node on it); the revision in use, deleted, is written again."""

from __future__ import annotations

from typing import Any

from support.clusters import GROUP, NAMESPACE, TEST_LABEL, Cluster, wait_for
from support.operator import Operator

from patchbay_api.revisions import EVERYONE, revision_data, spec_revision


def spec(cluster: Cluster, count: int, limit: int = 2) -> dict[str, Any]:
    return {
        "resourceName": f"example.com/{cluster.prefix}revised",
        "mode": "DevicePlugin",
        "nodeSelector": {"matchLabels": {TEST_LABEL: cluster.tag}},
        "plugin": {"discovery": {"virtual": {"count": count}}},
        "revisionHistoryLimit": limit,
        # Every node at once: this test is about the revisions kept, not the waves
        # (test_operator_rollouts_on_the_api_server.py), and no agent reports here to pass a gate.
        "rollout": {"strategy": "Immediate"},
    }


def revisions(cluster: Cluster, name: str) -> dict[str, dict[str, Any]]:
    found = cluster.apps.list_namespaced_controller_revision(
        NAMESPACE, label_selector=f"patchbay.dev/profile={name}"
    ).items
    return {r.metadata.name: cluster.api.sanitize_for_serialization(r) for r in found}


def stored(cluster: Cluster, name: str) -> tuple[str, dict[str, Any]]:
    """The hash of the profile's spec as the API server stored it (its defaults filled in), and
    that spec."""
    spec = dict((cluster.profile(name) or {})["spec"])
    return spec_revision(spec), spec


def numbers(cluster: Cluster, name: str) -> list[int]:
    return sorted(int(r["revision"]) for r in revisions(cluster, name).values())


def status(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict((cluster.profile(name) or {}).get("status") or {})


def test_revisions_follow_the_changes_and_the_one_in_use_is_kept(
    cluster: Cluster, operator: Operator
) -> None:
    name = f"{cluster.prefix}revised"
    nodes = cluster.add_nodes(2)
    first = spec(cluster, 1)
    created = cluster.create_profile(name, first)
    digest, first = stored(cluster, name)
    current = f"{name}-{digest}"

    cr = wait_for(
        "the first revision",
        lambda: revisions(cluster, name).get(current),
        detail=lambda: f"{revisions(cluster, name)}\n{operator.log()[-3000:]}",
    )
    assert cr["revision"] == 1
    assert cr["metadata"]["labels"]["patchbay.dev/profile"] == name
    assert cr["metadata"]["labels"]["controller-revision-hash"] == digest
    (owner,) = cr["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["apiVersion"].split("/")[0]) == (
        "DevicePluginProfile",
        created["metadata"]["uid"],
        GROUP,
    )
    assert cr["data"] == revision_data(first)

    # The status, in a DaemonSet's words; then an agent's report naming the revision counts.
    wait_for(
        "the status naming the revision",
        lambda: (
            status(cluster, name).get("updateRevision") == current
            and status(cluster, name).get("desiredNumberScheduled") == 2
        ),
    )
    assert status(cluster, name)["currentRevision"] == current
    assert status(cluster, name)["updatedNumberScheduled"] == 0
    device = [{"id": "virtual-0", "health": "Healthy"}]
    for node, revision in ((nodes[0], digest), (nodes[1], "0000000000")):
        pod = wait_for(f"the shared agent pod on {node}", lambda node=node: cluster.shared_agent_pod(node))
        cluster.apply_report(name, node, pod, device, first["resourceName"], revision=revision)
    wait_for(
        "one node counted on the update revision",
        lambda: (
            (
                status(cluster, name).get("updatedNumberScheduled"),
                status(cluster, name).get("updatedNumberReady"),
            )
            == (1, 1)
        ),
    )

    # The node agent's entry: the revision, and every node on it.
    entry = wait_for("the shared agent's entry", lambda: cluster.shared_entry(name))
    assert entry["revision"] == digest and entry["uid"] == created["metadata"]["uid"]
    assert entry["rollout"] == {
        "current": digest,
        "update": digest,
        "canarySelector": None,
        "threshold": EVERYONE,
        "exceptions": {},
    }

    # A label (no-op for the agents), then a change: the change is revision 2, the label made none.
    cluster.custom.patch_cluster_custom_object(
        GROUP, cluster.version, "devicepluginprofiles", name, {"metadata": {"labels": {"team": "a"}}}
    )
    cluster.patch_spec(name, {"plugin": {"discovery": {"virtual": {"count": 2}}}})
    second = f"{name}-{stored(cluster, name)[0]}"
    wait_for("the second revision", lambda: second in revisions(cluster, name))
    assert numbers(cluster, name) == [1, 2]
    wait_for("the status on it", lambda: status(cluster, name).get("updateRevision") == second)

    # Three more changes with revisionHistoryLimit 2: the one in use and the two before it stay.
    names = {}
    for count in (3, 4, 5):
        cluster.patch_spec(name, {"plugin": {"discovery": {"virtual": {"count": count}}}})
        names[count] = f"{name}-{stored(cluster, name)[0]}"
        # One change at a time: kopf hands over the latest spec, so changes in a burst may be one.
        wait_for(f"revision of count {count}", lambda c=count: names[c] in revisions(cluster, name))
    last = names[5]
    wait_for("the history pruned to the limit", lambda: numbers(cluster, name) == [3, 4, 5])
    assert last in revisions(cluster, name)

    # The revision in use, deleted: written again; an old one deleted stays deleted.
    cluster.apps.delete_namespaced_controller_revision(last, NAMESPACE)
    wait_for("the revision in use recreated", lambda: last in revisions(cluster, name))
    old = names[4]
    cluster.apps.delete_namespaced_controller_revision(old, NAMESPACE)
    cluster.patch_spec(name, {"revisionHistoryLimit": 1})  # a no-op for the agents, a prune
    wait_for("one old revision kept", lambda: len(revisions(cluster, name)) == 2)
    assert old not in revisions(cluster, name) and last in revisions(cluster, name)
