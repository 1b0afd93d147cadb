"""What the scenarios stand on, written once: local clusters (``patchbay_devcluster``), the chart
on the real node, the operator and the agent as processes, fake devices, the Go peers' builds,
and reading a process's memory.

Every process started here listens on 127.0.0.1 (or the real node's bridge), is bounded in time
and stopped by PID when its block ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from support.processes import stop_process

from patchbay_bench import REPO
from patchbay_bench.harness import Run, others_running, wait
from patchbay_bench.kube import NODES, PROFILES, Api, ns_path, profile
from patchbay_bench.peers import Operator, PodResourcesPeer, PyKubelet, ThreadedPeers
from patchbay_devcluster import DevCluster, find_bin_dir, real_node_holder
from patchbay_devcluster.imagebuild import BuiltImage, build_all
from patchbay_devcluster.install import helm, helm_install
from patchbay_devcluster.node import NODE_NAME
from patchbay_devcluster.procs import free_port
from patchbay_devcluster.releases import release_of

CRDS = (
    REPO / "crds" / "patchbay.dev_devicepluginprofiles.yaml",
    REPO / "crds" / "patchbay.dev_devicereports.yaml",
)
CHART = REPO / "charts" / "patchbay"
AGENTS_NS = "patchbay-system"
AGENT = str(Path(sys.executable).parent / "patchbay-agent")
"""The agent program as the venv installs it (a host process: no image, no pod)."""
IMAGE_ENV = {
    "PYTHONOPTIMIZE": "2",
    "PYTHONNODEBUGRANGES": "1",
    "MALLOC_ARENA_MAX": "2",
    # Empty: bytecode IS written. The image starts from bytecode compiled at its build; a host
    # process whose shell sets PYTHONDONTWRITEBYTECODE=1 would compile every module at each start,
    # which costs time and several MiB that a node never pays.
    "PYTHONDONTWRITEBYTECODE": "",
}
"""The interpreter settings of the agent image, for the agent run as a host process."""
CHART_VALUES: dict[str, Any] = {"operator": {"statusDebounceSeconds": 0.3}}
"""The chart as the real-node scenarios install it (one install serves all of them)."""


def bin_dir() -> Path:
    return find_bin_dir(os.environ.get("PATCHBAY_KUBE_BIN"))


def kube_release() -> str:
    return release_of(bin_dir())


def real_node_busy() -> str:
    """Why the machine's one real node cannot be used now ("" when it can): a real node runs, or
    another session's test run (its e2e tests take the real node when they come)."""
    holder = real_node_holder()
    if holder is not None:
        return f"another session's real node runs (state {holder})"
    others = [p for p in others_running() if p.endswith(("kubelet", "pytest"))]
    if others:
        return f"another session's kubelet or test run is on this machine ({', '.join(others)})"
    if shutil.which("kubelet") is None and not (bin_dir() / "kubelet").exists():
        return "no kubelet binary"
    return ""


@dataclass
class Cluster:
    """A running dev cluster: the tool's handle, the bench's API client, the kwok nodes made."""

    dev: DevCluster
    api: Api
    nodes: list[str] = field(default_factory=list)
    images: dict[str, BuiltImage] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> Path:
        return self.dev.kubeconfig

    def kubectl(self, *args: str) -> list[str]:
        return [str(bin_dir() / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args]

    def namespace(self, name: str) -> None:
        if self.api.get(f"/api/v1/namespaces/{name}") is None:
            self.api.create("/api/v1/namespaces", {"metadata": {"name": name}})
        wait(
            f"namespace {name}'s default ServiceAccount",
            lambda: self.api.get(f"{ns_path(name, 'serviceaccounts')}/default"),
            60,
            0.2,
        )

    def crds(self, paths: Sequence[Path] = CRDS) -> None:
        """Create the CRDs and wait until the API server serves them."""
        for path in paths:
            body = yaml.safe_load(path.read_text())
            if self.api.get(
                f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{body['metadata']['name']}"
            ):
                continue
            self.api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body)
        for path in paths:
            body = yaml.safe_load(path.read_text())
            version = next(v["name"] for v in body["spec"]["versions"] if v.get("storage"))
            self.served(f"/apis/{body['spec']['group']}/{version}/{body['spec']['names']['plural']}")

    def served(self, path: str, timeout: float = 60) -> None:
        """Wait until the API server serves ``path`` (a new CRD's resource reaches discovery)."""
        wait(f"{path} served", lambda: self.api.raw("GET", path)[0] == 200, timeout, 0.2)

    def chart_without_operator(self, namespace: str) -> None:
        """``helm install`` the chart with no operator pod (its CRDs, the agents' ServiceAccounts,
        Roles and admission policies): for an operator run as a host process against kwok nodes."""
        helm(
            self.dev,
            "install",
            "patchbay",
            str(CHART),
            "-n",
            namespace,
            "--create-namespace",
            "--set",
            "operator.replicas=0",
            "--set",
            "crds.keep=false",
        )
        self.crds()

    def label_node(self, node: str, labels: Mapping[str, str | None]) -> None:
        self.api.merge(f"{NODES}/{node}", {"metadata": {"labels": dict(labels)}})

    def down(self) -> None:
        self.api.close()
        self.dev.down(purge=True)


