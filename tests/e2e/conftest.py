"""The real node (kubelet + containerd + runc) joins the session's cluster once, on first use."""

from __future__ import annotations

import pytest

from patchbay_devcluster import DevCluster


@pytest.fixture(scope="session")
def real_node(devcluster: DevCluster) -> str:
    if "kubelet" not in {p.name for p in devcluster.running()}:
        devcluster.start_real_node(timeout=180)
    return "localhost"
