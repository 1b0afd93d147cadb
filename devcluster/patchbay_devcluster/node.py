"""A REAL node for the dev cluster: the pinned kubelet on containerd 2.4 (built with the Kubernetes
binaries, for its CDI injection) and Debian's runc.

The node uses the paths every node of a real cluster uses, so that the chart's defaults are the
ones proven here: the kubelet's root directory is the machine's ``/var/lib/kubelet`` (its
device-plugin socket, PodResources socket and plugin registry with it) and containerd reads CDI
specs from ``/var/run/cdi``. So only one real node runs per machine: ``OWNER_FILE`` names the
state directory of the node that holds them and its kubelet's PID, so a second node can tell
whether the first still runs; a node starting removes what a node of ours left there, and refuses
a kubelet directory that holds another kubelet's pods. Everything else the node owns lives under
one short directory linked as ``<state>/node``: containerd's root, state and socket, pod logs, the
CNI config and the images built by :mod:`patchbay_devcluster.images`; ``down`` removes it, the
kubelet directory's contents and the CDI specs of Patchbay's agents (``patchbay_*.json``).
Pods run in the cgroup subtree ``/patchbay-<id>``: of every hierarchy on a cgroup v1 host, of the
one unified hierarchy on a cgroup v2 host (:mod:`patchbay_devcluster.cgroups` tells which the host
has and prepares it); ``down`` finds and stops every container process there.

Network: a private pod network inside the machine. Ordinary pods get an address on the bridge
``patchbay0`` (CNI ``bridge`` + ``host-local``, Debian's containernetworking-plugins) in
``POD_SUBNET``; the bridge itself holds the first address, which is also the node's InternalIP,
so the kubelet's HTTP probes and a scraper on the node reach pods exactly as in a cluster. Pods
have no default route, the bridge does not forward (``net.ipv4.conf.patchbay0.forwarding=0``, and
the CNI plugin is told not to be a gateway, which would turn forwarding on machine-wide) and
nothing masquerades: a pod can talk to the node and to other pods, and nothing it sends can leave
the machine. The API server listens on 127.0.0.1, which pods cannot reach; its Service range
(``SERVICE_SUBNET``) starts at the bridge's address, so the ``kubernetes`` Service that every pod
finds in its environment IS the bridge's address, where the cluster runs a relay on the Service's
port (``DevCluster.pod_api_server``): pods reach the API server as in any cluster, through no
virtual IP. hostNetwork pods work too. The kubelet serves on 127.0.0.1 only; the node is named
``localhost`` and the API server prefers the Hostname address, so ``kubectl logs/exec`` reach the
kubelet over loopback.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchbay_devcluster import cgroups, images, pki
from patchbay_devcluster.cgroups import CgroupError, HostCgroups
from patchbay_devcluster.procs import Proc

log = logging.getLogger(__name__)

NODE_NAME = "localhost"
CGROUP_BASE = cgroups.BASE
# The kubelet's device manager hard-codes its registration socket (k8s.io/kubelet's
# pluginapi.KubeletSocket) whatever --root-dir says, so this directory is machine-wide, and so
# one real node at a time per machine: OWNER_FILE says whose it is.
KUBELET_ROOT = Path("/var/lib/kubelet")
DEVICE_PLUGIN_DIR = KUBELET_ROOT / "device-plugins"
OWNER_FILE = KUBELET_ROOT / "patchbay-real-node.json"
CDI_SPEC_DIR = Path("/var/run/cdi")
"""containerd's CDI directory (one of its two defaults), where the agents write their specs."""
CDI_OURS = ("patchbay_*.json", ".patchbay-*.tmp")
"""The CDI spec files Patchbay's agents write there (cdi.py, dra/claims.py): the only ones
``down`` removes."""

BRIDGE = "patchbay0"
"""The pod network's Linux bridge (one real node per machine, so one fixed name)."""

POD_SUBNET = ipaddress.IPv4Network("10.244.0.0/24")
"""Pod addresses; the bridge (and the node's InternalIP) is the first host address."""

