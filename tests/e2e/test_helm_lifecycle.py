"""The chart's lifecycle on the real node, as a cluster operator lives it.

- ``helm upgrade`` with a changed CRD upgrades the CRD (it is templated, not in Helm's crds/
  folder, which Helm never upgrades) and rolls the operator pod (a checksum of the CRD is on its
  pod template), with no node rewritten;
- ``helm uninstall`` keeps the CRD and every profile (``crds.keep``) and leaves node capacity
  alone: the operator is gone, nothing removes what it set;
- installing again takes over without rewriting any node (the operator's own counters say 0
  node patches once it has seen every node and reconciled the profile).

The test ends with the release installed from the repository's chart, as the session fixture
made it, so the tests after it find it as they expect.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from support.clusters import Cluster
from support.realnode import REPO, Installed, wait_for

from patchbay_devcluster import DevCluster
from patchbay_devcluster.install import helm_install, helm_uninstall

CRD = "devicepluginprofiles.patchbay.dev"
CRD_TEMPLATE = Path("templates/crds/patchbay.dev_devicepluginprofiles.yaml")


def chart_with_a_new_printer_column(tmp_path: Path) -> Path:
    """A copy of the chart whose CRD has one more printer column (a real CRD change)."""
    chart = tmp_path / "patchbay"
    shutil.copytree(REPO / "charts" / "patchbay", chart)
    crd = chart / CRD_TEMPLATE
    text = crd.read_text()
    column = (
        "        - name: Problems\n"
        "          type: integer\n"
        "          jsonPath: .status.problemCount\n"
        "          description: Nodes that need attention.\n"
    )
    marker = "        - name: Age\n"
    assert marker in text
    crd.write_text(text.replace(marker, column + marker, 1))
    return chart


def columns(ext: client.ApiextensionsV1Api) -> list[str]:
    crd = ext.read_custom_resource_definition(CRD)
    return [c.name for c in crd.spec.versions[0].additional_printer_columns]


def node_view(cluster: Cluster, node: str, resource: str) -> tuple[Any, ...]:
    """What the operator wrote on a node for ``resource``: the values and its ownership note."""
    obj = cluster.node(node)
    notes = {k: v for k, v in (obj["metadata"].get("annotations") or {}).items() if "patchbay" in k}
    return (*cluster.values(node, resource), yaml.safe_dump(notes, sort_keys=True))


def settled_stats(patchbay: Installed) -> dict[str, int]:
    """The running operator's counters once it has reconciled the profiles it found and has
    nothing queued (kopf logs each reconcile; the operator logs its counters when they move)."""

    def ready() -> dict[str, int] | None:
        if (
            patchbay.operator_ready() is None
            or "Handler 'reconcile' succeeded" not in patchbay.operator_log()
        ):
            return None
        stats = patchbay.operator_stats()
        return stats if stats.get("profiles", 0) >= 1 and stats.get("nodes") and not stats["queued"] else None

    result: dict[str, int] = wait_for("the new operator settled", ready, 120)
    return result


def test_upgrade_with_a_crd_change_uninstall_and_reinstall(
    patchbay: Installed, cluster: Cluster, e2e_cluster: DevCluster, real_node: str, tmp_path: Path
) -> None:
    ext = client.ApiextensionsV1Api(patchbay.api)
    name, resource = f"{cluster.prefix}kept", f"e2e.patchbay.dev/{cluster.tag}-kept"
    cluster.set_labels(real_node, {"patchbay.dev/e2e-helm": cluster.tag})
    try:
        cluster.create_profile(
            name,
            {
                "resourceName": resource,
                "mode": "Static",
                "nodeSelector": {"matchLabels": {"patchbay.dev/e2e-helm": cluster.tag}},
                "static": {"capacity": 3},
            },
        )
        wait_for("capacity on the node", lambda: cluster.values(real_node, resource) == ("3", "3"), 60)
        before = node_view(cluster, real_node, resource)
        old_pod = patchbay.operator_ready()
        assert old_pod is not None
        assert "Problems" not in columns(ext)

        # 1. upgrade with a CRD change: the CRD follows, the operator pod is replaced.
        helm_install(
            e2e_cluster, chart_with_a_new_printer_column(tmp_path), patchbay.images, patchbay.release.values
        )
        assert "Problems" in columns(ext)
        new_pod = wait_for(
            "a new operator pod",
            lambda: (
                (p := patchbay.operator_ready()) is not None and p.metadata.uid != old_pod.metadata.uid and p
            ),
            120,
        )
        assert (
            new_pod.metadata.annotations["patchbay.dev/crds-checksum"]
            != (old_pod.metadata.annotations["patchbay.dev/crds-checksum"])
        )
        assert settled_stats(patchbay)["nodePatches"] == 0
        assert node_view(cluster, real_node, resource) == before

        # 2. uninstall: the operator goes; the CRD, the profile and the node's capacity stay.
        helm_uninstall(e2e_cluster, patchbay.release)
        wait_for("no operator pod", lambda: not patchbay.operator_pods(), 120)
        assert ext.read_custom_resource_definition(CRD).metadata.name == CRD
        assert cluster.profile(name) is not None
        assert node_view(cluster, real_node, resource) == before

        # 3. install again (the repository's chart): it takes over, rewriting no node.
        helm_install(e2e_cluster, patchbay.release.chart, patchbay.images, patchbay.release.values)
        stats = settled_stats(patchbay)
        assert stats["nodePatches"] == 0, stats
        assert node_view(cluster, real_node, resource) == before
        assert "Problems" not in columns(ext)
        # The profile is served as before: deleting it removes its capacity (the new operator
        # knows what it owns from the node's annotations, not from memory).
        cluster.delete_profile(name)
        wait_for("the profile gone", lambda: cluster.profile(name) is None, 60)
        assert cluster.values(real_node, resource) == (None, None)
    finally:
        if patchbay.operator_ready() is None:
            helm_install(e2e_cluster, patchbay.release.chart, patchbay.images, patchbay.release.values)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-helm": None})
