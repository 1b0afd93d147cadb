"""CDI spec files: what makes the CDI names the agent returns resolvable by the container runtime.

With `spec.plugin.allocation.cdi.kind` set, Allocate names each physical device as
`<kind>=<device id>` (allocation.py). A runtime with CDI injection (containerd 2.x, CRI-O; not
containerd 1.6) looks every such name up in the spec files of its CDI directories and FAILS the
container when one does not resolve ("unresolvable CDI devices"). So the agent writes, for its
resource, one spec file that describes every device it serves (docs/cdi.md):

* one file per resource, `patchbay_<resource with "/" as "_">.json`, so two agents of the same
  resource during a rolling update write the same file with the same content (two files naming
  the same device would make the runtime refuse both as a conflict);
* a device's container edits are its device nodes (container path, host path, permissions), the
  same DeviceSpecs Allocate returns, which stay in the response for runtimes without CDI (CDI
  replaces a device node of the same path rather than adding a second one);
* written atomically (a temporary file in the same directory, then rename): the runtime re-reads
  the directory on change and never sees half a file;
* written when the agent starts and, when the devices changed since, before Allocate answers, so
  a name is resolvable before the kubelet can hand it to the runtime;
* left in place when the agent stops: containers of running pods are restarted by the kubelet with
  the same CDI names, agent or not. The next agent of the resource overwrites it;
* written again at once when it disappears while the agent runs (`SpecGuard`: inotify on the
  directory, and a slow backstop poll).

The CDI directory (`/var/run/cdi`) is a tmpfs on most nodes: a reboot empties it, and the kubelet
does not prepare a DRA claim again that its checkpoint holds as prepared (docs/cdi.md#reboots).
So the DRA claims' spec files are also kept as copies beside the driver's claim records, on the
kubelet's disk (`SpecCopies`): an agent writes every copy back into the CDI directory before it
registers, and whenever one disappears. Without that, a rebooted node's DRA pods stay in
CrashLoopBackOff ("unresolvable CDI devices").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from inotify_simple import flags

from patchbay_agent.constants import DEFAULT_CDI_SPEC_DIR
from patchbay_agent.core.inventory import DeviceSpec, Snapshot
from patchbay_agent.fswatch import DirWatcher
from patchbay_agent.wakeup import wait_any

__all__ = [
    "CDI_VERSION",
    "DEFAULT_CDI_SPEC_DIR",
    "CdiSpecs",
    "SpecCopies",
    "SpecGuard",
    "device_nodes",
    "spec_document",
    "spec_file_name",
    "write_spec",
]

log = logging.getLogger(__name__)

#: The CDI spec version written: 0.5.0 is the first with `hostPath` on device nodes (the path on
#: the node differs from the path in the container with a fake device tree, and may in general).
CDI_VERSION = "0.5.0"


def spec_file_name(resource_name: str) -> str:
    """`example.com/serial` -> `patchbay_example.com_serial.json` (one file per resource)."""
    return f"patchbay_{resource_name.replace('/', '_')}.json"


def write_spec(path: Path, doc: dict[str, Any]) -> None:
    """Write a CDI spec atomically: a temporary file in the same directory (created if need be),
    then rename, so the runtime, which re-reads the directory on change, never sees half a file.
    Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".patchbay-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def device_nodes(specs: Sequence[DeviceSpec]) -> list[dict[str, str]]:
    """CDI `deviceNodes` entries of a device's DeviceSpecs (container path, host path, permissions)."""
    return [{"path": s.container_path, "hostPath": s.host_path, "permissions": s.permissions} for s in specs]


def spec_document(kind: str, snap: Snapshot) -> dict[str, Any]:
    """The CDI spec for every physical device in `snap` that has device nodes, sorted by ID.

    Device IDs already follow CDI's name rule (letters, digits, then also `_ . : -`), which
    discovery and the config enforce for the kubelet's sake.
    """
    devices = []
    for pid in sorted(snap.specs):
        nodes = device_nodes(snap.specs[pid])
        if nodes:
            devices.append({"name": pid, "containerEdits": {"deviceNodes": nodes}})
    return {"cdiVersion": CDI_VERSION, "kind": kind, "devices": devices}


