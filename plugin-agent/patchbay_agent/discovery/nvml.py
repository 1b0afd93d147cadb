"""`nvml` discovery: NVIDIA GPUs through NVML (`nvidia-ml-py`, the optional `nvml` extra).

The ID is the GPU UUID; the device files are `/dev/nvidia<minor>` plus the control and UVM files
every CUDA process needs, when present. Without the package or without a driver the backend raises
`DiscoveryError` with what to do, instead of crashing with a traceback from inside NVML
(`nvmlInit()` fails fast without a driver: docs/facts.md#nvml).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from patchbay_agent.discovery.base import DiscoveryError, HostRoot, PhysicalDevice, make_device_id

log = logging.getLogger(__name__)

_SHARED_FILES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def _load_nvml() -> Any:
    try:
        # The optional extra: imported only when a profile asks for NVML.
        import pynvml
    except ImportError:
        raise DiscoveryError(
            "the nvml backend needs nvidia-ml-py: install the agent with the 'nvml' extra "
            "(pip install 'kube-patchbay[nvml]')"
        ) from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise DiscoveryError(
            f"NVML could not start ({e}): is the NVIDIA driver installed on this node and "
            "libnvidia-ml.so visible to the agent?"
        ) from None
    return pynvml


class NvmlBackend:
    name = "nvml"

    def __init__(self, host_root: HostRoot) -> None:
        self._root = host_root
        self._nvml = _load_nvml()

    def scan(self) -> list[PhysicalDevice]:
        nvml = self._nvml
        devices = []
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as e:
            log.warning("NVML device count failed: %s", e)
            return []
        shared = tuple(p for p in _SHARED_FILES if self._root.path(p).exists())
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                minor = nvml.nvmlDeviceGetMinorNumber(handle)
            except nvml.NVMLError as e:
                log.warning("Skipping GPU %d: %s", index, e)
                continue
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            numa: tuple[int, ...] = ()
            try:
                node = int(nvml.nvmlDeviceGetNumaNodeId(handle))
                numa = (node,) if node >= 0 else ()
            except (nvml.NVMLError, AttributeError):
                pass
            node_file = f"/dev/nvidia{minor}"
            attributes, capacity = self._describe(handle, uuid)
            devices.append(
                PhysicalDevice(
                    make_device_id(uuid),
                    (node_file, *shared),
                    (node_file,),
                    numa,
                    attributes=attributes,
                    capacity=capacity,
                )
            )
        return sorted(devices, key=lambda d: d.id)

    def _describe(
        self, handle: Any, uuid: str
    ) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, int], ...]]:
        """What DRA publishes of a GPU (docs/dra.md#resourceslices): its UUID, product name, PCI
        address and root complex (the standard `pciBusID`/`pcieRoot`), memory as capacity. Each
        read on its own: a GPU that will not say one thing still says the rest."""
        nvml = self._nvml
        attributes: list[tuple[str, str]] = [("uuid", uuid)]
        capacity: list[tuple[str, int]] = []
        try:
            name = nvml.nvmlDeviceGetName(handle)
            attributes.append(("productName", name.decode() if isinstance(name, bytes) else str(name)))
        except nvml.NVMLError as e:
            log.debug("GPU %s: no product name: %s", uuid, e)
        try:
            bus = nvml.nvmlDeviceGetPciInfo(handle).busId
            address = pci_address(bus.decode() if isinstance(bus, bytes) else str(bus))
        except (nvml.NVMLError, AttributeError) as e:
            log.debug("GPU %s: no PCI address: %s", uuid, e)
            address = None
        if address is not None:
            attributes.append(("pciAddress", address))
            if root := self._root.pcie_root(f"/sys/bus/pci/devices/{address}"):
                attributes.append(("pcieRoot", root))
        try:
            capacity.append(("memory", int(nvml.nvmlDeviceGetMemoryInfo(handle).total)))
        except (nvml.NVMLError, AttributeError, ValueError) as e:
            log.debug("GPU %s: no memory size: %s", uuid, e)
        return tuple(attributes), tuple(capacity)

    def watch_dirs(self) -> list[Path]:
        return []


def pci_address(nvml_bus_id: str) -> str | None:
    """NVML's bus ID (`00000000:3B:00.0`, an 8-digit domain) as sysfs writes it (`0000:3b:00.0`);
    None when it is not one."""
    m = re.fullmatch(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", nvml_bus_id.strip())
    if m is None or int(m.group(1), 16) > 0xFFFF:
        return None
    return f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"
