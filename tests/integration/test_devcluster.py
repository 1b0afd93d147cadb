"""Smoke tests of the local cluster: real etcd, API server, controller manager, scheduler and kwok."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.clusters import wait_for

from patchbay_devcluster import DevCluster, kubeapi
from patchbay_devcluster.controlplane import KWOK_TAINT_KEY
from patchbay_devcluster.procs import pid_runs

NODES = 50


def test_readyz_and_version(devcluster: DevCluster) -> None:
    api = devcluster.api()
    status, body = kubeapi.get(api, "/readyz?verbose")
    assert status == 200, body
    assert "readyz check passed" in body
    version = client.VersionApi(api).get_code()
    # The real binaries carry the pinned release's version (ldflags), not v0.0.0.
    assert version.git_version == "v1.37.1", version
    assert version.minor == "37"


def test_crd_applied_and_custom_resource_read_back(api: client.ApiClient, name_prefix: str) -> None:
    ext = client.ApiextensionsV1Api(api)
    custom = client.CustomObjectsApi(api)
    plural = name_prefix.replace("-", "") + "widgets"
    group = "smoke.patchbay.dev"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Cluster",
            "names": {"plural": plural, "singular": plural[:-1], "kind": plural[:-1].capitalize()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {"count": {"type": "integer", "minimum": 0}},
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    ext.create_custom_resource_definition(crd)
    try:

        def established() -> bool:
            got = ext.read_custom_resource_definition(f"{plural}.{group}")
            return any(c.type == "Established" and c.status == "True" for c in (got.status.conditions or []))

        wait_for("CRD Established", established, timeout=30)
        obj = {
            "apiVersion": f"{group}/v1",
            "kind": plural[:-1].capitalize(),
            "metadata": {"name": "one"},
            "spec": {"count": 3},
        }
        wait_for(
            "CR created",
            lambda: _try(lambda: custom.create_cluster_custom_object(group, "v1", plural, obj)),
            timeout=30,
        )
        got = custom.get_cluster_custom_object(group, "v1", plural, "one")
        assert got["spec"] == {"count": 3}
        # The schema is enforced by the real API server.
        bad = {**obj, "metadata": {"name": "two"}, "spec": {"count": -1}}
        with pytest.raises(ApiException) as err:
            custom.create_cluster_custom_object(group, "v1", plural, bad)
        assert err.value.status == 422
        assert "spec.count" in err.value.body
    finally:
        ext.delete_custom_resource_definition(f"{plural}.{group}")


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn() or True
    except ApiException as e:
        if e.status == 404:  # the new resource is not served yet
            return False
        raise


@pytest.fixture(scope="module")
def kwok_nodes(devcluster: DevCluster) -> tuple[str, list[str]]:
    """50 kwok nodes with a label of their own, shared by the tests of this module."""
    label = f"smoke-{os.getpid()}"
    names = devcluster.add_kwok_nodes(NODES, prefix=f"{label}-", labels={"patchbay.dev/smoke": label})
    return label, names


def test_kwok_nodes_become_ready(devcluster: DevCluster, kwok_nodes: tuple[str, list[str]]) -> None:
    label, names = kwok_nodes
    devcluster.wait_nodes_ready(NODES, label_selector=f"patchbay.dev/smoke={label}", timeout=120)
    assert devcluster.ready_nodes(f"patchbay.dev/smoke={label}") == set(names)


def test_daemonset_gets_one_pod_per_kwok_node(
    api: client.ApiClient, devcluster: DevCluster, kwok_nodes: tuple[str, list[str]], name_prefix: str
) -> None:
    """The real controller manager creates the pods and the real scheduler binds them."""
    label, names = kwok_nodes
    core = client.CoreV1Api(api)
    apps = client.AppsV1Api(api)
    ns = f"{name_prefix}ds"
    core.create_namespace({"metadata": {"name": ns}})
    try:
        wait_for(
            "default ServiceAccount",
            lambda: any(
                sa.metadata.name == "default" for sa in core.list_namespaced_service_account(ns).items
            ),
            timeout=60,
        )
        ds = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "smoke"},
            "spec": {
                "selector": {"matchLabels": {"app": "smoke"}},
                "template": {
                    "metadata": {"labels": {"app": "smoke"}},
                    "spec": {
                        "nodeSelector": {"patchbay.dev/smoke": label},
                        "tolerations": [{"key": KWOK_TAINT_KEY, "operator": "Exists"}],
                        "containers": [{"name": "c", "image": "docker.io/library/busybox:1.36"}],
                    },
                },
            },
        }
        apps.create_namespaced_daemon_set(ns, ds)

        def all_ready() -> bool:
            st = apps.read_namespaced_daemon_set_status("smoke", ns).status
            return st.desired_number_scheduled == NODES and (st.number_ready or 0) == NODES

        wait_for("DaemonSet ready on every kwok node", all_ready, timeout=180)
        pods = core.list_namespaced_pod(ns, label_selector="app=smoke").items
        assert len(pods) == NODES
        assert sorted(p.spec.node_name for p in pods) == sorted(names)  # exactly one per node
        for p in pods:
            scheduled = [c for c in p.status.conditions or [] if c.type == "PodScheduled"]
            assert scheduled and scheduled[0].status == "True", p.metadata.name
        events = core.list_namespaced_event(ns).items
        reasons = {(e.source.component if e.source else None, e.reason) for e in events}
        assert ("daemonset-controller", "SuccessfulCreate") in reasons, reasons
    finally:
        core.delete_namespace(ns)


def _listening_sockets(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that ``pid`` holds."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] != "0A" or cols[9] not in inodes:  # 0A = LISTEN
                continue
            addr_hex, port_hex = cols[1].split(":")
            if v6:
                addr = "::1" if addr_hex == "0" * 24 + "01000000" else addr_hex
            else:
                addr = ".".join(str(int(addr_hex[i : i + 2], 16)) for i in (6, 4, 2, 0))
            found.append((addr, int(port_hex, 16)))
    return found


def test_everything_listens_on_loopback_only(devcluster: DevCluster) -> None:
    procs = devcluster.running()
    # The real node's containerd and kubelet join this set when e2e tests added them.
    assert {p.name for p in procs} >= {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
    }
    for p in procs:
        sockets = _listening_sockets(p.pid)
        assert sockets, f"{p.name} listens on nothing?"
        bad = [s for s in sockets if not (s[0].startswith("127.") or s[0] == "::1")]
        assert not bad, f"{p.name} listens on non-loopback {bad}"


def test_cli_up_kubeconfig_down_leaves_nothing(tmp_path: Path, bin_dir: Path) -> None:
    """The CLI on its own state directory: up with kwok nodes, kubectl works, down stops every PID."""
    state = tmp_path / "cli-cluster"
    env = {**os.environ, "PATCHBAY_KUBE_BIN": str(bin_dir)}
    cli = [sys.executable, "-m", "patchbay_devcluster.cli", "--state-dir", str(state)]
    up = subprocess.run(
        [*cli, "up", "--nodes", "3", "--real-node"], env=env, capture_output=True, text=True, timeout=300
    )
    try:
        assert up.returncode == 0, up.stderr
        kubeconfig = (
            subprocess.run([*cli, "kubeconfig"], env=env, capture_output=True, text=True, check=True)
            .stdout.strip()
            .splitlines()[-1]
        )
        nodes = subprocess.run(
            [str(bin_dir / "kubectl"), "--kubeconfig", kubeconfig, "get", "nodes", "-o", "name"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.split()
        assert nodes == [f"node/kwok-node-{i}" for i in range(3)] + ["node/localhost"]
        # A running container on the real node: `down` must stop it and undo its mounts.
        on_real_node = {
            "spec": {"hostNetwork": True, "nodeSelector": {"kubernetes.io/hostname": "localhost"}}
        }
        run = subprocess.run(
            [
                str(bin_dir / "kubectl"),
                "--kubeconfig",
                kubeconfig,
                "run",
                "sleeper",
                "--image=docker.io/library/busybox:1.36",
                "--restart=Never",
                "--overrides=" + json.dumps(on_real_node),
                "--command",
                "--",
                "sleep",
                "3600",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, run.stderr
        wait = subprocess.run(
            [
                str(bin_dir / "kubectl"),
                "--kubeconfig",
                kubeconfig,
                "wait",
                "--for=jsonpath={.status.phase}=Running",
                "pod/sleeper",
                "--timeout=120s",
            ],
            capture_output=True,
            text=True,
            timeout=150,
        )
        assert wait.returncode == 0, wait.stderr
        node_dir = str((state / "node").resolve())
        mounts_before = [m for m in Path("/proc/self/mountinfo").read_text().splitlines() if node_dir in m]
        assert mounts_before  # the pod's volumes and rootfs are mounted under the state directory
        status = json.loads(subprocess.run([*cli, "status"], env=env, capture_output=True, text=True).stdout)
        assert status["readyz"] is True
        pids = [p["pid"] for p in status["processes"].values()]
        assert len(pids) == 7  # control plane, kwok, containerd, kubelet
        assert all(p["running"] for p in status["processes"].values())
        binaries = {int(p): Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0].decode() for p in pids}
    finally:
        down = subprocess.run([*cli, "down"], env=env, capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert not any(pid_runs(pid, binary) for pid, binary in binaries.items())
    # No process anywhere still refers to the state directory.
    leftovers = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
                if str(state).encode() in cmdline or node_dir.encode() in cmdline:
                    leftovers.append(proc.name)
            except OSError:
                pass
    assert not leftovers
    assert not state.exists()
    assert not [m for m in Path("/proc/self/mountinfo").read_text().splitlines() if node_dir in m]
    assert not Path(node_dir).exists()
