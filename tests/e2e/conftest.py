"""The real node (kubelet + containerd + runc) joins the session's cluster once, on first use."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2ehelpers import wait_for
from kubernetes import client

from patchbay_devcluster import DevCluster


@pytest.fixture(scope="session")
def real_node(devcluster: DevCluster) -> str:
    if "kubelet" not in {p.name for p in devcluster.running()}:
        devcluster.start_real_node(timeout=180)
    return "localhost"


@pytest.fixture
def namespace(api: client.ApiClient, name_prefix: str) -> Iterator[str]:
    """A namespace of the test's own, with its default ServiceAccount (pods need it)."""
    core = client.CoreV1Api(api)
    ns = f"{name_prefix}node"
    core.create_namespace({"metadata": {"name": ns}})
    wait_for("default ServiceAccount", lambda: core.list_namespaced_service_account(ns).items, 60)
    yield ns
    core.delete_namespace(ns)
