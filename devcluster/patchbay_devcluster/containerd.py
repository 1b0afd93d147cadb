"""The real node's container runtime: containerd 2.4 (built with the Kubernetes binaries, for its
CDI injection) with Debian's runc, on private sockets under the node's directory; its images
(the node's own, built by :mod:`patchbay_devcluster.images`, and Patchbay's) are imported with
``ctr``, never pulled from the network.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

from patchbay_devcluster import images
from patchbay_devcluster.hostdirs import NodeError, NodePaths
from patchbay_devcluster.process import Process, StateDir

log = logging.getLogger(__name__)


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
    config_path = '{paths.registry_config}'

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


def registry_hosts() -> str:
    """``_default/hosts.toml``: the upstream of EVERY registry is 127.0.0.1:9 (nothing listens)."""
    return (
        'server = "http://127.0.0.1:9"\n\n[host."http://127.0.0.1:9"]\n  capabilities = ["pull", "resolve"]\n'
    )


class Containerd(Process):
    """containerd of the node: its configuration, binaries, readiness (``ctr version`` answers),
    image store, and the runc shims that outlive it."""

    name = "containerd"

    def __init__(self, home: StateDir, paths: NodePaths, bin_dir: Path | None) -> None:
        super().__init__(home)
        self.paths = paths
        self.bin_dir = bin_dir

    def configure(self) -> None:
        """Its config file, and a registry configuration where every registry resolves to a
        closed port (idempotent)."""
        p = self.paths
        p.containerd_root.parent.mkdir(parents=True, exist_ok=True)
        p.containerd_config.write_text(containerd_config(p))
        (p.registry_config / "_default").mkdir(parents=True, exist_ok=True)
        (p.registry_config / "_default" / "hosts.toml").write_text(registry_hosts())

    def runtime_binary(self, name: str) -> Path:
        """containerd, its shim and ctr come from the Kubernetes build (hack/kube-binaries.sh)."""
        path = self.bin_dir / name if self.bin_dir is not None else None
        if path is None or not path.is_file():
            raise NodeError(
                f"no {name} in {self.bin_dir}: run `make setup` (hack/kube-binaries.sh builds "
                "containerd 2.x, which injects CDI devices; Debian bookworm's 1.6 cannot)"
            )
        return path

    def env(self) -> Mapping[str, str]:
        """PATH with the built binaries first: containerd looks its shim up on PATH, and Debian's
        1.6 shim may be installed too."""
        shim = self.runtime_binary("containerd-shim-runc-v2")
        return {**os.environ, "PATH": f"{shim.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}

    def argv(self) -> list[str]:
        # containerd finds its runc shim on PATH: the one built with it, first.
        self.runtime_binary("containerd-shim-runc-v2")
        return [str(self.runtime_binary("containerd")), "--config", str(self.paths.containerd_config)]

    def ctr(self, *args: str, timeout: float = 60) -> str:
        res = subprocess.run(
            [
                str(self.runtime_binary("ctr")),
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

    def ready(self) -> bool:
        if not self.paths.containerd_sock.exists():
            return False
        try:
            self.ctr("version", timeout=5)
        except (NodeError, subprocess.TimeoutExpired):
            return False
        return True

    def import_images(self, tarballs: Mapping[str, Path]) -> None:
        """The node's own images (``images.build_images``), by name."""
        for name, tarball in tarballs.items():
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
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(proc.name), signal.SIGKILL)
                    killed += 1
        return killed
