"""Install this checkout's Helm chart on the local cluster, with the images built here.

One function for the demo, the e2e tests and the benchmarks, so all three take the user's path:
``helm upgrade --install`` of ``charts/patchbay``. The local cluster differs from a real one in
two ways, and the values say so with the chart's own options (both off by default):

- there is no kube-proxy and the API server listens on 127.0.0.1 only, so the operator runs with
  ``operator.hostNetwork`` and reaches the API server at ``apiServer.host``/``port``, and the
  agents (on the pod network) reach it through the cluster tool's relay on the pod bridge
  (``agent.apiServer``; the API server's certificate names that address);
- there is no registry, so images are imported into the node (``DevCluster.load_images``) and the
  operator's pull policy is ``Never`` (a missing image says so at once: ErrImageNeverPull).
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
from patchbay_devcluster.procs import free_port

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
    """Chart values for the local cluster (see the module docstring for why each one)."""
    operator, agent = images["operator"], images["agent"]
    pod_host, pod_port = cluster.pod_api_server
    return {
        "image": {"repository": operator.repository, "tag": operator.tag, "pullPolicy": "Never"},
        "agent": {
            "image": agent.ref,
            "kubeletRootDir": str(cluster.real_node().paths.kubelet_root),
            "cdiSpecDir": str(cluster.real_node().paths.cdi_spec_dir),
            "apiServer": {"host": pod_host, "port": pod_port},
        },
        # On the node's network its ports are the machine's (on 127.0.0.1): free ones.
        "operator": {"hostNetwork": True, "healthPort": free_port()},
        "metrics": {"port": free_port()},
        "apiServer": {"host": "127.0.0.1", "port": cluster.state().ports["apiserver"]},
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


def helm_uninstall(cluster: DevCluster, release: Release, wait: str = "2m") -> None:
    helm(cluster, "uninstall", release.name, "--namespace", release.namespace, "--wait", "--timeout", wait)
