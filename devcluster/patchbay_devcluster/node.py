"""A REAL node for the dev cluster, composed of one type per part: containerd
(:mod:`patchbay_devcluster.containerd`), the kubelet (:mod:`patchbay_devcluster.kubelet`), the pod
network (:mod:`patchbay_devcluster.podnetwork`) and the node's and the machine's directories
(:mod:`patchbay_devcluster.hostdirs`). :class:`RealNode` prepares them, starts containerd and the
kubelet, and takes everything down again.

The node uses the paths every node of a real cluster uses, so that the chart's defaults are the
ones proven here: the kubelet's root directory is the machine's ``/var/lib/kubelet`` and
containerd reads CDI specs from ``/var/run/cdi``; so only one real node runs per machine
(``hostdirs.OWNER_FILE``). Everything else the node owns lives under one short directory linked as
``<state>/node``: containerd's root, state and socket, pod logs, the CNI config and the images
built by :mod:`patchbay_devcluster.images`; ``down`` removes it, the kubelet directory's contents
and the CDI specs of Patchbay's agents (``patchbay_*.json``). Pods run in the cgroup subtree
``/patchbay-<id>``: of every hierarchy on a cgroup v1 host, of the one unified hierarchy on a
cgroup v2 host (:mod:`patchbay_devcluster.cgroups` tells which the host has and prepares it);
``down`` finds and stops every container process there. hostNetwork pods work too.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import signal
import time
from pathlib import Path

from patchbay_devcluster import cgroups, hostdirs, images
from patchbay_devcluster.cgroups import CgroupError, HostCgroups
from patchbay_devcluster.containerd import Containerd
from patchbay_devcluster.hostdirs import NodeError, NodePaths, Owner
from patchbay_devcluster.kubelet import NODE_NAME, Kubelet
from patchbay_devcluster.podnetwork import (
    BRIDGE,
    CNI_PLUGINS,
    KUBERNETES_SERVICE_PORT,
    NODE_IP,
    POD_RANGE_START,
    POD_SUBNET,
    SERVICE_SUBNET,
    PodNetwork,
)
from patchbay_devcluster.process import State, StateDir
from patchbay_devcluster.procs import Proc

__all__ = [
    "BRIDGE",
    "CGROUP_BASE",
    "KUBERNETES_SERVICE_PORT",
    "NODE_IP",
    "NODE_NAME",
    "POD_RANGE_START",
    "POD_SUBNET",
    "SERVICE_SUBNET",
    "NodeError",
    "NodePaths",
    "Owner",
    "RealNode",
    "check_host",
    "host_cgroups",
]

log = logging.getLogger(__name__)

CGROUP_BASE = cgroups.BASE


def host_cgroups() -> HostCgroups:
    """The host's cgroups, v1 or v2 (never fails: ``HostCgroups.problem`` says what is missing)."""
    return cgroups.host_cgroups(CGROUP_BASE)


def check_host() -> HostCgroups:
    """Fail early, naming the missing piece, rather than deep inside a kubelet log; returns the
    host's cgroups, which decide the kubelet's settings."""
    if not shutil.which("runc"):
        raise NodeError("missing runc: apt-get install runc (make setup does)")
    missing_cni = [f"/usr/lib/cni/{c}" for c in CNI_PLUGINS if not Path(f"/usr/lib/cni/{c}").exists()]
    if missing_cni:
        raise NodeError(f"missing {', '.join(missing_cni)}: apt-get install containernetworking-plugins")
    if not shutil.which("ip"):
        raise NodeError("missing the `ip` command: apt-get install iproute2")
    if os.geteuid() != 0:
        raise NodeError("a real node needs root (containerd and the kubelet manage cgroups and mounts)")
    host = host_cgroups()
    problem = host.problem()
    if problem is not None:
        raise NodeError(problem)
    return host


