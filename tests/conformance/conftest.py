"""Conformance fixtures: the upstream kubelet device manager as a peer process, and the agent as
the `patchbay-agent` process the DaemonSet runs. Both are started by the test and stopped by PID.

The peer is built from tests/conformance/peer (hack/go-peer.sh) against the pinned Kubernetes release,
cached outside the repository by a hash of its sources; a cold build takes minutes, a warm one
none. A build failure is an error, never a skip.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.kubeletpeer import Harness, build_peer


@pytest.fixture(scope="session")
def peer_binary() -> Path:
    return build_peer()


@pytest.fixture
def harness(peer_binary: Path) -> Iterator[Harness]:
    root = Path(tempfile.mkdtemp(prefix="pbc", dir="/tmp"))
    h = Harness(root, peer_binary)
    try:
        yield h
    finally:
        h.close()
        shutil.rmtree(root, ignore_errors=True)
