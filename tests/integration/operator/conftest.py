"""The operator fixtures (the CRD, the operator subprocess, the Cluster helper) live in
tests/conftest.py, shared with the e2e tests on the real node: one operator per session. Here:
kopf's peering CRD, for the tests that run two replicas (``support.operator.peered_pair``)."""

from __future__ import annotations

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.clusters import REPO, wait_for

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
