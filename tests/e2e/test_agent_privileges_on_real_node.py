"""What an agent process may do on the REAL node, read from the kernel, not from the pod spec.

The agents run as uid 0 because the kubelet's directories they create sockets in
(`device-plugins`, `plugins`, `plugins_registry`) and the CDI spec directory are root's, mode 0755:
only their owner may create files there, and a non-root uid could do so only with
CAP_DAC_OVERRIDE, which Kubernetes cannot give a non-root process (it sets no ambient
capabilities). So the least an agent can run with is uid 0 WITHOUT capabilities: owner
permissions on root's files in the host paths it mounts, nothing more (docs/security.md#host-access).

Checked on the processes of a profile's own agent pod and of the shared node agent pod (the
kernel's /proc/<pid>/status for every process in the pod's cgroup, the pause process aside):
uid 0, no effective, permitted, inheritable or ambient capability, and an empty bounding set
(nothing regained through exec), no_new_privs, a seccomp filter.

And what of the kubelet's `plugins` directory (every CSI and DRA driver's sockets) the agents can
reach, from the kernel's /proc/<pid>/mountinfo: no mount shows `<kubelet root>/plugins` itself (or
anything above it); the shared node agent's only mount below it is its own
`plugins/patchbay_node-agent`, so another driver's directory, made on the host for the test, is
not there in its mount namespace (/proc/<pid>/root).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePosixPath

from support.clusters import Cluster
from support.realnode import OWN_AGENT, SHARED_SELECTOR, Installed, ended, pod_processes, wait_for

from patchbay_devcluster import DevCluster


def _unescape(field: str) -> str:
    """A mountinfo path field: the kernel writes space, tab, newline and backslash as octal."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mounts(pid: int | str) -> list[tuple[str, PurePosixPath, PurePosixPath]]:
    """(device major:minor, root: the path inside that filesystem the mount shows, mount point)
    of every mount in the mount namespace of ``pid``, from /proc/<pid>/mountinfo."""
    out = []
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        f = line.split()
        out.append((f[2], PurePosixPath(_unescape(f[3])), PurePosixPath(_unescape(f[4]))))
    return out


def in_filesystem(host_path: Path) -> tuple[str, PurePosixPath]:
    """(device, path inside that filesystem) of a directory of the host, as a bind mount of it
    shows in a container's mountinfo: the host's mount that holds it, plus the rest of the path."""
    path = PurePosixPath(os.path.realpath(host_path))
    holders = [m for m in mounts("self") if path == m[2] or path.is_relative_to(m[2])]
    device, root, point = max(reversed(holders), key=lambda m: len(m[2].parts))  # the last of the deepest
    return device, root / path.relative_to(point)


def test_agents_run_as_uid_0_with_no_capability_no_new_privileges_and_seccomp(
    patchbay: Installed, cluster: Cluster, e2e_cluster: DevCluster, real_node: str
) -> None:
    label = "patchbay.dev/e2e-privileges"
    own, shared = f"{cluster.prefix}own", f"{cluster.prefix}shared"

    def spec(suffix: str, **extra: object) -> dict[str, object]:
        return {
            "resourceName": f"e2e.patchbay.dev/{cluster.tag}-{suffix}",
            "mode": "DevicePlugin",
            "nodeSelector": {"matchLabels": {label: cluster.tag}},
            "plugin": {"discovery": {"virtual": {"count": 1}}},
            **extra,
        }

    plugins = e2e_cluster.real_node().paths.kubelet_root / "plugins"
    # Another driver's directory, as a CSI or DRA driver of the node has: no agent may see it.
    other = plugins / f"e2e-{cluster.tag}.example.com"
    other.mkdir(parents=True, exist_ok=True)
    (other / "plugin.sock").touch()
    cluster.set_labels(real_node, {label: cluster.tag})
    try:
        cluster.create_profile(own, spec("own", agent=OWN_AGENT))
        cluster.create_profile(shared, spec("shared"))
        pods = [
            wait_for("the profile's own agent pod Ready", lambda: patchbay.ready_agents(own), 120)[0],
            wait_for(
                "the shared node agent pod running",
                lambda: [
                    p
                    for p in patchbay.core.list_namespaced_pod(
                        patchbay.namespace, label_selector=SHARED_SELECTOR
                    ).items
                    if p.status.phase == "Running" and not p.metadata.deletion_timestamp
                ],
                120,
            )[0],
        ]
        for pod in pods:
            processes = pod_processes(e2e_cluster, pod)
            assert processes, f"no agent process found in pod {pod.metadata.name}"
            for pid, st in processes.items():
                where = f"pod {pod.metadata.name}, pid {pid} ({st.get('Name')})"
                assert st["Uid"].split() == ["0"] * 4, (where, st["Uid"])
                for caps in ("CapEff", "CapPrm", "CapInh", "CapAmb", "CapBnd"):
                    assert int(st[caps], 16) == 0, (where, caps, st[caps])
                assert st["NoNewPrivs"] == "1", (where, st["NoNewPrivs"])
                assert st["Seccomp"] == "2", (where, "seccomp mode", st["Seccomp"])
        # Least host access: of the kubelet's plugins directory, only the shared node agent's own.
        device, fs_plugins = in_filesystem(plugins)
        fs_own = fs_plugins / "patchbay_node-agent"
        for pod in pods:
            shared_pod = pod is pods[1]
            for pid in pod_processes(e2e_cluster, pod):
                where = f"pod {pod.metadata.name}, pid {pid}"
                below = []
                try:
                    seen = mounts(pid)
                except OSError:
                    if ended(pid):
                        continue  # ended meanwhile (a zombie's mountinfo reads EINVAL)
                    raise
                for dev, root, point in seen:
                    if dev != device:
                        continue
                    assert not (fs_plugins == root or fs_plugins.is_relative_to(root)), (
                        f"{where}: the mount at {point} shows the kubelet's whole plugins directory"
                    )
                    if root.is_relative_to(fs_plugins):
                        below.append((root, point))
                if shared_pod:
                    # Exactly its own directory, at the same path in the container.
                    assert below == [(fs_own, PurePosixPath(plugins / "patchbay_node-agent"))], (where, below)
                    own_dir = Path(f"/proc/{pid}/root{plugins}/patchbay_node-agent")
                    assert own_dir.is_dir() or ended(pid), where
                else:
                    assert below == [], (where, below)  # a device-plugin agent: none of it
                assert not Path(f"/proc/{pid}/root{other}").exists(), (where, "sees", other)
        print(
            f"agent privileges: {len(pods)} agent pods, uid 0, no capabilities, no_new_privs, seccomp; "
            "of the kubelet's plugins directory only the node agent's own"
        )
    finally:
        for name in (own, shared):
            cluster.delete_profile(name)
        cluster.set_labels(real_node, {label: None})
        shutil.rmtree(other, ignore_errors=True)
