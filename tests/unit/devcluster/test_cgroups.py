"""The real node on cgroup v1 and v2, without a real node: detection from the file system type and a
fake /sys/fs/cgroup tree, the kubelet's and containerd's settings for each, the node's cgroups made
ready (with a writer that does what the kernel does to ``cgroup.subtree_control``), and ``down``
finding every process of the node's pods in either layout.

The machine that runs these tests has one layout; the other is only what these fakes say of it
(docs/devcluster.md says which hosts the real node was proven on).
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from kubernetes import client
from support.realnode import ended, pod_processes

from patchbay_devcluster import DevCluster, cgroups
from patchbay_devcluster import node as node_module
from patchbay_devcluster.cgroups import (
    CgroupError,
    HostCgroups,
    create_node_cgroups,
    detect,
    kubelet_settings,
)
from patchbay_devcluster.containerd import containerd_config
from patchbay_devcluster.kubelet import kubelet_config
from patchbay_devcluster.node import NodePaths, RealNode

ROOT = "/patchbay-0123456789"
V2_CONTROLLERS = "cpuset cpu io memory hugetlb pids rdma misc"
"""``cgroup.controllers`` of a typical v2 root (Debian 12, Ubuntu 24.04, Fedora)."""


def v2_tree(base: Path, controllers: str = V2_CONTROLLERS, enabled: str = "") -> Path:
    base.mkdir(parents=True, exist_ok=True)
    (base / "cgroup.controllers").write_text(controllers + "\n")
    (base / "cgroup.subtree_control").write_text(enabled + "\n")
    (base / "cgroup.procs").write_text("1\n")
    return base


def v1_tree(base: Path, hierarchies: tuple[str, ...], hybrid: bool = False) -> Path:
    """Hierarchies as Debian mounts them: ``cpu,cpuacct`` with ``cpu`` and ``cpuacct`` links."""
    base.mkdir(parents=True, exist_ok=True)
    for name in (*hierarchies, *(("unified",) if hybrid else ())):
        (base / name).mkdir()
        (base / name / "cgroup.procs").write_text("1\n")
        if name == "cpu,cpuacct":
            (base / "cpu").symlink_to(name)
            (base / "cpuacct").symlink_to(name)
        if name == "cpuset":
            (base / name / "cpuset.cpus").write_text("0-1\n")
            (base / name / "cpuset.mems").write_text("0\n")
    return base


DEBIAN_V1 = ("cpu,cpuacct", "cpuset", "memory", "devices", "freezer", "pids", "blkio", "systemd")


class KernelWriter:
    """Writes as cgroupfs takes them, every write recorded: ``+c`` to a ``cgroup.subtree_control``
    adds ``c`` there, and fails (ENOENT) unless the cgroup has ``c``: in its
    ``cgroup.controllers`` at the base, else in its parent's ``cgroup.subtree_control``."""

    def __init__(self, base: Path, fail: dict[Path, int] | None = None) -> None:
        self.base = base
        self.writes: list[tuple[Path, str]] = []
        self.fail = fail or {}

    def __call__(self, path: Path, value: str) -> None:
        if path in self.fail:
            raise OSError(self.fail[path], os.strerror(self.fail[path]))
        if path.name == "cgroup.subtree_control":
            cgroup = path.parent
            has = cgroup / "cgroup.controllers" if cgroup == self.base else cgroup.parent / path.name
            controller = value.removeprefix("+")
            if controller not in has.read_text().split():
                raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
            enabled = set(path.read_text().split()) if path.exists() else set()
            path.write_text(" ".join(sorted(enabled | {controller})) + "\n")
        else:
            path.write_text(value)
        self.writes.append((path, value))


# --- detection ------------------------------------------------------------------------------


def test_cgroup2fs_is_v2_and_the_node_lives_in_one_directory(tmp_path: Path) -> None:
    host = detect("cgroup2fs", v2_tree(tmp_path / "cg"))
    assert host.version == 2
    assert host.problem() is None
    assert "cgroup v2" in host.describe()
    assert not host.hybrid
    assert host.node_dirs(ROOT) == [tmp_path / "cg" / ROOT.lstrip("/")]
    assert host.memory_dir(ROOT) == tmp_path / "cg" / ROOT.lstrip("/")


@pytest.mark.parametrize(
    ("controllers", "missing"),
    [("cpuset cpu io hugetlb pids", "memory"), ("memory pids", "cpu"), ("", "cpu memory pids")],
)
def test_v2_without_the_controllers_pods_need_is_refused_in_one_line(
    tmp_path: Path, controllers: str, missing: str
) -> None:
    problem = detect("cgroup2fs", v2_tree(tmp_path, controllers)).problem()
    assert problem is not None
    assert f"lacks the {missing} controller" in problem
    assert "\n" not in problem