NODE_IP = str(next(POD_SUBNET.hosts()))

SERVICE_SUBNET = ipaddress.IPv4Network("10.244.0.0/25")
"""The API server's Service range (``--service-cluster-ip-range``). Its first address, which the
API server gives the ``kubernetes`` Service, is NODE_IP, the bridge's own address: pods reach the
API server at the Service's address and port as in any cluster, and the cluster tool's relay
answers there (no virtual IP, no kube-proxy, nothing forwarded). The other Services' addresses
answer nothing, as without kube-proxy anywhere. Pods take addresses above this range."""
KUBERNETES_SERVICE_PORT = 443
"""The ``kubernetes`` Service's port (the API server's fixed choice): where the relay listens."""
POD_RANGE_START = SERVICE_SUBNET.broadcast_address + 1
"""The first pod address: above the Service range (126 pod addresses at once)."""
assert str(next(SERVICE_SUBNET.hosts())) == NODE_IP
BRIDGE_MAC = "02:70:62:00:00:01"
"""Locally administered (the 02 prefix), fixed: see ``create_bridge``."""
CNI_PLUGINS = ("bridge", "host-local", "loopback")


class NodeError(RuntimeError):
    """The real node cannot run here; the message says which part and why."""


@dataclass(frozen=True)
class Owner:
    """What ``OWNER_FILE`` holds: whose node has the machine-wide device-plugin directory."""

    state_dir: Path
    kubelet: Proc | None = None  # recorded once the kubelet runs

    @classmethod
    def read(cls) -> Owner | None:
        try:
            raw = json.loads(OWNER_FILE.read_text())
            kubelet = raw.get("kubelet")
            return cls(Path(raw["stateDir"]), Proc.from_dict(kubelet) if kubelet else None)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def write(self) -> None:
        OWNER_FILE.parent.mkdir(parents=True, exist_ok=True)
        doc: dict[str, Any] = {"stateDir": str(self.state_dir)}
        if self.kubelet is not None:
            doc["kubelet"] = self.kubelet.to_dict()
        tmp = OWNER_FILE.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(OWNER_FILE)

    def kubelet_runs(self) -> bool:
        return self.kubelet is not None and self.kubelet.runs()


