"""Install this checkout's Helm chart on the local cluster, with the images built here.

One function for the demo, the e2e tests and the benchmarks, so all three take the user's path:
``helm upgrade --install`` of ``charts/patchbay`` (the e2e tests: of the chart as ``helm package``
makes it, ``package_chart``, the archive ``make release`` ships) with the chart's DEFAULT values,
but for the images. The local cluster is made to look like a real one where the chart's defaults depend on
it: pods reach the API server through the ``kubernetes`` Service (its address is the pod
bridge's own, where the cluster tool's relay answers on the Service's port; docs/devcluster.md),
and the real node's kubelet uses ``/var/lib/kubelet`` and containerd ``/var/run/cdi``. The one
difference left: there is no registry, so images are imported into the node
(``DevCluster.load_images``) and their pull policy is ``Never`` (a missing image says so at once:
ErrImageNeverPull). The chart's options for clusters that differ (``operator.hostNetwork``,
``apiServer``, ``agent.apiServer``, the node paths) each have a test of their own.
"""

from __future__ import annotations

import base64
import json
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from patchbay_devcluster import registry as oci
from patchbay_devcluster.cluster import ClusterError, DevCluster
from patchbay_devcluster.imagebuild import BuiltImage
from patchbay_devcluster.node import RealNode

RELEASE = "patchbay"
NAMESPACE = "patchbay-system"


@dataclass(frozen=True)
class Release:
    """An installed release: enough to upgrade, uninstall or read it again."""

    name: str
    namespace: str
    chart: Path
    values: Mapping[str, Any]


PULL_SECRET = "patchbay-registry"  # noqa: S105 (a Secret's name, not a password)
"""The imagePullSecret ``helm_install`` creates for a registry that needs credentials."""


@dataclass(frozen=True)
class Published:
    """An image pushed to the cluster's registry: its repository there and the digest the push
    recorded (what the node's containerd pulls, by digest)."""

    program: str
    repository: str
    tag: str
    digest: str

    @property
    def ref(self) -> str:
        """``<registry>/<path>@sha256:...``: the reference by digest."""
        return f"{self.repository}@{self.digest}"


@dataclass(frozen=True)
class PublishedChart:
    url: str  # oci://<registry>/charts/patchbay
    version: str
    digest: str


def local_values(cluster: DevCluster, images: Mapping[str, BuiltImage]) -> dict[str, Any]:
    """Chart values for the local cluster: the images, and nothing else (see the module doc)."""
    operator, agent = images["operator"], images["agent"]
    return {
        "image": {"repository": operator.repository, "tag": operator.tag, "pullPolicy": "Never"},
        "agent": {"image": agent.ref},
    }


def merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``extra`` over ``base``, mappings merged key by key (as Helm merges values files)."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def helm(cluster: DevCluster, *args: str, stdin: str | None = None, timeout: float = 300) -> str:
    """Run the pinned helm against the local cluster; raise ClusterError with its output on failure."""
    argv = [str(cluster.bin_dir / "helm"), "--kubeconfig", str(cluster.kubeconfig), *args]
    res = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    if res.returncode != 0:
        raise ClusterError(f"helm {' '.join(args[:2])} failed:\n{res.stdout}{res.stderr}")
    return res.stdout


