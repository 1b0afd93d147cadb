"""The peers the test suites use, reused here rather than copied: the upstream kubelet device
manager built from Go (tests/conformance/peer) and the agent process it drives, the DRA peer built
from Go (bench/drapeer; every Go peer is built by hack/go-peer.sh), the Python kubelet
and PodResources peers, fake hardware, the real node's rollout sampler, the operator as a process
and the largest DeviceReport the CRD admits.

This is the one module of the bench that imports ``support`` (tests/support: the Makefile puts
``tests`` on PYTHONPATH beside ``bench``); every scenario goes through it.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from support import gopeer
from support.fakehw import FakeHardware
from support.kubeletpeer import AgentProcess, KubeletPeer, PeerError, build_peer, conformance_agent_argv
from support.kubeletpeer import _Process as Process
from support.operator import Operator
from support.podresources_peer import PodResourcesPeer, ThreadedPeers
from support.pykubelet import PyKubelet
from support.realnode import busybox_pod, limits
from support.reports import largest_report
from support.rollout import REGISTRATION_LINE, AllocatableSampler, Sample, dips, run_rollout

__all__ = [
    "REGISTRATION_LINE",
    "AgentProcess",
    "AllocatableSampler",
    "FakeHardware",
    "KubeletPeer",
    "Operator",
    "PeerError",
    "PodResourcesPeer",
    "Process",
    "PyKubelet",
    "Sample",
    "ThreadedPeers",
    "build_peer",
    "busybox_pod",
    "conformance_agent_argv",
    "dips",
    "drapeer",
    "largest_report",
    "limits",
    "run_rollout",
]


def drapeer(build: bool = True) -> Path | None:
    """bench/drapeer built (or reused from the cache); with ``build=False`` only if the cache has
    it (None otherwise: a cold build takes minutes)."""
    return gopeer.build("drapeer") if build else gopeer.cached("drapeer")


def binary_provenance(path: str | Path) -> str:
    """What the peer binary at `path` is, for a run's record: its sha256 and, for a Go binary, the
    Go release, main module and version-control revision it was built from (``go version -m``
    reads them from the binary). A figure against a peer given by path (squat=PATH) then names
    exactly the program it was measured against, however that binary was built."""
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    go = shutil.which("go")
    if go is None:
        return f"{path}: sha256 {digest} (no go command to read its build info)"
    out = subprocess.run([go, "version", "-m", str(path)], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        return f"{path}: sha256 {digest} (not a Go binary, or no build info)"
    lines = out.stdout.splitlines()
    release = lines[0].split(": ", 1)[-1].strip() if lines else "?"
    # The main module (path, mod) and where its source came from (build vcs.*); not every dependency.
    info = [
        " ".join(words)
        for words in (line.split() for line in lines[1:])
        if words
        and (
            words[0] in ("path", "mod")
            or (words[0] == "build" and words[1:2] and words[1].startswith("vcs."))
        )
    ]
    return f"{path}: sha256 {digest}; {release}; " + "; ".join(info)