@contextlib.contextmanager
def kwok_cluster(
    run: Run,
    nodes: int = 0,
    *,
    prefix: str = "kwok-node-",
    labels: Mapping[str, str] | None = None,
    crds: bool = True,
) -> Iterator[Cluster]:
    """A control plane with kwok and ``nodes`` Ready kwok nodes (no real node), the CRDs applied;
    stopped by PID when the block ends."""
    dev = DevCluster(run.work / "cluster", bin_dir())
    t0 = time.monotonic()
    dev.up(timeout=180, fleet=nodes)
    cluster = Cluster(dev, Api(dev.kubeconfig))
    try:
        if nodes:
            # Progress: at 20,000 nodes these two steps take about 15 minutes and printed nothing.
            run.log(f"control plane up in {time.monotonic() - t0:.0f} s; adding {nodes} kwok nodes")
            cluster.nodes = dev.add_kwok_nodes(nodes, prefix=prefix, labels=dict(labels or {}), workers=16)
            run.log(
                f"{nodes} kwok nodes created ({time.monotonic() - t0:.0f} s); waiting for them to be Ready"
            )
            selector = ",".join(f"{k}={v}" for k, v in (labels or {"type": "kwok"}).items())
            dev.wait_nodes_ready(nodes, label_selector=selector, timeout=max(300, nodes / 4))
            run.log(f"{nodes} kwok nodes Ready ({time.monotonic() - t0:.0f} s)")
        if crds:
            cluster.crds()
        yield cluster
    finally:
        cluster.down()


class Session:
    """What a bench invocation shares between its scenarios: the cluster with the real node and
    the chart, started by the first scenario that needs it and stopped at the end."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._chart: Cluster | None = None

    def chart_cluster(self, run: Run) -> Cluster:
        """A cluster of its own with the real node (containerd, kubelet, pod network) and the chart
        installed with the images built from this tree (the operator and agents as pods)."""
        if self._chart is not None:
            return self._chart
        busy = real_node_busy()
        if busy:
            raise RuntimeError(f"the real node is not free: {busy}")
        run.log("building (or reusing) the images")
        images = build_all(REPO)
        dev = DevCluster(Path(self._stack.enter_context(_tmpdir("pbb-chart-"))) / "c", bin_dir())
        dev.up(timeout=180)
        cluster = Cluster(dev, Api(dev.kubeconfig), images=images)
        self._stack.callback(cluster.down)
        dev.start_real_node()
        helm_install(dev, CHART, images, CHART_VALUES)
        run.log(f"cluster with the real node and the chart up ({dev.dir})")
        self._chart = cluster
        return cluster

    @property
    def holds_real_node(self) -> bool:
        """Whether the real node that runs is this invocation's own (so not "another session's")."""
        return self._chart is not None

    def real_node_busy(self) -> str:
        """``real_node_busy()`` for a scenario of this invocation: its own real node is no reason."""
        return "" if self.holds_real_node else real_node_busy()

    def close(self) -> None:
        self._chart = None
        self._stack.close()


