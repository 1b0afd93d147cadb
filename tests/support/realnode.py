"""Helpers shared by the e2e tests on the real node: the installed release, pods, fake devices."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from kubernetes import client
from kubernetes.client.rest import ApiException
from support.clusters import GROUP, VERSION, Cluster, kstatus, profile_spec, wait_for
from support.operator import scrape_stats

from patchbay_api.revisions import spec_revision
from patchbay_devcluster import DevCluster
from patchbay_devcluster.imagebuild import BuiltImage
from patchbay_devcluster.images import BUSYBOX_IMAGE
from patchbay_devcluster.install import Release

REPO = Path(__file__).resolve().parents[2]
DEVICES = 4
"""FAKE serial adapters per test profile (``serial_profile``)."""
AGENT_SELECTOR = "app.kubernetes.io/name=patchbay-agent"
#: Agent settings of its own: the profile gets its own agent DaemonSet (pods labelled with the
#: profile), which these tests look at; profiles without them share the node agent
#: (tests/e2e/test_node_agent_on_real_node.py).
OWN_AGENT: dict[str, Any] = {"updateStrategy": {"maxSurge": 1, "maxUnavailable": 0}}
METRICS_PORT = 8081
"""The chart's default metrics.port (charts/patchbay/values.yaml)."""
SHARED_SELECTOR = f"{AGENT_SELECTOR},patchbay.dev/agent=shared"
OPERATOR_SELECTOR = "app.kubernetes.io/name=patchbay,app.kubernetes.io/component=operator"

__all__ = [
    "AGENT_SELECTOR",
    "DEVICES",
    "REPO",
    "Installed",
    "add_fake_device",
    "busybox_pod",
    "kstatus",
    "limits",
    "pod_processes",
    "pod_ready",
    "serial_profile",
    "wait_for",
]


def pod_ready(pod: client.V1Pod) -> bool:
    """The pod's Ready condition is True (what a DaemonSet's rollout reads)."""
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


@dataclass
class Installed:
    """The chart's release on the e2e cluster, and what tests ask of it."""

    cluster: DevCluster
    api: client.ApiClient
    release: Release
    images: Mapping[str, BuiltImage]

    @property
    def namespace(self) -> str:
        return self.release.namespace

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def operator_pods(self) -> list[client.V1Pod]:
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=OPERATOR_SELECTOR).items)

    def operator_ready(self) -> client.V1Pod | None:
        """The one operator pod, when it is Running and Ready (else None)."""
        pods = [p for p in self.operator_pods() if not p.metadata.deletion_timestamp]
        if len(pods) != 1 or pods[0].status.phase != "Running":
            return None
        ready = [c for c in pods[0].status.conditions or [] if c.type == "Ready"]
        return pods[0] if ready and ready[0].status == "True" else None

    def operator_log(self) -> str:
        pod = self.operator_ready()
        assert pod is not None, "no Ready operator pod"
        return str(self.core.read_namespaced_pod_log(pod.metadata.name, self.namespace))

    def operator_stats(self) -> dict[str, Any]:
        """The operator pod's own counters from its /metrics: at the pod's address on the pod
        network (the node reaches its pods), or on the node's 127.0.0.1 with hostNetwork."""
        pod = self.operator_ready()
        assert pod is not None, "no Ready operator pod"
        (container,) = [c for c in pod.spec.containers if c.name == "operator"] or pod.spec.containers[:1]
        ports = {p.name: p.container_port for p in container.ports or []}
        host = "127.0.0.1" if pod.spec.host_network else pod.status.pod_ip
        return scrape_stats(f"http://{host}:{ports.get('metrics', METRICS_PORT)}/metrics")

    def agent_pods(self, profile: str) -> list[client.V1Pod]:
        selector = f"{AGENT_SELECTOR},patchbay.dev/profile={profile}"
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=selector).items)

    def ready_agents(self, profile: str) -> list[client.V1Pod]:
        out = []
        for p in self.agent_pods(profile):
            if not p.metadata.deletion_timestamp and pod_ready(p):
                out.append(p)
        return out


