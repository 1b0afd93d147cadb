"""Profiles end to end on the REAL node, on the user's path: the operator is the chart's pod, every
agent is a pod of the DaemonSet the operator renders, the kubelet, the scheduler and real pods.

Static: the capacity the operator writes is what the scheduler uses (one pod more than the
capacity stays Pending with the scheduler's reason), survives a kubelet restart, and goes with
the profile. DevicePlugin: the agent pod finds FAKE character devices under the machine's /dev
through its /host mounts, registers with the real kubelet, turns Ready through its probe; the
profile reports its agents and devices and kstatus says Current; a workload pod gets exactly its
device nodes and envs; a vanished device shows in the status with the node; a kubelet restart is
survived without restarting the agent.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from kubernetes import client
from support.clusters import Cluster
from support.realnode import (
    DEVICES,
    Installed,
    OnNode,
    add_fake_device,
    busybox_pod,
    kstatus,
    limits,
    pod_log,
    serial_profile,
    unschedulable,
    wait_for,
)

from patchbay_devcluster import DevCluster


def test_static_capacity_is_what_the_scheduler_uses(
    patchbay: Installed, cluster: Cluster, e2e_cluster: DevCluster, real_node: str, namespace: str
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
        message = wait_for("the third pod Unschedulable", lambda: unschedulable(core, namespace, extra), 60)
        assert f"Insufficient {resource}" in message

        # A kubelet that restarts keeps the extended resource the operator set (it has a
        # checkpoint); if anything resets it, the operator re-asserts it.
        e2e_cluster.stop_kubelet()
        e2e_cluster.start_kubelet()
        e2e_cluster.wait_real_node_ready(120)
        wait_for(
            "capacity after the kubelet restart",
            lambda: cluster.values(real_node, resource) == ("2", "2"),
            60,
        )
        wait_for("the operator pod Ready again", patchbay.operator_ready, 120)

        cluster.delete_profile(f"{cluster.prefix}static")
        wait_for("profile gone", lambda: cluster.profile(f"{cluster.prefix}static") is None, 60)
        assert cluster.values(real_node, resource) == (None, None)
    finally:
        cluster.set_labels(real_node, {"patchbay.dev/e2e-static": None})


def test_device_plugin_profile_runs_its_agent_pod_and_a_pod_gets_exactly_its_devices(
    patchbay: Installed, cluster: Cluster, real_node: str, namespace: str, fake_dev: Path
) -> None:
    name, resource = serial_profile(cluster, fake_dev, real_node)
    try:
        (agent,) = wait_for("the agent pod Ready (registered)", lambda: patchbay.ready_agents(name), 120)
        assert agent.spec.node_name == real_node
        assert not agent.spec.host_network, "the agent runs on the pod network"
        sc = agent.spec.containers[0].security_context
        assert sc.read_only_root_filesystem and sc.capabilities.drop == ["ALL"] and not sc.privileged
        full = (str(DEVICES), str(DEVICES))
        wait_for("devices on the node", lambda: cluster.values(real_node, resource) == full, 60)

        def current() -> dict[str, Any] | None:
            obj = cluster.profile(name) or {}
            st = obj.get("status") or {}
            good = st.get("nodes") == {"desired": 1, "ready": 1} and devices_are_full(st)
            return obj if good and kstatus(obj) == "Current" else None

        wait_for("the profile: agents 1/1, devices 4/4, kstatus Current", current, 60)

        pod = busybox_pod(
            "two-devices", real_node, f"echo SERIALS=$SERIALS; echo E2E=$E2E; ls {fake_dev}; sleep 3600"
        )
        core = cluster.core
        core.create_namespaced_pod(namespace, limits(pod, resource, 2))
        logs = wait_for("the pod's output", lambda: pod_log(core, namespace, "two-devices", "E2E="), 120)
        lines = logs.splitlines()
        ids = sorted(lines[0].removeprefix("SERIALS=").split(","))
        assert len(ids) == 2, logs
        assert lines[1] == "E2E=yes"
        # The container holds exactly the allocated device nodes, and the IDs name them.
        nodes = sorted(line for line in lines[2:] if line.startswith("ttyE2E"))
        assert len(nodes) == 2, logs
        assert [i.rsplit("_", 1)[-1] for i in ids] == nodes, logs
    finally:
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-plugin": None})


def devices_are_full(status: dict[str, Any]) -> bool:
    """The node reports all devices, the agents call every one healthy, and none is in use."""
    want = {"capacity": DEVICES, "allocatable": DEVICES, "healthy": DEVICES, "unhealthy": 0}
    return want.items() <= (status.get("devices") or {}).items()


def test_vanished_device_and_kubelet_restart_with_the_agent_pod(
    patchbay: Installed, cluster: Cluster, e2e_cluster: DevCluster, real_node: str, fake_dev: Path
) -> None:
    name, resource = serial_profile(cluster, fake_dev, real_node)
    try:
        (agent,) = wait_for("the agent pod Ready", lambda: patchbay.ready_agents(name), 120)
        full = (str(DEVICES), str(DEVICES))
        wait_for("devices on the node", lambda: cluster.values(real_node, resource) == full, 60)

        (fake_dev / "ttyE2E2").unlink()
        wait_for(
            "allocatable drops, capacity stays",
            lambda: cluster.values(real_node, resource) == (str(DEVICES), str(DEVICES - 1)),
            60,
        )

        def degraded_naming_the_node() -> Any:
            st = (cluster.profile(name) or {}).get("status") or {}
            cond = next((c for c in st.get("conditions") or [] if c["type"] == "Degraded"), None)
            named = [p for p in st.get("problems") or [] if p.get("node") == real_node]
            return cond if cond and cond["status"] == "True" and named else None

        assert wait_for("Degraded naming the node", degraded_naming_the_node, 60)["reason"]
        add_fake_device(fake_dev, "ttyE2E2")
        wait_for("allocatable recovers", lambda: cluster.values(real_node, resource) == full, 60)

        # The kubelet restarts (a crash): it wipes the plugin directory; the agent pod notices,
        # serves a fresh socket and registers again, without restarting.
        e2e_cluster.stop_kubelet()
        e2e_cluster.start_kubelet()
        e2e_cluster.wait_real_node_ready(120)
        wait_for("devices after the kubelet restart", lambda: cluster.values(real_node, resource) == full, 60)
        (after,) = wait_for("the agent pod Ready again", lambda: patchbay.ready_agents(name), 120)
        assert after.metadata.uid == agent.metadata.uid
        assert after.status.container_statuses[0].restart_count == 0
        wait_for(
            "the profile's counts recover",
            lambda: devices_are_full((cluster.profile(name) or {}).get("status") or {}),
            60,
        )
    finally:
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-plugin": None})


def test_virtual_tokens_reach_a_pod_through_the_agent_pod(
    patchbay: Installed, cluster: Cluster, real_node: str, namespace: str
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
            },
        )
        wait_for("tokens on the node", lambda: cluster.values(real_node, resource) == ("5", "5"), 120)
        pod = limits(busybox_pod("tokens", real_node, "echo TOKENS=$TOKENS; sleep 3600"), resource, 3)
        cluster.core.create_namespaced_pod(namespace, pod)
        out = wait_for("the pod's tokens", lambda: pod_log(cluster.core, namespace, "tokens", "TOKENS="), 120)
        tokens = out.strip().removeprefix("TOKENS=").split(",")
        assert len(tokens) == len(set(tokens)) == 3
        assert all(t.startswith("virtual-") for t in tokens), tokens
    finally:
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-virtual": None})


def test_cdi_names_resolve_through_the_spec_the_agent_pod_writes(on_node: OnNode) -> None:
    """allocation.cdi on a runtime WITH CDI injection (the node's containerd 2.4): a CDI name that
    resolves nowhere fails the container ("unresolvable CDI devices"), so the pod running at all
    proves the agent pod's spec file resolved it. The spec sits in the node's CDI directory (the
    chart's agent.cdiSpecDir) and names the pod's device with its node; removed, it is written
    again before the next Allocate answers."""
    patchbay, cluster, e2e_cluster, real_node, namespace, fake_dev = on_node
    kind = "e2e.patchbay.dev/serial"
    name, resource = serial_profile(cluster, fake_dev, real_node, suffix="cdi", cdi_kind=kind)
    spec_file = e2e_cluster.real_node().paths.cdi_spec_dir / f"patchbay_{resource.replace('/', '_')}.json"
    core = cluster.core
    try:
        wait_for("the agent pod Ready (registered)", lambda: patchbay.ready_agents(name), 120)
        full = (str(DEVICES), str(DEVICES))
        wait_for("devices on the node", lambda: cluster.values(real_node, resource) == full, 60)
        for pod_name in ("cdi-first", "cdi-second"):
            pod = busybox_pod(pod_name, real_node, f"echo SERIALS=$SERIALS; ls {fake_dev}; sleep 3600")
            core.create_namespaced_pod(namespace, limits(pod, resource, 1))
            logs = wait_for(
                f"{pod_name} running", lambda n=pod_name: pod_log(core, namespace, n, "SERIALS="), 120
            )
            (device,) = logs.splitlines()[0].removeprefix("SERIALS=").split(",")
            assert [line for line in logs.splitlines()[1:] if line.startswith("ttyE2E")] == [
                device.rsplit("_", 1)[-1]
            ], logs
            spec = json.loads(spec_file.read_text())
            assert spec["kind"] == kind
            named = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
            assert len(named) == DEVICES
            host_path = str(fake_dev / device.rsplit("_", 1)[-1])
            assert named[device] == [{"path": host_path, "hostPath": host_path, "permissions": "rw"}]
            # The next pod's CDI name resolves only if the agent writes the spec again.
            spec_file.unlink()
    finally:
        for pod_name in ("cdi-first", "cdi-second"):
            with contextlib.suppress(client.ApiException):
                core.delete_namespaced_pod(pod_name, namespace, grace_period_seconds=0)
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-plugin": None})
