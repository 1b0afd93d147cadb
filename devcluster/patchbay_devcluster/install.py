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

import json
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchbay_devcluster.cluster import ClusterError, DevCluster
from patchbay_devcluster.imagebuild import BuiltImage

RELEASE = "patchbay"
NAMESPACE = "patchbay-system"


@dataclass(frozen=True)
class Release:
    """An installed release: enough to upgrade, uninstall or read it again."""

    name: str
    namespace: str
    chart: Path
    values: Mapping[str, Any]


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
) -> Release:
    """Import the images into the real node, then ``helm upgrade --install --wait`` the chart.

    ``values`` are merged over ``local_values``. Idempotent: a second call upgrades in place.
    """
    cluster.load_images((i.ref, i.archive) for i in images.values())
    merged = merge(local_values(cluster, images), values or {})
    helm(
        cluster,
        "upgrade", "--install", release, str(chart),
        "--namespace", namespace, "--create-namespace",
        "--values", "-",
        "--wait", "--timeout", wait,
        stdin=json.dumps(merged),
    )  # fmt: skip
    return Release(release, namespace, chart, merged)


def helm_uninstall(cluster: DevCluster, release: Release, wait: str = "2m", *, hooks: bool = True) -> str:
    """``helm uninstall --wait``; its output. ``hooks=False``: ``--no-hooks``, so the chart's
    pre-delete check does not run (it refuses while profiles exist: docs/operations.md#uninstall).
    """
    flags = () if hooks else ("--no-hooks",)
    args = ("uninstall", release.name, "--namespace", release.namespace, "--wait", "--timeout", wait, *flags)
    return helm(cluster, *args)
