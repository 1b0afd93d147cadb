"""The chart's options for clusters that differ from the defaults, each proven on the real node,
and its replicas: the session installs the chart with its DEFAULT values (but the images), so
these tests upgrade the release with one option each and put the defaults back afterwards.

- ``operator.hostNetwork`` with ``apiServer``: the operator on the node's network, reaching the
  API server at an address given as a value (clusters without kube-proxy);
- ``agent.apiServer``: the agents reach the API server at an address given as a value instead of
  the ``kubernetes`` Service;
- ``operator.replicas: 2``: two operator pods (which the defaults allow here: no host port to
  share), one working; deleting the working one in the middle of a profile change, the other
  finishes it; deleting it while a staged rollout's canary wave is held for its gate, the other
  resumes the rollout from the profile's status and completes it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from support.clusters import Cluster
from support.realnode import DEVICES, Installed, serial_profile, served, staged_serial, wait_for

from patchbay_api.revisions import spec_revision
from patchbay_devcluster import DevCluster
from patchbay_devcluster.cluster import RELAY_PORT
from patchbay_devcluster.install import helm_install
from patchbay_devcluster.node import NODE_IP
from patchbay_devcluster.procs import free_port


@pytest.fixture(scope="module")
def upgrade(patchbay: Installed, e2e_cluster: DevCluster) -> Iterator[Any]:
    """``upgrade(values)`` upgrades the release with those values over the session's (not over
    another test's: ``helm upgrade`` without ``--reuse-values``); the release is put back as the
    session installed it once, after the module's last test, its operator Ready (each test
    upgrades it first thing, so putting it back between them would only roll the operator twice)."""

    def apply(values: dict[str, Any]) -> None:
        helm_install(e2e_cluster, patchbay.release.chart, patchbay.images, values)

    try:
        yield apply
    finally:
        helm_install(e2e_cluster, patchbay.release.chart, patchbay.images)
        wait_for("the operator back as installed, Ready", patchbay.operator_ready, 180)


def _env(pod: client.V1Pod) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env or [] if e.value is not None}


def _static(cluster: Cluster, node: str, count: int) -> tuple[str, str]:
    name, resource = f"{cluster.prefix}dongle", f"e2e.patchbay.dev/{cluster.tag}-dongle"
    cluster.set_labels(node, {"patchbay.dev/e2e-static": cluster.tag})
    cluster.create_profile(
        name,
        {
            "resourceName": resource,
            "mode": "Static",
            "nodeSelector": {"matchLabels": {"patchbay.dev/e2e-static": cluster.tag}},
            "static": {"capacity": count},
        },
    )
    return name, resource


def test_the_operator_on_the_nodes_network_with_the_api_server_as_a_value(
    patchbay: Installed, cluster: Cluster, e2e_cluster: DevCluster, real_node: str, upgrade: Any
) -> None:
    port = e2e_cluster.state().ports["apiserver"]
    upgrade(
        {
            "operator": {"hostNetwork": True, "healthPort": free_port()},
            "metrics": {"port": free_port()},
            "apiServer": {"host": "127.0.0.1", "port": port},
        }
    )
    pod = wait_for(
        "the operator Ready on the node's network",
        lambda: (p := patchbay.operator_ready()) is not None and p.spec.host_network and p,
        180,
    )
    env = _env(pod)
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("127.0.0.1", str(port))
    name, resource = _static(cluster, real_node, 3)
    try:
        wait_for(
            "the operator's capacity on the node",
            lambda: cluster.values(real_node, resource) == ("3", "3"),
            90,
        )
        assert patchbay.operator_stats(), "the operator's /metrics on the node's 127.0.0.1"
    finally:
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-static": None})


def test_agents_reach_the_api_server_at_an_address_given_as_a_value(
    patchbay: Installed, cluster: Cluster, real_node: str, fake_dev: Any, upgrade: Any
) -> None:
    """The relay also answers the bridge's address and the Service's port given literally."""
    upgrade({"agent": {"apiServer": {"host": NODE_IP, "port": RELAY_PORT}}})
    name, _resource = serial_profile(cluster, fake_dev, real_node)
    try:
        (agent,) = wait_for("the agent pod Ready", lambda: patchbay.ready_agents(name), 120)
        env = _env(agent)
        assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == (NODE_IP, str(RELAY_PORT))

        def reported() -> dict[str, Any] | None:
            st = (cluster.profile(name) or {}).get("status") or {}
            devices = st.get("devices") or {}
            return st if devices.get("healthy") == DEVICES else None

        wait_for("the agent's DeviceReport counted", reported, 90)
    finally:
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-plugin": None})


def _working(patchbay: Installed, pods: list[client.V1Pod]) -> client.V1Pod | None:
    """The replica whose last peering verdict is Working (its log says so)."""
    working = []
    for pod in pods:
        log = str(patchbay.core.read_namespaced_pod_log(pod.metadata.name, patchbay.namespace))
        verdicts = [
            line
            for line in log.splitlines()
            if "Working: no live peer" in line or "Waiting: live peers" in line
        ]
        if verdicts and "Working:" in verdicts[-1]:
            working.append(pod)
    return working[0] if len(working) == 1 else None


def _two_ready(patchbay: Installed) -> list[client.V1Pod] | None:
    pods = [p for p in patchbay.operator_pods() if not p.metadata.deletion_timestamp]
    ready = [
        p for p in pods if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    ]
    return ready if len(ready) == 2 else None


def test_two_replicas_and_the_standby_finishes_a_change_and_a_rollout_the_working_one_left(
    patchbay: Installed, cluster: Cluster, real_node: str, fake_dev: Path, upgrade: Any
) -> None:
    upgrade({"operator": {"replicas": 2}})
    pods = wait_for("two operator pods Ready", lambda: _two_ready(patchbay), 180)
    active = wait_for("one replica working", lambda: _working(patchbay, pods), 90)
    name, resource = _static(cluster, real_node, 2)
    try:
        wait_for("capacity 2 on the node", lambda: cluster.values(real_node, resource) == ("2", "2"), 90)
        # A change, and the working replica goes at once (SIGTERM, as a drain or an upgrade).
        cluster.patch_spec(name, {"static": {"capacity": 5}})
        patchbay.core.delete_namespaced_pod(active.metadata.name, patchbay.namespace)
        t0 = time.monotonic()
        wait_for(
            "the other replica finishing the change",
            lambda: cluster.values(real_node, resource) == ("5", "5"),
            150,
            detail=lambda: str(cluster.profile(name)),
        )
        took = time.monotonic() - t0

        def current() -> bool:
            obj = cluster.profile(name) or {}
            return bool((obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"])

        wait_for("the profile's status observing the change", current, 60)
        print(f"standby finished the change {took:.1f} s after the working replica was deleted")
    finally:
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-static": None})
    _takeover_mid_rollout(patchbay, cluster, real_node, fake_dev)


def _takeover_mid_rollout(patchbay: Installed, cluster: Cluster, real_node: str, fake_dev: Path) -> None:
    """A staged rollout whose canary wave (the real node) is held for its gate when the working
    replica is deleted: the other replica resumes it from the profile's status, holds the rest of
    the gate and completes it; the node never leaves the update revision and keeps every device."""
    ns = patchbay.namespace
    rollout_spec = {"healthySeconds": 25, "progressDeadlineSeconds": 300}
    with staged_serial(cluster, fake_dev, real_node, ns, "takeover", rollout_spec) as (name, resource, _):
        # Both replicas up (the one deleted above replaced) and the working one known BEFORE the
        # change: waiting for them after it let the 25 s gate pass first under load (the rollout
        # Complete, nothing left to take over).
        pods = wait_for("two operator pods Ready", lambda: _two_ready(patchbay), 180)
        active = wait_for("one replica working", lambda: _working(patchbay, pods), 90)
        # A good change (a second glob; the same devices), so a real wave with a real gate.
        globs = [f"{fake_dev}/ttyE2E*", f"{fake_dev}/takeover-none*"]
        cluster.patch_spec(name, {"plugin": {"discovery": {"paths": {"globs": globs}}}})
        update = spec_revision((cluster.profile(name) or {})["spec"])

        def rollout() -> dict[str, Any]:
            return dict(((cluster.profile(name) or {}).get("status") or {}).get("rollout") or {})

        wait_for("the canary serving the update", lambda: served(cluster, ns, name, real_node) == update, 120)

        def progressing() -> bool:
            status = (cluster.profile(name) or {}).get("status") or {}
            on_update = status.get("updateRevision") == f"{name}-{update}"
            return on_update and (status.get("rollout") or {}).get("phase") == "Progressing"

        # Still held for its gate (25 s); the status is written through the operator's debounce
        # (1 s), so it may say so a moment after the node serves the update.
        wait_for("the rollout Progressing on the update", progressing, 10, detail=lambda: str(rollout()))
        patchbay.core.delete_namespaced_pod(active.metadata.name, ns)
        t0 = time.monotonic()

        def complete() -> dict[str, Any] | None:
            status = (cluster.profile(name) or {}).get("status") or {}
            done = status.get("currentRevision") == f"{name}-{update}"
            return status if done and (status.get("rollout") or {}).get("phase") == "Complete" else None

        wait_for("the other replica completing the rollout", complete, 240, detail=lambda: str(rollout()))
        took = time.monotonic() - t0
        assert served(cluster, ns, name, real_node) == update
        assert cluster.values(real_node, resource) == (str(DEVICES), str(DEVICES))
        print(f"rollout resumed and completed {took:.1f} s after the working replica was deleted mid-gate")
