"""`virtual` discovery: N countable tokens with no device files (`virtual-0` ... `virtual-N-1`).

For things that are counted, not wired: licences, bandwidth units, IP slots. They are always
present; an exec health probe can still take tokens out of service.
"""

from __future__ import annotations

from pathlib import Path

from patchbay_agent.config import VirtualDiscovery
from patchbay_agent.discovery.base import PhysicalDevice


class VirtualBackend:
    name = "virtual"

    def __init__(self, spec: VirtualDiscovery) -> None:
        width = len(str(spec.count - 1))
        # Zero-padded so that sorting by ID is sorting by number.
        self._devices = [PhysicalDevice(f"virtual-{i:0{width}d}") for i in range(spec.count)]

    def scan(self) -> list[PhysicalDevice]:
        return list(self._devices)

    def watch_dirs(self) -> list[Path]:
        return []