@contextlib.contextmanager
def _tmpdir(prefix: str) -> Iterator[str]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix=prefix, dir="/tmp") as tmp:
        yield tmp


SESSION = Session()

AGENT_IMAGE = "example.invalid/agent:bench"
"""The agent image of the bench's host-process operators: kwok runs their agent pods, so it is never
pulled."""


@contextlib.contextmanager
def operator(
    run: Run, kubeconfig: Path, namespace: str, *args: str, start_timeout: float = 60.0
) -> Iterator[Operator]:
    """The operator program as a host process against ``kubeconfig``'s cluster, with its
    /metrics on 127.0.0.1 (``Operator.stats``); stopped when the block ends. `start_timeout`:
    how long its /healthz may take to answer (after its first LISTs: ``Operator.live_after``).

    Its agents' image is ``AGENT_IMAGE`` unless ``args`` name one: every operator of a run then
    renders the same agent DaemonSet, so a fresh operator does not roll the agent pods that the
    one before it made (at 5,000 kwok nodes such a rollout busied the control plane through
    every later round of a scenario)."""
    log_dir = run.work / f"operator-{len(list(run.work.glob('operator-*')))}"
    log_dir.mkdir()
    if "--agent-image" not in args:
        args = ("--agent-image", AGENT_IMAGE, *args)
    op = Operator(kubeconfig, log_dir, args=args, namespace=namespace)
    op.start(timeout=start_timeout)
    try:
        yield op
    finally:
        op.stop()


def agents_everywhere(run: Run, cluster: Cluster, namespace: str, name: str, label: str) -> None:
    """A DevicePlugin profile ``name`` selecting the ``label``=1 kwok nodes, and its agent pods on
    every one of them (kwok runs them): one operator renders the DaemonSet, then stops. The pods'
    names go into ``report_proxy``'s reports, so an operator believes them.

    Done when the DaemonSet counts a ready pod on every node, read from its status (one small
    object): the rounds that follow must not share the cores with the scheduler binding and
    kwok starting thousands of pods (at 5,000 nodes the first round's start took twice the
    others' when the wait ended once the pods merely existed), and polling LISTs of every pod
    (70 MB a second at 20,000 nodes) were themselves most of the API server's load."""
    spec = {
        "resourceName": "example.com/serial",
        "mode": "DevicePlugin",
        "nodeSelector": {"matchLabels": {label: "1"}},
        "plugin": {"discovery": {"virtual": {"count": 4}}},
        "agent": {"tolerations": [{"operator": "Exists"}]},
    }
    cluster.api.create(PROFILES, profile(name, spec))
    nodes = len(cluster.nodes)
    sets = f"/apis/apps/v1/namespaces/{namespace}/daemonsets"

    def ready() -> int:
        found = cluster.api.items(sets, labelSelector=f"patchbay.dev/profile={name}")
        return sum(int((ds.get("status") or {}).get("numberReady") or 0) for ds in found)

    t0 = time.monotonic()
    run.log(f"profile {name} created; waiting for its agent pods to be ready on {nodes} nodes")
    with operator(run, cluster.kubeconfig, namespace):
        wait("the agent pods ready on every node", lambda: ready() >= nodes, max(300, nodes * 0.3), 2.0)
    run.log(f"agent pods ready on {nodes} nodes ({time.monotonic() - t0:.0f} s)")


