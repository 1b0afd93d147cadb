"""Fixtures for the operator's integration tests: the CRD applied, the operator as a subprocess.

See optest.py for the helpers. One operator runs at a time (it watches every profile and node
cluster-wide); tests isolate themselves with per-test name prefixes and node labels.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from optest import CRD_FILE, GROUP, NAMESPACE, PLURAL, VERSION, Cluster, Operator, wait_for

from patchbay_devcluster import DevCluster


@pytest.fixture(scope="session")
def crd(api: client.ApiClient) -> dict[str, Any]:
    """The CRD from crds/, applied (created or replaced) and Established."""
    ext = client.ApiextensionsV1Api(api)
    body = yaml.safe_load(CRD_FILE.read_text())
    name = body["metadata"]["name"]
    try:
        current = ext.read_custom_resource_definition(name)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(name, body)
    except ApiException as e:
        if e.status != 404:
            raise
        ext.create_custom_resource_definition(body)

    def established() -> bool:
        c = ext.read_custom_resource_definition(name)
        return any(x.type == "Established" and x.status == "True" for x in c.status.conditions or [])

    wait_for("the CRD to be Established", established)
    # Discovery of the new group lags a little behind Established.
    custom = client.CustomObjectsApi(api)
    wait_for("the profile API to be served", lambda: _served(custom))
    return body


def _served(custom: client.CustomObjectsApi) -> bool:
    try:
        custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    except ApiException:
        return False
    return True


@pytest.fixture(scope="session")
def namespace(api: client.ApiClient) -> str:
    core = client.CoreV1Api(api)
    try:
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    except ApiException as e:
        if e.status != 409:
            raise
    return NAMESPACE


@pytest.fixture(scope="session")
def operator_process(
    devcluster: DevCluster, crd: dict[str, Any], namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    op = Operator(devcluster.kubeconfig, tmp_path_factory.mktemp("operator"))
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture
def operator(operator_process: Operator) -> Operator:
    """The running operator (restarted if a previous test stopped it)."""
    operator_process.ensure()
    return operator_process


@pytest.fixture
def cluster(
    api: client.ApiClient, devcluster: DevCluster, name_prefix: str, crd: dict[str, Any]
) -> Iterator[Cluster]:
    c = Cluster(api, devcluster, name_prefix)
    try:
        yield c
    finally:
        c.cleanup()
