"""What the agent's `nvml` backend makes of the GPUs of THIS machine: run it where a real NVIDIA GPU
and driver are (the project's own machines have none, so its tests use a fake `pynvml`).

    PYTHONPATH=plugin-agent python3 hack/nvml_check.py [--out nvml-check.json]

It prints, and writes as one JSON record:

- the machine: driver and NVML versions, the cgroup filesystem, the NVIDIA device files;
- `raw`: every value the backend reads, straight from NVML (each read on its own, an error kept
  as its text): the record tests/data/nvml/ keeps so that the fake `pynvml` of the unit tests
  replays what a real GPU said;
- `devices`: the backend's scan (IDs, device files, NUMA node, attributes, capacity);
- `slices`: the ResourceSlice documents the DRA path would publish for them, and `cdi`: the CDI
  spec the Device Plugin and DRA paths would write;
- `mig`: read only, never changed: the MIG mode and each GPU instance profile NVML knows of
  (slices, memory, multiprocessors, how many fit). Nothing here creates, destroys or resets anything.

Exit status 0 when the backend found at least one GPU, 1 otherwise (the record says why).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _read(label: str, out: dict[str, Any], call: Callable[..., Any], *args: Any) -> Any:
    """One NVML read, `call(*args)`; its value (bytes decoded) or, when it fails, `{"error": text}`
    (NVMLError has a subclass per code, and a missing function is a finding too)."""
    try:
        value = call(*args)
    except Exception as e:
        out[label] = {"error": f"{type(e).__name__}: {e}"}
        return None
    if isinstance(value, bytes):
        value = value.decode()
    out[label] = value
    return value


def _bus_id(nvml: Any, h: Any) -> Any:
    return nvml.nvmlDeviceGetPciInfo(h).busId


def _memory_total(nvml: Any, h: Any) -> int:
    return int(nvml.nvmlDeviceGetMemoryInfo(h).total)


def _function(nvml: Any, name: str) -> Callable[..., Any]:
    """NVML's function `name`, or one that raises AttributeError when this nvidia-ml-py lacks it."""

    def missing(*_: Any) -> Any:
        raise AttributeError(f"this nvidia-ml-py has no {name}")

    found: Callable[..., Any] = getattr(nvml, name, missing)
    return found


def raw_nvml(nvml: Any) -> dict[str, Any]:
    """The values the backend reads, per GPU, exactly as NVML gave them."""
    out: dict[str, Any] = {}
    _read("driverVersion", out, _function(nvml, "nvmlSystemGetDriverVersion"))
    _read("nvmlVersion", out, _function(nvml, "nvmlSystemGetNVMLVersion"))
    count = _read("deviceCount", out, nvml.nvmlDeviceGetCount) or 0
    gpus = []
    for i in range(count):
        g: dict[str, Any] = {"index": i}
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        _read("uuid", g, nvml.nvmlDeviceGetUUID, h)
        _read("minor", g, nvml.nvmlDeviceGetMinorNumber, h)
        _read("numaNode", g, _function(nvml, "nvmlDeviceGetNumaNodeId"), h)
        _read("name", g, nvml.nvmlDeviceGetName, h)
        _read("busId", g, _bus_id, nvml, h)
        _read("memoryTotal", g, _memory_total, nvml, h)
        gpus.append(g)
    out["gpus"] = gpus
    return out


_PROFILE_FIELDS = (
    "id",
    "sliceCount",
    "instanceCount",
    "multiprocessorCount",
    "copyEngineCount",
    "decoderCount",
    "encoderCount",
    "memorySizeMB",
)


def mig_facts(nvml: Any) -> list[dict[str, Any]]:
    """MIG as NVML describes it, read only: the mode (current, pending), how many MIG devices fit,
    and every GPU instance profile with its slices, memory, multiprocessors and instance count."""
    facts = []
    n_profiles = int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        g: dict[str, Any] = {"index": i}
        mode = _read("migMode", g, _function(nvml, "nvmlDeviceGetMigMode"), h)
        if mode is not None:
            g["migMode"] = list(mode)
        _read("maxMigDeviceCount", g, _function(nvml, "nvmlDeviceGetMaxMigDeviceCount"), h)
        profiles = []
        for p in range(n_profiles):
            entry: dict[str, Any] = {"profile": p}
            info = _read("info", entry, _function(nvml, "nvmlDeviceGetGpuInstanceProfileInfo"), h, p)
            if info is not None:
                entry["info"] = {k: getattr(info, k) for k in _PROFILE_FIELDS if hasattr(info, k)}
            profiles.append(entry)
        g["profiles"] = profiles
        facts.append(g)
    return facts


def machine() -> dict[str, Any]:
    out: dict[str, Any] = {"python": sys.version.split()[0]}
    try:
        out["cgroupFs"] = subprocess.run(
            ["stat", "-fc", "%T", "/sys/fs/cgroup"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        out["cgroupFs"] = f"unknown: {e}"
    out["devFiles"] = sorted(p.name for p in Path("/dev").glob("nvidia*"))
    out["sysBusPci"] = Path("/sys/bus/pci/devices").is_dir()
    try:
        from importlib.metadata import version

        out["nvidia-ml-py"] = version("nvidia-ml-py")
    except Exception as e:
        out["nvidia-ml-py"] = f"unknown: {e}"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="also write the record here")
    parser.add_argument("--node", default="gpu-node", help="node name for the slice documents")
    parser.add_argument(
        "--host-root",
        type=Path,
        default=Path("/"),
        help="where the node's / is (/dev, /sys), as the agent's --host-root (default: /)",
    )
    args = parser.parse_args(argv)

    from patchbay_agent.cdi import spec_document
    from patchbay_agent.config import NvmlDiscovery
    from patchbay_agent.core.health import CheckResult, DeviceHealthTracker
    from patchbay_agent.core.inventory import Inventory
    from patchbay_agent.discovery import DiscoveryError, HostRoot, make_backend
    from patchbay_agent.dra.slices import slice_devices, slice_documents

    record: dict[str, Any] = {"machine": machine()}
    root = HostRoot(args.host_root)
    try:
        backend = make_backend(NvmlDiscovery(), root)
    except DiscoveryError as e:
        record["error"] = str(e)
        print(json.dumps(record, indent=2))
        return 1
    import pynvml as nvml  # the backend imported it and called nvmlInit()

    record["raw"] = raw_nvml(nvml)
    devices = backend.scan()
    record["devices"] = [
        {
            "id": d.id,
            "devPaths": list(d.dev_paths),
            "numa": list(d.numa_nodes),
            "attributes": dict(d.attributes),
            "capacity": dict(d.capacity),
        }
        for d in devices
    ]
    inventory = Inventory(1, "rw")
    tracker = DeviceHealthTracker(1, 1)
    tracker.observe({d.id: CheckResult(True) for d in devices})
    inventory.update(devices, tracker)
    record["slices"] = slice_documents("gpu.example.com", args.node, slice_devices(inventory.current))
    record["cdi"] = spec_document("example.com/gpu", inventory.current)
    record["devFilesExist"] = {p: root.path(p).exists() for d in devices for p in d.dev_paths}
    record["mig"] = mig_facts(nvml)
    text = json.dumps(record, indent=2, default=str)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if devices else 1


if __name__ == "__main__":
    sys.exit(main())