def test_tmpfs_with_the_v1_hierarchies_is_v1_and_the_node_is_in_each(tmp_path: Path) -> None:
    base = v1_tree(tmp_path / "cg", DEBIAN_V1)
    host = detect("tmpfs", base)
    assert host.version == 1
    assert host.problem() is None
    assert not host.hybrid
    assert {"cpu", "cpuacct", "cpuset", "memory"} <= host.controllers
    dirs = host.node_dirs(ROOT)
    assert base / "memory" / ROOT.lstrip("/") in dirs
    assert base / "systemd" / ROOT.lstrip("/") in dirs
    assert host.memory_dir(ROOT) == base / "memory" / ROOT.lstrip("/")
    comounted = detect("tmpfs", v1_tree(tmp_path / "co", ("cpu,cpuacct", "cpuset", "memory,blkio")))
    assert comounted.problem() is None
    assert comounted.memory_dir(ROOT) == tmp_path / "co" / "memory,blkio" / ROOT.lstrip("/")


def test_hybrid_is_v1_and_teardown_looks_in_the_unified_mount_too(tmp_path: Path) -> None:
    """systemd's hybrid layout (this project's own test machine): runc and the kubelet see v1 (a
    statfs of /sys/fs/cgroup), and runc mirrors each container's cgroup into ``unified``."""
    base = v1_tree(tmp_path / "cg", DEBIAN_V1, hybrid=True)
    host = detect("tmpfs", base)
    assert host.version == 1
    assert host.hybrid
    assert host.problem() is None
    assert "hybrid" in host.describe()
    assert base / "unified" / ROOT.lstrip("/") in host.node_dirs(ROOT)
    assert "unified" not in host.controllers


@pytest.mark.parametrize(
    ("hierarchies", "missing"),
    [
        (("cpu,cpuacct", "cpuset", "pids"), "memory"),
        (("cpuset", "memory"), "cpu cpuacct"),
        ((), "cpu cpuacct cpuset memory"),
    ],
)
def test_v1_without_the_kubelets_hierarchies_is_refused_in_one_line(
    tmp_path: Path, hierarchies: tuple[str, ...], missing: str
) -> None:
    problem = detect("tmpfs", v1_tree(tmp_path / "cg", hierarchies)).problem()
    assert problem is not None
    assert f"lacks the {missing} hierarchy" in problem
    assert "\n" not in problem


@pytest.mark.parametrize("fs", ["", "sysfs", "ext2/ext3"])
def test_no_cgroup_filesystem_is_refused_in_one_line(tmp_path: Path, fs: str) -> None:
    host = detect(fs, tmp_path)
    assert host.version == 0
    assert host.node_dirs(ROOT) == []
    problem = host.problem()
    assert problem is not None
    assert "no cgroup filesystem" in problem
    assert "\n" not in problem


def test_the_file_system_type_is_what_stat_says(tmp_path: Path) -> None:
    assert cgroups.fs_type(tmp_path) not in ("", "cgroup2fs")
    assert cgroups.fs_type(tmp_path / "missing") == ""


# --- settings -------------------------------------------------------------------------------


def test_the_kubelets_cgroup_settings_on_v1_and_v2(tmp_path: Path) -> None:
    assert kubelet_settings(1, ROOT) == {
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": ROOT,
        "failCgroupV1": False,
    }
    assert kubelet_settings(2, ROOT) == {"cgroupDriver": "cgroupfs", "cgroupRoot": ROOT, "failCgroupV1": True}
    paths = NodePaths(tmp_path)
    for version in (1, 2):
        conf = kubelet_config(paths, tmp_path / "pki", 1, 2, ROOT, cgroup_version=version)
        assert conf["cgroupDriver"] == "cgroupfs"
        assert conf["cgroupRoot"] == ROOT
        assert conf["failCgroupV1"] is (version == 2)
        # The kubelet and containerd stay where they were started: the root holds pods only.
        assert "kubeletCgroups" not in conf
        assert "systemCgroups" not in conf


def test_containerds_runc_uses_cgroupfs_on_either_version(tmp_path: Path) -> None:
    conf = containerd_config(NodePaths(tmp_path))
    options = conf.split(".runtimes.runc.options]", 1)[1]
    assert "SystemdCgroup = false" in options.split("[", 1)[0]


# --- the node's cgroups made ready ------------------------------------------------------------


