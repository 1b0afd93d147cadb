"""The types every discovery backend shares: `PhysicalDevice`, `HostRoot`, `Backend`, and IDs
(`make_device_id`: `patchbay_api.discovery.device_id`, the rule `kubectl patchbay diff` applies too)."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from patchbay_api.discovery import device_id as make_device_id

__all__ = ["Backend", "DiscoveryError", "HostRoot", "PhysicalDevice", "make_device_id"]


class DiscoveryError(RuntimeError):
    """Discovery cannot work at all on this node (e.g. NVML without a driver); not transient."""


@dataclass(frozen=True)
class PhysicalDevice:
    """One physical device as discovery sees it.

    `dev_paths` become DeviceSpecs in Allocate. `check_paths` must exist (and, under /dev, open)
    for the device to count as present and healthy; they differ from `dev_paths` for PCI (the
    sysfs function directory) and are empty for virtual tokens.
    """

    id: str
    dev_paths: tuple[str, ...] = ()
    check_paths: tuple[str, ...] = ()
    numa_nodes: tuple[int, ...] = ()
    #: What discovery read about the device besides its ID, as (attribute, value) pairs, e.g.
    #: ("pciVendor", "10de"). DRA mode publishes them as ResourceSlice attributes
    #: `patchbay.dev/<attribute>` (docs/dra.md#resourceslices); the device plugin API has no place
    #: for them. Not compared: a device is the same device whatever was read about it.
    attributes: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    #: What the device has a measurable amount of, as (name, integer amount), e.g. ("memory",
    #: 85899345920) for a GPU's bytes; DRA mode publishes it as the device's capacity.
    capacity: tuple[tuple[str, int], ...] = field(default=(), compare=False)


class Backend(Protocol):
    """What the agent needs from a discovery backend."""

    name: str

    def scan(self) -> list[PhysicalDevice]:
        """The devices present now, sorted by ID. Vanished or half-read devices are skipped."""
        ...

    def watch_dirs(self) -> list[Path]:
        """Host-rooted directories whose changes (inotify) mean "scan again now"."""
        ...


class HostRoot:
    """The directory the host's / is mounted at; maps host paths to paths the agent can read."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, host_path: str) -> Path:
        return self.root / host_path.lstrip("/")

    def glob(self, host_pattern: str) -> list[str]:
        """Host paths matching a glob, found under the root; the root itself is escaped."""
        prefix = str(self.root).rstrip("/")
        matches = glob.glob(glob.escape(prefix) + "/" + host_pattern.lstrip("/"))
        return sorted("/" + os.path.relpath(m, prefix) for m in matches)

    def resolve(self, host_path: str, max_hops: int = 16) -> Path:
        """Follow symlinks the way the HOST would (absolute targets stay inside the root).

        /dev/serial/by-id/* are absolute or relative symlinks to /dev/ttyUSB*; resolving them
        with the agent's own / would look in the container's /dev instead.
        """
        return self.path(self.host_target(host_path, max_hops))

    def pcie_root(self, sysfs_device: str) -> str | None:
        """The PCIe root complex a sysfs device hangs under, `pci<domain>:<bus>`, the first
        directory of its real path below /sys/devices (/sys/bus/*/devices/* link there); None
        for a device not under a PCI root (platform, virtual). The standard DRA attribute
        `resource.kubernetes.io/pcieRoot` (docs/dra.md#resourceslices)."""
        target = self.host_target(sysfs_device)
        parts = target.split("/")
        if len(parts) > 3 and parts[:3] == ["", "sys", "devices"] and _PCIE_ROOT.fullmatch(parts[3]):
            return parts[3]
        return None

    def host_target(self, host_path: str, max_hops: int = 16) -> str:
        """The host path `host_path` names once its symlinks are followed as the host would."""
        current = host_path
        for _ in range(max_hops):
            p = self.path(current)
            try:
                target = os.readlink(p)
            except OSError:
                return current
            current = (
                target
                if target.startswith("/")
                else os.path.normpath(os.path.join(os.path.dirname(current), target))
            )
        return current

    def reader(self, host_dir: str) -> Callable[[str], str | None]:
        """``read`` of the attributes of one sysfs directory, by name (``vendor``, ``idProduct``):
        what ``patchbay_api.discovery``'s filters take."""
        return lambda attr: self.read(f"{host_dir}/{attr}")

    def read(self, host_path: str) -> str | None:
        """A small sysfs attribute, stripped; None when it is missing or unreadable."""
        try:
            return self.path(host_path).read_text(encoding="ascii", errors="replace").strip()
        except OSError:
            return None


_PCIE_ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")
