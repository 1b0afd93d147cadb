"""What a reboot does to pods that hold devices, on the real node: the CDI directory comes back
empty (a tmpfs on most nodes), the node agent starts again, and the kubelet starts the pods'
containers again with the CDI names it kept. For a DRA claim the kubelet does not even ask the
driver again: its checkpoint holds the claim as prepared (kubernetes#141433). So the node agent
writes every CDI spec it owns (the device plugin's, and every prepared claim's from the copies it
keeps beside its claim records) before it says Ready, and whenever one disappears.

Both ways of holding a device, served by the shared node agent (the chart's default path): a pod
with an extended resource served by a device plugin whose Allocate names CDI devices, and a pod
with a ResourceClaim. Without the fix the DRA pod stayed in CrashLoopBackOff: "CDI device
injection failed: unresolvable CDI devices <driver>/device=<claim uid>-...".

Two cases: the directory emptied and the agent restarted (its pod deleted), then the holders'
containers killed; and the same with the kubelet killed and started again around the emptying
and the agent's death (its in-memory state lost: it restarts the holders' containers from its
checkpoints alone).
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

from kubernetes import client
from support.clusters import Cluster
from support.dranode import RESOURCE_GROUP, RESOURCE_VERSION, claim_template, dra_profile
from support.realnode import (
    DEVICES,
    SHARED_SELECTOR,
    Installed,
    OnNode,
    busybox_pod,
    limits,
    pod_processes,
    pod_ready,
    serial_profile,
    wait_for,
)

from patchbay_devcluster import DevCluster


def _holder(name: str, node: str, fake_dev: Path) -> dict[str, Any]:
    """A pod whose container prints its devices at every start and then sleeps; restarted by the
    kubelet when it dies (restartPolicy Always), as a workload's pods are."""
    pod = busybox_pod(name, node, f"echo START SERIALS=$SERIALS; ls {fake_dev}; sleep 3600")
    pod["spec"]["restartPolicy"] = "Always"
    return pod


def _running_again(core: client.CoreV1Api, ns: str, name: str, restarts: int) -> str | None:
    """The current container's log once the pod runs with more than `restarts` restarts."""
    pod = core.read_namespaced_pod(name, ns)
    statuses = pod.status.container_statuses or []
    if pod.status.phase != "Running" or not statuses or not statuses[0].ready:
        return None
    if statuses[0].restart_count <= restarts:
        return None
    text = str(core.read_namespaced_pod_log(name, ns))
    return text if "START SERIALS=" in text else None


def _waiting_reason(core: client.CoreV1Api, ns: str, name: str) -> str:
    """What the pod's container is doing, for a timeout's message."""
    pod = core.read_namespaced_pod(name, ns)
    statuses = pod.status.container_statuses or []
    if not statuses:
        return f"phase {pod.status.phase}, no container status: {pod.status.conditions}"
    c = statuses[0]
    return (
        f"phase {pod.status.phase} ({pod.status.reason}: {pod.status.message}), ready {c.ready}, "
        f"restarts {c.restart_count}, state {c.state}, last state {c.last_state}"
    )


def _kill(e2e_cluster: DevCluster, pod: client.V1Pod) -> None:
    """SIGKILL every process of the pod but its pause: its containers die, the pod stays."""
    for pid in pod_processes(e2e_cluster, pod):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _empty(directory: Path) -> list[str]:
    """Remove Patchbay's spec files from the CDI directory (what a reboot does to all of them; the
    machine's directory may hold other vendors' specs, which stay)."""
    names = sorted(p.name for p in directory.glob("patchbay_*.json"))
    for name in names:
        (directory / name).unlink()
    return names


def _node_agent(core: client.CoreV1Api, patchbay: Installed, node: str) -> client.V1Pod | None:
    """The node agent pod on `node` (None between one pod and the next)."""
    pods = core.list_namespaced_pod(patchbay.namespace, label_selector=SHARED_SELECTOR).items
    live = [p for p in pods if p.spec.node_name == node and not p.metadata.deletion_timestamp]
    return live[0] if len(live) == 1 else None


def _restarted(now: client.V1Pod, before: client.V1Pod) -> bool:
    """The same pod, its container started again since `before`."""
    counts = [c.restart_count for c in (now.status.container_statuses or [])]
    was = [c.restart_count for c in (before.status.container_statuses or [])]
    return bool(counts) and counts != was


