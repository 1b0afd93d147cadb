"""The host's cgroups as the real node sees them: which version, what the kubelet needs of each,
and where the node's own cgroups are.

Which version: what ``stat -f`` says of ``/sys/fs/cgroup``, the same test runc and the kubelet make
(a statfs for ``CGROUP2_SUPER_MAGIC``, opencontainers/cgroups ``IsCgroup2UnifiedMode``):

- ``cgroup2fs``: unified, cgroup v2. The node's cgroup root is one directory,
  ``/sys/fs/cgroup/<root>``; the controllers the kubelet uses must be enabled in the parent's
  ``cgroup.subtree_control`` (the kubelet checks that its cgroup root has them in
  ``cgroup.controllers`` before it creates anything), and the node's cgroup holds no process of its
  own (cgroup v2 lets only a cgroup without processes hand controllers on to children).
- ``tmpfs``: cgroup v1, one mounted hierarchy per controller (or group of controllers). The
  kubelet needs ``cpu``, ``cpuacct``, ``cpuset`` and ``memory`` (``validateSystemRequirements``),
  and the node's cgroup root exists in every hierarchy.
- hybrid (``tmpfs`` plus a cgroup2 mount at ``/sys/fs/cgroup/unified``, systemd's hybrid layout):
  treated as v1, as runc and the kubelet treat it; runc mirrors each container's cgroup into the
  unified mount, so teardown looks there too.
- anything else (nothing mounted): no real node, and a one-line reason.

Only the standard library: ``hack/host_check.py`` loads this file by path with the machine's
python3 before the virtualenv exists, so ``make setup`` and the node decide alike.
"""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BASE = Path("/sys/fs/cgroup")
V2_FS = "cgroup2fs"
V1_FS = "tmpfs"
HYBRID_MOUNT = "unified"
"""systemd's hybrid layout mounts cgroup2 here, beside the v1 hierarchies."""

V1_REQUIRED = ("cpu", "cpuacct", "cpuset", "memory")
"""The v1 hierarchies the kubelet refuses to start without (its validateSystemRequirements)."""
V2_USED = ("cpu", "cpuset", "hugetlb", "memory", "pids")
"""The v2 controllers the kubelet uses where the kernel has them (getSupportedUnifiedControllers):
the node enables each one that is available."""
V2_REQUIRED = ("cpu", "memory", "pids")
"""Of those, what pods cannot do without (their limits), so what the node requires."""


class CgroupError(RuntimeError):
    """The real node cannot run on this host's cgroups; the message is one line saying why."""


@dataclass(frozen=True)
class HostCgroups:
    """What ``/sys/fs/cgroup`` holds. ``detect`` never fails: ``problem`` says what is missing."""

    version: int
    """2 (unified), 1 (v1 or hybrid) or 0 (no cgroup filesystem there)."""
    fs_type: str
    base: Path
    hierarchies: tuple[Path, ...] = ()
    """v1: every mounted hierarchy (the hybrid's unified mount included); v2: ``(base,)``."""
    controllers: frozenset[str] = frozenset()
    """v2: ``cgroup.controllers`` of the base; v1: the controllers of the mounted hierarchies."""

    @property
    def hybrid(self) -> bool:
        return self.version == 1 and (self.base / HYBRID_MOUNT) in self.hierarchies

    def describe(self) -> str:
        if self.version == 2:
            return f"cgroup v2 (unified, {self.base} is {self.fs_type})"
        if self.version == 1:
            hybrid = f", hybrid: cgroup2 also at {self.base / HYBRID_MOUNT}" if self.hybrid else ""
            return f"cgroup v1 ({self.base} is {self.fs_type}{hybrid})"
        return f"no cgroups ({self.base} is {self.fs_type or 'missing'})"

    def problem(self) -> str | None:
        """Why the real node cannot run here, in one line; None when it can."""
        if self.version == 2:
            missing = [c for c in V2_REQUIRED if c not in self.controllers]
            if missing:
                have = " ".join(sorted(self.controllers)) or "none"
                return (
                    f"cgroup v2 at {self.base} lacks the {' '.join(missing)} controller(s) the kubelet's "
                    f"pods need ({self.base}/cgroup.controllers: {have}); in a container, delegate them to it"
                )
            return None
        if self.version == 1:
            missing = [c for c in V1_REQUIRED if c not in self.controllers]
            if missing:
                return (
                    f"cgroup v1 at {self.base} lacks the {' '.join(missing)} hierarchy(ies) the kubelet "
                    f"needs: mount them (mount -t cgroup -o {missing[0]} cgroup {self.base}/{missing[0]})"
                )
            return None
        return (
            f"no cgroup filesystem at {self.base} (`stat -f` says {self.fs_type or 'missing'}): the real "
            "node needs cgroup v2 (cgroup2fs) or cgroup v1 hierarchies (tmpfs) mounted there"
        )

    def node_dirs(self, root: str) -> list[Path]:
        """The node's cgroup root in every hierarchy: what ``down`` searches and removes."""
        return [h / root.lstrip("/") for h in self.hierarchies]

    def memory_dir(self, root: str) -> Path:
        """The node's cgroup root where memory is accounted; every pod's cgroup lies below it."""
        if self.version == 2:
            return self.base / root.lstrip("/")
        memory = [h for h in self.hierarchies if "memory" in h.name.split(",")]
        return (memory[0] if memory else self.base / "memory") / root.lstrip("/")