class CdiSpecs:
    """Keeps one resource's spec file in `directory` in step with the devices (see module doc)."""

    def __init__(self, directory: Path, kind: str, resource_name: str) -> None:
        self.directory = directory
        self.kind = kind
        self.path = directory / spec_file_name(resource_name)
        self._written: dict[str, Any] | None = None
        #: the snapshot `_written` was built from (or found equal to)
        self._snapshot: Snapshot | None = None
        self.writes = 0

    def ensure(self, snap: Snapshot) -> bool:
        """Write the spec if it differs from what this process last wrote; True when written.

        Raises OSError when the directory cannot be written (the caller says what fails with it).
        """
        if snap is self._snapshot and self.path.exists():
            # Allocate's common case: the devices have not changed since the last call (snapshots
            # are replaced, never mutated), so the document is not built again.
            return False
        doc = spec_document(self.kind, snap)
        if doc == self._written and self.path.exists():
            self._snapshot = snap
            return False
        write_spec(self.path, doc)
        self._written, self._snapshot = doc, snap
        self.writes += 1
        log.info("Wrote CDI spec %s: kind %s, %d device(s)", self.path, self.kind, len(doc["devices"]))
        return True

    @property
    def owned(self) -> frozenset[str]:
        """The spec file names this process keeps in the directory."""
        return frozenset({self.path.name}) if self._written is not None else frozenset()


class SpecCopies:
    """Copies of the spec files a DRA driver wrote for its prepared claims, in `state_dir` (on
    the kubelet's disk, beside the claim records), so that they can be written again after the
    CDI directory was emptied (see the module doc). One copy per spec file, same name."""

    def __init__(self, spec_dir: Path, state_dir: Path) -> None:
        self.spec_dir = spec_dir
        self.dir = state_dir / "cdi"
        self.restored = 0

    def keep(self, name: str, doc: dict[str, Any]) -> None:
        """Keep (or replace) the copy of spec file `name`; raises OSError."""
        write_spec(self.dir / name, doc)

    def forget(self, name: str) -> None:
        """The claim was unprepared: its copy goes (absent is fine); raises OSError."""
        (self.dir / name).unlink(missing_ok=True)

    @property
    def owned(self) -> frozenset[str]:
        try:
            return frozenset(n for n in os.listdir(self.dir) if n.endswith(".json") and not n.startswith("."))
        except OSError:
            return frozenset()

    def restore(self, *, compare: bool = False) -> int:
        """Write every kept spec that is missing from the CDI directory (`compare`: also every one
        whose content differs); returns how many were written. A copy that cannot be read is
        left alone and logged; a spec that cannot be written is logged (the next event or poll
        tries again)."""
        written = 0
        for name in sorted(self.owned):
            target = self.spec_dir / name
            if target.exists() and not compare:
                continue
            try:
                doc = json.loads((self.dir / name).read_text())
            except (OSError, ValueError) as e:
                log.warning("Cannot read the kept CDI spec %s: %s", self.dir / name, e)
                continue
            with contextlib.suppress(OSError, ValueError):
                if json.loads(target.read_text()) == doc:
                    continue
            try:
                write_spec(target, doc)
            except OSError as e:
                log.error("Cannot write the CDI spec %s again: %s", target, e)
                continue
            written += 1
        if written:
            self.restored += written
            log.info("Wrote %d prepared claim CDI spec(s) again into %s", written, self.spec_dir)
        return written


class SpecGuard:
    """Writes our spec files again as soon as one disappears from the CDI directory: inotify on the
    directory (a file deleted or moved away, the directory itself removed), and a backstop poll
    that also puts a lost watch back. `owned` names our files; `restore` writes the missing ones
    and returns how many it wrote."""

    def __init__(
        self,
        directory: Path,
        owned: Callable[[], Collection[str]],
        restore: Callable[[], int],
        *,
        poll_interval: float = 10.0,
    ) -> None:
        self.directory = directory
        self._owned = owned
        self._restore = restore
        self._poll_interval = poll_interval
        self._kick = asyncio.Event()
        #: files written again because they had disappeared
        self.rewritten = 0

    def _on_event(self, directory: Path, name: str, mask: int) -> None:
        if mask & (flags.DELETE_SELF | flags.MOVE_SELF) or (
            mask & (flags.DELETE | flags.MOVED_FROM) and name in self._owned()
        ):
            self._kick.set()

    def check(self) -> int:
        """Write what is missing now; returns how many files were written."""
        try:
            n = self._restore()
        except OSError as e:
            log.error("Cannot write our CDI specs again into %s: %s", self.directory, e)
            return 0
        self.rewritten += n
        return n

    async def run(self, stop: asyncio.Event) -> None:
        watcher = DirWatcher(self._on_event)
        try:
            while not stop.is_set():
                watcher.ensure([self.directory])
                self._kick.clear()
                if self.check():
                    log.warning("Our CDI spec files in %s had disappeared: written again", self.directory)
                await wait_any((self._kick, stop), self._poll_interval)
        finally:
            watcher.close()
