"""Where the built images are kept, and how the cache stays bounded.

Every image is an OCI archive in ``$PATCHBAY_CACHE/images`` (default ``~/.cache/patchbay/images``),
named ``patchbay-<program>-[<arch>-]<hash>.oci.tar`` after the hash of its inputs
(``imagebuild.input_hash``). Every change to a program is a new archive, so without pruning the
cache grew by one archive a change (about 75 MB an agent, 90 MB an operator) and podman's storage
with it. A build keeps the ``KEEP_PER_IMAGE`` archives of its program and architecture used last
(a cache hit marks its archive used: ``used``) and removes the others, with their work folders and
podman's images tagged with their hash (``prune``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

KEEP_PER_IMAGE = 6
"""Archives kept per program and architecture. Those in use at once on one machine: the tree's
own, the two earlier releases' that the upgrade test installs first, another checkout's (CI's
clean clone beside a working tree) and one each from before a change was taken back."""


def cache_dir() -> Path:
    return Path(os.environ.get("PATCHBAY_CACHE") or Path.home() / ".cache" / "patchbay") / "images"


def used(archive: Path) -> None:
    """Mark a cached archive used now (what ``prune`` keeps by); a read-only cache stays as it is."""
    with contextlib.suppress(OSError):
        os.utime(archive)


def prune(name: str, arch_part: str, keep: int = KEEP_PER_IMAGE) -> list[Path]:
    """Remove the archives of program ``name`` for one architecture (``arch_part``: ``""`` for
    the machine's own, ``"arm64-"``) beyond the ``keep`` used last (by modification time: a build
    writes it, a cache hit touches it), with their work folders and podman's images tagged with
    their hash; the archives removed. A removed image that is wanted again is built again, and
    podman's copy is loaded again from its archive where one is needed (``install.push_image``,
    the agent image bench), so nothing else can come to miss one."""
    pattern = re.compile(rf"patchbay-{re.escape(name)}-{re.escape(arch_part)}([0-9a-f]{{12}})\.oci\.tar")
    archives = cache_dir().glob(f"patchbay-{name}-*.oci.tar")
    found = {p: m[1] for p in archives if (m := pattern.fullmatch(p.name))}
    removed = sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)[keep:]
    if not removed:
        return []
    tags = [f"-{arch_part}{found[path]}" for path in removed]
    for path, tag in zip(removed, tags, strict=True):
        path.unlink(missing_ok=True)
        work = cache_dir() / "work" / f"{name}{tag}"
        shutil.rmtree(work, ignore_errors=True)
        work.with_name(f"{work.name}.lock").unlink(missing_ok=True)
    listed = ["podman", "images", "--format", "{{.Repository}}:{{.Tag}}"]
    refs = subprocess.run(listed, capture_output=True, text=True, check=False).stdout.split()
    # The tag is <release>-<hash>; the tests' own tags of it add a suffix (-upgrade, -registry).
    mine = [
        r for r in refs if r.rpartition(":")[0].endswith(f"/patchbay-{name}") and any(t in r for t in tags)
    ]
    if mine:
        subprocess.run(["podman", "rmi", "--force", *mine], capture_output=True, check=False)
    log.info("  pruned %d older %s archives (kept the %d used last)", len(removed), name, keep)
    return removed