def test_v2_enables_the_kubelets_controllers_in_the_parent_and_in_the_nodes_cgroup(tmp_path: Path) -> None:
    """The kubelet checks that its cgroup root has cpu, cpuset, memory, hugetlb and pids (those the
    kernel has) in ``cgroup.controllers``, which the parent's ``cgroup.subtree_control`` decides."""
    base = v2_tree(tmp_path, "cpuset cpu io memory pids", enabled="memory")
    host = detect("cgroup2fs", base)
    write = KernelWriter(base)
    dirs = create_node_cgroups(host, ROOT, write)
    sub = base / ROOT.lstrip("/")
    assert dirs == [sub]
    assert write.writes == [
        (base / "cgroup.subtree_control", "+cpu"),
        (base / "cgroup.subtree_control", "+cpuset"),
        (base / "cgroup.subtree_control", "+pids"),
        (sub / "cgroup.subtree_control", "+cpu"),
        (sub / "cgroup.subtree_control", "+cpuset"),
        (sub / "cgroup.subtree_control", "+memory"),
        (sub / "cgroup.subtree_control", "+pids"),
    ]
    # What the kubelet's Validate reads as its cgroup root's cgroup.controllers:
    assert set((base / "cgroup.subtree_control").read_text().split()) == {"cpu", "cpuset", "memory", "pids"}
    again = KernelWriter(base)
    assert create_node_cgroups(host, ROOT, again) == [sub]
    assert again.writes == []


def test_v2_with_processes_in_the_parent_says_what_to_do(tmp_path: Path) -> None:
    """A container's root cgroup that holds processes cannot hand controllers on (EBUSY)."""
    base = v2_tree(tmp_path)
    write = KernelWriter(base, fail={base / "cgroup.subtree_control": errno.EBUSY})
    with pytest.raises(CgroupError, match=r"holds processes; move them to a child cgroup first") as e:
        create_node_cgroups(detect("cgroup2fs", base), ROOT, write)
    assert "\n" not in str(e.value)


def test_v2_on_a_read_only_tree_names_the_error(tmp_path: Path) -> None:
    base = v2_tree(tmp_path)
    write = KernelWriter(base, fail={base / "cgroup.subtree_control": errno.EROFS})
    with pytest.raises(CgroupError, match="Read-only file system"):
        create_node_cgroups(detect("cgroup2fs", base), ROOT, write)


def test_v1_makes_the_root_in_every_hierarchy_and_gives_a_new_cpuset_its_parents(tmp_path: Path) -> None:
    base = v1_tree(tmp_path / "cg", DEBIAN_V1, hybrid=True)
    host = detect("tmpfs", base)
    dirs = create_node_cgroups(host, ROOT, KernelWriter(base))
    name = ROOT.lstrip("/")
    for hierarchy in DEBIAN_V1:
        assert (base / hierarchy / name).is_dir()
    assert not (base / "unified" / name).exists()  # runc's, on a hybrid host
    assert base / "memory" / name in dirs
    assert (base / "cpuset" / name / "cpuset.cpus").read_text() == "0-1\n"
    assert (base / "cpuset" / name / "cpuset.mems").read_text() == "0\n"
    (base / "cpuset" / name / "cpuset.cpus").write_text("1\n")
    create_node_cgroups(host, ROOT, KernelWriter(base))
    assert (base / "cpuset" / name / "cpuset.cpus").read_text() == "1\n"  # set: kept


def test_a_host_with_a_problem_gets_no_cgroups(tmp_path: Path) -> None:
    base = v1_tree(tmp_path / "cg", ("cpu,cpuacct", "cpuset"))
    with pytest.raises(CgroupError, match="lacks the memory hierarchy"):
        create_node_cgroups(detect("tmpfs", base), ROOT, KernelWriter(base))
    assert not (base / "cpuset" / ROOT.lstrip("/")).exists()


# --- down, and the tests' view of a pod's processes ---------------------------------------------


@pytest.fixture
def cat_process() -> Iterator[subprocess.Popen[bytes]]:
    """A child that runs ``cat`` for certain, not the Python that forked it.

    ``Popen`` returns once the child's close-on-exec pipe closes, which the kernel does in the
    middle of ``execve``: before the new command name (``Name`` in /proc/<pid>/status) and
    command line are set. Under load a read of /proc right after ``Popen`` saw ``python`` there.
    The echo of one line is the handshake: only the new program can answer it.
    """
    proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"exec'd?\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == b"exec'd?\n"
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


