"""The local cluster: real etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok.

Everything lives in one state directory (certificates, kubeconfigs, etcd data, logs and
``state.json`` with the ports and the PID of every process it started). Every process listens on
127.0.0.1 only, on ports picked free at ``up`` time, so several clusters (a developer's and a test
session's) can run side by side. One exception, with the real node: the relay
(:mod:`patchbay_devcluster.relay`) listens on the pod network's bridge address only, so that pods
reach the API server (``DevCluster.pod_api_server``); traffic goes between the node and its pods,
never beyond. ``down`` stops each recorded PID (SIGTERM, then SIGKILL after a grace period) after
checking that the PID still runs the binary it started, so a recycled PID is never signalled.

What each component is (identity, command line, health endpoint) is in
:mod:`patchbay_devcluster.controlplane`; the optional real node in :mod:`patchbay_devcluster.node`;
starting, probing and stopping processes in :mod:`patchbay_devcluster.procs`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from patchbay_devcluster import controlplane, kubeapi, pki
from patchbay_devcluster import registry as oci
from patchbay_devcluster.controlplane import COMPONENTS, KWOK_NODE_LABEL, kwok_node
from patchbay_devcluster.node import (
    KUBERNETES_SERVICE_PORT,
    NODE_IP,
    NODE_NAME,
    SERVICE_SUBNET,
    NodeError,
    Owner,
    RealNode,
)
from patchbay_devcluster.poll import poll_until
from patchbay_devcluster.procs import Proc, free_port, http_ok, spawn, stop_child, stop_pid, tail, tls_ok

log = logging.getLogger(__name__)

BIN_ENV = "PATCHBAY_KUBE_BIN"
STATE_ENV = "PATCHBAY_DEVCLUSTER_DIR"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
PORTS = (
    "etcd",
    "etcd-peer",
    "apiserver",
    "controller-manager",
    "scheduler",
    "kwok",
    "kubelet",
    "kubelet-healthz",
)
"""The ports picked at ``up``, by name (the real node's kubelet takes the last two). The real
node adds ``relay``, a port of the bridge address, when it starts."""

RELAY = "relay"
"""The relay's name as a process and as a port of ``state.json``."""
RELAY_PORT = KUBERNETES_SERVICE_PORT
"""The relay's port on the bridge address: the ``kubernetes`` Service's, whose address is the
bridge's (``node.SERVICE_SUBNET``), so pods reach the API server as in any cluster. Something else
on the machine that holds it (a listener on the wildcard address) is an error that says so."""
API_SERVER_IPS = (NODE_IP,)
"""Addresses the API server's certificate names besides localhost and 127.0.0.1: the relay's,
so that pods verify the API server they reach through it."""


def real_node_holder() -> Path | None:
    """The state directory of the cluster whose real node runs on this machine now (its kubelet
    recorded and alive), or None. One real node runs per machine (node.OWNER_FILE)."""
    owner = Owner.read()
    return owner.state_dir if owner is not None and owner.kubelet_runs() else None


class ClusterError(RuntimeError):
    """Something the operator of the tool must act on; the message says what and where to look."""


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


@dataclass
class State:
    """What ``state.json`` holds: enough for ``down``/``status`` from another process."""

    ports: dict[str, int] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> State:
        if not path.exists():
            return cls()
        raw = json.loads(path.read_text())
        return cls(ports=raw.get("ports", {}), procs=[Proc.from_dict(p) for p in raw.get("procs", [])])

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        doc = {"ports": self.ports, "procs": [p.to_dict() for p in self.procs]}
        tmp.write_text(json.dumps(doc, indent=2))
        tmp.replace(path)


def _wait(what: str, check: Callable[[], bool], timeout: float, detail: Callable[[], str]) -> None:
    """Until ``check()`` holds; an API server or component not (yet) answering is "not yet"."""
    poll_until(what, check, timeout=timeout, error=ClusterError, detail=detail, ignore=kubeapi.UNAVAILABLE)


class DevCluster:
    """One local cluster rooted at ``state_dir``. Methods are safe to call from any process."""

    def __init__(self, state_dir: Path, bin_dir: Path | None = None) -> None:
        self.dir = state_dir.resolve()
        self._bin_dir = bin_dir
        self.pki_dir = self.dir / "pki"
        self.log_dir = self.dir / "logs"
        self.state_file = self.dir / "state.json"
        self.kubeconfig = self.dir / "kubeconfig"
        self._api: tuple[tuple[int, int], client.ApiClient] | None = None

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
        port = self.state().ports.get("apiserver")
        if not port:
            raise ClusterError(f"no cluster in {self.dir}: run `patchbay-devcluster up`")
        try:
            key = (port, self.kubeconfig.stat().st_mtime_ns)
        except FileNotFoundError:
            raise ClusterError(f"no kubeconfig at {self.kubeconfig}: run `patchbay-devcluster up`") from None
        if self._api is None or self._api[0] != key:
            if self._api is not None:
                kubeapi.close(self._api[1])
            self._api = (key, kubeapi.connect(self.kubeconfig))
        return self._api[1]

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

    def up(self, nodes: int = 0, real_node: bool = False, timeout: float = 90.0) -> None:
        """Start the control plane and kwok (a no-op if they already run), then ensure ``nodes``
        kwok nodes and, with ``real_node``, the real kubelet node."""
        if self.is_up():
            log.info("Cluster in %s is already running (%s)", self.dir, self.server)
        else:
            if self.running():
                log.warning("Cluster in %s is partly running; stopping it first", self.dir)
                self.down(purge=False)
            self._start(timeout)
        if real_node and "kubelet" not in {p.name for p in self.running()}:
            self.start_real_node(timeout=max(timeout, 120.0))
        if nodes:
            self.add_kwok_nodes(nodes)
            self.wait_nodes_ready(nodes, label_selector=f"{KWOK_NODE_LABEL}=kwok", timeout=timeout)

    def _start(self, timeout: float) -> None:
        t0 = time.monotonic()
        for d in (self.dir, self.pki_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o700)
        state = State(ports={n: free_port() for n in PORTS})
        state.save(self.state_file)
        controlplane.write_credentials(
            self.dir, self.pki_dir, self.kubeconfig, state.ports["apiserver"], api_ips=API_SERVER_IPS
        )
        log.info("Starting control plane in %s", self.dir)
        children: list[subprocess.Popen[bytes]] = []
        try:
            for name in COMPONENTS:
                proc, child = self._spawn(name, self._argv(name, state.ports))
                children.append(child)
                state.procs.append(proc)
                state.save(self.state_file)
                self._wait_component(name, state.ports, Path(proc.log), timeout, child)
                log.info("  %s ready (pid %d)", name, proc.pid)
        except BaseException:
            log.error("Start failed; stopping what was started")
            # Our own children, through their Popen handles: one may not have exec'd its binary
            # yet, which the PID + binary check in down() would (rightly) refuse to signal.
            for child in reversed(children):
                stop_child(child)
            self.down(purge=False)
            raise
        log.info(
            "Cluster up in %.1fs: %s, kubeconfig %s", time.monotonic() - t0, self.server, self.kubeconfig
        )

    def _spawn(
        self, name: str, argv: Sequence[str], marker: str = "", env: Mapping[str, str] | None = None
    ) -> tuple[Proc, subprocess.Popen[bytes]]:
        return spawn(name, argv, self.log_dir, self.dir, marker=marker, env=env)

    def _argv(self, name: str, ports: dict[str, int]) -> list[str]:
        # The "kubernetes" Service's address is the pod bridge's own (node.SERVICE_SUBNET).
        return controlplane.argv(
            name, self.bin_dir, self.dir, self.pki_dir, ports, service_range=str(SERVICE_SUBNET)
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
            node.kill_pods()
            node.kill_shims()
            node.unmount_all()
            node.remove_network()
            node.remove_cgroups()
            node.release_device_plugin_dir()
            # Runtime state outside the state directory: removed even without ``purge``
            # (the kubelet's and containerd's logs stay in <state>/logs).
            node.remove_files()
        leftover = [p for p in st.procs if p.runs()]
        if leftover:
            raise ClusterError(f"still running after down: {[(p.name, p.pid) for p in leftover]}")
        if self._api is not None:
            kubeapi.close(self._api[1])
            self._api = None
        if purge:
            shutil.rmtree(self.dir, ignore_errors=True)
        elif self.state_file.exists():
            State(ports=st.ports).save(self.state_file)
        return stopped

    def restart_component(self, name: str, timeout: float = 90.0, grace: float = 5.0) -> Proc:
        """Stop one control-plane component by PID and start it again on the same ports.

        For tests of what clients do when, say, the API server goes away and comes back (its
        watch cache then starts afresh at the current revision). ``grace`` is short: the API
        server otherwise waits for its open watches, and a crash is as real a test. The state
        file is updated with the new PID. After the API server, any other control-plane
        component that exited while it was away is started again (``_revive_exited``).
        """
        if name not in COMPONENTS:
            raise ClusterError(f"unknown component {name!r}; one of {', '.join(COMPONENTS)}")
        st = self.state()
        old = next((p for p in st.procs if p.name == name), None)
        if old is None:
            raise ClusterError(f"{name} is not running in {self.dir}")
        stop_pid(old, grace=grace)
        proc = self._respawn(st, st.procs.index(old), timeout)
        if name == "kube-apiserver":
            self._revive_exited(st, timeout)
        return proc

    def _revive_exited(self, st: State, timeout: float) -> None:
        """Start again each control-plane component of ``st`` that no longer runs.

        The controller-manager's /healthz answers before it has built its controllers, and it
        exits (code 1) when the API server refuses a connection while it builds them: a restart of
        the API server in its first seconds lost it for good (CI, 2026-11-27: "failed to create
        Kubernetes client for resourcequota-controller ... connection refused"). On a real control
        plane the kubelet restarts that static pod; here this does, once, on the same ports.
        """
        for i, p in enumerate(st.procs):
            if p.name not in COMPONENTS or p.runs():
                continue
            log.warning("%s (pid %d) exited while the API server was away; starting it again", p.name, p.pid)
            self._respawn(st, i, timeout)

    def _respawn(self, st: State, index: int, timeout: float) -> Proc:
        """Start ``st.procs[index]`` (stopped or exited) again on the same ports; wait until healthy.

        The state file gets the new PID before the wait, so that a failed start is still stopped
        by ``down``; the child is stopped here too when the wait fails or is interrupted.
        """
        name = st.procs[index].name
        proc, child = self._spawn(name, self._argv(name, st.ports))
        st.procs[index] = proc
        st.save(self.state_file)
        try:
            self._wait_component(name, st.ports, Path(proc.log), timeout, child)
        except BaseException:
            stop_child(child)
            raise
        log.info("Restarted %s (pid %d)", name, proc.pid)
        return proc

    def _wait_component(
        self, name: str, ports: dict[str, int], logfile: Path, timeout: float, child: subprocess.Popen[bytes]
    ) -> None:
        # poll() on our own child, not /proc: right after fork the child still runs Python.
        def fail() -> str:
            code = child.poll()
            alive = "running" if code is None else f"exited with code {code}"
            return f"{name} (pid {child.pid}) {alive}; {tail(logfile)}"

        healthy: Callable[[], bool]
        if name == "kube-apiserver":
            healthy = lambda: kubeapi.readyz(self.api(), timeout=5)  # noqa: E731
        else:
            port, path, tls = controlplane.HEALTH[name]
            healthy = lambda: http_ok(ports[port], path, tls=tls)  # noqa: E731

        def check() -> bool:
            if child.poll() is not None:
                raise ClusterError(f"{name} exited during start\n{fail()}")
            return healthy()

        _wait(name, check, timeout, fail)

    # --- the real node ---------------------------------------------------------------------

    def real_node(self) -> RealNode:
        # Teardown needs no binaries: only start-up resolves the bin dir.
        return RealNode(self.dir, self.pki_dir, self._bin_dir)

    def start_real_node(self, timeout: float = 180.0) -> None:
        """containerd + the pinned kubelet as node ``localhost``; waits until the node is Ready."""
        t0 = time.monotonic()
        st = self.state()
        node = RealNode(self.dir, self.pki_dir, self.bin_dir)
        try:
            node.claim_device_plugin_dir()
        except NodeError as e:
            raise ClusterError(str(e)) from None
        node.prepare(st.ports["apiserver"], st.ports["kubelet"], st.ports["kubelet-healthz"])
        self._start_relay(st, timeout)
        log.info("Starting the real node (containerd + kubelet) in %s", node.paths.root)
        proc, child = self._spawn("containerd", node.containerd_argv(), env=node.containerd_env())
        st.procs.append(proc)
        st.save(self.state_file)

        def containerd_ok() -> bool:
            if child.poll() is not None:
                raise ClusterError(f"containerd exited\n{tail(Path(proc.log))}")
            return node.containerd_ready()

        _wait("containerd", containerd_ok, timeout, lambda: tail(Path(proc.log)))
        node.import_images()
        self.start_kubelet()
        self.wait_real_node_ready(timeout)
        log.info("Real node %s Ready in %.1fs", NODE_NAME, time.monotonic() - t0)

    def _start_relay(self, st: State, timeout: float) -> None:
        """The relay on the bridge address (which ``RealNode.prepare`` made), recorded in ``st``;
        waits until a TLS handshake through it verifies the API server's certificate for that
        address. Kept if it already runs (a second ``start_real_node`` after a failed one)."""
        # Imported here, not with this module: the package imports this module, and a module run
        # with ``python -m`` must not be imported before it runs (runpy warns, and it would be
        # loaded twice).
        from patchbay_devcluster import relay

        if any(p.name == RELAY and p.runs() for p in st.procs):
            return
        # A state directory of an earlier version: its certificate may not name the address yet.
        # Issued again now, the running API server reloads it; the wait below sees it served.
        controlplane.api_server_certificate(self.pki_dir, API_SERVER_IPS)
        st.procs = [p for p in st.procs if p.name != RELAY]
        port = free_port(NODE_IP, preferred=RELAY_PORT)
        if port != RELAY_PORT:
            raise ClusterError(
                f"port {RELAY_PORT} of {NODE_IP} is taken (a listener on the wildcard address?): pods "
                f"reach the API server through the kubernetes Service at {NODE_IP}:{RELAY_PORT}; free it"
            )
        st.ports[RELAY] = port
        argv = relay.argv((NODE_IP, port), ("127.0.0.1", st.ports["apiserver"]))
        proc, child = self._spawn(RELAY, argv, marker=relay.MODULE)
        st.procs.append(proc)
        st.save(self.state_file)

        def verified() -> bool:
            if child.poll() is not None:
                raise ClusterError(f"the relay exited\n{tail(Path(proc.log))}")
            return tls_ok(NODE_IP, port, self.pki_dir / "ca.crt")

        try:
            _wait(f"the relay on {NODE_IP}:{port}", verified, timeout, lambda: tail(Path(proc.log)))
        except BaseException:
            stop_child(child)
            raise
        log.info("  relay for pods on %s:%d (pid %d)", NODE_IP, port, proc.pid)

    def load_images(self, images: Iterable[tuple[str, Path]]) -> None:
        """Import ``(name, OCI archive)`` pairs into the real node's containerd (no registry here)."""
        if not any(p.name == "containerd" for p in self.running()):
            raise ClusterError("no real node is running: start it with `up --real-node` first")
        # The binaries resolved now: a cluster that was already up (a second `make demo`) has not
        # looked for them yet, and ctr is one of them.
        node = RealNode(self.dir, self.pki_dir, self.bin_dir)
        for ref, archive in images:
            t0 = time.monotonic()
            if node.import_archive(ref, archive):
                log.info("  imported %s into the real node in %.1fs", ref, time.monotonic() - t0)

    # --- the OCI registry ------------------------------------------------------------------

    def registry(self, name: str = "registry") -> oci.Registry | None:
        """The cluster's registry called ``name`` if it runs (``start_registry``), else None."""
        if not any(p.name == name and p.runs() for p in self.state().procs):
            return None
        return oci.load_record(self.dir / "registry" / name / "registry.json")

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
        if not any(p.name == "containerd" for p in self.running()):
            raise ClusterError("no real node is running: start it with `up --real-node` first")
        st = self.state()
        home = self.dir / "registry" / name
        home.mkdir(parents=True, exist_ok=True)
        port = st.ports.get(name) or free_port()
        st.ports[name] = port
        ca = pki.CertificateAuthority(self.pki_dir)
        serving = ca.issue("registry-serving", "patchbay-registry", server=True)
        htpasswd = None
        if credentials is not None:
            htpasswd = home / "htpasswd"
            htpasswd.write_text(oci.htpasswd_line(credentials))
        conf = home / "config.yml"
        storage = home / "storage"
        conf.write_text(json.dumps(oci.config(storage, port, serving.cert, serving.key, htpasswd), indent=2))
        reg = oci.Registry(
            name, port, ca.pair.cert, oci.write_cert_dir(ca.pair.cert, home / "certs.d"), credentials
        )
        node = RealNode(self.dir, self.pki_dir, self._bin_dir)
        hosts = node.paths.root / "registry" / reg.host / "hosts.toml"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text(oci.hosts_toml(reg))
        try:
            argv = [str(oci.binary()), "serve", str(conf)]
        except oci.RegistryError as e:
            raise ClusterError(str(e)) from None
        st.procs = [p for p in st.procs if p.name != name]
        proc, child = self._spawn(name, argv, env=oci.env())
        st.procs.append(proc)
        st.save(self.state_file)

        def answers() -> bool:
            if child.poll() is not None:
                raise ClusterError(f"the registry {name} exited\n{tail(Path(proc.log))}")
            return reg.answers()

        try:
            _wait(f"the registry on {reg.host}", answers, timeout, lambda: tail(Path(proc.log)))
        except BaseException:
            stop_child(child)
            raise
        oci.save_record(home / "registry.json", reg)
        log.info("  registry %s on https://%s (pid %d)", name, reg.host, proc.pid)
        return reg

    def stop_registry(self, name: str = "registry") -> bool:
        """Stop the registry ``name`` by PID (its storage, port and hosts file stay, so
        ``start_registry`` brings the same one back); False if it was not running."""
        return any(stop_pid(p, grace=5) for p in self.state().procs if p.name == name)

    def start_kubelet(self) -> Proc:
        """Start (or start again, after ``stop_kubelet``) the real node's kubelet."""
        st = self.state()
        st.procs = [p for p in st.procs if p.name != "kubelet" or p.runs()]
        if any(p.name == "kubelet" for p in st.procs):
            raise ClusterError("the kubelet is already running")
        node = RealNode(self.dir, self.pki_dir, self.bin_dir)
        proc, child = self._spawn("kubelet", node.kubelet_argv())
        st.procs.append(proc)
        st.save(self.state_file)
        node.record_kubelet(proc)
        port = st.ports["kubelet-healthz"]

        def healthy() -> bool:
            if child.poll() is not None:
                raise ClusterError(f"kubelet exited\n{tail(Path(proc.log))}")
            return http_ok(port, "/healthz", tls=False)

        _wait("kubelet", healthy, 120, lambda: tail(Path(proc.log)))
        return proc

    def stop_kubelet(self, sig: int = signal.SIGKILL) -> None:
        """Stop the kubelet by PID (SIGKILL by default: a crash, not a drain). Pods keep running."""
        for p in self.state().procs:
            if p.name == "kubelet":
                stop_pid(p, grace=15, sig=sig)

    def wait_real_node_ready(self, timeout: float = 120.0) -> None:
        _wait(
            f"node {NODE_NAME}",
            lambda: NODE_NAME in self.ready_nodes(f"kubernetes.io/hostname={NODE_NAME}"),
            timeout,
            lambda: tail(self.log_dir / "kubelet.log"),
        )

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
        api = self.api()
        names = [f"{prefix}{i}" for i in range(start, start + count)]

        def create(name: str) -> None:
            kubeapi.create_node(api, kwok_node(name, labels or {}))

        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(create, names))
        log.info("Created %d kwok nodes in %.1fs", count, time.monotonic() - t0)
        return names

    def ready_nodes(self, label_selector: str = "") -> set[str]:
        return kubeapi.ready_nodes(self.api(), label_selector, timeout=60)

    def wait_nodes_ready(self, count: int, label_selector: str = "", timeout: float = 120.0) -> None:
        last = -1

        def enough() -> bool:
            nonlocal last
            n = len(self.ready_nodes(label_selector))
            if n < count and n != last:
                log.info("  %d/%d nodes Ready", n, count)
            last = n
            return n >= count

        poll_until(
            f"{count} nodes Ready",
            enough,
            timeout=timeout,
            interval=0.5,
            error=ClusterError,
            detail=lambda: f"only {max(last, 0)}/{count} Ready",
        )
        log.info("%d nodes Ready", last)

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
