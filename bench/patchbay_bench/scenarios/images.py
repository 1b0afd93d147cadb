"""The operator and agent images (podman on a local Debian base, cached by content): a rebuild of
each program on a cached base, a warm build (every input hashed, a cache hit), with ``cold`` the
base itself from nothing; each image's OCI archive (gzip layers) and its size as podman stores it.
Figures only: there is no baseline for building an image."""

from __future__ import annotations

import subprocess
import time

from patchbay_bench import REPO
from patchbay_bench.harness import Run
from patchbay_devcluster.imagebuild import PROGRAMS, base_image, build_all, build_program, find_repo


def podman_mb(ref: str) -> float:
    out = subprocess.run(
        ["podman", "image", "inspect", ref, "--format", "{{.Size}}"], capture_output=True, text=True
    )
    return int(out.stdout.strip()) / 1e6 if out.returncode == 0 else float("nan")


def run(r: Run) -> None:
    repo = find_repo(REPO)
    built = build_all(repo)  # whatever is not cached yet, before anything is timed
    if r.flag("cold"):
        base = base_image()
        subprocess.run(["podman", "rmi", "--force", base], capture_output=True)
        t0 = time.monotonic()
        base_image()
        r.figure(
            "images: the base from nothing (mmdebstrap + python3, podman import)",
            "s",
            {"base": [time.monotonic() - t0]},
        )
    warm = []
    for _ in range(r.rounds()):
        t0 = time.monotonic()
        built = build_all(repo)
        warm.append(time.monotonic() - t0)
    r.figure("images: warm build of both (inputs hashed, cache hit)", "s", {"both": warm}, headline=True)
    base = base_image()
    for program in PROGRAMS:
        name = program.name
        if r.flag("rebuild"):
            times = [build_program(repo, program, base, force=True).seconds for _ in range(r.rounds())]
            r.figure(f"images: {name} rebuilt on a cached base", "s", {name: times}, headline=True)
        image = built[name]
        r.figure(f"images: {name} OCI archive", "MB", {name: [image.size_bytes / 1e6]})
        r.figure(f"images: {name} as podman stores it", "MB", {name: [podman_mb(image.ref)]})
    if not r.flag("rebuild"):
        r.note("rebuilds left out (rebuild=false): each takes tens of seconds to minutes")