@dataclass(frozen=True)
class NodePaths:
    """Every path of the real node, derived from the cluster's state directory."""

    root: Path

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd" / "state"

    @property
    def containerd_sock(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd" / "config.toml"

    @property
    def kubelet_root(self) -> Path:
        return KUBELET_ROOT

    @property
    def cdi_spec_dir(self) -> Path:
        """Where this node's containerd reads CDI specs (and agents write them)."""
        return CDI_SPEC_DIR

    @property
    def device_plugin_dir(self) -> Path:
        return DEVICE_PLUGIN_DIR

    @property
    def pod_resources_socket(self) -> Path:
        return self.kubelet_root / "pod-resources" / "kubelet.sock"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def cni_conf(self) -> Path:
        return self.root / "cni"

    @property
    def cni_state(self) -> Path:
        """host-local's address leases (kept with the node, so ``down`` removes them)."""
        return self.root / "cni-ipam"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    @property
    def images(self) -> Path:
        return self.root / "images"


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


def containerd_config(paths: NodePaths) -> str:
    """containerd 2.4 (config version 4) on private sockets, CRI on, nothing on TCP, CDI on.

    Everything lives under the node's own directory, including the CDI spec directory (not the
    machine's /etc/cdi or /var/run/cdi), so a node's specs go with ``down``. No imports from
    /etc/containerd and no NRI socket in /var/run/nri: nothing of the machine's own runtime setup
    leaks in or out.
    """
    cri = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""version = 4
root = '{paths.containerd_root}'
state = '{paths.containerd_state}'
imports = []
disabled_plugins = ['io.containerd.snapshotter.v1.btrfs', 'io.containerd.snapshotter.v1.zfs',
  'io.containerd.snapshotter.v1.devmapper', 'io.containerd.snapshotter.v1.blockfile',
  'io.containerd.snapshotter.v1.erofs', 'io.containerd.nri.v1.nri']

[plugins.'io.containerd.server.v1.grpc']
  address = '{paths.containerd_sock}'

[plugins.'io.containerd.server.v1.ttrpc']
  address = '{paths.containerd_sock}.ttrpc'

[plugins.'io.containerd.internal.v1.opt']
  path = '{paths.root / "containerd" / "opt"}'

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{images.PAUSE_IMAGE}'
  [plugins.'io.containerd.cri.v1.images'.registry]
    # Every registry resolves to a closed loopback port (see registry_hosts): images here are
    # imported, and a pull must fail at once instead of reaching for the network.
    config_path = '{paths.root / "registry"}'

[{cri}]
  # The sandbox here cannot lower oom_score_adj below its own.
  restrict_oom_score_adj = true
  # Pod network namespaces are bind-mounted under the node's state, so ``down`` unmounts them
  # with everything else instead of leaving them in the machine's /var/run/netns.
  netns_mounts_under_state_dir = true
  enable_selinux = false
  disable_apparmor = true
  # CDI devices named by device plugins (Allocate's cdi_devices) and DRA drivers resolve here.
  cdi_spec_dirs = ['{paths.cdi_spec_dir}']
  [{cri}.containerd]
    default_runtime_name = 'runc'
    [{cri}.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = '{shutil.which("runc") or "runc"}'
        # cgroupfs, as the kubelet's cgroupDriver, on cgroup v1 and v2 alike: no systemd manages
        # cgroups here. containerd, its shim and runc tell v1 from v2 themselves (a statfs of
        # /sys/fs/cgroup, as patchbay_devcluster.cgroups does).
        SystemdCgroup = false
  [{cri}.cni]
    bin_dirs = ['/usr/lib/cni']
    conf_dir = '{paths.cni_conf}'
"""


def cni_conflist(paths: NodePaths) -> dict[str, Any]:
    """The pod network: a bridge the cluster tool made, addresses from ``POD_SUBNET``, no routes.

    ``isGateway`` stays false: the plugin would then give the bridge an address itself AND switch
    on forwarding for the whole machine. ``routes`` is empty, so pods know only their subnet (the
    node and the other pods); there is no default route to leave by.
    """
    return {
        "cniVersion": "1.0.0",
        "name": "patchbay-pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": False,
                "isDefaultGateway": False,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": str(POD_SUBNET), "rangeStart": str(POD_RANGE_START)}]],
                    "routes": [],
                    "dataDir": str(paths.cni_state),
                },
            }
        ],
    }


def unmount_under(*roots: Path) -> None:
    """Detach every mount at or under `roots`, the deepest first."""
    prefixes = [str(r) for r in roots]
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4].replace("\\040", " ")
        if any(target == r or target.startswith(r + "/") for r in prefixes):
            mounts.append(target)
    for target in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)


def foreign_kubelet_state() -> list[str]:
    """What in KUBELET_ROOT looks like another kubelet's state (pods, a device checkpoint) when no
    node of ours has claimed the directory: a real kubelet's, which a dev node must never take
    over. Empty when the directory is ours (OWNER_FILE) or holds no such state."""
    if OWNER_FILE.exists() or not KUBELET_ROOT.is_dir():
        return []
    signs = ("pods", "device-plugins/kubelet_internal_checkpoint", "cpu_manager_state", "dra_manager_state")
    return [s for s in signs if (KUBELET_ROOT / s).exists()]


def clear_machine_dirs() -> None:
    """Empty KUBELET_ROOT (but OWNER_FILE and the device-plugin directory itself) and remove our
    CDI specs: the state a node of ours left behind. Mounts under KUBELET_ROOT must be gone."""
    for entry in [*DEVICE_PLUGIN_DIR.glob("*.sock"), DEVICE_PLUGIN_DIR / "kubelet_internal_checkpoint"]:
        with contextlib.suppress(OSError):
            entry.unlink()
    if KUBELET_ROOT.is_dir():
        for entry in KUBELET_ROOT.iterdir():
            if entry in (OWNER_FILE, DEVICE_PLUGIN_DIR):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    entry.unlink()
    for pattern in CDI_OURS:
        for f in CDI_SPEC_DIR.glob(pattern):
            with contextlib.suppress(OSError):
                f.unlink()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise NodeError(f"ip {' '.join(args)}: {res.stderr.strip()}")
    return res


def create_bridge() -> None:
    """``patchbay0`` with the node's address and a fixed MAC, up, forwarding off (idempotent).

    The MAC is set explicitly: a Linux bridge otherwise takes the lowest MAC of its ports, so it
    changes as pods come and go, and a pod's ARP entry for the node's address would then point at
    another pod's port (its frames bridged there instead of reaching the node).
    """
    if _ip("link", "show", BRIDGE, check=False).returncode != 0:
        _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("link", "set", "dev", BRIDGE, "address", BRIDGE_MAC)
    sysctl = Path("/proc/sys/net/ipv4/conf") / BRIDGE / "forwarding"
    sysctl.write_text("0\n")
    v6 = Path("/proc/sys/net/ipv6/conf") / BRIDGE / "disable_ipv6"
    if v6.exists():
        v6.write_text("1\n")
    address = f"{NODE_IP}/{POD_SUBNET.prefixlen}"
    if address not in _ip("-4", "addr", "show", "dev", BRIDGE).stdout:
        _ip("addr", "add", address, "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")


def delete_bridge() -> None:
    """Remove the bridge (its veth ports went with the pods' network namespaces)."""
    _ip("link", "del", BRIDGE, check=False)


def registry_hosts() -> str:
    """``_default/hosts.toml``: the upstream of EVERY registry is 127.0.0.1:9 (nothing listens)."""
    return (
        'server = "http://127.0.0.1:9"\n\n[host."http://127.0.0.1:9"]\n  capabilities = ["pull", "resolve"]\n'
    )


def kubelet_config(
    paths: NodePaths, pki_dir: Path, port: int, healthz_port: int, cgroup_root: str, *, cgroup_version: int
) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(pki_dir / "ca.crt")},
        },
        # Only clients with a certificate of the cluster's CA reach it, on loopback.
        "authorization": {"mode": "AlwaysAllow"},
        "tlsCertFile": str(pki_dir / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(pki_dir / "kubelet-serving.key"),
        "containerRuntimeEndpoint": f"unix://{paths.containerd_sock}",
        "podLogsDir": str(paths.pod_logs),
        # cgroup v1 or v2 (cgroups.kubelet_settings), no systemd, kernel defaults we may not change.
        **cgroups.kubelet_settings(cgroup_version, cgroup_root),
        "failSwapOn": False,
        "protectKernelDefaults": False,
        # Images are imported, never pulled: never garbage-collect them, never evict for disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "resolvConf": "",
        "serializeImagePulls": False,
        "maxPods": 50,
        "syncFrequency": "10s",
    }


class RealNode:
    """Start/stop helpers for the real node; DevCluster starts and records its processes."""

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

    def prepare(self, api_port: int, kubelet_port: int, healthz_port: int) -> None:
        """Write configs, certificates, CNI config and image tarballs (idempotent)."""
        host = check_host()
        log.info("  %s: pods under the cgroup %s", host.describe(), self.cgroup_root)
        p = self.paths
        if not self.paths.root.exists():
            # A new node: what an earlier node of ours left in the machine's kubelet directory
            # (a crash, no `down`) would confuse this kubelet (pods, checkpoints of another node).
            unmount_under(p.kubelet_root)
            clear_machine_dirs()
        for d in (p.root, p.containerd_root.parent, p.kubelet_root, p.pod_logs, p.cni_conf, p.cdi_spec_dir):
            d.mkdir(parents=True, exist_ok=True)
        if not self.link.is_symlink():
            self.link.symlink_to(p.root)
        p.containerd_config.write_text(containerd_config(p))
        (p.root / "registry" / "_default").mkdir(parents=True, exist_ok=True)
        (p.root / "registry" / "_default" / "hosts.toml").write_text(registry_hosts())
        (p.cni_conf / "10-loopback.conflist").unlink(missing_ok=True)
        (p.cni_conf / "10-patchbay-pods.conflist").write_text(json.dumps(cni_conflist(p), indent=2))
        create_bridge()
        ca = pki.CertificateAuthority(self.pki_dir)
        client = ca.issue("kubelet-client", f"system:node:{NODE_NAME}", orgs=("system:nodes",), client=True)
        ca.issue("kubelet-serving", NODE_NAME, server=True)
        pki.write_kubeconfig(self.kubeconfig, f"https://127.0.0.1:{api_port}", ca.pair.cert, client)
        p.kubelet_config.write_text(
            json.dumps(
                kubelet_config(
                    p, self.pki_dir, kubelet_port, healthz_port, self.cgroup_root, cgroup_version=host.version
                ),
                indent=2,
            )
        )
        self.image_tarballs = images.build_images(p.images)
        self.create_cgroups(host)

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

    @property
    def kubeconfig(self) -> Path:
        return self.paths.root / "kubelet.kubeconfig"

    def _runtime_binary(self, name: str) -> Path:
        """containerd, its shim and ctr come from the Kubernetes build (hack/kube-binaries.sh)."""
        path = self.bin_dir / name if self.bin_dir is not None else None
        if path is None or not path.is_file():
            raise NodeError(
                f"no {name} in {self.bin_dir}: run `make setup` (hack/kube-binaries.sh builds "
                "containerd 2.x, which injects CDI devices; Debian bookworm's 1.6 cannot)"
            )
        return path

    def containerd_env(self) -> dict[str, str]:
        """PATH with the built binaries first: containerd looks its shim up on PATH, and Debian's
        1.6 shim may be installed too."""
        shim = self._runtime_binary("containerd-shim-runc-v2")
        return {**os.environ, "PATH": f"{shim.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}

    def containerd_argv(self) -> list[str]:
        # containerd finds its runc shim on PATH: the one built with it, first.
        self._runtime_binary("containerd-shim-runc-v2")
        return [str(self._runtime_binary("containerd")), "--config", str(self.paths.containerd_config)]

    def kubelet_argv(self) -> list[str]:
        if self.bin_dir is None:
            raise NodeError("no Kubernetes binaries to run the kubelet from")
        return [
            str(self.bin_dir / "kubelet"),
            f"--config={self.paths.kubelet_config}",
            f"--kubeconfig={self.kubeconfig}",
            f"--root-dir={self.paths.kubelet_root}",
            f"--cert-dir={self.paths.root / 'kubelet-pki'}",
            f"--hostname-override={NODE_NAME}",
            # The bridge's address: hostNetwork pods get it as their IP, so probes of those pods
            # stay on the pod network too (never the machine's own interface).
            f"--node-ip={NODE_IP}",
            "--v=1",
            # The device manager's plugin handler and client at V(2): every registration,
            # connection, ListAndWatch update and disconnection of a device plugin is logged
            # (klog matches file base names, so other handler.go/client.go files log a little too).
            "--vmodule=handler=2,client=2",
        ]

    def ctr(self, *args: str, timeout: float = 60) -> str:
        res = subprocess.run(
            [
                str(self._runtime_binary("ctr")),
                "--address",
                str(self.paths.containerd_sock),
                "--namespace",
                "k8s.io",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if res.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)}: {res.stderr.strip()}")
        return res.stdout

    def containerd_ready(self) -> bool:
        if not self.paths.containerd_sock.exists():
            return False
        try:
            self.ctr("version", timeout=5)
        except (NodeError, subprocess.TimeoutExpired):
            return False
        return True

    def import_images(self) -> None:
        for name, tarball in self.image_tarballs.items():
            self.ctr("images", "import", "--no-unpack=false", str(tarball), timeout=120)
            log.info("  imported %s", name)

    def image_names(self) -> set[str]:
        return set(self.ctr("images", "list", "--quiet").split())

    def import_archive(self, ref: str, archive: Path) -> bool:
        """Import an OCI archive (``podman save --format oci-archive``) as ``ref``; False when
        containerd already has that name (tags are content hashes, so the same name is the same
        image)."""
        if ref in self.image_names():
            return False
        # An OCI archive names its image by tag; --base-name supplies the repository.
        self.ctr("images", "import", "--base-name", ref.rsplit(":", 1)[0], str(archive), timeout=300)
        if ref not in self.image_names():
            raise NodeError(f"importing {archive} did not produce {ref}")
        return True

    # --- teardown ------------------------------------------------------------------------------

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

    def kill_shims(self) -> int:
        """The runc shims outlive containerd by design; ours name our socket in their argv."""
        needle = str(self.paths.containerd_sock).encode()
        killed = 0
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmd = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if b"containerd-shim" in cmd and needle in cmd:
                try:
                    os.kill(int(proc.name), signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
        return killed

    def unmount_all(self) -> None:
        """Detach every mount under the node's directory and the kubelet's (tmpfs volumes,
        overlay rootfs, shm)."""
        unmount_under(self.paths.root.resolve(), self.paths.kubelet_root)

    def claim_device_plugin_dir(self) -> None:
        """Take the machine-wide kubelet directory (device plugins, PodResources, plugin registry)
        and CDI directory, or say clearly who holds them: another node whose recorded kubelet
        still runs, or a kubelet that is not one of ours."""
        if foreign := foreign_kubelet_state():
            raise NodeError(
                f"{KUBELET_ROOT} holds another kubelet's state ({', '.join(foreign)}) and no Patchbay "
                "node claimed it: a real node of the dev cluster uses the machine's kubelet directory, "
                "so it cannot run on a machine that is a Kubernetes node already"
            )
        owner = Owner.read()
        if owner is not None and owner.state_dir != self.state_dir and owner.kubelet_runs():
            raise NodeError(
                f"another real node (state dir {owner.state_dir}) is running, and the kubelet's "
                f"device-plugin directory {DEVICE_PLUGIN_DIR} is machine-wide: stop it first with "
                f"`patchbay-devcluster --state-dir {owner.state_dir} down`"
            )
        Owner(self.state_dir).write()

    def record_kubelet(self, kubelet: Proc) -> None:
        """Note the running kubelet in ``OWNER_FILE`` (if this node holds it), so that another
        cluster's claim can tell this node still runs."""
        owner = Owner.read()
        if owner is not None and owner.state_dir == self.state_dir:
            Owner(self.state_dir, kubelet).write()

    def release_device_plugin_dir(self) -> None:
        """Give the machine-wide directories back as a new node would find them (after
        ``unmount_all``): no sockets (the kubelet's and those of plugins killed with their pods),
        no device checkpoint (it names pods of the node that is gone), no kubelet state, no CDI
        spec of Patchbay's. Only when this node holds them."""
        owner = Owner.read()
        if owner is None or owner.state_dir != self.state_dir:
            return
        clear_machine_dirs()
        OWNER_FILE.unlink(missing_ok=True)

    def remove_files(self) -> None:
        """After ``unmount_all``: the node's directory and the state directory's link to it."""
        shutil.rmtree(self.paths.root, ignore_errors=True)
        if self.link.is_symlink():
            self.link.unlink()

    def remove_network(self) -> None:
        """After the pods are gone: the bridge and its leases (``remove_files`` takes the leases)."""
        delete_bridge()

    def exists(self) -> bool:
        return self.paths.root.exists() or self.link.is_symlink()

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
