"""Measures the node inventory's keeper (plugin-agent/patchbay_agent/inventory/keeper.py) on this
machine, with a client that records writes instead of sending them:

1. quiet: the keeper on the machine's REAL /sys and /dev (host root /), its backstop rescan every
   5 s, for 60 s after its first write: writes and scans counted, and the inventory's size;
2. hot-plug: on a FAKE HARDWARE tree (tests/support/fakemachines.py), the default coalescing:
   seconds from an FTDI adapter's files appearing to the write that lists it, and from their
   removal to the write without it (5 times each).

Run: PYTHONPATH=plugin-agent:tests .venv/bin/python hack/inventory_measure.py
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from support import fakemachines
from support.fakehw import FakeHardware

from patchbay_agent.discovery.base import HostRoot
from patchbay_agent.inventory.keeper import InventoryKeeper


class Recorder:
    def __init__(self) -> None:
        self.applied: list[tuple[float, dict[str, Any]]] = []

    def apply_inventory(self, doc: dict[str, Any]) -> dict[str, Any]:
        self.applied.append((time.monotonic(), doc))
        return {**doc, "metadata": {**doc["metadata"], "resourceVersion": str(len(self.applied))}}

    def node_uid(self, node_name: str) -> str:
        return "0" * 36


async def _wait(check: Any) -> float:
    while not check():  # noqa: ASYNC110 - the recorder has no event; a 5 ms look
        await asyncio.sleep(0.005)
    return time.monotonic()


async def quiet(seconds: float) -> None:
    client = Recorder()
    keeper = InventoryKeeper(HostRoot("/"), "this-node", "agent", client, dict, rescan=5.0)
    stop = asyncio.Event()
    task = asyncio.create_task(keeper.run(stop))
    await _wait(lambda: client.applied)
    size = len(json.dumps(client.applied[0][1], separators=(",", ":")))
    scans = keeper.scans
    await asyncio.sleep(seconds)
    stop.set()
    await task
    print(
        f"real node: inventory {size} bytes ({client.applied[0][1]['summary']}); in the {seconds:.0f} s "
        f"after the first write: {len(client.applied) - 1} writes, {keeper.scans - scans} scans"
    )


async def hotplug(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        hw = FakeHardware(Path(tmp))
        fakemachines.usb_camera(hw)
        client = Recorder()
        keeper = InventoryKeeper(HostRoot(tmp), "n", "agent", client, dict, gpus=False)
        stop = asyncio.Event()
        task = asyncio.create_task(keeper.run(stop))
        await _wait(lambda: client.applied)

        def has(doc: dict[str, Any]) -> bool:
            return any(u["port"] == "1-2" for u in doc.get("usb", []))

        appear, leave = [], []
        for _ in range(rounds):
            t0 = time.monotonic()
            fakemachines.ftdi_serial_adapter(hw)
            appear.append(await _wait(lambda: has(client.applied[-1][1])) - t0)
            t0 = time.monotonic()
            fakemachines.remove_ftdi_serial_adapter(hw)
            leave.append(await _wait(lambda: not has(client.applied[-1][1])) - t0)
        stop.set()
        await task
        print(
            f"hot-plug (fake tree, default coalescing): appears in max {max(appear):.2f} s "
            f"(median {statistics.median(appear):.2f}), leaves in max {max(leave):.2f} s "
            f"(median {statistics.median(leave):.2f}), {rounds} rounds, {len(client.applied)} writes"
        )


if __name__ == "__main__":
    asyncio.run(hotplug(5))
    asyncio.run(quiet(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0))
