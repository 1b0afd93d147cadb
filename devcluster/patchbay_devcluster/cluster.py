"""The local cluster: real etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok.

Everything lives in one state directory (certificates, kubeconfigs, etcd data, logs and
``state.json`` with the ports and the PID of every process it started). Every process listens on
127.0.0.1 only, on ports picked free at ``up`` time, so several clusters (a developer's and a test
session's) can run side by side. ``down`` stops each recorded PID (SIGTERM, then SIGKILL after a
grace period) after checking that the PID still runs the binary it started, so a recycled PID is
never signalled.

The control plane is set up like envtest/kubeadm: one CA, the Node and RBAC authorizers,
NodeRestriction, per-component client identities, service-account token signing, and the
controller manager using per-controller service-account credentials.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from patchbay_devcluster import pki
from patchbay_devcluster.node import NODE_NAME, NodeError, RealNode
from patchbay_devcluster.rest import ApiError, Rest

log = logging.getLogger(__name__)

BIN_ENV = "PATCHBAY_KUBE_BIN"
STATE_ENV = "PATCHBAY_DEVCLUSTER_DIR"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_TAINT_KEY = "kwok.x-k8s.io/node"
KWOK_NODE_LABEL = "type"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
KWOK_STAGES = Path(__file__).with_name("kwok-stages.yaml")
# Order matters: started in this order, stopped in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


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


def free_port() -> int:
    """A port that is free on 127.0.0.1 right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pid_runs(pid: int, binary: str) -> bool:
    """True if ``pid`` is alive and still runs ``binary`` (guards against recycled PIDs)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    argv0 = raw.split(b"\0", 1)[0].decode(errors="replace")
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # state field after the ")" of the command name: Z means a zombie, i.e. already exited.
    if stat.rsplit(")", 1)[1].split()[0] == "Z":
        return False
    return argv0 == binary


@dataclass
class Proc:
    name: str
    pid: int
    binary: str
    log: str


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
        return cls(ports=raw.get("ports", {}), procs=[Proc(**p) for p in raw.get("procs", [])])

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)


def _wait(what: str, check: Callable[[], bool], timeout: float, on_fail: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, ApiError):
            pass
        time.sleep(0.2)
    raise ClusterError(f"{what} not ready after {timeout:.0f}s\n{on_fail()}")


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return f"last lines of {path}:\n" + "\n".join(text[-lines:])


class DevCluster:
    """One local cluster rooted at ``state_dir``. Methods are safe to call from any process."""

    def __init__(self, state_dir: Path, bin_dir: Path | None = None) -> None:
        self.dir = state_dir.resolve()
        self._bin_dir = bin_dir
        self.pki_dir = self.dir / "pki"
        self.log_dir = self.dir / "logs"
        self.state_file = self.dir / "state.json"
        self.kubeconfig = self.dir / "kubeconfig"

    # --- paths and clients -------------------------------------------------------------------

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = find_bin_dir()
        return self._bin_dir

    def state(self) -> State:
        return State.load(self.state_file)

    def rest(self, timeout: float = 10.0) -> Rest:
        port = self.state().ports.get("apiserver")
        if not port:
            raise ClusterError(f"no cluster in {self.dir}: run `patchbay-devcluster up`")
        return Rest(
            port=port,
            ca=self.pki_dir / "ca.crt",
            cert=self.pki_dir / "admin.crt",
            key=self.pki_dir / "admin.key",
            timeout=timeout,
        )

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.state().ports['apiserver']}"

    # --- lifecycle ---------------------------------------------------------------------------

    def running(self) -> list[Proc]:
        return [p for p in self.state().procs if pid_runs(p.pid, p.binary)]

    def is_up(self) -> bool:
        st = self.state()
        return bool(st.procs) and all(pid_runs(p.pid, p.binary) for p in st.procs)

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
        names = (
            "etcd",
            "etcd-peer",
            "apiserver",
            "controller-manager",
            "scheduler",
            "kwok",
            "kubelet",
            "kubelet-healthz",
        )
        state = State(ports={n: free_port() for n in names})
        state.save(self.state_file)
        self._write_pki_and_kubeconfigs(state.ports["apiserver"])
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
                _stop_child(child)
            self.down(purge=False)
            raise
        log.info(
            "Cluster up in %.1fs: %s, kubeconfig %s", time.monotonic() - t0, self.server, self.kubeconfig
        )

    def _spawn(self, name: str, argv: Sequence[str]) -> tuple[Proc, subprocess.Popen[bytes]]:
        logfile = self.log_dir / f"{name}.log"
        with logfile.open("ab") as out:
            child = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                start_new_session=True,  # survives the CLI; never gets the terminal's signals
            )
        return Proc(name=name, pid=child.pid, binary=argv[0], log=str(logfile)), child

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
            node.release_device_plugin_dir(self.dir)
            # Runtime state outside the state directory: removed even without ``purge``
            # (the kubelet's and containerd's logs stay in <state>/logs).
            node.remove_files()
        leftover = [p for p in st.procs if pid_runs(p.pid, p.binary)]
        if leftover:
            raise ClusterError(f"still running after down: {[(p.name, p.pid) for p in leftover]}")
        if purge:
            _rmtree(self.dir)
        elif self.state_file.exists():
            State(ports=st.ports).save(self.state_file)
        return stopped

    def restart_component(self, name: str, timeout: float = 90.0, grace: float = 5.0) -> Proc:
        """Stop one control-plane component by PID and start it again on the same ports.

        For tests of what clients do when, say, the API server goes away and comes back (its
        watch cache then starts afresh at the current revision). ``grace`` is short: the API
        server otherwise waits for its open watches, and a crash is as real a test. The state
        file is updated with the new PID.
        """
        if name not in COMPONENTS:
            raise ClusterError(f"unknown component {name!r}; one of {', '.join(COMPONENTS)}")
        st = self.state()
        old = next((p for p in st.procs if p.name == name), None)
        if old is None:
            raise ClusterError(f"{name} is not running in {self.dir}")
        stop_pid(old, grace=grace)
        proc, child = self._spawn(name, self._argv(name, st.ports))
        st.procs = [proc if p.name == name else p for p in st.procs]
        st.save(self.state_file)
        try:
            self._wait_component(name, st.ports, Path(proc.log), timeout, child)
        except BaseException:
            _stop_child(child)
            raise
        log.info("Restarted %s (pid %d)", name, proc.pid)
        return proc

    # --- the real node ---------------------------------------------------------------------

    def real_node(self) -> RealNode:
        # Teardown needs no binaries: only start-up resolves the bin dir.
        return RealNode(self.dir, self.pki_dir, self._bin_dir)

    def start_real_node(self, timeout: float = 180.0) -> None:
        """containerd + the pinned kubelet as node ``localhost``; waits until the node is Ready."""
        t0 = time.monotonic()
        st = self.state()
        node = RealNode(self.dir, self.pki_dir, self.bin_dir)

        def kubelet_running(state_dir: Path) -> bool:
            other = DevCluster(state_dir)
            return any(p.name == "kubelet" for p in other.running())

        try:
            node.claim_device_plugin_dir(self.dir, kubelet_running)
        except NodeError as e:
            raise ClusterError(str(e)) from None
        node.prepare(st.ports["apiserver"], st.ports["kubelet"], st.ports["kubelet-healthz"])
        log.info("Starting the real node (containerd + kubelet) in %s", node.paths.root)
        proc, child = self._spawn("containerd", node.containerd_argv())
        st.procs.append(proc)
        st.save(self.state_file)

        def containerd_ok() -> bool:
            if child.poll() is not None:
                raise ClusterError(f"containerd exited\n{_tail(Path(proc.log))}")
            return node.containerd_ready()

        _wait("containerd", containerd_ok, timeout, lambda: _tail(Path(proc.log)))
        node.import_images()
        self.start_kubelet()
        self.wait_real_node_ready(timeout)
        log.info("Real node %s Ready in %.1fs", NODE_NAME, time.monotonic() - t0)

    def load_images(self, images: Iterable[tuple[str, Path]]) -> None:
        """Import ``(name, OCI archive)`` pairs into the real node's containerd (no registry here)."""
        if not any(p.name == "containerd" for p in self.running()):
            raise ClusterError("no real node is running: start it with `up --real-node` first")
        node = self.real_node()
        for ref, archive in images:
            t0 = time.monotonic()
            if node.import_archive(ref, archive):
                log.info("  imported %s into the real node in %.1fs", ref, time.monotonic() - t0)

    def start_kubelet(self) -> Proc:
        """Start (or start again, after ``stop_kubelet``) the real node's kubelet."""
        st = self.state()
        st.procs = [p for p in st.procs if p.name != "kubelet" or pid_runs(p.pid, p.binary)]
        if any(p.name == "kubelet" for p in st.procs):
            raise ClusterError("the kubelet is already running")
        proc, child = self._spawn("kubelet", self.real_node().kubelet_argv())
        st.procs.append(proc)
        st.save(self.state_file)
        port = st.ports["kubelet-healthz"]

        def healthy() -> bool:
            if child.poll() is not None:
                raise ClusterError(f"kubelet exited\n{_tail(Path(proc.log))}")
            return _http_ok(port, "/healthz", tls=False)

        _wait("kubelet", healthy, 120, lambda: _tail(Path(proc.log)))
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
            lambda: _tail(self.log_dir / "kubelet.log"),
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
        rest = self.rest()
        names = [f"{prefix}{i}" for i in range(start, start + count)]

        def create(name: str) -> None:
            rest.call("POST", "/api/v1/nodes", kwok_node(name, labels or {}), ok=(409,))

        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(create, names))
        log.info("Created %d kwok nodes in %.1fs", count, time.monotonic() - t0)
        return names

    def ready_nodes(self, label_selector: str = "") -> set[str]:
        from urllib.parse import quote

        path = "/api/v1/nodes"
        if label_selector:
            path += "?labelSelector=" + quote(label_selector)
        items = self.rest(timeout=60).call("GET", path)["items"]
        ready = set()
        for n in items:
            for c in n.get("status", {}).get("conditions") or []:
                if c.get("type") == "Ready" and c.get("status") == "True":
                    ready.add(n["metadata"]["name"])
        return ready

    def wait_nodes_ready(self, count: int, label_selector: str = "", timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        last = -1
        while time.monotonic() < deadline:
            n = len(self.ready_nodes(label_selector))
            if n >= count:
                log.info("%d nodes Ready", n)
                return
            if n != last:
                log.info("  %d/%d nodes Ready", n, count)
                last = n
            time.sleep(0.5)
        raise ClusterError(f"only {last}/{count} nodes Ready after {timeout:.0f}s")

    # --- configuration -----------------------------------------------------------------------

    def _write_pki_and_kubeconfigs(self, port: int) -> None:
        ca = pki.CertificateAuthority(self.pki_dir)
        ca.issue("apiserver", "kube-apiserver", server=True)
        ca.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", orgs=("system:masters",), client=True
        )
        pki.service_account_keys(self.pki_dir)
        # A separate CA for the aggregation layer's front proxy (as kubeadm does): requests carrying
        # X-Remote-User headers are trusted only from a client certificate of THIS CA.
        front = pki.CertificateAuthority(self.pki_dir / "front-proxy")
        front.issue("front-proxy-client", "front-proxy-client", client=True)
        identities = {
            "admin": ("patchbay-admin", ("system:masters",)),
            "controller-manager": ("system:kube-controller-manager", ()),
            "scheduler": ("system:kube-scheduler", ()),
            "kwok": ("kwok-controller", ("system:masters",)),
        }
        for stem, (cn, orgs) in identities.items():
            pair = ca.issue(stem, cn, orgs=orgs, client=True)
            target = self.kubeconfig if stem == "admin" else self.dir / f"{stem}.kubeconfig"
            write_kubeconfig(target, f"https://127.0.0.1:{port}", ca.pair.cert, pair)

    def _argv(self, name: str, ports: dict[str, int]) -> list[str]:
        b = str(self.bin_dir / name)
        p = self.pki_dir
        if name == "etcd":
            client = f"http://127.0.0.1:{ports['etcd']}"
            peer = f"http://127.0.0.1:{ports['etcd-peer']}"
            return [
                b,
                "--name=devcluster",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=devcluster={peer}",
                "--unsafe-no-fsync",  # test data: durability is not worth the fsync latency
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ]
        if name == "kube-apiserver":
            return [
                b,
                f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
                f"--secure-port={ports['apiserver']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # Endpoints may not hold loopback addresses, so the "kubernetes" Service gets none:
                # nothing here may connect to a ClusterIP anyway.
                "--endpoint-reconciler-type=none",
                f"--cert-dir={p}",
                f"--tls-cert-file={p / 'apiserver.crt'}",
                f"--tls-private-key-file={p / 'apiserver.key'}",
                f"--client-ca-file={p / 'ca.crt'}",
                f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
                f"--kubelet-certificate-authority={p / 'ca.crt'}",
                # The real node is "localhost" (Hostname address); kwok nodes have only an
                # InternalIP of 127.0.0.1. Either way logs/exec stay on loopback.
                "--kubelet-preferred-address-types=Hostname,InternalIP",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={p / 'sa.pub'}",
                f"--service-account-signing-key-file={p / 'sa.key'}",
                f"--requestheader-client-ca-file={p / 'front-proxy' / 'ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={p / 'front-proxy' / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={p / 'front-proxy' / 'front-proxy-client.key'}",
                "--profiling=false",
                # Defaults of 400/200 throttle thousands of kwok nodes' heartbeats plus a benchmark.
                "--max-requests-inflight=3000",
                "--max-mutating-requests-inflight=1000",
                "--v=1",
            ]
        if name in ("kube-controller-manager", "kube-scheduler"):
            stem = "controller-manager" if name == "kube-controller-manager" else "scheduler"
            kc = str(self.dir / f"{stem}.kubeconfig")
            argv = [
                b,
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports[stem]}",
                f"--cert-dir={self.dir / stem}",
                # A client that patches thousands of nodes must not be throttled by our own defaults.
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
                "--v=1",
            ]
            if name == "kube-controller-manager":
                argv += [
                    "--use-service-account-credentials=true",
                    f"--service-account-private-key-file={p / 'sa.key'}",
                    f"--root-ca-file={p / 'ca.crt'}",
                    f"--cluster-signing-cert-file={p / 'ca.crt'}",
                    f"--cluster-signing-key-file={p / 'ca.key'}",
                    "--cluster-name=patchbay-dev",
                    "--concurrent-daemonset-syncs=5",
                ]
            return argv
        if name == "kwok":
            return [
                b,
                f"--kubeconfig={self.dir / 'kwok.kubeconfig'}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                f"--server-address=127.0.0.1:{ports['kwok']}",
                "--node-ip=127.0.0.1",
                "--cidr=10.0.1.0/24",
                "--node-lease-duration-seconds=40",
                f"--config={KWOK_STAGES}",
            ]
        raise ValueError(name)

    def _wait_component(
        self, name: str, ports: dict[str, int], logfile: Path, timeout: float, child: subprocess.Popen[bytes]
    ) -> None:
        # poll() on our own child, not /proc: right after fork the child still runs Python.
        def fail() -> str:
            code = child.poll()
            alive = "running" if code is None else f"exited with code {code}"
            return f"{name} (pid {child.pid}) {alive}; {_tail(logfile)}"

        def alive_and(check: Callable[[], bool]) -> Callable[[], bool]:
            def inner() -> bool:
                if child.poll() is not None:
                    raise ClusterError(f"{name} exited during start\n{fail()}")
                return check()

            return inner

        if name == "etcd":
            check = lambda: _http_ok(ports["etcd"], "/health", tls=False)  # noqa: E731
        elif name == "kube-apiserver":
            check = lambda: self.rest(timeout=5).request("GET", "/readyz")[0] == 200  # noqa: E731
        elif name == "kube-controller-manager":
            check = lambda: _http_ok(ports["controller-manager"], "/healthz", tls=True)  # noqa: E731
        elif name == "kube-scheduler":
            check = lambda: _http_ok(ports["scheduler"], "/healthz", tls=True)  # noqa: E731
        else:
            check = lambda: _http_ok(ports["kwok"], "/healthz", tls=False)  # noqa: E731
        _wait(name, alive_and(check), timeout, fail)

    # --- reporting ---------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        st = self.state()
        procs = {p.name: {"pid": p.pid, "running": pid_runs(p.pid, p.binary)} for p in st.procs}
        out: dict[str, Any] = {"stateDir": str(self.dir), "processes": procs, "ports": st.ports}
        if st.ports.get("apiserver"):
            out["server"] = self.server
            out["kubeconfig"] = str(self.kubeconfig)
            try:
                out["readyz"] = self.rest(timeout=3).request("GET", "/readyz")[0] == 200
            except OSError:
                out["readyz"] = False
        return out


