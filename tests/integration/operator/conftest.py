"""The operator fixtures (the CRD, the operator subprocess, the Cluster helper) live in
tests/conftest.py, shared with the e2e tests on the real node: one operator per session. Here:
kopf's peering CRD, for the tests that run two replicas (``support.operator.peered_pair``), and
the operator's own API client for the tests that drive its parts in-process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.clusters import REPO, wait_for

from patchbay_devcluster import DevCluster
from patchbay_operator.kube import Kube, load_configuration

PEERING_CRD = REPO / "crds" / "kopf.dev_clusterkopfpeerings.yaml"


@pytest.fixture
def peering_crd(api: client.ApiClient) -> None:
    """kopf's ClusterKopfPeering CRD, Established (the chart installs it with two replicas)."""
    ext = client.ApiextensionsV1Api(api)
    body = yaml.safe_load(PEERING_CRD.read_text())
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as e:
        if e.status != 409:
            raise
    wait_for(
        "peering CRD established",
        lambda: any(
            c.type == "Established" and c.status == "True"
            for c in ext.read_custom_resource_definition(body["metadata"]["name"]).status.conditions or []
        ),
    )


@pytest.fixture
def kube(devcluster: DevCluster) -> Iterator[Kube]:
    """The operator's API client (``kube.Kube``) on the test cluster, closed after the test."""
    k = Kube(load_configuration(str(devcluster.kubeconfig), 4))
    try:
        yield k
    finally:
        k.close()