def package_chart(helm_bin: Path, chart: Path, destination: Path) -> Path:
    """``helm package`` the chart folder ``chart`` into ``destination``; returns the archive
    (``<name>-<version>.tgz``, the version from its Chart.yaml). What ``make release`` ships and
    what the e2e suite installs, so what is released is what is tested."""
    destination.mkdir(parents=True, exist_ok=True)
    argv = [str(helm_bin), "package", str(chart), "--destination", str(destination)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if res.returncode != 0:
        raise ClusterError(f"helm package {chart} failed:\n{res.stdout}{res.stderr}")
    # helm prints "Successfully packaged chart and saved it to: <path>".
    archive = Path(res.stdout.strip().rsplit(": ", 1)[-1])
    if not archive.is_file():
        raise ClusterError(f"helm package {chart}: no archive where it said: {res.stdout.strip()}")
    return archive


def helm_install(
    cluster: DevCluster,
    chart: Path,
    images: Mapping[str, BuiltImage],
    values: Mapping[str, Any] | None = None,
    *,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    wait: str = "3m",
    registry: oci.Registry | None = None,
) -> Release:
    """Import the images into the real node (or push them and the chart to a registry), then
    ``helm upgrade --install --wait`` the chart.

    ``values`` are merged over ``local_values``. Idempotent: a second call upgrades in place.

    With ``registry`` (or with ``PATCHBAY_REGISTRY=1``: the cluster's registry ``registry``,
    started if need be): through the registry instead of an import (``publish``).
    """
    if registry is None and oci.enabled():
        registry = cluster.start_registry()
    if registry is not None:
        chart_args, base = publish(cluster, chart, images, registry, namespace)
    else:
        cluster.load_images((i.ref, i.archive) for i in images.values())
        chart_args, base = [str(chart)], local_values(cluster, images)
    merged = merge(base, values or {})
    helm(
        cluster,
        "upgrade", "--install", release, *chart_args,
        "--namespace", namespace, "--create-namespace",
        "--values", "-",
        "--wait", "--timeout", wait,
        stdin=json.dumps(merged),
    )  # fmt: skip
    return Release(release, namespace, chart, merged)


# --- through an OCI registry ----------------------------------------------------------------------


def _podman(step: str, argv: list[str], timeout: float = 600) -> str:
    res = subprocess.run(["podman", *argv], capture_output=True, text=True, timeout=timeout, check=False)
    if res.returncode != 0:
        raise ClusterError(
            f"{step}: podman {' '.join(argv[:2])} exited {res.returncode}\n{res.stdout}{res.stderr}"
        )
    return res.stdout


def push_image(image: BuiltImage, registry: oci.Registry) -> Published:
    """``podman push`` the built image to ``registry`` as
    ``<registry>/kube-patchbay/patchbay-<program>:<tag>``; the digest is the one the push recorded.
    Pushed every time, never skipped because the tag is there: a tag can be moved (the e2e suite
    moves one), and a second push of the same image is quick (the registry has its blobs). An
    image only in the archive cache (not in podman's storage) is loaded first."""
    repository = registry.repository(image.program)
    exists = subprocess.run(["podman", "image", "exists", image.ref], capture_output=True, check=False)
    if exists.returncode != 0:
        _podman(f"loading {image.archive}", ["load", "--input", str(image.archive)])
    with tempfile.TemporaryDirectory() as tmp:
        digestfile = Path(tmp) / "digest"
        creds = []
        if registry.credentials is not None:
            creds = ["--creds", f"{registry.credentials.username}:{registry.credentials.password}"]
        argv = ["push", "--quiet", "--cert-dir", str(registry.cert_dir), "--digestfile", str(digestfile)]
        _podman(f"pushing {image.ref}", [*argv, *creds, image.ref, f"docker://{repository}:{image.tag}"])
        digest = digestfile.read_text().strip()
    if not digest.startswith("sha256:"):
        raise ClusterError(f"pushing {image.ref} to {registry.host}: no digest recorded ({digest!r})")
    return Published(image.program, repository, image.tag, digest)


def chart_file(chart: Path, name: str) -> str | None:
    """The text of ``name`` (``Chart.yaml``, ``values.schema.json``) of a chart folder or archive."""
    if chart.is_dir():
        path = chart / name
        return path.read_text() if path.is_file() else None
    with tarfile.open(chart) as tar:
        for member in tar.getmembers():
            if member.name.count("/") == 1 and member.name.endswith("/" + name):
                data = tar.extractfile(member)
                return data.read().decode() if data is not None else None
    return None


def takes_digest(chart: Path) -> bool:
    """Whether the chart has ``image.digest`` (0.1.0 and 0.2.0 do not: they get ``tag@digest``)."""
    raw = chart_file(chart, "values.schema.json")
    props = json.loads(raw).get("properties", {}).get("image", {}).get("properties", {}) if raw else {}
    return "digest" in props


def helm_registry_args(cluster: DevCluster, registry: oci.Registry) -> list[str]:
    """The flags that make helm trust ``registry`` (the cluster's CA) and keep its logins in the
    cluster's state directory rather than the user's ~/.config/helm."""
    config = cluster.dir / "registry" / "helm-registry.json"
    return ["--ca-file", str(registry.ca), "--registry-config", str(config)]


def push_chart(cluster: DevCluster, chart: Path, registry: oci.Registry) -> PublishedChart:
    """``helm push`` the chart (a folder is packaged first, as ``make release`` does) to
    ``oci://<registry>/charts``, after ``helm registry login`` where the registry needs it."""
    if chart.is_dir():
        chart = package_chart(cluster.bin_dir / "helm", chart, cluster.dir / "registry" / "charts")
    meta = yaml.safe_load(chart_file(chart, "Chart.yaml") or "{}")
    flags = helm_registry_args(cluster, registry)
    if registry.credentials is not None:
        helm(
            cluster, "registry", "login", registry.host, "--username", registry.credentials.username,
            "--password-stdin", *flags[:2], "--registry-config", flags[3],
            stdin=registry.credentials.password,
        )  # fmt: skip
    out = helm(cluster, "push", str(chart), registry.charts, *flags)
    digest = next((line.split()[-1] for line in out.splitlines() if line.startswith("Digest:")), "")
    return PublishedChart(f"{registry.charts}/{meta['name']}", str(meta["version"]), digest)


def pull_secret(cluster: DevCluster, registry: oci.Registry, namespace: str, name: str = PULL_SECRET) -> str:
    """A ``kubernetes.io/dockerconfigjson`` Secret with the registry's credentials in ``namespace``
    (created, or replaced); returns its name."""
    assert registry.credentials is not None
    core = client.CoreV1Api(cluster.api())
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    except client.ApiException as e:
        if e.status != 409:
            raise
    data = json.dumps(registry.credentials.docker_config(registry.host)).encode()
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace),
        type="kubernetes.io/dockerconfigjson",
        data={".dockerconfigjson": base64.b64encode(data).decode()},
    )
    try:
        core.create_namespaced_secret(namespace, body)
    except client.ApiException as e:
        if e.status != 409:
            raise
        core.replace_namespaced_secret(name, namespace, body)
    return name