def kwok_node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A Node object that kwok will manage: heartbeats keep it Ready; no kubelet behind it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node-role.kubernetes.io/agent": "",
                KWOK_NODE_LABEL: "kwok",
                **labels,
            },
        },
        "spec": {"taints": [{"key": KWOK_TAINT_KEY, "value": "fake", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
        },
    }


def write_kubeconfig(path: Path, server: str, ca: Path, client: pki.CertPair) -> None:
    """A kubeconfig with the certificates embedded, so it can be copied and still work."""

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "patchbay-dev", "cluster": {"server": server, "certificate-authority-data": b64(ca)}}
        ],
        "users": [
            {
                "name": "patchbay-dev",
                "user": {
                    "client-certificate-data": b64(client.cert),
                    "client-key-data": b64(client.key),
                },
            }
        ],
        "contexts": [
            {"name": "patchbay-dev", "context": {"cluster": "patchbay-dev", "user": "patchbay-dev"}}
        ],
        "current-context": "patchbay-dev",
    }
    path.write_text(json.dumps(doc, indent=2))  # JSON is valid YAML; kubectl reads it as is
    path.chmod(0o600)


def _http_ok(port: int, path: str, tls: bool) -> bool:
    import http.client
    import ssl

    conn: http.client.HTTPConnection
    if tls:
        # The components serve a self-signed certificate of their own for /healthz only.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=3)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    finally:
        conn.close()


def stop_pid(p: Proc, grace: float, sig: int = signal.SIGTERM) -> bool:
    """Stop one recorded process (``sig``, then SIGKILL after ``grace``); False if it was not running."""
    if not pid_runs(p.pid, p.binary):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(p.pid, sig)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and pid_runs(p.pid, p.binary):
        _reap(p.pid)
        time.sleep(0.05)
    if pid_runs(p.pid, p.binary):
        log.warning("%s (pid %d) still running after %.0fs; killing", p.name, p.pid, grace)
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)
        time.sleep(0.1)
    _reap(p.pid)
    return True


def _stop_child(child: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    if child.poll() is not None:
        return
    child.terminate()
    try:
        child.wait(grace)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(5)


def _reap(pid: int) -> None:
    """Collect the exit status of our own child (no-op for processes started by another CLI)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