class RealNode:
    """The real node of one cluster: its parts, and what it does with all of them (prepare,
    start, tear down). ``DevCluster`` records the processes in its state."""

    def __init__(self, state_dir: Path, pki_dir: Path, bin_dir: Path | None) -> None:
        self.state_dir = state_dir.resolve()
        # Stable across processes (``down`` may run from another CLI call): derived from the path.
        digest = hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:10]
        # Unix socket paths are capped at 108 bytes (containerd checks 104), and the kubelet's
        # device-plugin sockets live under its root dir: so the node lives at a short path,
        # linked from the state directory as ``<state>/node``.
        self.link = state_dir / "node"
        self.paths = NodePaths(Path(f"/tmp/patchbay-node-{digest}"))
        self.pki_dir = pki_dir
        self.bin_dir = bin_dir
        self.cgroup_root = f"/patchbay-{digest}"
        home = StateDir(self.state_dir)
        self.containerd = Containerd(home, self.paths, bin_dir)
        self.kubelet = Kubelet(home, self.paths, pki_dir, bin_dir)
        self.network = PodNetwork(self.paths)
        self.image_tarballs: dict[str, Path] = {}

    def prepare(self, api_port: int, kubelet_port: int, healthz_port: int) -> None:
        """Write configs, certificates, CNI config and image tarballs (idempotent)."""
        host = check_host()
        log.info("  %s: pods under the cgroup %s", host.describe(), self.cgroup_root)
        p = self.paths
        if not self.paths.root.exists():
            # A new node: what an earlier node of ours left in the machine's kubelet directory
            # (a crash, no `down`) would confuse this kubelet (pods, checkpoints of another node).
            hostdirs.unmount_under(p.kubelet_root)
            hostdirs.clear_machine_dirs()
        for d in (p.root, p.kubelet_root, p.pod_logs, p.cdi_spec_dir):
            d.mkdir(parents=True, exist_ok=True)
        if not self.link.is_symlink():
            self.link.symlink_to(p.root)
        self.containerd.configure()
        self.network.create()
        self.kubelet.configure(
            api_port, kubelet_port, healthz_port, self.cgroup_root, cgroup_version=host.version
        )
        self.image_tarballs = images.build_images(p.images)
        self.create_cgroups(host)

    def start(self, st: State, timeout: float) -> None:
        """containerd (until ``ctr`` answers), the node's own images, then the kubelet (until its
        /healthz answers), recorded in ``st``; after ``prepare``."""
        self.containerd.launch(st, timeout)
        self.containerd.import_images(self.image_tarballs)
        self.kubelet.start(st)

    def import_archive(self, ref: str, archive: Path) -> bool:
        """Import an OCI archive as ``ref`` into containerd (``Containerd.import_archive``)."""
        return self.containerd.import_archive(ref, archive)

    # --- the pods' cgroups ---------------------------------------------------------------------

    def create_cgroups(self, host: HostCgroups) -> list[Path]:
        """The kubelet's cgroupRoot, ready for it: in every v1 hierarchy, or on v2 with the
        controllers it uses handed down to it (``cgroups.create_node_cgroups``)."""
        try:
            return cgroups.create_node_cgroups(host, self.cgroup_root)
        except CgroupError as e:
            raise NodeError(str(e)) from None

    def cgroup_dir(self) -> Path:
        """The node's cgroup root where memory is accounted, on v1 or v2: each pod's cgroup
        (``pod<uid>``) lies below it."""
        return host_cgroups().memory_dir(self.cgroup_root)

    def kill_pods(self) -> int:
        """SIGKILL every process in the node's cgroup subtree (containers and sandboxes): the
        subtree in every v1 hierarchy, or the one v2 subtree (whose ``cgroup.kill`` also kills
        what forks meanwhile, on kernels from 5.14)."""
        host = host_cgroups()
        pids: set[int] = set()
        for sub in host.node_dirs(self.cgroup_root):
            if sub.is_dir():
                # os.walk, not Path.rglob: a pod's cgroup that goes while we walk (the kubelet
                # removing it) is skipped; rglob raised FileNotFoundError and left the cluster up.
                for dirpath, _dirs, files in os.walk(sub):
                    if "cgroup.procs" not in files:
                        continue
                    try:
                        pids.update(int(x) for x in Path(dirpath, "cgroup.procs").read_text().split())
                    except OSError:
                        continue
                kill = sub / "cgroup.kill"
                if host.version == 2 and kill.exists():
                    with contextlib.suppress(OSError):
                        kill.write_text("1")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)

    def remove_cgroups(self) -> None:
        for sub in host_cgroups().node_dirs(self.cgroup_root):
            if not sub.is_dir():
                continue
            dirs = sorted((d for d in sub.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True)
            for d in [*dirs, sub]:
                for _ in range(20):
                    try:
                        d.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.05)

    # --- the machine's directories -------------------------------------------------------------

    def claim_device_plugin_dir(self) -> None:
        """Take the machine-wide kubelet and CDI directories, or say who holds them (``hostdirs.claim``)."""
        hostdirs.claim(self.state_dir)

    def record_kubelet(self, kubelet: Proc) -> None:
        """Note the running kubelet in the owner file, if this node holds it."""
        hostdirs.record_kubelet(self.state_dir, kubelet)

    def release_device_plugin_dir(self) -> None:
        """Give the machine-wide directories back, if this node holds them (``hostdirs.release``)."""
        hostdirs.release(self.state_dir)

    # --- teardown ------------------------------------------------------------------------------

    def exists(self) -> bool:
        return self.paths.root.exists() or self.link.is_symlink()

    def teardown(self) -> None:
        """After its processes are stopped: its pods and shims killed, its mounts, network and
        cgroups gone, the machine's directories given back, its directory removed. Runtime state
        outside the state directory goes even when the state directory is kept (the kubelet's and
        containerd's logs stay in ``<state>/logs``)."""
        self.kill_pods()
        self.containerd.kill_shims()
        # Every mount under the node's directory and the kubelet's (tmpfs volumes, overlay rootfs, shm).
        hostdirs.unmount_under(self.paths.root.resolve(), self.paths.kubelet_root)
        self.network.remove()
        self.remove_cgroups()
        self.release_device_plugin_dir()
        # The node's directory (with the CNI leases) and the state directory's link to it.
        shutil.rmtree(self.paths.root, ignore_errors=True)
        if self.link.is_symlink():
            self.link.unlink()
