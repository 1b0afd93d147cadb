"""The peers the test suites use, reused here rather than copied: the upstream kubelet device
manager built from Go (tests/conformance/peer) and the agent process it drives, the DRA peer built
from Go (bench/drapeer; every Go peer is built by hack/go-peer.sh), the Python kubelet
and PodResources peers, fake hardware, the real node's rollout sampler, the operator as a process
and the largest DeviceReport the CRD admits.

This is the one module of the bench that imports ``support`` (tests/support: the Makefile puts
``tests`` on PYTHONPATH beside ``bench``); every scenario goes through it.
"""

from __future__ import annotations

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
