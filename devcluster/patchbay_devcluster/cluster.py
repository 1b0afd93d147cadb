"""The local cluster: real etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok.

Everything lives in one state directory (certificates, kubeconfigs, etcd data, logs and
``state.json`` with the ports and the PID of every process it started). Every process listens on
127.0.0.1 only, on ports picked free at ``up`` time, so several clusters (a developer's and a test
session's) can run side by side. One exception, with the real node: the relay
(:mod:`patchbay_devcluster.relay`) listens on the pod network's bridge address only, so that pods
reach the API server (``DevCluster.pod_api_server``); traffic goes between the node and its pods,
never beyond. ``down`` stops each recorded PID (SIGTERM, then SIGKILL after a grace period) after
checking that the PID still runs the binary it started, so a recycled PID is never signalled.

:class:`DevCluster` is a composition root: each process is owned by one type, on one base
(:mod:`patchbay_devcluster.process`): the control plane's components in
:mod:`patchbay_devcluster.components`, the relay in :mod:`patchbay_devcluster.podrelay`, a
registry in :mod:`patchbay_devcluster.registryserver`, and the real node (containerd, the kubelet,
the pod network) in :mod:`patchbay_devcluster.node`.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kubernetes import client

from patchbay_devcluster import kubeapi
from patchbay_devcluster import registry as oci
from patchbay_devcluster.clusterapi import AdminApi, Nodes
from patchbay_devcluster.components import PORTS, ControlPlane
from patchbay_devcluster.controlplane import KWOK_NODE_LABEL
from patchbay_devcluster.node import NODE_IP, NODE_NAME, NodeError, Owner, RealNode
from patchbay_devcluster.podrelay import API_SERVER_IPS, RELAY, RELAY_PORT, PodRelay
from patchbay_devcluster.process import ClusterError, State, StateDir
from patchbay_devcluster.procs import Proc, stop_pid
from patchbay_devcluster.registryserver import RegistryServer

__all__ = [
    "API_SERVER_IPS",
    "BINARIES",
    "BIN_ENV",
    "PORTS",
    "RELAY",
    "RELAY_PORT",
    "STATE_ENV",
    "ClusterError",
    "DevCluster",
    "Proc",
    "State",
    "default_state_dir",
    "find_bin_dir",
    "real_node_holder",
]

log = logging.getLogger(__name__)

BIN_ENV = "PATCHBAY_KUBE_BIN"
STATE_ENV = "PATCHBAY_DEVCLUSTER_DIR"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


def real_node_holder() -> Path | None:
    """The state directory of the cluster whose real node runs on this machine now (its kubelet
    recorded and alive), or None. One real node runs per machine (hostdirs.OWNER_FILE)."""
    owner = Owner.read()
    return owner.state_dir if owner is not None and owner.kubelet_runs() else None


def default_state_dir() -> Path:
    env = os.environ.get(STATE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "patchbay" / "devcluster"


def find_bin_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Where the pinned Kubernetes binaries are: ``explicit``, else ``$PATCHBAY_KUBE_BIN``."""
    raw = explicit or os.environ.get(BIN_ENV)
    if not raw:
        raise ClusterError(
            f"no Kubernetes binaries: pass --bin-dir or set {BIN_ENV} "
            "(make setup builds them; `hack/kube-binaries.sh --print-bin-dir` prints the path)"
        )
    path = Path(raw)
    missing = [b for b in BINARIES if not (path / b).is_file()]
    if missing:
        raise ClusterError(f"{path} lacks {', '.join(missing)}: run `make setup`")
    return path


