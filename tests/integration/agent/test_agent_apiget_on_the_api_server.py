"""The agent's GET on the event loop (`patchbay_agent.apiget`) against the REAL API server.

NodePrepareResources reads each claim with it (docs/dra.md#prepare), so it must give exactly what
the agent's other client gives, with the same credentials: the session cluster's admin kubeconfig
(client certificate, the cluster's CA), and in-cluster credentials as a pod has them (a
ServiceAccount token from the TokenRequest API and the CA in a service-account directory, the
server from KUBERNETES_SERVICE_HOST/PORT). Checked: the same object as `resource_claim`, one
connection kept for many GETs, parallel GETs each answered right, the API server's own refusal
(404 naming the claim, 403 for an account without the right) and a rotated token used at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.clusters import create_resource_claim

from patchbay_agent.apiget import GetError
from patchbay_agent.kubeclient import ApiError, KubeClient
from patchbay_devcluster import DevCluster
from patchbay_devcluster.pki import CertificateAuthority

GROUP, VERSION = "resource.k8s.io", "v1"


def _claims(api: client.ApiClient, namespace: str, count: int) -> list[str]:
    custom = client.CustomObjectsApi(api)
    names = [f"claim-{i}" for i in range(count)]
    for name in names:
        create_resource_claim(
            custom, namespace, name, [{"name": "r", "exactly": {"deviceClassName": "none"}}]
        )
    return names


def test_apiget_reads_what_the_agents_client_reads_on_one_kept_connection(
    devcluster: DevCluster, api: client.ApiClient, namespace: str
) -> None:
    names = _claims(api, namespace, 20)
    kube = KubeClient(devcluster.kubeconfig)

    async def scenario() -> None:
        getter = kube.getter()
        assert getter is not None  # a client certificate and a CA: apiget handles them
        try:
            for name in names:
                got = await kube.resource_claim_async(getter, namespace, name, seconds=10)
                assert got == kube.resource_claim(namespace, name)
            assert getter.connects == 1
            # The kubelet may prepare several claims at once: each GET gets its own answer.
            many = await asyncio.gather(
                *(kube.resource_claim_async(getter, namespace, n, seconds=10) for n in names)
            )
            assert [m["metadata"]["name"] for m in many] == names
            assert len(getter._idle) <= 4  # the extra connections were closed
            with pytest.raises(ApiError) as gone:
                await kube.resource_claim_async(getter, namespace, "no-such-claim", seconds=10)
            assert gone.value.status == 404
            assert 'resourceclaims.resource.k8s.io "no-such-claim" not found' in gone.value.message
        finally:
            getter.close()

    asyncio.run(scenario())


def _service_account_token(api: client.ApiClient, namespace: str, account: str) -> str:
    core = client.CoreV1Api(api)
    with contextlib.suppress(ApiException):
        core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    answer = core.create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 600}}
    )
    return str(answer.status.token)


def test_apiget_in_a_pods_credentials_sends_the_token_as_it_is_now(
    devcluster: DevCluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    (name,) = _claims(api, namespace, 1)
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "claims"},
            "rules": [{"apiGroups": [GROUP], "resources": ["resourceclaims"], "verbs": ["get"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "claims"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "claims"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )
    sa_dir = tmp_path / "serviceaccount"
    sa_dir.mkdir()
    (sa_dir / "ca.crt").write_bytes((devcluster.pki_dir / "ca.crt").read_bytes())
    (sa_dir / "token").write_text(_service_account_token(api, namespace, "nobody"))
    url = urlsplit(devcluster.server)
    env = {"KUBERNETES_SERVICE_HOST": str(url.hostname), "KUBERNETES_SERVICE_PORT": str(url.port)}
    kube = KubeClient(None, service_account_dir=sa_dir, env=env)

    async def scenario() -> None:
        getter = kube.getter()
        assert getter is not None
        try:
            # An account without the right: the API server's own refusal.
            with pytest.raises(ApiError) as refused:
                await kube.resource_claim_async(getter, namespace, name, seconds=10)
            assert refused.value.status == 403
            assert f"system:serviceaccount:{namespace}:nobody" in refused.value.message
            # The kubelet rotates the token file: the next GET carries the new token.
            (sa_dir / "token").write_text(_service_account_token(api, namespace, "reader"))
            got = await kube.resource_claim_async(getter, namespace, name, seconds=10)
            assert got["metadata"]["name"] == name
        finally:
            getter.close()

    asyncio.run(scenario())


def test_apiget_verifies_the_servers_certificate(devcluster: DevCluster, tmp_path: Path) -> None:
    """A CA that did not sign the API server's certificate: no answer is trusted."""
    other = CertificateAuthority(tmp_path / "other-ca")  # a fresh CA of its own
    sa_dir = tmp_path / "serviceaccount"
    sa_dir.mkdir()
    (sa_dir / "ca.crt").write_bytes(other.pair.cert.read_bytes())
    (sa_dir / "token").write_text("any")
    url = urlsplit(devcluster.server)
    env = {"KUBERNETES_SERVICE_HOST": str(url.hostname), "KUBERNETES_SERVICE_PORT": str(url.port)}
    getter = KubeClient(None, service_account_dir=sa_dir, env=env).getter()
    assert getter is not None

    async def scenario() -> None:
        with pytest.raises(GetError, match="CERTIFICATE_VERIFY_FAILED"):
            await getter.get("/api/v1/namespaces/default", seconds=10)

    asyncio.run(scenario())
