"""Device discovery: one backend per way of finding devices, all reading under a host root.

A backend turns the host's /dev and /sys (mounted at `--host-root`, `/` on a bare node, a fake
tree in tests) into `PhysicalDevice`s. Paths inside a `PhysicalDevice` are HOST paths (`/dev/...`):
that is what the kubelet hands the container runtime; only the agent itself reads them through the
host root (`HostRoot.path`).

`scan()` is synchronous and cheap (a glob and a few small sysfs reads); the agent runs it off the
event loop so a wedged sysfs read never blocks Allocate.
"""

from __future__ import annotations

from patchbay_agent.config import (
    Discovery,
    NvmlDiscovery,
    PathsDiscovery,
    PciDiscovery,
    UsbDiscovery,
    VirtualDiscovery,
)
from patchbay_agent.discovery.base import (
    Backend,
    DiscoveryError,
    HostRoot,
    PhysicalDevice,
    make_device_id,
)
from patchbay_agent.discovery.nvml import NvmlBackend
from patchbay_agent.discovery.paths import PathsBackend
from patchbay_agent.discovery.pci import PciBackend
from patchbay_agent.discovery.usb import UsbBackend
from patchbay_agent.discovery.virtual import VirtualBackend

__all__ = ["Backend", "DiscoveryError", "HostRoot", "PhysicalDevice", "make_backend", "make_device_id"]


def make_backend(discovery: Discovery, host_root: HostRoot) -> Backend:
    """The backend for a config's discovery section (NVML itself is only imported when used)."""
    if isinstance(discovery, PathsDiscovery):
        return PathsBackend(discovery, host_root)
    if isinstance(discovery, PciDiscovery):
        return PciBackend(discovery, host_root)
    if isinstance(discovery, UsbDiscovery):
        return UsbBackend(discovery, host_root)
    if isinstance(discovery, VirtualDiscovery):
        return VirtualBackend(discovery)
    if isinstance(discovery, NvmlDiscovery):
        return NvmlBackend(host_root)
    raise TypeError(f"unknown discovery {discovery!r}")
