"""The agent on the REAL kubelet: registration, capacity on the node, a pod that gets 2 devices,
a kubelet restart, and a device that disappears and comes back.

The devices are a FAKE hardware tree: character device nodes (major 1, minor 3: the null
device) named ttyUSB0..3 under a temporary host root. Everything else is real: the agent
process, the kubelet's device manager, containerd and runc creating the device nodes in the
container.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from e2ehelpers import add_fake_device, busybox_pod, fake_device_tree, host_agent, wait_for
from kubernetes import client

from patchbay_devcluster import DevCluster

RESOURCE = "e2e.patchbay.dev/serial"
DEVICES = 4


def allocatable(core: client.CoreV1Api, node: str) -> tuple[str | None, str | None]:
    st = core.read_node_status(node).status
    return (st.capacity or {}).get(RESOURCE), (st.allocatable or {}).get(RESOURCE)


@pytest.fixture
def fake_tree(tmp_path: Path) -> Path:
    return fake_device_tree(tmp_path / "host", [f"ttyUSB{i}" for i in range(DEVICES)])


@pytest.fixture
def agent(real_node: str, fake_tree: Path, tmp_path: Path) -> Iterator[Path]:
    config = {
        "resourceName": RESOURCE,
        "plugin": {
            "discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}},
            "health": {"periodSeconds": 1, "failureThreshold": 1, "successThreshold": 1},
            "allocation": {"permissions": "rw", "devicesEnvName": "PATCHBAY_DEVICES", "envs": {"E2E": "yes"}},
        },
    }
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(yaml.safe_dump(config))
    with host_agent(cfg, real_node, fake_tree, tmp_path / "agent.log"):
        yield fake_tree


def test_pod_gets_exactly_its_two_devices(
    api: client.ApiClient, devcluster: DevCluster, real_node: str, agent: Path, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    wait_for("capacity on the node", lambda: allocatable(core, real_node) == (str(DEVICES), str(DEVICES)), 60)
    pod = busybox_pod(
        "two-devices",
        real_node,
        "echo DEVICES=$PATCHBAY_DEVICES; echo E2E=$E2E; ls /dev | grep ttyUSB; sleep 3600",
    )
    pod["spec"]["containers"][0]["resources"] = {"limits": {RESOURCE: "2"}, "requests": {RESOURCE: "2"}}
    core.create_namespaced_pod(namespace, pod)
    wait_for(
        "pod Running",
        lambda: core.read_namespaced_pod("two-devices", namespace).status.phase == "Running",
        120,
    )

    def output() -> str | None:
        text: str = core.read_namespaced_pod_log("two-devices", namespace)
        return text if "ttyUSB" in text else None

    logs = wait_for("pod output", output, 30)
    lines = logs.splitlines()
    ids = sorted(lines[0].removeprefix("DEVICES=").split(","))
    assert len(ids) == 2, logs
    assert lines[1] == "E2E=yes"
    # The container holds exactly the allocated device nodes, and the IDs name them.
    assert sorted(line for line in lines[2:] if line.startswith("ttyUSB")) == ids, logs


def test_kubelet_restart_and_device_loss_recover_without_restarting_the_agent(
    api: client.ApiClient, devcluster: DevCluster, real_node: str, agent: Path
) -> None:
    core = client.CoreV1Api(api)
    full = (str(DEVICES), str(DEVICES))
    wait_for("capacity on the node", lambda: allocatable(core, real_node) == full, 60)

    devcluster.stop_kubelet()
    devcluster.start_kubelet()
    devcluster.wait_real_node_ready(120)
    wait_for("re-registered after the kubelet restart", lambda: allocatable(core, real_node) == full, 60)

    (agent / "dev" / "ttyUSB3").unlink()
    wait_for(
        "allocatable drops when a device file disappears",
        lambda: allocatable(core, real_node) == (str(DEVICES), str(DEVICES - 1)),
        60,
    )
    add_fake_device(agent, "ttyUSB3")
    wait_for("allocatable recovers", lambda: allocatable(core, real_node) == full, 60)
