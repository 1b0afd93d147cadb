"""The dev cluster's real node: the pinned kubelet runs real containers through containerd + runc."""

from __future__ import annotations

import time
from typing import Any

from e2ehelpers import busybox_pod, wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException

from patchbay_devcluster import DevCluster


def test_real_node_registers_with_its_own_identity(api: client.ApiClient, real_node: str) -> None:
    node = client.CoreV1Api(api).read_node(real_node)
    assert node.status.node_info.kubelet_version == "v1.37.1"
    assert node.status.node_info.container_runtime_version.startswith("containerd://")
    ready = [c for c in node.status.conditions if c.type == "Ready"]
    assert ready[0].status == "True", ready
    # The Node authorizer + NodeRestriction let it register itself; it is not kwok-managed.
    assert "kwok.x-k8s.io/node" not in (node.metadata.annotations or {})
    hostnames = [a.address for a in node.status.addresses if a.type == "Hostname"]
    assert hostnames == ["localhost"]


def test_pod_runs_in_a_real_container_and_logs_come_back_over_loopback(
    api: client.ApiClient, real_node: str, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(
        namespace,
        # The API server turns "$$" into "$" in commands, so the shell sees "$$".
        busybox_pod("hello", real_node, "echo pid=$$$$ ; echo done"),
    )

    def succeeded() -> bool:
        phase = core.read_namespaced_pod("hello", namespace).status.phase
        assert phase != "Failed"
        return phase == "Succeeded"

    wait_for("pod Succeeded", succeeded, 120)
    # kubectl-logs path: API server -> kubelet on localhost:<port> with the CA-signed serving cert.
    logs = core.read_namespaced_pod_log("hello", namespace)
    assert (
        logs.splitlines()[0] == "pid=1"
    )  # PID 1 of its own PID namespace: a real container, not a host process
    assert logs.strip().endswith("done")


def test_killed_kubelet_comes_back_and_running_pods_are_unaffected(
    api: client.ApiClient, devcluster: DevCluster, real_node: str, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(namespace, busybox_pod("sleeper", real_node, "sleep 3600"))

    def running() -> Any:
        pod = core.read_namespaced_pod("sleeper", namespace)
        return pod if pod.status.phase == "Running" else None

    before = wait_for("pod Running", running, 120).status.container_statuses[0]
    devcluster.stop_kubelet()  # SIGKILL: a crash
    devcluster.start_kubelet()
    devcluster.wait_real_node_ready(120)
    # Give the new kubelet a sync to (wrongly) restart anything, then compare.
    time.sleep(3)
    after = running()
    assert after is not None
    status = after.status.container_statuses[0]
    assert status.restart_count == 0
    assert status.container_id == before.container_id
    assert status.state.running.started_at == before.state.running.started_at


def test_unschedulable_request_stays_pending_with_the_schedulers_reason(
    api: client.ApiClient, real_node: str, namespace: str
) -> None:
    """A pod asking for a resource the node lacks is rejected by the real scheduler, not run."""
    core = client.CoreV1Api(api)
    pod = busybox_pod("wants-dongle", real_node, "true")
    pod["spec"]["containers"][0]["resources"] = {
        "requests": {"example.com/nothing": "1"},
        "limits": {"example.com/nothing": "1"},
    }
    core.create_namespaced_pod(namespace, pod)

    def unschedulable() -> str | None:
        try:
            p = core.read_namespaced_pod("wants-dongle", namespace)
        except ApiException:
            return None
        for c in p.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                return str(c.message)
        return None

    message = wait_for("Unschedulable condition", unschedulable, 60)
    assert "Insufficient example.com/nothing" in message


def test_image_pulls_never_leave_the_machine(api: client.ApiClient, real_node: str, namespace: str) -> None:
    """Every registry is mapped to a closed loopback port: a missing image fails fast, locally."""
    core = client.CoreV1Api(api)
    pod = busybox_pod("pull", real_node, "true")
    pod["spec"]["containers"][0]["image"] = "registry.example.com/nothing/here:1.0"
    pod["spec"]["containers"][0]["imagePullPolicy"] = "Always"
    core.create_namespaced_pod(namespace, pod)

    def pull_failed() -> str | None:
        for e in core.list_namespaced_event(namespace, field_selector="involvedObject.name=pull").items:
            if e.reason == "Failed" and "registry.example.com/nothing/here" in (e.message or ""):
                return str(e.message)
        return None

    message = wait_for("pull failure event", pull_failed, 90)
    assert "127.0.0.1:9" in message