@dataclass(frozen=True)
class Proxied:
    """A running ``reportproxy``: the kubeconfig that dials it, and its process (for its CPU)."""

    kubeconfig: Path
    pid: int

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far, user and system (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def report_proxy(
    run: Run, cluster: Cluster, size: str, *, namespace: str, profile: str, node_label: str
) -> Iterator[Proxied]:
    """``reportproxy`` in front of ``cluster``'s API server, serving ``profile``'s reports (one
    per ``node_label`` node, ``size`` "bounds" or "small"); yields its kubeconfig and process.
    Stopped by PID when the block ends."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "patchbay_bench.reportproxy",
        "--pki",
        str(cluster.dev.pki_dir),
        "--upstream",
        str(cluster.dev.state().ports["apiserver"]),
        "--port",
        str(port),
        "--namespace",
        namespace,
        "--profile",
        profile,
        "--node-label",
        node_label,
        "--size",
        size,
    ]
    kubeconfig = run.work / f"via-proxy-{size}.kubeconfig"
    doc = yaml.safe_load(cluster.kubeconfig.read_text())
    for c in doc["clusters"]:
        c["cluster"]["server"] = f"https://127.0.0.1:{port}"
    kubeconfig.write_text(yaml.safe_dump(doc))
    log = run.work / f"proxy-{size}-{port}.log"  # one per proxy: an earlier one's "serving" line misleads
    with Child(argv, log) as proxy:

        def serving() -> bool:
            if not proxy.alive():
                raise AssertionError(f"the report proxy exited: {log.read_text()[-2000:]}")
            return f"serving on 127.0.0.1:{port}" in log.read_text()

        wait("the report proxy", serving, 30, 0.1)
        yield Proxied(kubeconfig, proxy.pid)


@contextlib.contextmanager
def fake_devices(directory: Path, names: Sequence[str]) -> Iterator[list[Path]]:
    """FAKE devices on the node: character devices that are the null device (1:3), so runc makes
    them in a container as it would a serial adapter. Removed when the block ends; a leftover of
    a run that was killed before its cleanup (the directory is the scenario's own) goes first."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    paths = []
    try:
        for name in names:
            path = directory / name
            os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))
            paths.append(path)
        yield paths
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def vanish(device: Path) -> int:
    """Remove a fake device node; returns its device number for ``restore``."""
    rdev = device.stat().st_rdev
    device.unlink()
    return rdev


def restore(device: Path, rdev: int) -> None:
    os.mknod(device, 0o666 | 0o020000, rdev)


# --- processes -------------------------------------------------------------------------------


class Child:
    """A child process with its output in a log file, stopped by PID (SIGTERM, then SIGKILL)."""

    def __init__(self, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                list(argv), stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = 20.0) -> None:
        stop_process(self.proc, grace)

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def host_agent_args(
    node: str,
    work: Path,
    host: Path,
    plugin_dir: Path,
    pod_resources: Path,
    kubeconfig: Path | None,
    *,
    http: str = "off",
    namespace: str = "default",
) -> list[str]:
    """An agent's paths and identity as a host process (what the DaemonSet's pod gives it), every
    one of them under ``work`` or given: no default of the agent may reach the machine's own
    kubelet, CDI or PodResources paths (another session's real node may use them)."""
    args = [
        "--node-name",
        node,
        "--device-plugin-dir",
        str(plugin_dir),
        "--host-root",
        str(host),
        "--host-path-prefix",
        str(host),
        "--http-address",
        http,
        "--pod-resources-socket",
        str(pod_resources),
        "--kubelet-root-dir",
        str(work / "kubelet"),
        "--cdi-spec-dir",
        str(work / "cdi"),
    ]
    if kubeconfig is not None:
        args += ["--kubeconfig", str(kubeconfig), "--report-namespace", namespace]
    return args


class HostNode:
    """A node for agents run as host processes: a host tree whose ``/dev`` holds FAKE device
    files, a device-plugin directory where the Python kubelet peer serves, a PodResources peer."""

    def __init__(self, work: Path, name: str = "kwok-node-0") -> None:
        self.work, self.name = work, name
        self.host, self.plugin_dir, self.pod_resources = work / "host", work / "dp", work / "pr.sock"
        for d in (
            self.host / "dev",
            self.plugin_dir,
            work / "kubelet" / "plugins_registry",
            work / "kubelet" / "plugins",
        ):
            d.mkdir(parents=True, exist_ok=True)
        self._loop = ThreadedPeers().__enter__()
        self.kubelet = PyKubelet(self.plugin_dir)
        self.pr = PodResourcesPeer(self.pod_resources)
        self._loop.call(self.kubelet.start())
        self._loop.call(self.pr.start())

    def device(self, name: str) -> Path:
        path = self.host / "dev" / name
        path.write_text("")
        return path

    def healthy(self, resource: str) -> int:
        """Healthy devices of ``resource`` in the kubelet peer's latest list."""
        return self.kubelet.healthy(resource)

    def agent_args(
        self, kubeconfig: Path | None, *, http: str = "off", namespace: str = "default"
    ) -> list[str]:
        """The agent's paths and identity as a host process (what the DaemonSet's pod gives it)."""
        return host_agent_args(
            self.name,
            self.work,
            self.host,
            self.plugin_dir,
            self.pod_resources,
            kubeconfig,
            http=http,
            namespace=namespace,
        )

    def close(self) -> None:
        self._loop.call(self.pr.stop())
        self._loop.call(self.kubelet.stop())
        self._loop.__exit__()

    def __enter__(self) -> HostNode:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