def fs_type(base: Path = BASE) -> str:
    """``stat -f -c %T`` of ``base`` (``cgroup2fs``, ``tmpfs``, ...); empty when it is missing."""
    try:
        res = subprocess.run(
            ["stat", "-f", "-c", "%T", str(base)], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return res.stdout.strip() if res.returncode == 0 else ""


def detect(fs: str, base: Path = BASE) -> HostCgroups:
    """What ``base`` holds, given its file system type (pure but for reading the tree)."""
    if fs == V2_FS:
        try:
            controllers = frozenset((base / "cgroup.controllers").read_text().split())
        except OSError:
            controllers = frozenset()
        return HostCgroups(2, fs, base, (base,), controllers)
    if fs == V1_FS:
        try:
            entries = sorted(base.iterdir())
        except OSError:
            entries = []
        hierarchies = tuple(h for h in entries if (h / "cgroup.procs").exists())
        controllers = frozenset(c for h in hierarchies if h.name != HYBRID_MOUNT for c in h.name.split(","))
        return HostCgroups(1, fs, base, hierarchies, controllers)
    return HostCgroups(0, fs, base)


def host_cgroups(base: Path = BASE) -> HostCgroups:
    return detect(fs_type(base), base)


def kubelet_settings(version: int, root: str) -> dict[str, object]:
    """The KubeletConfiguration's cgroup fields for a host of ``version``.

    The cgroupfs driver on both: no systemd manages cgroups here, and runc is told the same
    (containerd's ``SystemdCgroup = false``). ``failCgroupV1`` is false only on v1 (kubelets from
    1.35 refuse v1 otherwise); on v2 it stays true, so a kubelet that finds v1 after all refuses
    instead of running with settings meant for v2. No ``kubeletCgroups``/``systemCgroups``: the
    kubelet and containerd stay in the cgroup they were started in, so the node's cgroup root holds
    pods only (on v2 it must hold no process to hand controllers on).
    """
    return {"cgroupDriver": "cgroupfs", "cgroupRoot": root, "failCgroupV1": version != 1}


def write_knob(path: Path, value: str) -> None:
    path.write_text(value)


def _enable(subtree_control: Path, controllers: list[str], write: Callable[[Path, str], None]) -> None:
    """Enable each controller in ``subtree_control`` that is not yet (one write each, as the kernel
    rejects a whole line for one bad name)."""
    try:
        enabled = set(subtree_control.read_text().split())
    except OSError:
        enabled = set()
    cgroup = subtree_control.parent
    for c in controllers:
        if c in enabled:
            continue
        try:
            write(subtree_control, f"+{c}")
        except OSError as e:
            if e.errno == errno.EBUSY:
                # cgroup v2 hands controllers on only from a cgroup without processes (the
                # machine's root cgroup aside): here, a container's root cgroup, most likely.
                raise CgroupError(
                    f"cannot enable the {c} controller in {subtree_control}: {cgroup} holds processes; "
                    f"move them to a child cgroup first: mkdir {cgroup}/init && "
                    f"for p in $(cat {cgroup}/cgroup.procs); do echo $p > {cgroup}/init/cgroup.procs; done"
                ) from None
            raise CgroupError(f"cannot enable the {c} controller in {subtree_control}: {e.strerror}") from e


def create_node_cgroups(
    host: HostCgroups, root: str, write: Callable[[Path, str], None] = write_knob
) -> list[Path]:
    """Make the node's cgroup root ready for its kubelet, idempotently; returns its directories.

    v1: the directory in every hierarchy (the kubelet insists it exists in each one it uses), a
    new cpuset given its parent's CPUs and memory nodes. v2: the controllers the kubelet uses
    enabled in the base's ``cgroup.subtree_control``, the directory, and the same controllers
    enabled in its own ``cgroup.subtree_control`` for the kubelet's ``kubepods`` below it.
    """
    problem = host.problem()
    if problem is not None:
        raise CgroupError(problem)
    name = root.lstrip("/")
    if host.version == 2:
        used = [c for c in V2_USED if c in host.controllers]
        _enable(host.base / "cgroup.subtree_control", used, write)
        sub = host.base / name
        sub.mkdir(exist_ok=True)
        _enable(sub / "cgroup.subtree_control", used, write)
        return [sub]
    dirs = []
    for hierarchy in host.hierarchies:
        if hierarchy.name == HYBRID_MOUNT:
            continue  # runc mirrors its cgroups there itself
        sub = hierarchy / name
        sub.mkdir(exist_ok=True)
        if "cpuset" in hierarchy.name.split(","):
            # A new cpuset has no CPUs or memory nodes until given its parent's.
            for knob in ("cpuset.cpus", "cpuset.mems"):
                try:
                    empty = not (sub / knob).read_text().strip()
                except FileNotFoundError:
                    empty = True
                if empty:
                    write(sub / knob, (hierarchy / knob).read_text())
        dirs.append(sub)
    return dirs