class DevCluster:
    """One local cluster rooted at ``state_dir``. Methods are safe to call from any process."""

    def __init__(self, state_dir: Path, bin_dir: Path | None = None) -> None:
        self.dir = state_dir.resolve()
        self.home = StateDir(self.dir)
        self._bin_dir = bin_dir
        self.pki_dir = self.home.pki
        self.log_dir = self.home.logs
        self.state_file = self.home.state_file
        self.kubeconfig = self.home.kubeconfig
        self._admin = AdminApi(self.home)
        self.nodes = Nodes(self.api, self.log_dir / "kubelet.log")
        self.control_plane = ControlPlane(self.home, lambda: self.bin_dir, self.api)

    # --- paths and clients -------------------------------------------------------------------

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = find_bin_dir()
        return self._bin_dir

    def state(self) -> State:
        return State.load(self.state_file)

    def api(self) -> client.ApiClient:
        """The official client as the admin, kept (with its connections) while the API server's
        port and the kubeconfig stay the same."""
        return self._admin()

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.state().ports['apiserver']}"

    @property
    def pod_api_server(self) -> tuple[str, int]:
        """(host, port) where pods on the real node's pod network reach the API server: the relay
        on the bridge address. The API server's certificate names that host, so clients verify
        it as usual. ClusterError unless the relay runs (``up --real-node`` starts it)."""
        st = self.state()
        port = st.ports.get(RELAY)
        if not port or not any(p.name == RELAY and p.runs() for p in st.procs):
            raise ClusterError(
                f"no relay for pods runs in {self.dir}: start the real node (`up --real-node`)"
            )
        return NODE_IP, port

    # --- lifecycle ---------------------------------------------------------------------------

    def running(self) -> list[Proc]:
        return [p for p in self.state().procs if p.runs()]

    def is_up(self) -> bool:
        st = self.state()
        return bool(st.procs) and all(p.runs() for p in st.procs)

    def up(self, nodes: int = 0, real_node: bool = False, timeout: float = 90.0, fleet: int = 0) -> None:
        """Start the control plane and kwok (a no-op if they already run), then ensure ``nodes``
        kwok nodes and, with ``real_node``, the real kubelet node. ``fleet``: the kwok nodes the
        control plane is sized for when more are added later (at least ``nodes``); past 5,000
        kwok's periodic writes are spread out (``controlplane.kwok_stretch``)."""
        if self.is_up():
            log.info("Cluster in %s is already running (%s)", self.dir, self.server)
        else:
            if self.running():
                log.warning("Cluster in %s is partly running; stopping it first", self.dir)
                self.down(purge=False)
            self._start(timeout, max(nodes, fleet))
        if real_node and "kubelet" not in {p.name for p in self.running()}:
            self.start_real_node(timeout=max(timeout, 120.0))
        if nodes:
            self.add_kwok_nodes(nodes)
            self.wait_nodes_ready(nodes, label_selector=f"{KWOK_NODE_LABEL}=kwok", timeout=timeout)

    def _start(self, timeout: float, fleet: int) -> None:
        t0 = time.monotonic()
        try:
            self.control_plane.start(timeout, api_ips=API_SERVER_IPS, fleet=fleet)
        except BaseException:
            log.error("Start failed; stopping what was started")
            self.down(purge=False)
            raise
        log.info(
            "Cluster up in %.1fs: %s, kubeconfig %s", time.monotonic() - t0, self.server, self.kubeconfig
        )

    def down(self, purge: bool = True, grace: float = 15.0) -> list[str]:
        """Stop every recorded process by PID; with ``purge`` remove the state directory.

        Returns the names of the processes that were stopped. Stops in reverse start order so
        that kwok and the controllers go before the API server, and the API server before etcd.
        """
        st = self.state()
        stopped: list[str] = []
        node: RealNode | None = self.real_node()
        if node is not None and not node.exists():
            node = None
        for p in reversed(st.procs):
            if stop_pid(p, grace):
                stopped.append(p.name)
            if p.name == "kubelet" and node is not None:
                # The kubelet is gone; now nothing restarts the pods' containers.
                node.kill_pods()
        if node is not None:
            # Runtime state outside the state directory: removed even without ``purge``.
            node.teardown()
        leftover = [p for p in st.procs if p.runs()]
        if leftover:
            raise ClusterError(f"still running after down: {[(p.name, p.pid) for p in leftover]}")
        self._admin.close()
        if purge:
            shutil.rmtree(self.dir, ignore_errors=True)
        elif self.state_file.exists():
            State(ports=st.ports, fleet=st.fleet).save(self.state_file)
        return stopped

    def restart_component(self, name: str, timeout: float = 90.0, grace: float = 5.0) -> Proc:
        """Stop one control-plane component by PID and start it again on the same ports.

        For tests of what clients do when, say, the API server goes away and comes back (its
        watch cache then starts afresh at the current revision). ``grace`` is short: the API
        server otherwise waits for its open watches, and a crash is as real a test. The state
        file is updated with the new PID. After the API server, any other control-plane
        component that exited while it was away is started again (``ControlPlane.restart``).
        """
        return self.control_plane.restart(self.state(), name, timeout, grace)

    # --- the real node ---------------------------------------------------------------------

    def real_node(self) -> RealNode:
        # Teardown needs no binaries: only start-up resolves the bin dir.
        return RealNode(self.dir, self.pki_dir, self._bin_dir)

    def _containerd_runs(self) -> None:
        if not any(p.name == "containerd" for p in self.running()):
            raise ClusterError("no real node is running: start it with `up --real-node` first")

    def start_real_node(self, timeout: float = 180.0) -> None:
        """containerd + the pinned kubelet as node ``localhost``, and the relay for its pods;
        waits until the node is Ready."""
        t0 = time.monotonic()
        st = self.state()
        node = RealNode(self.dir, self.pki_dir, self.bin_dir)
        try:
            node.claim_device_plugin_dir()
        except NodeError as e:
            raise ClusterError(str(e)) from None
        node.prepare(st.ports["apiserver"], st.ports["kubelet"], st.ports["kubelet-healthz"])
        PodRelay.ensure(self.home, st, timeout)
        log.info("Starting the real node (containerd + kubelet) in %s", node.paths.root)
        node.start(st, timeout)
        self.wait_real_node_ready(timeout)
        log.info("Real node %s Ready in %.1fs", NODE_NAME, time.monotonic() - t0)

    def load_images(self, images: Iterable[tuple[str, Path]]) -> None:
        """Import ``(name, OCI archive)`` pairs into the real node's containerd (no registry here)."""
        self._containerd_runs()
        # The binaries resolved now: a cluster that was already up (a second `make demo`) has not
        # looked for them yet, and ctr is one of them.
        node = RealNode(self.dir, self.pki_dir, self.bin_dir)
        for ref, archive in images:
            t0 = time.monotonic()
            if node.import_archive(ref, archive):
                log.info("  imported %s into the real node in %.1fs", ref, time.monotonic() - t0)

    def start_kubelet(self) -> Proc:
        """Start (or start again, after ``stop_kubelet``) the real node's kubelet."""
        return RealNode(self.dir, self.pki_dir, self.bin_dir).kubelet.start(self.state())

    def stop_kubelet(self, sig: int = signal.SIGKILL) -> None:
        """Stop the kubelet by PID (SIGKILL by default: a crash, not a drain). Pods keep running."""
        self.real_node().kubelet.stop(self.state(), grace=15, sig=sig)

    def wait_real_node_ready(self, timeout: float = 120.0) -> None:
        self.nodes.wait_real_node(timeout)

    # --- the OCI registry ------------------------------------------------------------------

    def registry(self, name: str = "registry") -> oci.Registry | None:
        """The cluster's registry called ``name`` if it runs (``start_registry``), else None."""
        return RegistryServer(self.home, name).running(self.state())

    def start_registry(
        self, name: str = "registry", credentials: oci.Credentials | None = None, timeout: float = 60.0
    ) -> oci.Registry:
        """Run distribution's registry as a process of the cluster (:mod:`patchbay_devcluster.registry`):
        on 127.0.0.1, TLS with the cluster's CA, storage under the state directory, htpasswd auth
        with ``credentials``; and tell the real node's containerd about it (a hosts file in its
        ``config_path``). Kept when it already runs; started again on its port and storage when it
        was stopped (``stop_registry``). Needs the real node."""
        if (running := self.registry(name)) is not None:
            return running
        self._containerd_runs()
        hosts = self.real_node().paths.registry_config
        return RegistryServer(self.home, name).start(self.state(), credentials, hosts, timeout)

    def stop_registry(self, name: str = "registry") -> bool:
        """Stop the registry ``name`` by PID (its storage, port and hosts file stay, so
        ``start_registry`` brings the same one back); False if it was not running."""
        return RegistryServer(self.home, name).stop(self.state())

    # --- nodes -------------------------------------------------------------------------------

    def add_kwok_nodes(
        self,
        count: int,
        prefix: str = "kwok-node-",
        labels: dict[str, str] | None = None,
        start: int = 0,
        workers: int = 8,
    ) -> list[str]:
        """Create ``count`` kwok-managed Nodes named ``<prefix><i>``; existing ones are kept.

        kwok nodes carry the ``kwok.x-k8s.io/node=fake:NoSchedule`` taint, so only pods that
        tolerate it (DaemonSets made for them, tests) land there.
        """
        names = [f"{prefix}{i}" for i in range(start, start + count)]
        self.nodes.add_kwok(names, labels or {}, workers)
        return names

    def ready_nodes(self, label_selector: str = "") -> set[str]:
        return self.nodes.ready(label_selector)

    def wait_nodes_ready(self, count: int, label_selector: str = "", timeout: float = 120.0) -> None:
        self.nodes.wait_ready(count, label_selector, timeout)

    # --- reporting ---------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        st = self.state()
        procs = {p.name: {"pid": p.pid, "running": p.runs()} for p in st.procs}
        out: dict[str, Any] = {"stateDir": str(self.dir), "processes": procs, "ports": st.ports}
        if st.ports.get("apiserver"):
            unavailable: tuple[type[BaseException], ...] = (ClusterError, *kubeapi.UNAVAILABLE)
            out["server"] = self.server
            if procs.get(RELAY, {}).get("running") and st.ports.get(RELAY):
                out["podServer"] = f"https://{NODE_IP}:{st.ports[RELAY]}"
            out["kubeconfig"] = str(self.kubeconfig)
            try:
                out["readyz"] = kubeapi.readyz(self.api(), timeout=3)
            except unavailable:
                out["readyz"] = False
        return out
