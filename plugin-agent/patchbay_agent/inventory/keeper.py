"""Keeping the node's NodeInventory current: scan on change, write only when it differs.

The loop is the one change-writer (`changewriter.ChangeWriter`, as the DeviceReport's): inotify on
/dev and the directories below it where device files of the classes read appear (`DEV_DIRS`)
notifies it; it lets the burst settle (`coalesce`), scans /sys off the event loop, builds the
object and compares it with the last one written: an equal one is not written. sysfs sends no
inotify events for devices that come or go, so /dev is what says "look again" (a USB serial
adapter's /dev/ttyUSB0, a camera's /dev/video0, /dev/bus/usb/BBB/DDD of any USB device), and a
backstop rescan every `rescan` seconds catches what brings no device file (a PCI function bound
to another driver): on a quiet node each costs a scan of /sys (milliseconds) and no request.
`notify()` is also called when the profiles served here change (what serves each entry).

The owner reference needs the Node's UID: looked up before the first write, and again while it
is unknown. A failed write (the admission policy's 403, the CRD not installed yet) is logged and
retried with the agent's backoff; nothing raises into the node agent.

What was written must stay there, as for the DeviceReport: comparing a scan with the last write
alone would leave an inventory someone deleted (`kubectl delete nodeinventory`) gone until the
hardware changes. So the keeper follows its own object (`inventory_watch`: an `ownwatch.OwnWatch`
of `nodeinventories` by `metadata.name`, one watch per node) and knows the resourceVersions its
writes returned, so the events of its own writes cost nothing. Any other event is looked at between
writes (`verify`, one LIST of that one name): an inventory that is gone, or that another field
manager edited (`kubectl patch`, `kubectl edit`), is written again at once; repairs that keep
coming are paced (`ownwatch.Repairs.pace`: 1 s doubling to 120 s after the first 3 in 5 minutes).
An edit is undone by a forced server-side apply, not by delete and create as the DeviceReport's:
the schema prunes unknown fields and every list in it is atomic, so the apply puts every field the
agent writes back; what stays is what the agent does not write (a label someone added), which is
no edit to repair after that (`Repairs.wrote` keeps its manager). The agent needs no delete verb.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from patchbay_agent.changewriter import COALESCE_SECONDS, ChangeWriter
from patchbay_agent.constants import INVENTORY_KIND, INVENTORY_PLURAL, REPORT_GROUP, REPORT_VERSION
from patchbay_agent.discovery.base import HostRoot, PhysicalDevice
from patchbay_agent.fswatch import DirWatcher
from patchbay_agent.inventory.document import build_inventory
from patchbay_agent.inventory.sysfs import Hardware, scan
from patchbay_agent.ownwatch import OwnWatch, Repairs, Selection, WatchClient, name_of, version_of

log = logging.getLogger(__name__)

#: Host directories watched (those that exist; looked for again on every rescan).
DEV_DIRS = (
    "/dev",
    "/dev/bus/usb",
    "/dev/dri",
    "/dev/vfio",
    "/dev/accel",
    "/dev/serial/by-id",
    "/dev/v4l/by-id",
)
#: The backstop rescan of /sys, seconds.
RESCAN_SECONDS = 60.0


class InventoryClient(Protocol):
    def apply_inventory(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of the NodeInventory; the object as stored; raise on failure."""

    def node_uid(self, node_name: str) -> str:
        """The Node's UID; raise when it cannot be found."""


