"""A profile's revisions on the real node (issue 45, steps 1-2): after a change of spec.plugin, the
agent's DeviceReport names the revision it serves (``revision``, the hash of the profile's
ControllerRevision ``<profile>-<hash>``), for the shared node agent (the change applied live: the
same pod) and for an agent of its own (its DaemonSet rolls, the new pod reads the revision beside
its config); the profile's status names the update revision and counts the node on it."""

from __future__ import annotations

from typing import Any

from kubernetes.client.rest import ApiException
from support.clusters import GROUP, VERSION, Cluster
from support.realnode import SHARED_SELECTOR, Installed, wait_for

from patchbay_api.revisions import spec_revision


def report(cluster: Cluster, namespace: str, name: str, node: str) -> dict[str, Any]:
    try:
        obj: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "devicereports", f"{name}.{node}"
        )
    except ApiException as e:
        if e.status == 404:
            return {}
        raise
    return obj


def status(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict((cluster.profile(name) or {}).get("status") or {})


def on_revision(cluster: Cluster, ns: str, name: str, node: str, count: int) -> bool:
    """The profile's spec as stored (its defaults filled in) has `count` virtual devices, the
    node's agent reports its revision, and the status counts the node on it."""
    spec = (cluster.profile(name) or {})["spec"]
    if spec["plugin"]["discovery"]["virtual"]["count"] != count:
        return False
    digest = spec_revision(spec)
    st = status(cluster, name)
    return (
        report(cluster, ns, name, node).get("revision") == digest
        and st.get("updateRevision") == f"{name}-{digest}"
        and (st.get("desiredNumberScheduled"), st.get("updatedNumberScheduled"), st.get("updatedNumberReady"))
        == (1, 1, 1)
    )


def test_the_report_names_the_revision_served_after_a_change_of_the_plugin(
    patchbay: Installed, cluster: Cluster, real_node: str
) -> None:
    shared, own = f"{cluster.prefix}rev-shared", f"{cluster.prefix}rev-own"
    label = "patchbay.dev/e2e-revisions"
    cluster.set_labels(real_node, {label: cluster.tag})
    ns = patchbay.namespace

    def spec(name: str, count: int, **extra: Any) -> dict[str, Any]:
        return {
            "resourceName": f"e2e.patchbay.dev/{cluster.tag}-{name}",
            "mode": "DevicePlugin",
            "nodeSelector": {"matchLabels": {label: cluster.tag}},
            "plugin": {"discovery": {"virtual": {"count": count}}},
            **extra,
        }

    def shared_pod() -> Any:
        pods = cluster.core.list_namespaced_pod(ns, label_selector=SHARED_SELECTOR).items
        live = [p for p in pods if p.spec.node_name == real_node and not p.metadata.deletion_timestamp]
        return live[0] if len(live) == 1 else None

    own_agent = {"agent": {"tolerations": [{"operator": "Exists"}]}}
    try:
        cluster.create_profile(shared, spec("shared", 1))
        cluster.create_profile(own, spec("own", 1, **own_agent))
        for name in (shared, own):
            wait_for(
                f"{name}'s first revision reported",
                lambda n=name: on_revision(cluster, ns, n, real_node, 1),
                180,
            )
        pod = shared_pod()
        assert pod is not None

        cluster.patch_spec(shared, {"plugin": {"discovery": {"virtual": {"count": 2}}}})
        cluster.patch_spec(own, {"plugin": {"discovery": {"virtual": {"count": 2}}}})
        wait_for(
            "the shared agent reports the new revision",
            lambda: on_revision(cluster, ns, shared, real_node, 2),
            180,
        )
        wait_for(
            "the own agent reports the new revision",
            lambda: on_revision(cluster, ns, own, real_node, 2),
            180,
        )
        res = f"e2e.patchbay.dev/{cluster.tag}-shared"
        wait_for("2 shared devices", lambda: cluster.values(real_node, res) == ("2", "2"), 120)
        after = shared_pod()
        assert after is not None and after.metadata.uid == pod.metadata.uid  # live: the same pod
        revs = cluster.apps.list_namespaced_controller_revision(
            ns, label_selector=f"patchbay.dev/profile={shared}"
        )
        assert sorted(int(r.revision) for r in revs.items) == [1, 2]
        print(
            "revisions reported:",
            {n: report(cluster, ns, n, real_node).get("revision") for n in (shared, own)},
        )
    finally:
        for name in (shared, own):
            cluster.delete_profile(name)
        cluster.set_labels(real_node, {label: None})
