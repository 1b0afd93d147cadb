"""Fixtures of the agent's tests on the real API server: a namespace, a kwok node and a directory of
their own, and all of it with the API (``agent_node``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.clusters import AgentNode

from patchbay_devcluster import DevCluster


@pytest.fixture
def namespace(api: client.ApiClient, name_prefix: str) -> Iterator[str]:
    """A namespace of the test's own (``<prefix>agent``), deleted at its end."""
    core = client.CoreV1Api(api)
    ns = f"{name_prefix}agent"
    core.create_namespace({"metadata": {"name": ns}})
    try:
        yield ns
    finally:
        with contextlib.suppress(ApiException):
            core.delete_namespace(ns)


@pytest.fixture
def node(devcluster: DevCluster, api: client.ApiClient, name_prefix: str) -> Iterator[tuple[str, str]]:
    """A kwok node of the test's own: (name, uid), deleted at its end."""
    (name,) = devcluster.add_kwok_nodes(1, prefix=f"{name_prefix}n", labels={"patchbay.dev/test": "agent"})
    core = client.CoreV1Api(api)
    try:
        yield name, core.read_node(name).metadata.uid
    finally:
        with contextlib.suppress(ApiException):
            core.delete_node(name)


@pytest.fixture
def workdir(short_dir: Path) -> Path:
    """The agent's directory: its kubelet root, sockets, config and log (short: tests/conftest.py)."""
    return short_dir


@pytest.fixture
def agent_node(
    api: client.ApiClient, devcluster: DevCluster, node: tuple[str, str], workdir: Path, name_prefix: str
) -> AgentNode:
    """The test's node, its directory and the API, together."""
    return AgentNode(client.CustomObjectsApi(api), devcluster, *node, workdir, name_prefix)
