"""Installed the way clusters install: the chart from ``oci://`` and the images BY DIGEST from a
real OCI registry (distribution's registry, a process of the cluster on 127.0.0.1, TLS with the
cluster's CA), pulled by the real node's containerd through its hosts file; never imported.

- by digest: the operator's and an agent's pods run the digests the pushes recorded, and the
  node's containerd lists the images under the registry's reference and digest; a tag moved
  after the push does not move a digest pinned in values;
- with credentials: a registry with htpasswd auth; a pod without a pull secret fails with
  ErrImagePull (401), the chart's ``imagePullSecrets`` lets the operator's pod and the agents'
  (through their ServiceAccounts) pull;
- a registry down while an agent DaemonSet rolls: the old agent pod keeps serving, the new one
  cannot pull, and the profile says so; the registry back, the roll completes.

Each test upgrades the session's release in place with the values it needs (from a registry,
whatever the release was before: ``helm upgrade`` without ``--reuse-values``), and the module puts
it back as the session installed it once, after its last test (not after each: the next test
replaces it at once).
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from support.clusters import Cluster
from support.ociregistry import relabelled as relabel
from support.realnode import DEVICES, Installed, OnNode, serial_profile, wait_for

from patchbay_devcluster import DevCluster
from patchbay_devcluster.imagebuild import BuiltImage
from patchbay_devcluster.install import Release, helm_install, node_images, push_image
from patchbay_devcluster.registry import Credentials, Registry


@pytest.fixture(scope="module")
def relabelled(patchbay: Installed, tmp_path_factory: pytest.TempPathFactory) -> dict[str, BuiltImage]:
    """The session's images with one label more: their own image IDs (``support.ociregistry.relabelled``
    says why)."""
    work = tmp_path_factory.mktemp("relabel")
    return {name: relabel(image, "registry", work) for name, image in patchbay.images.items()}


@pytest.fixture(scope="module")
def restore(patchbay: Installed, e2e_cluster: DevCluster) -> Iterator[None]:
    """Puts the release back as the session installed it, its operator Ready, after the module."""
    try:
        yield
    finally:
        helm_install(e2e_cluster, patchbay.release.chart, patchbay.images)
        wait_for("the operator back as installed, Ready", patchbay.operator_ready, 180)


def _container(pod: client.V1Pod) -> tuple[str, str]:
    """(spec image, status imageID) of the pod's first container."""
    status = (pod.status.container_statuses or [None])[0]
    return pod.spec.containers[0].image, (status.image_id if status else "") or ""


def _waiting(pods: list[client.V1Pod]) -> list[tuple[str, str]]:
    """(reason, message) of every waiting container of ``pods``."""
    out = []
    for p in pods:
        for c in p.status.container_statuses or []:
            if c.state and c.state.waiting:
                out.append((c.state.waiting.reason or "", c.state.waiting.message or ""))
    return out


def _served(cluster: Cluster, node: str, resource: str) -> bool:
    return cluster.values(node, resource) == (str(DEVICES), str(DEVICES))


def test_chart_and_images_from_the_registry_by_digest(
    on_node: OnNode, relabelled: dict[str, BuiltImage], restore: None
) -> None:
    patchbay, cluster, e2e_cluster, real_node, _ns, fake_dev = on_node
    reg = e2e_cluster.start_registry()
    release = helm_install(e2e_cluster, patchbay.release.chart, relabelled, registry=reg)
    operator_digest = release.values["image"]["digest"]
    agent_ref = release.values["agent"]["image"]
    operator_ref = f"{reg.repository('operator')}@{operator_digest}"
    assert agent_ref.startswith(reg.repository("agent") + "@sha256:"), agent_ref

    def operator_from_registry() -> client.V1Pod | None:
        pod = patchbay.operator_ready()
        return pod if pod is not None and _container(pod)[0] == operator_ref else None

    pod = wait_for("the operator pod from the registry, Ready", operator_from_registry, 180)
    assert _container(pod)[1].endswith(operator_digest), _container(pod)

    name, resource = serial_profile(cluster, fake_dev, real_node)
    wait_for("the agent serves the devices", lambda: _served(cluster, real_node, resource), 180)
    agent = _one_ready_agent(patchbay, name)
    assert _container(agent)[0] == agent_ref
    assert _container(agent)[1].endswith(agent_ref.rsplit("@", 1)[1]), _container(agent)

    # The node's containerd pulled them: listed under the registry's reference, by digest.
    listed = node_images(e2e_cluster)
    assert listed.get(operator_ref) == operator_digest, listed
    assert listed.get(agent_ref) == agent_ref.rsplit("@", 1)[1], listed
    print(json.dumps({k: v for k, v in listed.items() if k.startswith(reg.host)}, indent=2))

    # A digest pinned in values wins over a tag that names another image: the operator's
    # repository's tag "moved" points at the agent's image, values give that tag AND the digest;
    # the chart renders repository@digest, and the node runs the pinned digest.
    moved = _move_tag(relabelled["agent"], reg, "moved")
    assert moved != operator_digest
    pinned = helm_install(
        e2e_cluster,
        patchbay.release.chart,
        relabelled,
        {"image": {"tag": "moved", "digest": operator_digest}},
        registry=reg,
    )
    assert pinned.values["image"]["digest"] == operator_digest
    pod = wait_for("the operator pod, pinned, Ready", operator_from_registry, 180)
    assert _container(pod)[1].endswith(operator_digest), (_container(pod), moved)