class OnNode(NamedTuple):
    """What most tests on the real node work with, in the order they unpack it; each field is the
    e2e fixture of that name (tests/e2e/conftest.py: ``on_node``)."""

    #: the chart installed, its operator pod Ready
    patchbay: Installed
    #: assertion helpers over the e2e cluster (deletes the test's profiles and nodes afterwards)
    cluster: Cluster
    e2e_cluster: DevCluster
    #: the real node's name
    real_node: str
    #: a namespace of the test's own
    namespace: str
    #: a directory under the machine's /dev for the test's FAKE devices
    fake_dev: Path


def busybox_pod(name: str, node: str, script: str, *, host_network: bool = False) -> dict[str, Any]:
    """A busybox pod pinned to ``node`` running ``sh -c script`` (on the pod network by default)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "hostNetwork": host_network,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "command": ["sh", "-c", script]}],
        },
    }


def pod_log(core: client.CoreV1Api, ns: str, name: str, marker: str) -> str | None:
    """The pod's log once it runs and has written ``marker`` (None before); a pod that ended fails."""
    pod = core.read_namespaced_pod(name, ns)
    assert pod.status.phase not in ("Failed", "Succeeded"), pod.status
    if pod.status.phase != "Running":
        return None
    text = str(core.read_namespaced_pod_log(name, ns))
    return text if marker in text else None


def unschedulable(core: client.CoreV1Api, ns: str, name: str) -> str | None:
    """Why the scheduler leaves the pod Pending, or None while it does not say."""
    pod = core.read_namespaced_pod(name, ns)
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return str(c.message)
    return None


def add_fake_device(directory: Path, name: str) -> Path:
    """A FAKE device: a character device node that is really the null device (1:3), so runc can
    create it in a container exactly as it would a serial adapter."""
    path = directory / name
    os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))
    return path


def limits(pod: dict[str, Any], resource: str, count: int) -> dict[str, Any]:
    pod["spec"]["containers"][0]["resources"] = {"limits": {resource: str(count)}}
    return pod


PLUGIN = Path(os.environ.get("VIRTUAL_ENV") or REPO / ".venv") / "bin" / "kubectl-patchbay"
"""The kubectl plugin as the virtualenv installs it."""


def kubectl_patchbay(kubeconfig: Path, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl patchbay ARGS`` as a user runs it, against the release in ``namespace``."""
    return subprocess.run(
        [str(PLUGIN), *args, "--kubeconfig", str(kubeconfig), "-n", namespace],
        capture_output=True,
        text=True,
        timeout=180,
    )


def served(cluster: Cluster, namespace: str, name: str, node: str) -> str:
    """The revision of profile ``name`` that ``node``'s agent reports serving ("" before a report)."""
    try:
        obj = cluster.custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "devicereports", f"{name}.{node}"
        )
    except ApiException as e:
        if e.status == 404:
            return ""
        raise
    return str(obj.get("revision") or "")


