"""`make demo`: a local cluster with a real node and kwok nodes, the operator, two profiles from
examples/, a pod using each, and a summary of what the scheduler and the pods really saw.

Everything is real (etcd, API server, controllers, scheduler, kubelet, containerd, runc, the
operator, the agent) except the hardware: the serial adapters are FAKE character devices
(mknod 1,3, the null device) under the cluster's state directory.

There is no image registry here, so the agent DaemonSet the operator creates cannot start its
pod (imagePullPolicy Never: ErrImageNeverPull, and nothing reaches for the network). The demo
runs the very same agent as a host process with the config the operator rendered into the
ConfigMap, which is what the DaemonSet's pod would run.

`make demo-down` (`hack/demo.py down`) stops the operator and the agent by PID, then the cluster.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from patchbay_devcluster import DevCluster, default_state_dir, find_bin_dir
from patchbay_devcluster.cluster import Proc, stop_pid
from patchbay_devcluster.images import BUSYBOX_IMAGE

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "patchbay-system"
STATIC = REPO / "examples" / "static-dongles.yaml"
PLUGIN = REPO / "examples" / "deviceplugin-serial.yaml"
KWOK_NODES = 5


def step(text: str) -> None:
    print(f"\n\033[1m==> {text}\033[0m", flush=True)


def wait_for(what: str, check: Callable[[], Any], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise SystemExit(f"demo: timed out after {timeout:.0f}s waiting for {what}")


def spawn(state: Path, name: str, argv: list[str]) -> dict[str, Any]:
    log = (state / "logs" / f"demo-{name}.log").open("ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return {"name": name, "pid": proc.pid, "binary": argv[0], "log": log.name}


def load_yaml(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


def up(cluster: DevCluster) -> None:
    step(f"Local cluster: control plane, the real node 'localhost', {KWOK_NODES} kwok nodes")
    cluster.up(nodes=KWOK_NODES, real_node=True, timeout=180)
    state = cluster.dir
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    core, custom, ext = client.CoreV1Api(api), client.CustomObjectsApi(api), client.ApiextensionsV1Api(api)
    procs: list[dict[str, Any]] = []

    step("The DevicePluginProfile CRD and the operator (a host process with the admin kubeconfig)")
    for crd in sorted((REPO / "crds").glob("*.yaml")):
        body = load_yaml(crd)
        try:
            ext.create_custom_resource_definition(body)
        except ApiException as e:
            if e.status != 409:
                raise
    wait_for(
        "the CRD",
        lambda: _served(custom),
        60,
    )
    try:
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    except ApiException as e:
        if e.status != 409:
            raise
    procs.append(
        spawn(
            state,
            "operator",
            [
                sys.executable,
                "-m",
                "patchbay_operator.main",
                "--kubeconfig",
                str(cluster.kubeconfig),
                "--namespace",
                NAMESPACE,
                "--status-debounce",
                "0.5",
            ],
        )
    )
    (state / "demo.json").write_text(json.dumps(procs))

    step("Static: 4 example.com/dongle on every node labelled example.com/dongle-port=true")
    for node in ["localhost", "kwok-node-0", "kwok-node-1", "kwok-node-2"]:
        labels = {"example.com/dongle-port": "true"}
        if node == "kwok-node-2":
            labels["example.com/dongles"] = "2"  # a per-node count from a label
        core.patch_node(node, {"metadata": {"labels": labels}})
    _apply(custom, load_yaml(STATIC))
    wait_for(
        "dongles on localhost",
        lambda: (
            (core.read_node_status("localhost").status.allocatable or {}).get("example.com/dongle") == "4"
        ),
    )

    step("DevicePlugin: /dev/ttyUSB* serial adapters (FAKE character devices) on localhost")
    tree = state / "fake-host"
    (tree / "dev").mkdir(parents=True, exist_ok=True)
    (tree / "sys").mkdir(exist_ok=True)
    for i in range(4):
        dev = tree / "dev" / f"ttyUSB{i}"
        if not dev.exists():
            os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))
    core.patch_node("localhost", {"metadata": {"labels": {"example.com/serial": "present"}}})
    plugin = load_yaml(PLUGIN)
    plugin["spec"].setdefault("agent", {})["imagePullPolicy"] = "Never"  # no registry here
    _apply(custom, plugin)
    name = plugin["metadata"]["name"]
    cm = wait_for(
        "the agent ConfigMap the operator renders",
        lambda: _get(lambda: core.read_namespaced_config_map(f"patchbay-{name}", NAMESPACE)),
    )
    agent_config = state / "agent-config.yaml"
    agent_config.write_text(next(iter(cm.data.values())))
    procs.append(
        spawn(
            state,
            "agent",
            [
                sys.executable,
                "-m",
                "patchbay_agent.main",
                "--config",
                str(agent_config),
                "--node-name",
                "localhost",
                "--host-root",
                str(tree),
                "--host-path-prefix",
                str(tree),
                "--http-address",
                "off",
            ],
        )
    )
    (state / "demo.json").write_text(json.dumps(procs))
    wait_for(
        "serial adapters on localhost",
        lambda: (
            (core.read_node_status("localhost").status.allocatable or {}).get("example.com/serial") == "4"
        ),
    )

    step("Pods that use them (busybox on the real node)")
    pods = {
        "uses-dongle": ("example.com/dongle", 1, "echo dongles granted; sleep 3600"),
        "uses-serial": (  # its devices env and the device nodes in its /dev
            "example.com/serial",
            2,
            "echo PATCHBAY_DEVICES=$PATCHBAY_DEVICES SERIAL_BAUD=$SERIAL_BAUD; "
            "ls /dev | grep ttyUSB; sleep 3600",
        ),
    }
    for pod, (resource, count, script) in pods.items():
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod},
            "spec": {
                "hostNetwork": True,
                "nodeSelector": {"kubernetes.io/hostname": "localhost"},
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "main",
                        "image": BUSYBOX_IMAGE,
                        "command": ["sh", "-c", script],
                        "resources": {"limits": {resource: str(count)}},
                    }
                ],
            },
        }
        try:
            core.create_namespaced_pod("default", body)
        except ApiException as e:
            if e.status != 409:
                raise
        wait_for(
            f"pod {pod} Running",
            lambda p=pod: core.read_namespaced_pod(p, "default").status.phase == "Running",
        )
    time.sleep(2)  # the profiles' debounced status
    summary(cluster, core)


def _served(custom: client.CustomObjectsApi) -> bool:
    try:
        custom.list_cluster_custom_object("patchbay.dev", "v1alpha1", "devicepluginprofiles")
    except ApiException:
        return False
    return True


def _get(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def _apply(custom: client.CustomObjectsApi, body: dict[str, Any]) -> None:
    custom.patch_cluster_custom_object(
        "patchbay.dev",
        "v1alpha1",
        "devicepluginprofiles",
        body["metadata"]["name"],
        body,
        field_manager="patchbay-demo",
        force=True,
        _content_type="application/apply-patch+yaml",
    )


def summary(cluster: DevCluster, core: client.CoreV1Api) -> None:
    kubectl = [str(find_bin_dir() / "kubectl"), "--kubeconfig", str(cluster.kubeconfig)]
    step("kubectl get dpp")
    subprocess.run([*kubectl, "get", "dpp"], check=False)
    step("What the scheduler sees: capacity/allocatable per node")
    print(f"{'NODE':<14} {'example.com/dongle':>20} {'example.com/serial':>20}")
    for node in core.list_node().items:
        cap, alloc = node.status.capacity or {}, node.status.allocatable or {}
        cells = [
            f"{alloc.get(r, '-')}/{cap.get(r, '-')}" for r in ("example.com/dongle", "example.com/serial")
        ]
        print(f"{node.metadata.name:<14} {cells[0]:>20} {cells[1]:>20}")
    step("What each pod received")
    for pod in ("uses-dongle", "uses-serial"):
        print(f"--- {pod}:")
        print(core.read_namespaced_pod_log(pod, "default").rstrip())
    step("Done")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    print("The serial profile's agent DaemonSet cannot pull an image here (no registry): its pod shows")
    print("ErrImageNeverPull and the profile counts 0 agents available; the agent serving the node")
    print("runs as a host process with the operator's rendered config. Stop everything: make demo-down")


def down(cluster: DevCluster) -> None:
    record = cluster.dir / "demo.json"
    if record.exists():
        for p in json.loads(record.read_text()):
            if stop_pid(Proc(**p), grace=10):
                print(f"stopped {p['name']} (pid {p['pid']})")
    stopped = cluster.down()
    print("stopped: " + (", ".join(stopped) if stopped else "no cluster was running"))


def main() -> None:
    # The cluster tool reports its progress (each component ready, nodes Ready) through logging.
    logging.basicConfig(level=logging.INFO, format="    %(message)s")
    cluster = DevCluster(default_state_dir())
    if sys.argv[1:] == ["down"]:
        down(cluster)
    elif sys.argv[1:] in ([], ["up"]):
        up(cluster)
    else:
        raise SystemExit("usage: hack/demo.py [up|down]")


if __name__ == "__main__":
    main()