def layouts(tmp_path: Path) -> dict[str, tuple[HostCgroups, list[Path]]]:
    """Each layout, and where runc puts one container's cgroup in it (in each v1 hierarchy)."""
    pod = f"{ROOT.lstrip('/')}/kubepods/besteffort/poduid-1/c1"
    v2 = detect("cgroup2fs", v2_tree(tmp_path / "v2"))
    v1 = detect("tmpfs", v1_tree(tmp_path / "v1", DEBIAN_V1, hybrid=True))
    return {
        "v2": (v2, [v2.base / pod]),
        "v1": (v1, [v1.base / h / pod for h in (*DEBIAN_V1, "unified")]),
    }


@pytest.mark.parametrize("layout", ["v1", "v2"])
def test_down_finds_every_process_of_the_nodes_pods(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cat_process: subprocess.Popen[bytes], layout: str
) -> None:
    host, containers = layouts(tmp_path)[layout]
    for c in containers:
        c.mkdir(parents=True)
        (c / "cgroup.procs").write_text(f"{cat_process.pid}\n")
    if host.version == 2:
        (host.base / ROOT.lstrip("/") / "cgroup.kill").write_text("0")
    monkeypatch.setattr(node_module, "host_cgroups", lambda: host)
    node = RealNode(tmp_path / "state", tmp_path / "pki", None)
    node.cgroup_root = ROOT
    assert node.kill_pods() == 1
    assert cat_process.wait(timeout=30) == -signal.SIGKILL
    if host.version == 2:
        assert (host.base / ROOT.lstrip("/") / "cgroup.kill").read_text() == "1"
    assert node.cgroup_dir() == host.memory_dir(ROOT)


@pytest.mark.parametrize("layout", ["v1", "v2"])
def test_down_removes_the_nodes_cgroups_in_either_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    host, containers = layouts(tmp_path)[layout]
    for c in containers:
        c.mkdir(parents=True)  # cgroupfs directories go with rmdir, files and all; empty ones here
    monkeypatch.setattr(node_module, "host_cgroups", lambda: host)
    node = RealNode(tmp_path / "state", tmp_path / "pki", None)
    node.cgroup_root = ROOT
    node.remove_cgroups()
    assert not any(d.exists() for d in host.node_dirs(ROOT))
    assert all(h.is_dir() for h in host.hierarchies)


def pod_in_cgroup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str, pids: list[int]
) -> tuple[DevCluster, client.V1Pod]:
    """A cluster whose real node's cgroup tree (a fake one, in ``layout``) holds a pod whose one
    container's ``cgroup.procs`` lists ``pids``; and that pod."""
    host, _ = layouts(tmp_path)[layout]
    pod_dir = host.memory_dir(ROOT) / "kubepods" / "besteffort" / "poduid-1"
    (pod_dir / "c1").mkdir(parents=True)
    (pod_dir / "c1" / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in pids))
    monkeypatch.setattr(node_module, "host_cgroups", lambda: host)
    node = RealNode(tmp_path / "state", tmp_path / "pki", None)
    node.cgroup_root = ROOT
    cluster = cast(DevCluster, SimpleNamespace(real_node=lambda: node))
    return cluster, client.V1Pod(metadata=client.V1ObjectMeta(name="p", uid="uid-1"))


@pytest.mark.parametrize("layout", ["v1", "v2"])
def test_a_pods_processes_are_read_from_its_cgroup_in_either_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cat_process: subprocess.Popen[bytes], layout: str
) -> None:
    procs = pod_processes(*pod_in_cgroup(tmp_path, monkeypatch, layout, [cat_process.pid]))
    assert list(procs) == [cat_process.pid]
    assert procs[cat_process.pid]["Name"] == "cat"


def test_a_zombie_of_the_pod_is_left_out_and_reads_as_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cat_process: subprocess.Popen[bytes]
) -> None:
    """A process of the pod that has exited but is not yet reaped (an exec probe's child, say):
    its mountinfo reads EINVAL and its status has no memory, so the tests reading a pod's
    processes skip it (`pod_processes`) or take a failed read of it for its end (`ended`), as
    for one already gone."""
    zombie = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 30
        while not ended(zombie.pid) and time.monotonic() < deadline:  # exited, not reaped: no wait()
            time.sleep(0.01)
        assert ended(zombie.pid)
        with pytest.raises(OSError, match=r"Invalid argument|No such file") as e:
            Path(f"/proc/{zombie.pid}/mountinfo").read_text()
        assert e.value.errno in (errno.EINVAL, errno.ENOENT)
        assert not ended(cat_process.pid) and not ended("self")
        pod = pod_in_cgroup(tmp_path, monkeypatch, "v2", [cat_process.pid, zombie.pid])
        assert list(pod_processes(*pod)) == [cat_process.pid]
    finally:
        zombie.wait()
    assert ended(zombie.pid)  # reaped: gone from /proc