def _move_tag(other: BuiltImage, reg: Registry, tag: str) -> str:
    """Push ``other`` as ``tag`` of the operator's repository in ``reg``; the digest it now names."""
    target = f"docker://{reg.repository('operator')}:{tag}"
    argv = ["podman", "push", "--quiet", "--cert-dir", str(reg.cert_dir), other.ref, target]
    subprocess.run(argv, check=True, capture_output=True, timeout=300)
    digest = reg.manifest_digest(reg.repository("operator"), tag)
    assert digest is not None
    return digest


def test_pull_with_credentials_from_a_registry_with_auth(
    on_node: OnNode, relabelled: dict[str, BuiltImage], restore: None
) -> None:
    patchbay, cluster, e2e_cluster, real_node, namespace, fake_dev = on_node
    creds = Credentials("patchbay", secrets.token_urlsafe(16))
    reg = e2e_cluster.start_registry("registry-auth", creds)
    agent = push_image(relabelled["agent"], reg)
    core = client.CoreV1Api(e2e_cluster.api())

    # Without credentials: the node's containerd is refused (401), the kubelet says ErrImagePull.
    core.create_namespaced_pod(namespace, _pod("no-secret", real_node, agent.ref))

    def refused() -> list[tuple[str, str]]:
        pod = core.read_namespaced_pod("no-secret", namespace)
        return [w for w in _waiting([pod]) if w[0] in ("ErrImagePull", "ImagePullBackOff")]

    reason, message = wait_for("the pull without credentials refused", refused, 120)[0]
    assert "authorization failed" in message or "401" in message, (reason, message)

    # The chart with imagePullSecrets: the operator's pod and an agent's pull with them.
    release = helm_install(e2e_cluster, patchbay.release.chart, relabelled, registry=reg)
    assert release.values["imagePullSecrets"] == [{"name": "patchbay-registry"}], release.values
    operator_ref = f"{reg.repository('operator')}@{release.values['image']['digest']}"

    def operator_from_registry() -> client.V1Pod | None:
        pod = patchbay.operator_ready()
        return pod if pod is not None and _container(pod)[0] == operator_ref else None

    wait_for("the operator pod pulled with the pull secret, Ready", operator_from_registry, 180)
    name, resource = serial_profile(cluster, fake_dev, real_node)
    wait_for(
        "the agent, pulled with the pull secret, serves", lambda: _served(cluster, real_node, resource), 180
    )
    pod = _one_ready_agent(patchbay, name)
    assert _container(pod)[0] == agent.ref
    # The ServiceAccount's pull secret, which admission copies into every pod that runs as it.
    assert [s.name for s in pod.spec.image_pull_secrets or []] == ["patchbay-registry"], pod.spec
    assert node_images(e2e_cluster).get(agent.ref) == agent.digest


def _one_ready_agent(patchbay: Any, name: str) -> Any:
    """The profile's one Ready agent pod. The kubelet counts the devices as soon as the plugin
    registers, a moment before the pod's readiness probe passes: so wait for it (bounded)."""
    (pod,) = wait_for(
        "the profile's agent pod Ready",
        lambda: pods if len(pods := patchbay.ready_agents(name)) == 1 else None,
        120,
        detail=lambda: f"ready agent pods: {[p.metadata.name for p in patchbay.ready_agents(name)]}",
    )
    return pod


def _pod(name: str, node: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            # Always: a pull is asked of the registry even where the node holds the image already.
            "containers": [
                {"name": "main", "image": image, "imagePullPolicy": "Always", "command": ["true"]}
            ],
        },
    }


def test_registry_down_while_the_agents_roll(
    on_node: OnNode, relabelled: dict[str, BuiltImage], restore: None, tmp_path: Path
) -> None:
    patchbay, cluster, e2e_cluster, real_node, _ns, fake_dev = on_node
    reg = e2e_cluster.start_registry()
    # A second agent image that no node holds yet: the agent with one label more (a new digest).
    newer = relabel(relabelled["agent"], "newer", tmp_path)
    newer_pushed = push_image(newer, reg)
    release: Release = helm_install(
        e2e_cluster,
        patchbay.release.chart,
        relabelled,
        {"admission": {"profiles": {"allowedAgentImages": [newer_pushed.ref]}}},
        registry=reg,
    )
    name, resource = serial_profile(cluster, fake_dev, real_node)
    wait_for("the agent serves the devices", lambda: _served(cluster, real_node, resource), 180)
    old = _one_ready_agent(patchbay, name)
    assert _container(old)[0] == release.values["agent"]["image"]

    assert e2e_cluster.stop_registry()
    try:
        cluster.patch_spec(name, {"agent": {"image": newer_pushed.ref}})

        def stuck() -> list[tuple[str, str]]:
            pods = [p for p in patchbay.agent_pods(name) if p.metadata.name != old.metadata.name]
            return [w for w in _waiting(pods) if w[0] in ("ErrImagePull", "ImagePullBackOff")]

        _reason, message = wait_for("the new agent pod unable to pull", stuck, 180)[0]
        assert reg.host in message, message
        # The old pod keeps serving: still Ready, the devices still allocatable.
        assert old.metadata.name in {p.metadata.name for p in patchbay.ready_agents(name)}
        assert _served(cluster, real_node, resource)

        def says_why() -> str | None:
            text = json.dumps((cluster.profile(name) or {}).get("status") or {})
            return text if "ImagePullBackOff" in text or "ErrImagePull" in text else None

        status = wait_for("the profile saying why the agents are stuck", says_why, 120)
        print(status)
    finally:
        e2e_cluster.start_registry()

    def rolled() -> bool:
        ready = patchbay.ready_agents(name)
        return len(ready) == 1 and _container(ready[0])[0] == newer_pushed.ref

    wait_for("the roll completed with the registry back", rolled, 300)
    assert _served(cluster, real_node, resource)