def serial_profile(
    cluster: Cluster,
    fake_dev: Path,
    node: str,
    *,
    suffix: str = "serial",
    cdi_kind: str | None = None,
    agent: dict[str, Any] | None = OWN_AGENT,
    label: str = "patchbay.dev/e2e-plugin",
    subdir: str | None = None,
) -> tuple[str, str]:
    """A DevicePlugin profile over DEVICES fake devices on ``node``; returns (name, resource).
    ``cdi_kind``: also return CDI names of that kind (allocation.cdi). ``agent``: the profile's
    agent settings (None: none, so the shared node agent serves it). The devices are
    ``fake_dev/ttyE2E*``, or ``fake_dev/<subdir>/ttyE2E*`` (several profiles over one fake_dev).
    The node gets ``label`` (the profile's selector)."""
    name, resource = f"{cluster.prefix}{suffix}", f"e2e.patchbay.dev/{cluster.tag}-{suffix}"
    allocation: dict[str, Any] = {"permissions": "rw", "devicesEnvName": "SERIALS", "envs": {"E2E": "yes"}}
    if cdi_kind:
        allocation["cdi"] = {"kind": cdi_kind}
    where = fake_dev / subdir if subdir else fake_dev
    where.mkdir(exist_ok=True)
    for i in range(DEVICES):
        add_fake_device(where, f"ttyE2E{i}")
    cluster.set_labels(node, {label: cluster.tag})
    plugin = {
        "discovery": {"paths": {"globs": [f"{where}/ttyE2E*"]}},
        "health": {"periodSeconds": 1, "failureThreshold": 1, "successThreshold": 1},
        "allocation": allocation,
    }
    own = {"agent": agent} if agent is not None else {}
    cluster.create_profile(
        name, profile_spec(resource, "DevicePlugin", {label: cluster.tag}, plugin=plugin, **own)
    )
    return name, resource


@contextlib.contextmanager
def staged_serial(
    cluster: Cluster, fake_dev: Path, node: str, namespace: str, suffix: str, rollout: dict[str, Any]
) -> Iterator[tuple[str, str, str]]:
    """A DevicePlugin profile over the FAKE devices, served by the shared node agent on ``node``
    (so staged), with ``spec.rollout`` set (not a revision); yields (name, resource, its first
    revision) once the node counts every device and reports that revision; deleted afterwards."""
    label = f"patchbay.dev/e2e-{suffix}"
    name, resource = serial_profile(cluster, fake_dev, node, suffix=suffix, agent=None, label=label)
    try:
        cluster.patch_spec(name, {"rollout": rollout})
        full = (str(DEVICES), str(DEVICES))
        wait_for("every device on the node", lambda: cluster.values(node, resource) == full, 180)
        first = spec_revision((cluster.profile(name) or {})["spec"])
        wait_for("the first revision reported", lambda: served(cluster, namespace, name, node) == first, 120)
        yield name, resource, first
    finally:
        cluster.delete_profile(name)
        cluster.set_labels(node, {label: None})


def ended(pid: int | str) -> bool:
    """Whether process ``pid`` has ended or is ending: gone from /proc, or a zombie (state Z, or X
    while it is reaped). A zombie's /proc/<pid>/status still reads, but its mountinfo and root do not
    (EINVAL, ENOENT): a process of a pod that ends while a test reads it (an exec probe's, a child
    the agent waited for) is skipped, not taken for an agent that lacks something."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    # "pid (comm) S ...": the comm may hold spaces and parentheses, the state follows the last ')'
    return stat.rpartition(")")[2].split()[:1] in (["Z"], ["X"], [])


def pod_processes(e2e_cluster: DevCluster, pod: client.V1Pod) -> dict[int, dict[str, str]]:
    """PID -> the fields of /proc/<pid>/status of every live process of ``pod`` but its pause (a
    zombie left out); from the pod's cgroup (``pod<uid>`` under the node's cgroup root: in the
    memory hierarchy on cgroup v1, in the unified one on v2)."""
    root = e2e_cluster.real_node().cgroup_dir()
    dirs = [d for d in root.rglob(f"pod{pod.metadata.uid}") if d.is_dir()]
    assert len(dirs) == 1, f"the cgroup of pod {pod.metadata.name}: {dirs}"
    out: dict[int, dict[str, str]] = {}
    for procs in dirs[0].rglob("cgroup.procs"):
        for pid in map(int, procs.read_text().split()):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except FileNotFoundError:
                continue  # ended meanwhile
            fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
            if fields.get("State", "").startswith(("Z", "X")):
                continue  # ending: a zombie has no memory, mounts or root left to read (`ended`)
            if fields.get("Name", "").strip() != "pause":
                out[pid] = {k: v.strip() for k, v in fields.items()}
    return out
