"""`nvml` discovery: NVIDIA GPUs through NVML (`nvidia-ml-py`, the optional `nvml` extra).

The ID is the GPU UUID; the device files are `/dev/nvidia<minor>` plus the control and UVM files
every CUDA process needs, when present. Without the package or without a driver the backend raises
`DiscoveryError` with what to do, instead of crashing with a traceback from inside NVML
(`nvmlInit()` fails fast without a driver: docs/facts.md#nvml).
"""

from __future__ import annotations

import logging
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
            devices.append(PhysicalDevice(make_device_id(uuid), (node_file, *shared), (node_file,), numa))
        return sorted(devices, key=lambda d: d.id)

    def watch_dirs(self) -> list[Path]:
        return []