def registry_values(published: Mapping[str, Published], *, digest_key: bool = True) -> dict[str, Any]:
    """Chart values that take the images from the registry BY DIGEST, with the chart's default pull
    policy (IfNotPresent): the operator's as ``image.repository`` + ``image.digest`` (a chart
    without ``image.digest``: ``image.tag`` = ``<tag>@<digest>``), the agent's as
    ``<repository>@<digest>``."""
    operator, agent = published["operator"], published["agent"]
    image: dict[str, Any] = {"repository": operator.repository}
    if digest_key:
        image["digest"] = operator.digest
    else:
        image["tag"] = f"{operator.tag}@{operator.digest}"
    return {"image": image, "agent": {"image": agent.ref}}


def publish(
    cluster: DevCluster, chart: Path, images: Mapping[str, BuiltImage], registry: oci.Registry, namespace: str
) -> tuple[list[str], dict[str, Any]]:
    """The way clusters install: push the images (``podman push``) and the chart (``helm push``)
    to ``registry``; returns the arguments that name the chart to ``helm upgrade --install``
    (``oci://<registry>/charts/patchbay --version X`` and helm's trust of the registry) and the
    values that take the images BY DIGEST with the chart's own pull policy
    (``registry_values``): the real node's containerd pulls them from the registry (its hosts
    file, the cluster's CA). Where the registry needs credentials: an imagePullSecret
    (``PULL_SECRET``) in ``namespace``, named in the chart's ``imagePullSecrets``."""
    published = {name: push_image(image, registry) for name, image in images.items()}
    pushed = push_chart(cluster, chart, registry)
    base = registry_values(published, digest_key=takes_digest(chart))
    if registry.credentials is not None:
        base["imagePullSecrets"] = [{"name": pull_secret(cluster, registry, namespace)}]
    return [pushed.url, "--version", pushed.version, *helm_registry_args(cluster, registry)], base


def node_images(cluster: DevCluster) -> dict[str, str]:
    """The real node's containerd images (namespace k8s.io) as ``{name: digest}``: what ``ctr -n
    k8s.io images ls`` lists."""
    node = RealNode(cluster.dir, cluster.pki_dir, cluster.bin_dir)
    out: dict[str, str] = {}
    for line in node.containerd.ctr("images", "list").splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 3:
            out[cols[0]] = cols[2]
    return out


def helm_uninstall(cluster: DevCluster, release: Release, wait: str = "2m", *, hooks: bool = True) -> str:
    """``helm uninstall --wait``; its output. ``hooks=False``: ``--no-hooks``, so the chart's
    pre-delete check does not run (it refuses while profiles exist: docs/operations.md#uninstall).
    """
    flags = () if hooks else ("--no-hooks",)
    args = ("uninstall", release.name, "--namespace", release.namespace, "--wait", "--timeout", wait, *flags)
    return helm(cluster, *args)
