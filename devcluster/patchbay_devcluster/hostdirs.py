"""The real node's directories: its own (:class:`NodePaths`, under one short directory linked as
``<state>/node``) and the machine's that every node of a real cluster uses, so that the chart's
defaults are the ones proven here: the kubelet's root ``/var/lib/kubelet`` (its device-plugin
socket, PodResources socket and plugin registry with it) and containerd's CDI directory
``/var/run/cdi``.

Those are machine-wide, so one real node runs per machine: ``OWNER_FILE`` names the state
directory of the node that holds them and its kubelet's PID (:class:`Owner`), so a second node can
tell whether the first still runs (:func:`claim`); a node starting removes what a node of ours left
there (:func:`clear_machine_dirs`), and refuses a kubelet directory that holds another kubelet's
pods (:func:`foreign_kubelet_state`).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchbay_devcluster.procs import Proc

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

    @property
    def registry_config(self) -> Path:
        """containerd's registry ``config_path``: a directory of ``<host>/hosts.toml`` files."""
        return self.root / "registry"


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


def claim(state_dir: Path) -> None:
    """Take the machine-wide kubelet directory (device plugins, PodResources, plugin registry)
    and CDI directory for the node of ``state_dir``, or say clearly who holds them: another node
    whose recorded kubelet still runs, or a kubelet that is not one of ours."""
    if foreign := foreign_kubelet_state():
        raise NodeError(
            f"{KUBELET_ROOT} holds another kubelet's state ({', '.join(foreign)}) and no Patchbay "
            "node claimed it: a real node of the dev cluster uses the machine's kubelet directory, "
            "so it cannot run on a machine that is a Kubernetes node already"
        )
    owner = Owner.read()
    if owner is not None and owner.state_dir != state_dir and owner.kubelet_runs():
        raise NodeError(
            f"another real node (state dir {owner.state_dir}) is running, and the kubelet's "
            f"device-plugin directory {DEVICE_PLUGIN_DIR} is machine-wide: stop it first with "
            f"`patchbay-devcluster --state-dir {owner.state_dir} down`"
        )
    Owner(state_dir).write()


def record_kubelet(state_dir: Path, kubelet: Proc) -> None:
    """Note the running kubelet in ``OWNER_FILE`` (if the node of ``state_dir`` holds it), so that
    another cluster's claim can tell this node still runs."""
    owner = Owner.read()
    if owner is not None and owner.state_dir == state_dir:
        Owner(state_dir, kubelet).write()


def release(state_dir: Path) -> None:
    """Give the machine-wide directories back as a new node would find them (after the node's
    mounts are gone): no sockets (the kubelet's and those of plugins killed with their pods), no
    device checkpoint (it names pods of the node that is gone), no kubelet state, no CDI spec of
    Patchbay's. Only when the node of ``state_dir`` holds them."""
    owner = Owner.read()
    if owner is None or owner.state_dir != state_dir:
        return
    clear_machine_dirs()
    OWNER_FILE.unlink(missing_ok=True)
