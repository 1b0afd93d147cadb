"""`paths` discovery: device files under /dev, by glob (one device per match) or by group.

A glob match's ID is its path below /dev with "/" turned into "_" (profile contract), so
`/dev/ttyUSB0` is `ttyUSB0` and `/dev/serial/by-id/usb-FTDI-if00` is `serial_by-id_usb-FTDI-if00`.
A group is always listed (it is declared, not found); whether its files exist is a HEALTH question,
so a group with a missing file turns Unhealthy after the failure threshold instead of vanishing.
"""

from __future__ import annotations

import glob as globmod
import os
from pathlib import Path

from patchbay_agent.config import PathsDiscovery
from patchbay_agent.discovery.base import HostRoot, PhysicalDevice
from patchbay_api.discovery import path_id


class PathsBackend:
    name = "paths"

    def __init__(self, spec: PathsDiscovery, host_root: HostRoot) -> None:
        self._spec = spec
        self._root = host_root

    def scan(self) -> list[PhysicalDevice]:
        found: dict[str, PhysicalDevice] = {}
        for pattern in self._spec.globs:
            for host_path in self._root.glob(pattern):
                if self._root.path(host_path).is_dir():
                    continue
                dev_id = path_id(host_path)
                # Two globs may match the same file: one device, not two.
                found.setdefault(dev_id, PhysicalDevice(dev_id, (host_path,), (host_path,)))
        for group in self._spec.groups:
            found[group.id] = PhysicalDevice(group.id, group.paths, group.paths)
        return [found[k] for k in sorted(found)]

    def watch_dirs(self) -> list[Path]:
        """The fixed directory part of every glob and every group member's directory."""
        dirs: set[str] = set()
        for pattern in self._spec.globs:
            fixed = []
            for part in pattern.split("/"):
                if globmod.has_magic(part):
                    break
                fixed.append(part)
            # A glob without magic is a single file: watch its directory.
            if len(fixed) == len(pattern.split("/")):
                fixed = fixed[:-1]
            dirs.add("/".join(fixed) or "/")
        for group in self._spec.groups:
            dirs.update(os.path.dirname(p) for p in group.paths)
        return [self._root.path(d) for d in sorted(dirs)]