# --- memory ----------------------------------------------------------------------------------


def bytecode_ahead() -> int:
    """Compile the agent's and the bench's own modules to bytecode now, as the agent image does at
    build (plugin-agent/Dockerfile): a process started from this checkout would otherwise compile
    every module from source at each start (an editable install has no .pyc, and this machine sets
    PYTHONDONTWRITEBYTECODE), which is not what a node runs. Returns how many files were written."""
    import compileall
    import importlib.util

    written = 0
    for package in ("patchbay_agent", "patchbay_bench"):
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        for directory in spec.submodule_search_locations:
            before = sum(1 for _ in Path(directory).rglob("*.pyc"))
            compileall.compile_dir(directory, quiet=1)
            written += sum(1 for _ in Path(directory).rglob("*.pyc")) - before
    return written


def status_mib(pid: int, key: str) -> float:
    """A ``/proc/<pid>/status`` size in MiB: VmRSS (now), VmHWM (the peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {key} for pid {pid}")


def smaps_rollup_mib(pid: int) -> dict[str, float]:
    """Every size of ``/proc/<pid>/smaps_rollup`` in MiB, by its name (Rss, Pss, Anonymous...)."""
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        words = rest.split()
        if len(words) == 2 and words[1] == "kB":
            out[key] = int(words[0]) / 1024
    return out


def rss_pss_mib(pid: int) -> tuple[float, float]:
    """(RSS, PSS) in MiB from ``smaps_rollup`` (shared libraries included)."""
    sizes = smaps_rollup_mib(pid)
    return sizes.get("Rss", 0.0), sizes.get("Pss", 0.0)


def pod_processes(cluster: Cluster, uid: str) -> list[int]:
    """The PIDs of a pod on the real node (its cgroup's, but the pause container)."""
    root = cluster.dev.real_node().cgroup_dir()
    (pod_dir,) = [d for d in root.rglob(f"pod{uid}") if d.is_dir()]
    pids = []
    for procs in pod_dir.rglob("cgroup.procs"):
        for pid in procs.read_text().split():
            if Path(f"/proc/{pid}/comm").read_text().strip() != "pause":
                pids.append(int(pid))
    return pids


def pod_memory(cluster: Cluster, uid: str) -> dict[str, float]:
    """A real-node pod's memory in MiB: its processes' RSS and PSS (``smaps_rollup``), and what
    its memory cgroup is charged (``cgroup_rss``: v1 total_rss / v2 anon; ``cgroup_usage``)."""
    root = cluster.dev.real_node().cgroup_dir()
    (pod_dir,) = [d for d in root.rglob(f"pod{uid}") if d.is_dir()]
    stat = dict(line.split() for line in (pod_dir / "memory.stat").read_text().splitlines())
    v2 = (pod_dir / "memory.current").exists()
    usage = int((pod_dir / ("memory.current" if v2 else "memory.usage_in_bytes")).read_text())
    out = {
        "rss": 0.0,
        "pss": 0.0,
        "cgroup_rss": int(stat["anon" if v2 else "total_rss"]) / 2**20,
        "cgroup_usage": usage / 2**20,
    }
    for pid in pod_processes(cluster, uid):
        rss, pss = rss_pss_mib(pid)
        out["rss"] += rss
        out["pss"] += pss
    return out


def agent_pods(cluster: Cluster, selector: str) -> list[dict[str, Any]]:
    """The agent pods of a label selector that are not being deleted."""
    pods = cluster.api.items(ns_path(AGENTS_NS, "pods"), labelSelector=selector)
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


NODE = NODE_NAME
