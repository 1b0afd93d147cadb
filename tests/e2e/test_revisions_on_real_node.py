"""A profile's revisions on the real node (issue 45): after a change of spec.plugin, the agent's
DeviceReport names the revision it serves (``revision``, the hash of the profile's
ControllerRevision ``<profile>-<hash>``), for the shared node agent and for an agent of its own
(both take the change live: the same pod); the profile's status names the update revision and
counts the node on it. Then an agent of its own staged on the real node as the shared one is: a
good change rolls through its canary wave and its gate to Complete, a bad change (a glob matching
nothing) halts at the canary and the node is put back on the previous revision with every device,
neither the holder pod nor the agent pod restarted. Devices of the staged profile are FAKE."""

from __future__ import annotations

import time
from typing import Any

from kubernetes.client.rest import ApiException
from support.clusters import GROUP, VERSION, Cluster
from support.realnode import (
    AGENT_SELECTOR,
    DEVICES,
    SHARED_SELECTOR,
    Installed,
    OnNode,
    busybox_pod,
    limits,
    pod_ready,
    serial_profile,
    served,
    wait_for,
)

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


def rollout_of(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict(status(cluster, name).get("rollout") or {})


def test_an_own_agent_is_staged_a_good_change_completes_and_a_bad_one_halts_at_the_canary(
    on_node: OnNode,
) -> None:
    """A profile with an agent of its own (its own ConfigMap and DaemonSet): its change reaches the
    running agent through the ConfigMap, wave by wave, as the shared node agent's would."""
    patchbay, cluster, _e2e, real_node, namespace, fake_dev = on_node
    ns = patchbay.namespace
    label = "patchbay.dev/e2e-own-staged"
    name, resource = serial_profile(cluster, fake_dev, real_node, suffix="ownstaged", label=label)
    full = (str(DEVICES), str(DEVICES))
    own_pods = f"{AGENT_SELECTOR},patchbay.dev/profile={name}"

    def agent_pod() -> Any:
        pods = cluster.core.list_namespaced_pod(ns, label_selector=own_pods).items
        live = [p for p in pods if p.spec.node_name == real_node and not p.metadata.deletion_timestamp]
        return live[0] if len(live) == 1 and pod_ready(live[0]) else None

    def revision() -> str:
        return spec_revision((cluster.profile(name) or {})["spec"])

    try:
        # A short gate and deadline (not a revision: nothing agents act on).
        cluster.patch_spec(name, {"rollout": {"healthySeconds": 5, "progressDeadlineSeconds": 120}})
        wait_for("every device on the node", lambda: cluster.values(real_node, resource) == full, 180)
        first = revision()
        wait_for("the first revision reported", lambda: served(cluster, ns, name, real_node) == first, 120)
        agent = wait_for("the own agent's pod ready", agent_pod, 120)
        # A pod holding one device (in the test's namespace, deleted with it).
        holder = limits(busybox_pod("holder", real_node, "sleep 86400"), resource, 1)
        cluster.core.create_namespaced_pod(namespace, holder)
        held = wait_for(
            "the holder running",
            lambda: pod_ready(p := cluster.core.read_namespaced_pod("holder", namespace)) and p,
        )
        # (1) A good change: through the canary wave and its gate, then Complete.
        started = time.monotonic()
        cluster.patch_spec(name, {"plugin": {"health": {"periodSeconds": 2}}})
        good = revision()
        canary = wait_for(
            "the canary wave held for its gate",
            lambda: (
                (r := rollout_of(cluster, name)).get("phase") == "Progressing"
                and r.get("wave") == 0
                and served(cluster, ns, name, real_node) == good
                and r
            ),
            60,
        )
        wait_for(
            "the good change complete",
            lambda: (
                rollout_of(cluster, name).get("phase") == "Complete"
                and status(cluster, name).get("currentRevision") == f"{name}-{good}"
            ),
            120,
        )
        completed = time.monotonic() - started
        assert canary["waveNodes"] == 1, canary
        # (2) A bad change: a glob matching nothing halts at the canary, the node is put back.
        started = time.monotonic()
        cluster.patch_spec(name, {"plugin": {"discovery": {"paths": {"globs": [f"{fake_dev}/nothing*"]}}}})
        bad = revision()
        halted = wait_for(
            "the rollout halted",
            lambda: (r := rollout_of(cluster, name)).get("phase") == "Halted" and r,
            180,
            detail=lambda: (
                f"rollout {rollout_of(cluster, name)} served {served(cluster, ns, name, real_node)}"
            ),
        )
        assert halted["haltedNodes"] == [real_node], halted
        assert f"0 healthy devices, {DEVICES} before the change" in halted["message"], halted
        back_on = lambda: served(cluster, ns, name, real_node) == good and cluster.values(real_node, resource)  # noqa: E731
        wait_for("the node back on the good revision with every device", lambda: back_on() == full, 120)
        back = time.monotonic() - started
        st = status(cluster, name)
        assert (st["currentRevision"], st["updateRevision"]) == (f"{name}-{good}", f"{name}-{bad}")
        # Live, never a restart: the same holder and the same agent pod, neither restarted.
        after = cluster.core.read_namespaced_pod("holder", namespace)
        assert after.metadata.uid == held.metadata.uid and pod_ready(after)
        assert sum(c.restart_count for c in after.status.container_statuses or []) == 0
        now = agent_pod()
        assert now is not None and now.metadata.uid == agent.metadata.uid, "the own agent's pod was replaced"
        assert sum(c.restart_count for c in now.status.container_statuses or []) == 0
        print(
            f"own agent: good change complete {completed:.1f} s after it; bad change halted and the "
            f"node back with {DEVICES} devices {back:.1f} s after it"
        )
    finally:
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {label: None})
