"""A staged rollout on the real node (issue 45, step 3): with the real node as the profile's only
node (so its canary), a bad change (a glob that matches nothing) halts after the canary wave, the
node is put back on the previous revision with every device, the pod holding one of them is never
restarted, and the profile is Stalled (RolloutHalted) naming the node; ``kubectl patchbay rollout
status`` exits 1 on it and ``history`` shows both revisions. The shared node agent
serves the profile (the change and the put-back applied live). Devices are FAKE (character
devices the fixture makes under /dev)."""

from __future__ import annotations

import time
from typing import Any

from support.realnode import (
    DEVICES,
    SHARED_SELECTOR,
    OnNode,
    busybox_pod,
    kubectl_patchbay,
    limits,
    pod_ready,
    served,
    staged_serial,
    wait_for,
)

from patchbay_api.revisions import spec_revision


def test_a_bad_change_halts_after_the_canary_and_the_node_is_put_back(
    on_node: OnNode,
) -> None:
    patchbay, cluster, e2e_cluster, real_node, namespace, fake_dev = on_node
    ns = patchbay.namespace
    # A short gate and deadline (the defaults are 30 s and 600 s); not a revision (not what agents act on).
    rollout_spec = {"healthySeconds": 5, "progressDeadlineSeconds": 120}
    full = (str(DEVICES), str(DEVICES))
    with staged_serial(cluster, fake_dev, real_node, ns, "waves", rollout_spec) as (name, resource, first):
        holder = limits(busybox_pod("holder", real_node, "sleep 86400"), resource, 1)
        cluster.core.create_namespaced_pod(namespace, holder)
        try:
            pod = wait_for(
                "the holder running",
                lambda: (p := cluster.core.read_namespaced_pod("holder", namespace)) and pod_ready(p) and p,
                120,
            )

            # The bad commit: a glob that matches nothing.
            started = time.monotonic()
            cluster.patch_spec(
                name, {"plugin": {"discovery": {"paths": {"globs": [f"{fake_dev}/nothing*"]}}}}
            )
            bad = spec_revision((cluster.profile(name) or {})["spec"])

            def halted() -> dict[str, Any] | None:
                rollout = ((cluster.profile(name) or {}).get("status") or {}).get("rollout") or {}
                return rollout if rollout.get("phase") == "Halted" else None

            def agent_side() -> str:
                pods = cluster.core.list_namespaced_pod(ns, label_selector=SHARED_SELECTOR).items
                logs = [
                    str(cluster.core.read_namespaced_pod_log(p.metadata.name, ns, tail_lines=40))
                    for p in pods
                ]
                return f"entry {cluster.shared_entry(name, ns)}\nagent log:\n" + "\n".join(logs)

            rollout = wait_for("the rollout halted", halted, 180, detail=agent_side)
            print(agent_side())
            took = time.monotonic() - started
            assert rollout["haltedNodes"] == [real_node] and real_node in rollout["message"], rollout
            assert f"0 healthy devices, {DEVICES} before the change" in rollout["message"], rollout
            stalled = cluster.condition(name, "Stalled") or {}
            assert stalled.get("status") == "True" and stalled.get("reason") == "RolloutHalted", stalled
            assert real_node in stalled["message"]
            # kubectl's verbs on the real halt: status exits 1 with the message, history has both.
            status = kubectl_patchbay(e2e_cluster.kubeconfig, ns, "rollout", "status", name, "--watch=false")
            assert status.returncode == 1 and real_node in status.stderr + status.stdout, status
            history = kubectl_patchbay(e2e_cluster.kubeconfig, ns, "rollout", "history", name)
            assert history.returncode == 0 and "nothing*" in history.stdout, history

            # Put back: the previous revision, every device, the holder never restarted.
            wait_for(
                "the node back on the first revision",
                lambda: served(cluster, ns, name, real_node) == first,
                120,
            )
            wait_for("every device back", lambda: cluster.values(real_node, resource) == full, 120)
            back = time.monotonic() - started
            after = cluster.core.read_namespaced_pod("holder", namespace)
            assert after.metadata.uid == pod.metadata.uid and pod_ready(after)
            assert sum(c.restart_count for c in after.status.container_statuses or []) == 0
            status = (cluster.profile(name) or {})["status"]
            assert (
                status["currentRevision"] == f"{name}-{first}" and status["updateRevision"] == f"{name}-{bad}"
            )
            print(
                f"halted {took:.1f} s after the bad change; node back with {DEVICES} devices at {back:.1f} s"
            )
        finally:
            cluster.core.delete_namespaced_pod("holder", namespace, grace_period_seconds=0)