class InventoryKeeper(ChangeWriter):
    """See the module doc: `run(stop)` until stopped; `notify()` when what is served changed."""

    def __init__(
        self,
        host_root: HostRoot,
        node_name: str,
        agent: str | None,
        client: InventoryClient,
        served: Callable[[], Mapping[str, Sequence[PhysicalDevice]]],
        *,
        coalesce: float = COALESCE_SECONDS,
        rescan: float = RESCAN_SECONDS,
        gpus: bool = True,
        scanner: Callable[[HostRoot], Hardware] | None = None,
        watch: OwnWatch | None = None,
    ) -> None:
        """`watch`: the inventory followed on the API server (`inventory_watch`); without one, an
        inventory someone else deleted or edited stays so until the hardware changes."""
        super().__init__(coalesce=coalesce, resync=rescan, watch=watch)
        self.what = f"NodeInventory {node_name}"
        self._root = host_root
        self._node = node_name
        self._agent = agent
        self._client = client
        self._served = served
        self._scan = scanner or (lambda root: scan(root, gpus=gpus))
        self.node_uid: str | None = None
        #: the last inventory written (without observedAt); None before the first write and while
        #: a repair is due (`verify`)
        self.written: dict[str, Any] | None = None
        self.scans = 0
        self.unchanged = 0
        self._repairs = Repairs(INVENTORY_KIND, None, keep=8)
        self._watcher: DirWatcher | None = None

    def _dirs(self) -> list[Path]:
        dirs = [self._root.path(d) for d in DEV_DIRS]
        usb = self._root.path("/dev/bus/usb")
        with contextlib.suppress(OSError):  # no USB bus (yet)
            dirs += sorted(p for p in usb.iterdir() if p.is_dir())
        return dirs

    def _on_event(self, directory: Path, name: str, mask: int) -> None:
        self.notify()

    async def run(self, stop: asyncio.Event) -> None:
        self._watcher = DirWatcher(self._on_event)
        self._watcher.ensure(self._dirs())
        try:
            await super().run(stop)
        finally:
            self._watcher.close()

    async def check(self) -> None:
        """The backstop: watch directories that appeared, and scan again."""
        if self._watcher is not None:
            self._watcher.ensure(self._dirs())
        self.notify()

    async def build(self) -> dict[str, Any]:
        hw = await asyncio.to_thread(self._scan, self._root)
        self.scans += 1
        served = self._served()
        if self._watcher is not None:
            # A new bus directory (/dev/bus/usb/003) is watched as soon as it is seen, and so is
            # every directory of a file a profile serves: its going is seen at once, while the
            # profile keeps the vanished device (Unhealthy) for a while.
            files = {p for devices in served.values() for d in devices for p in d.dev_paths}
            self._watcher.ensure(
                [*self._dirs(), *(self._root.path(os.path.dirname(p)) for p in sorted(files))]
            )
        return build_inventory(self._node, self._agent, hw, served, self.node_uid, exists=self._exists)

    def _exists(self, host_path: str) -> bool:
        return os.path.lexists(self._root.path(host_path))

    async def sync(self) -> bool:
        doc = await self.build()
        if doc == self.written:
            self.succeeded()
            self.unchanged += 1
            return False
        if self.node_uid is None:
            try:
                self.node_uid = await asyncio.to_thread(self._client.node_uid, self._node)
            except Exception as e:
                log.info("Cannot find node %s's UID (%s): the NodeInventory has no owner yet", self._node, e)
            if self.node_uid is not None:
                doc = await self.build()
        stamped = {**doc, "observedAt": _now()}
        try:
            stored = await asyncio.to_thread(self._client.apply_inventory, stamped)
        except Exception as e:
            delay = self.failed()
            log.warning("Writing NodeInventory %s failed (%s); retrying in %.1fs", self._node, e, delay)
            return False
        first = self.writes == 0
        self.written = doc
        self._repairs.wrote(version_of(stored), stored)
        self.writes += 1
        self._repairs.written((self._node,))
        self.succeeded()
        summary = doc.get("summary", {})
        log.log(
            logging.INFO if first else logging.DEBUG,
            "Wrote NodeInventory %s: %s PCI, %s USB, %s character devices, %s GPUs",
            self._node,
            summary.get("pci"),
            summary.get("usb"),
            summary.get("char"),
            summary.get("gpus"),
        )
        return True

    @property
    def restored(self) -> int:
        """How often the inventory was found deleted or edited by someone else, and written again."""
        return self._repairs.done

    def seen(self, kind: str, obj: dict[str, Any]) -> bool:
        """A watch event: may someone else have deleted or edited the inventory since this agent
        wrote it? Not when the event is one of its own writes; nothing to guard before the first."""
        return self.written is not None and self._repairs.suspect(kind, obj, (self._node,))

    async def verify(self) -> None:
        """Is the stored inventory still the one an agent wrote (one LIST of its name)? Gone, or
        edited by another field manager: written again now (paced when repairs keep coming). A
        failed LIST is logged: the next event, or a later change, looks again."""
        if self.written is None or self._watch is None:
            return
        try:
            items = await asyncio.to_thread(self._watch.list_now)
        except Exception as e:
            log.warning("Reading %s %s failed (%s)", INVENTORY_KIND, self._node, e)
            return
        if not self._repairs.look((self._node,), items):
            return
        if not any(name_of(i) == self._node for i in items):
            # Its owner may be a Node replaced meanwhile (the garbage collector's deletion): the
            # next write looks the UID up again.
            self.node_uid = None
        self.written = None
        self.notify()
        self.hold(self._repairs.pace())


def inventory_watch(client: object, node_name: str) -> OwnWatch | None:
    """The watch of the node's NodeInventory (a field selector on its name), for a client that can
    watch (`kubeclient.KubeClient`, the agent's one client); None for one that cannot."""
    if not isinstance(client, WatchClient):
        return None
    selection = Selection(
        f"{REPORT_GROUP}/{REPORT_VERSION}", INVENTORY_PLURAL, None, f"metadata.name={node_name}"
    )
    return OwnWatch(client, selection)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