def _scenario(
    patchbay: Installed,
    cluster: Cluster,
    e2e_cluster: DevCluster,
    node: str,
    namespace: str,
    fake_dev: Path,
    *,
    with_kubelet: bool,
) -> None:
    core, custom = cluster.core, cluster.custom
    cdi_dir = e2e_cluster.real_node().paths.cdi_spec_dir
    kind = f"{cluster.tag}.e2e.patchbay.dev/serial"
    serial, resource = serial_profile(cluster, fake_dev, node, cdi_kind=kind, agent=None)
    dra, _dra_resource, driver = dra_profile(cluster, fake_dev, node, own_agent=False)
    try:
        wait_for(
            "the serial adapters on the node",
            lambda: cluster.values(node, resource) == (str(DEVICES),) * 2,
            120,
        )
        claim_template(custom, namespace, "reboot-serial", driver)
        core.create_namespaced_pod(namespace, limits(_holder("dp-holder", node, fake_dev), resource, 1))
        dra_pod = _holder("dra-holder", node, fake_dev)
        dra_pod["spec"]["resourceClaims"] = [{"name": "serial", "resourceClaimTemplateName": "reboot-serial"}]
        dra_pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "serial"}]}
        core.create_namespaced_pod(namespace, dra_pod)
        before = {}
        for pod in ("dp-holder", "dra-holder"):
            before[pod] = wait_for(
                f"{pod} running", lambda pod=pod: _running_again(core, namespace, pod, -1), 120
            )
        # This test's spec files: the device plugin's, and the one claim's (other tests' files
        # stay behind in the directory: a spec outlives its profile, docs/cdi.md).
        dp_spec = f"patchbay_{resource.replace('/', '_')}.json"
        claim_specs = [p.name for p in cdi_dir.glob(f"patchbay_{driver}_*.json")]
        assert len(claim_specs) == 1, claim_specs
        owned = sorted([dp_spec, *claim_specs])
        assert (cdi_dir / dp_spec).exists(), sorted(p.name for p in cdi_dir.iterdir())
        agent = _node_agent(core, patchbay, node)
        assert agent is not None
        holders = [core.read_namespaced_pod(p, namespace) for p in ("dp-holder", "dra-holder")]

        if with_kubelet:
            # The kubelet goes too (its in-memory state with it) while the directory is emptied
            # and the agent dies; the holders' containers keep running through it (a kubelet
            # re-admits the pods it finds at start, and a pod whose device plugin has not
            # registered again by then fails admission: docs/cdi.md#reboots).
            e2e_cluster.stop_kubelet()
            emptied = _empty(cdi_dir)
            _kill(e2e_cluster, agent)
            e2e_cluster.start_kubelet()
            e2e_cluster.wait_real_node_ready(120)
        else:
            emptied = _empty(cdi_dir)
            core.delete_namespaced_pod(agent.metadata.name, agent.metadata.namespace, grace_period_seconds=5)
        wait_for(
            "the node agent Ready again",
            lambda: (
                (p := _node_agent(core, patchbay, node)) is not None
                and pod_ready(p)
                and (p.metadata.uid != agent.metadata.uid or _restarted(p, agent))
            ),
            120,
        )
        # Every spec it owns is back by the time it is Ready: the kubelet can start a holder's
        # container again at any moment, with the CDI names it kept.
        back = sorted(p.name for p in cdi_dir.glob("patchbay_*.json"))
        assert set(owned) <= set(back), (owned, back)
        for pod in holders:
            _kill(e2e_cluster, pod)
        assert set(owned) <= set(emptied), (owned, emptied)

        for pod in ("dp-holder", "dra-holder"):
            text = wait_for(
                f"{pod} running again with its devices",
                lambda pod=pod: _running_again(core, namespace, pod, 0),
                240,
                detail=lambda pod=pod: _waiting_reason(core, namespace, pod),
            )
            assert text.splitlines()[0] == before[pod].splitlines()[0], (pod, before[pod], text)
        assert set(owned) <= {p.name for p in cdi_dir.glob("patchbay_*.json")}
    finally:
        for pod in ("dp-holder", "dra-holder"):
            core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
        wait_for(
            "the claim's CDI spec removed", lambda: not list(cdi_dir.glob(f"patchbay_{driver}_*.json")), 120
        )
        custom.delete_namespaced_custom_object(
            RESOURCE_GROUP, RESOURCE_VERSION, namespace, "resourceclaimtemplates", "reboot-serial"
        )
        cluster.delete_profile(serial)
        cluster.delete_profile(dra)
        cluster.set_labels(node, {"patchbay.dev/e2e-plugin": None, "patchbay.dev/e2e-dra": None})


def test_holders_run_again_after_the_cdi_directory_was_emptied_and_the_agent_restarted(
    on_node: OnNode,
) -> None:
    _scenario(*on_node, with_kubelet=False)


def test_holders_run_again_after_the_same_with_a_kubelet_restart(
    on_node: OnNode,
) -> None:
    _scenario(*on_node, with_kubelet=True)
