"""The project's Go peers, each built (or reused from the cache outside the repository) by the one
build script, hack/go-peer.sh, from its source folder and what it pins:

- ``conformance-peer`` (tests/conformance/peer): the upstream kubelet device manager of a release,
  with one file of exported names compiled into its package (devicemanager_export.go.in);
- ``metadatareader`` (tests/conformance/metadatareader): the device metadata reader of
  k8s.io/dynamic-resource-allocation of a release (1.36 on; from 1.37 it also validates);
- ``gitopshealth`` (tests/conformance/gitopshealth): Argo CD's Lua VM and Flux's kstatus;
- ``drapeer`` (bench/drapeer): a DRA kubelet plugin on the upstream helper library, the bench's
  baseline.

A peer of a release is built, unless told one, against the newest release of the matrix, whatever
release the cluster runs: the conformance peer's export file reads that release's device manager
internals, and the DRA peer is a baseline for speed, not a test of a release
(CONFORMANCE_K8S_VERSION and DRAPEER_K8S_VERSION override). A failed build raises: never a skip.
By hand: ``PYTHONPATH=tests .venv/bin/python -m support.gopeer NAME [RELEASE]`` prints the path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from patchbay_devcluster.releases import matrix, minor

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "hack" / "go-peer.sh"
#: exit status of go-peer.sh --cached-only when the cache lacks the binary
NOT_CACHED = 3


def _staging(release: str) -> str:
    """A Kubernetes release's published staging modules' version: ``v1.37.1`` -> ``v0.37.1``."""
    return "v0." + release.removeprefix("v1.")


def _conformance_peer(release: str) -> list[str]:
    pkg = "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
    return ["--kubernetes", release, "--overlay", f"{pkg}=devicemanager_export.go.in"]


def _metadatareader(release: str) -> list[str]:
    if minor(release) < (1, 36):
        raise ValueError(f"release {release} has no device metadata API (from 1.36)")
    tags = ["--tags", "dra_v037"] if minor(release) >= (1, 37) else []
    modules = ("k8s.io/dynamic-resource-allocation", "k8s.io/apimachinery")
    return [*tags, *(f"{m}@{_staging(release)}" for m in modules)]


def _gitopshealth(release: str) -> list[str]:
    # gopher-lua v1.1.1 is the version argo-cd's go.mod requires (Argo CD 2.x and 3.x); cli-utils
    # v0.37.2 is the kstatus release of the Kubernetes 1.34+ line. No Kubernetes release of its own.
    return ["github.com/yuin/gopher-lua@v1.1.1", "sigs.k8s.io/cli-utils@v0.37.2"]


def _drapeer(release: str) -> list[str]:
    modules = (
        "k8s.io/dynamic-resource-allocation",
        "k8s.io/api",
        "k8s.io/apimachinery",
        "k8s.io/client-go",
        "k8s.io/kubelet",
    )
    return [f"{m}@{_staging(release)}" for m in modules]


#: name -> (source folder, what it pins for a release, the variable that overrides its release)
PEERS: dict[str, tuple[Path, Callable[[str], list[str]], str | None]] = {
    "conformance-peer": (
        REPO / "tests" / "conformance" / "peer",
        _conformance_peer,
        "CONFORMANCE_K8S_VERSION",
    ),
    "metadatareader": (REPO / "tests" / "conformance" / "metadatareader", _metadatareader, None),
    "gitopshealth": (REPO / "tests" / "conformance" / "gitopshealth", _gitopshealth, None),
    "drapeer": (REPO / "bench" / "drapeer", _drapeer, "DRAPEER_K8S_VERSION"),
}


def _run(name: str, release: str | None, cached_only: bool) -> subprocess.CompletedProcess[str]:
    src, pins, override = PEERS[name]
    release = release or (override and os.environ.get(override)) or matrix()[-1]
    argv = [str(BUILD), name, str(src), *(["--cached-only"] if cached_only else []), *pins(release)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)


def _path(name: str, out: subprocess.CompletedProcess[str]) -> Path:
    if out.returncode != 0:
        raise RuntimeError(f"building the Go peer {name} failed:\n{out.stderr[-4000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def build(name: str, release: str | None = None) -> Path:
    """The peer's binary, built unless the cache has it (a cold build takes minutes)."""
    return _path(name, _run(name, release, cached_only=False))


def cached(name: str, release: str | None = None) -> Path | None:
    """The peer's binary if the cache has it, else None (nothing is built)."""
    out = _run(name, release, cached_only=True)
    return None if out.returncode == NOT_CACHED else _path(name, out)


if __name__ == "__main__":
    print(build(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None))
