"""Profiles end to end on the REAL node: the operator, the kubelet, the scheduler and real pods.

Static: the capacity the operator writes is what the scheduler uses (one pod more than the
capacity stays Pending with the scheduler's reason), survives a kubelet restart, and goes with
the profile. DevicePlugin: the agent runs as a host process with the config the operator
rendered into its ConfigMap (no image registry here: the DaemonSet's pod cannot start, so its
imagePullPolicy is Never and nothing reaches for the network), over FAKE character devices;
the profile's status shows the device counts and names the node when a device disappears.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2ehelpers import add_fake_device, busybox_pod, fake_device_tree, host_agent, wait_for
from kubernetes import client
from optest import NAMESPACE, Cluster, Operator

from patchbay_devcluster import DevCluster


def limits(pod: dict[str, Any], resource: str, count: int) -> dict[str, Any]:
    pod["spec"]["containers"][0]["resources"] = {"limits": {resource: str(count)}}
    return pod


def pending_reason(core: client.CoreV1Api, ns: str, name: str) -> str | None:
    pod = core.read_namespaced_pod(name, ns)
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return str(c.message)
    return None


def test_static_capacity_is_what_the_scheduler_uses(
    operator: Operator, cluster: Cluster, devcluster: DevCluster, real_node: str, namespace: str
) -> None:
    resource = f"e2e.patchbay.dev/{cluster.tag}-dongle"
    cluster.set_labels(real_node, {"patchbay.dev/e2e-static": cluster.tag})
    try:
        cluster.create_profile(
            f"{cluster.prefix}static",
            {
                "resourceName": resource,
                "mode": "Static",
                "nodeSelector": {"matchLabels": {"patchbay.dev/e2e-static": cluster.tag}},
                "static": {"capacity": 2},
            },
        )
        wait_for("capacity on the real node", lambda: cluster.values(real_node, resource) == ("2", "2"), 60)
        core = cluster.core
        for i in range(3):
            core.create_namespaced_pod(
                namespace, limits(busybox_pod(f"d{i}", real_node, "sleep 3600"), resource, 1)
            )
        wait_for(
            "two pods Running",
            lambda: (
                sum(core.read_namespaced_pod(f"d{i}", namespace).status.phase == "Running" for i in range(3))
                == 2
            ),
            120,
        )
        running = {
            f"d{i}"
            for i in range(3)
            if core.read_namespaced_pod(f"d{i}", namespace).status.phase == "Running"
        }
        (extra,) = {"d0", "d1", "d2"} - running
        message = wait_for("the third pod Unschedulable", lambda: pending_reason(core, namespace, extra), 60)
        assert f"Insufficient {resource}" in message

        # A kubelet that restarts keeps the extended resource the operator set (it has a
        # checkpoint); if anything resets it, the operator re-asserts it.
        devcluster.stop_kubelet()
        devcluster.start_kubelet()
        devcluster.wait_real_node_ready(120)
        wait_for(
            "capacity after the kubelet restart",
            lambda: cluster.values(real_node, resource) == ("2", "2"),
            60,
        )

        cluster.delete_profile(f"{cluster.prefix}static")
        wait_for("profile gone", lambda: cluster.profile(f"{cluster.prefix}static") is None, 60)
        assert cluster.values(real_node, resource) == (None, None)
    finally:
        cluster.set_labels(real_node, {"patchbay.dev/e2e-static": None})


@pytest.fixture
def fake_tree(tmp_path: Path) -> Path:
    return fake_device_tree(tmp_path / "host", [f"ttyE2E{i}" for i in range(4)])


@pytest.fixture
def plugin_profile(
    operator: Operator, cluster: Cluster, real_node: str, fake_tree: Path, tmp_path: Path
) -> Iterator[tuple[str, str]]:
    """A DevicePlugin profile on the real node, and the agent running with its rendered config."""
    name = f"{cluster.prefix}serial"
    resource = f"e2e.patchbay.dev/{cluster.tag}-serial"
    cluster.set_labels(real_node, {"patchbay.dev/e2e-plugin": cluster.tag})
    cluster.create_profile(
        name,
        {
            "resourceName": resource,
            "mode": "DevicePlugin",
            "nodeSelector": {"matchLabels": {"patchbay.dev/e2e-plugin": cluster.tag}},
            "plugin": {
                "discovery": {"paths": {"globs": ["/dev/ttyE2E*"]}},
                "health": {"periodSeconds": 1, "failureThreshold": 1, "successThreshold": 1},
                "allocation": {"devicesEnvName": "SERIALS"},
            },
            "agent": {"imagePullPolicy": "Never"},
        },
    )
    cm = wait_for(
        "the agent config the operator renders",
        lambda: _configmap(cluster.core, f"patchbay-{name}"),
        60,
    )
    config = tmp_path / "rendered.yaml"
    config.write_text(next(iter(cm.data.values())))
    try:
        with host_agent(config, real_node, fake_tree, tmp_path / "agent.log"):
            yield name, resource
    finally:
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-plugin": None})


def _configmap(core: client.CoreV1Api, name: str) -> Any:
    try:
        return core.read_namespaced_config_map(name, NAMESPACE)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def test_device_plugin_profile_status_follows_the_real_kubelet(
    cluster: Cluster, real_node: str, plugin_profile: tuple[str, str], fake_tree: Path
) -> None:
    name, resource = plugin_profile
    wait_for("devices on the node", lambda: cluster.values(real_node, resource) == ("4", "4"), 60)

    def devices() -> Any:
        st = (cluster.profile(name) or {}).get("status") or {}
        return st.get("devices")

    wait_for("the profile's device counts", lambda: devices() == {"capacity": 4, "allocatable": 4}, 60)

    (fake_tree / "dev" / "ttyE2E2").unlink()
    wait_for(
        "allocatable drops, capacity stays", lambda: cluster.values(real_node, resource) == ("4", "3"), 60
    )

    def degraded_naming_the_node() -> Any:
        st = (cluster.profile(name) or {}).get("status") or {}
        cond = next((c for c in st.get("conditions") or [] if c["type"] == "Degraded"), None)
        named = [p for p in st.get("problems") or [] if p.get("node") == real_node]
        return cond if cond and cond["status"] == "True" and named else None

    cond = wait_for("Degraded naming the node", degraded_naming_the_node, 60)
    assert cond["reason"]

    add_fake_device(fake_tree, "ttyE2E2")
    wait_for("allocatable recovers", lambda: cluster.values(real_node, resource) == ("4", "4"), 60)
    wait_for("the profile's counts recover", lambda: devices() == {"capacity": 4, "allocatable": 4}, 60)
    st = (cluster.profile(name) or {}).get("status") or {}
    assert not [p for p in st.get("problems") or [] if p.get("node") == real_node and "nhealthy" in str(p)]


def test_virtual_tokens_reach_a_pod_through_the_operators_config(
    operator: Operator, cluster: Cluster, real_node: str, namespace: str, tmp_path: Path
) -> None:
    """The virtual backend (countable tokens, no device files) on the real kubelet."""
    name = f"{cluster.prefix}tokens"
    resource = f"e2e.patchbay.dev/{cluster.tag}-token"
    cluster.set_labels(real_node, {"patchbay.dev/e2e-virtual": cluster.tag})
    try:
        cluster.create_profile(
            name,
            {
                "resourceName": resource,
                "mode": "DevicePlugin",
                "nodeSelector": {"matchLabels": {"patchbay.dev/e2e-virtual": cluster.tag}},
                "plugin": {
                    "discovery": {"virtual": {"count": 5}},
                    "allocation": {"devicesEnvName": "TOKENS"},
                },
                "agent": {"imagePullPolicy": "Never"},
            },
        )
        cm = wait_for("the rendered config", lambda: _configmap(cluster.core, f"patchbay-{name}"), 60)
        config = tmp_path / "rendered.yaml"
        config.write_text(next(iter(cm.data.values())))
        tree = fake_device_tree(tmp_path / "host", [])
        with host_agent(config, real_node, tree, tmp_path / "agent.log"):
            wait_for("tokens on the node", lambda: cluster.values(real_node, resource) == ("5", "5"), 60)
            pod = limits(busybox_pod("tokens", real_node, "echo TOKENS=$TOKENS; sleep 3600"), resource, 3)
            cluster.core.create_namespaced_pod(namespace, pod)

            def output() -> str | None:
                if cluster.core.read_namespaced_pod("tokens", namespace).status.phase != "Running":
                    return None
                text = str(cluster.core.read_namespaced_pod_log("tokens", namespace))
                return text if "TOKENS=" in text else None

            tokens = wait_for("the pod's tokens", output, 120).strip().removeprefix("TOKENS=").split(",")
            assert len(tokens) == len(set(tokens)) == 3
            assert all(t.startswith("virtual-") for t in tokens), tokens
    finally:
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-virtual": None})
