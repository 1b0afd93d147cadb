"""The chart's lifecycle on the real node, as a cluster operator lives it.

- ``helm upgrade`` with a changed CRD upgrades the CRD (it is templated, not in Helm's crds/
  folder, which Helm never upgrades) and rolls the operator pod (a checksum of the CRD is on its
  pod template), with no node rewritten; upgrading back does the same;
- ``helm uninstall`` with profiles in place (a Static, a DevicePlugin and a DRA profile, pods
  holding devices) is refused by the chart's pre-delete hook, in one line naming the profiles and
  the command that deletes them, and the release's objects all stay: the agents keep their
  ServiceAccounts, RBAC and admission policies, and a new DRA pod still gets its device;
- with ``uninstall.allowWithProfiles`` the uninstall goes on, and the hook stops the operator and
  the agents first: no agent runs without what the chart deleted; the profiles, the static
  capacity and the holders stay;
- installing again takes over without rewriting any node (the operator's own counters say 0
  node patches once it has seen every node and reconciled the profiles): every holder still
  runs, every node's counts are what they were (docs/operations.md#uninstall).

The tests end with the release installed from the repository's chart, as the session fixture
made it, so the tests after them find it as they expect.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from support.clusters import Cluster
from support.dranode import claim_pod, claim_template, dra_profile, slice_devices
from support.realnode import (
    AGENT_SELECTOR,
    DEVICES,
    REPO,
    Installed,
    OnNode,
    busybox_pod,
    limits,
    pod_log,
    serial_profile,
    wait_for,
)
from support.releases import has

from patchbay_devcluster import DevCluster
from patchbay_devcluster.install import helm_install, merge

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


def static_profile(cluster: Cluster, node: str) -> tuple[str, str]:
    """A Static profile of 3 on ``node`` (labelled for it), its capacity there: (name, resource)."""
    name, resource = f"{cluster.prefix}kept", f"e2e.patchbay.dev/{cluster.tag}-kept"
    cluster.set_labels(node, {"patchbay.dev/e2e-helm": cluster.tag})
    selector = {"matchLabels": {"patchbay.dev/e2e-helm": cluster.tag}}
    spec = {"resourceName": resource, "mode": "Static", "nodeSelector": selector, "static": {"capacity": 3}}
    cluster.create_profile(name, spec)
    wait_for("capacity on the node", lambda: cluster.values(node, resource) == ("3", "3"), 60)
    return name, resource


def test_upgrade_with_a_crd_change_and_back(
    patchbay: Installed, cluster: Cluster, e2e_cluster: DevCluster, real_node: str, tmp_path: Path
) -> None:
    ext = client.ApiextensionsV1Api(patchbay.api)
    try:
        _, resource = static_profile(cluster, real_node)
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

        # 2. upgrade back (the repository's chart): the CRD follows again, rewriting no node.
        helm_install(e2e_cluster, patchbay.release.chart, patchbay.images, patchbay.release.values)
        assert "Problems" not in columns(ext)
        wait_for(
            "the operator pod replaced again",
            lambda: (p := patchbay.operator_ready()) is not None and p.metadata.uid != new_pod.metadata.uid,
            120,
        )
        assert settled_stats(patchbay)["nodePatches"] == 0
        assert node_view(cluster, real_node, resource) == before
    finally:
        if patchbay.operator_ready() is None:
            helm_install(e2e_cluster, patchbay.release.chart, patchbay.images, patchbay.release.values)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-helm": None})


def helm_run(e2e_cluster: DevCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """The pinned helm, its exit status and output kept whatever they are (the test reads them)."""
    argv = [str(e2e_cluster.bin_dir / "helm"), "--kubeconfig", str(e2e_cluster.kubeconfig), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


def helm_uninstall_run(e2e_cluster: DevCluster, patchbay: Installed) -> subprocess.CompletedProcess[str]:
    release = patchbay.release
    res = helm_run(
        e2e_cluster, "uninstall", release.name, "-n", release.namespace, "--wait", "--timeout", "4m"
    )
    print(f"$ helm uninstall {release.name} -n {release.namespace}  (exit {res.returncode})")
    print(res.stdout + res.stderr)
    return res


KLOG = re.compile(r"^[IWE]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")
"""A line client-go logs inside Helm (klog's header: severity, date, time, pid, file:line): its
watcher's own chatter (once, under load, "watch ended with error ... context canceled" as the
hook's watch closed), not what Helm tells the user."""


def said(res: subprocess.CompletedProcess[str]) -> list[str]:
    """What Helm told the user: its output's lines, less client-go's klog lines."""
    return [line for line in (res.stdout + res.stderr).splitlines() if not KLOG.match(line)]


def helm_status(e2e_cluster: DevCluster, patchbay: Installed) -> dict[str, Any] | None:
    res = helm_run(e2e_cluster, "status", patchbay.release.name, "-n", patchbay.namespace, "-o", "json")
    return json.loads(res.stdout) if res.returncode == 0 else None


def agent_guardrails(patchbay: Installed) -> dict[str, list[str]]:
    """What the chart gives the agents, by kind (labelled component=agent): their ServiceAccounts,
    RBAC and ValidatingAdmissionPolicies with their bindings."""
    selector = f"app.kubernetes.io/instance={patchbay.release.name},app.kubernetes.io/component=agent"
    rbac, adm = client.RbacAuthorizationV1Api(patchbay.api), client.AdmissionregistrationV1Api(patchbay.api)
    ns = patchbay.namespace
    listed = {
        "ServiceAccount": patchbay.core.list_namespaced_service_account(ns, label_selector=selector),
        "Role": rbac.list_namespaced_role(ns, label_selector=selector),
        "RoleBinding": rbac.list_namespaced_role_binding(ns, label_selector=selector),
        "ClusterRole": rbac.list_cluster_role(label_selector=selector),
        "ClusterRoleBinding": rbac.list_cluster_role_binding(label_selector=selector),
        "ValidatingAdmissionPolicy": adm.list_validating_admission_policy(label_selector=selector),
        "ValidatingAdmissionPolicyBinding": adm.list_validating_admission_policy_binding(
            label_selector=selector
        ),
    }
    return {kind: sorted(o.metadata.name for o in got.items) for kind, got in listed.items()}


def running_agents(patchbay: Installed) -> list[tuple[str, str]]:
    """Every agent pod of the release's namespace: (name, its ServiceAccount)."""
    pods = patchbay.core.list_namespaced_pod(patchbay.namespace, label_selector=AGENT_SELECTOR).items
    return sorted((p.metadata.name, p.spec.service_account_name) for p in pods)


def pods_named(core: client.CoreV1Api, namespace: str, name: str) -> list[client.V1Pod]:
    return list(core.list_namespaced_pod(namespace, field_selector=f"metadata.name={name}").items)


def holders_running(core: client.CoreV1Api, namespace: str, uids: dict[str, str]) -> bool:
    """Each holder pod is the same pod as before (uid), Running, its container never restarted."""
    for name, uid in uids.items():
        pod = core.read_namespaced_pod(name, namespace)
        statuses = pod.status.container_statuses or []
        if pod.metadata.uid != uid or pod.status.phase != "Running" or any(c.restart_count for c in statuses):
            return False
    return True


def dra_pod(
    name: str, node: str, resource: str, template: str, fake_dev: Path, served: bool
) -> dict[str, Any]:
    """A pod asking one device of the DRA profile: unchanged (``limits`` of the extended resource)
    where the release serves it through the DeviceClass, else by a claim from ``template``."""
    if served:
        return limits(
            busybox_pod(name, node, f"echo SERIALS=$SERIALS; ls {fake_dev}; sleep 3600"), resource, 1
        )
    return claim_pod(name, node, template, fake_dev)


def test_uninstall_with_profiles_is_refused_then_allowed_and_a_reinstall_takes_over(
    on_node: OnNode, kube_release: str
) -> None:
    patchbay, cluster, e2e_cluster, real_node, namespace, fake_dev = on_node
    core = cluster.core
    served = has("dra-extended-resource", kube_release)
    allowed = merge(patchbay.release.values, {"uninstall": {"allowWithProfiles": True}})
    try:
        static, static_res = static_profile(cluster, real_node)
        # A DevicePlugin profile with an agent of its own (ServiceAccount patchbay-agent) and a
        # DRA profile served by the shared node agent (patchbay-agent-dra).
        serial, serial_res = serial_profile(cluster, fake_dev, real_node)
        dra, dra_res, driver = dra_profile(cluster, fake_dev, real_node, own_agent=False)
        full = (str(DEVICES), str(DEVICES))
        wait_for("serial adapters on the node", lambda: cluster.values(real_node, serial_res) == full, 120)
        wait_for(
            "static capacity on the node", lambda: cluster.values(real_node, static_res) == ("3", "3"), 60
        )
        wait_for(
            "the DRA devices published",
            lambda: len(slice_devices(cluster, driver, real_node)) == DEVICES,
            120,
        )
        claim_template(cluster.custom, namespace, "one-serial", driver)
        core.create_namespaced_pod(
            namespace,
            limits(busybox_pod("dp-holder", real_node, "echo HELD=$SERIALS; sleep 3600"), serial_res, 1),
        )
        core.create_namespaced_pod(namespace, claim_pod("dra-holder", real_node, "one-serial", fake_dev))
        for pod in ("dp-holder", "dra-holder"):
            wait_for(f"{pod} running", lambda pod=pod: pod_log(core, namespace, pod, "="), 120)
        holders = {
            p: core.read_namespaced_pod(p, namespace).metadata.uid for p in ("dp-holder", "dra-holder")
        }
        before = node_view(cluster, real_node, static_res)
        guardrails, agents = agent_guardrails(patchbay), running_agents(patchbay)
        assert {sa for _, sa in agents} == {"patchbay-agent", "patchbay-agent-dra"}, agents
        assert all(guardrails.values()), guardrails
        operator = patchbay.operator_ready()
        assert operator is not None
        profiles = sorted([static, serial, dra])

        # 1. The defaults: refused, in one line naming the profiles and the command that deletes them.
        res = helm_uninstall_run(e2e_cluster, patchbay)
        assert res.returncode != 0
        # Helm 4 prints the hook's log through its logger, then why the hook failed.
        line = (
            f"patchbay: not uninstalling: 3 DevicePluginProfiles exist ({', '.join(profiles)}); "
            "delete them first with `kubectl delete dpp --all` (it returns once the operator has "
            "removed what they set), or set uninstall.allowWithProfiles=true to uninstall anyway "
            "(docs/operations.md#uninstall)"
        )
        assert said(res) == [
            f'level=INFO msg="{line}"',
            f"Error: resource Job/{patchbay.namespace}/patchbay-uninstall not ready. status: Failed, "
            "message: Job Failed. failed: 1/1",
        ]
        # Helm records the release as "uninstalling" before it runs the hook and keeps that when the
        # hook fails (helm/helm#9700); nothing of it was deleted.
        status = helm_status(e2e_cluster, patchbay)
        assert status is not None and status["info"]["status"] == "uninstalling", status
        assert agent_guardrails(patchbay) == guardrails
        assert running_agents(patchbay) == agents
        after = patchbay.operator_ready()
        assert after is not None and after.metadata.uid == operator.metadata.uid
        # The hook's Job, ServiceAccount and RBAC went by their hook-failed and hook-succeeded
        # policies (Helm waited for that), the Job's pod after it.
        batch, hook = client.BatchV1Api(patchbay.api), "app.kubernetes.io/component=uninstall"
        rbac = client.RbacAuthorizationV1Api(patchbay.api)
        assert not batch.list_namespaced_job(patchbay.namespace, label_selector=hook).items
        assert not core.list_namespaced_service_account(patchbay.namespace, label_selector=hook).items
        assert not rbac.list_cluster_role(label_selector=hook).items
        assert not rbac.list_cluster_role_binding(label_selector=hook).items
        wait_for(
            "the hook's pod gone",
            lambda: not core.list_namespaced_pod(patchbay.namespace, label_selector=hook).items,
            60,
        )
        # A DRA pod asking for a device is still prepared by its agent: no 401.
        core.create_namespaced_pod(
            namespace, dra_pod("dra-new", real_node, dra_res, "one-serial", fake_dev, served)
        )
        wait_for("a new DRA pod running", lambda: pod_log(core, namespace, "dra-new", "SERIALS="), 120)
        core.delete_namespaced_pod("dra-new", namespace)
        wait_for(
            "the new DRA pod gone (its claim unprepared)",
            lambda: not pods_named(core, namespace, "dra-new"),
            120,
        )
        # `helm upgrade` needs a deployed release: a rollback to the revision at hand marks it so.
        revision = str(status["version"])
        refused = helm_run(
            e2e_cluster,
            "upgrade",
            patchbay.release.name,
            str(patchbay.release.chart),
            "-n",
            patchbay.namespace,
            "--reuse-values",
        )
        assert refused.returncode != 0 and "has no deployed releases" in refused.stderr, refused.stderr
        rolled = helm_run(
            e2e_cluster, "rollback", patchbay.release.name, revision, "-n", patchbay.namespace, "--wait"
        )
        assert rolled.returncode == 0, rolled.stderr
        status = helm_status(e2e_cluster, patchbay)
        assert status is not None and status["info"]["status"] == "deployed", status

        # 2. Opted in: the uninstall goes on; the hook stopped the operator and the agents first.
        helm_install(e2e_cluster, patchbay.release.chart, patchbay.images, allowed)
        res = helm_uninstall_run(e2e_cluster, patchbay)
        assert res.returncode == 0, res.stderr
        stopped = f"patchbay-node-agent, patchbay-{serial}"
        line = (
            f"patchbay: uninstall.allowWithProfiles: operator stopped, agent DaemonSets deleted ({stopped}); "
            f"kept 3 DevicePluginProfiles ({', '.join(profiles)}) and the static capacity they set, "
            "served again once the chart is installed again"
        )
        assert f'level=INFO msg="{line}"' in res.stderr.splitlines(), res.stderr
        assert f'release "{patchbay.release.name}" uninstalled' in res.stdout, res.stdout
        assert helm_status(e2e_cluster, patchbay) is None
        assert not patchbay.operator_pods()
        assert running_agents(patchbay) == [], "an agent left without its ServiceAccount, RBAC and policies"
        assert not cluster.apps.list_namespaced_daemon_set(
            patchbay.namespace, label_selector=AGENT_SELECTOR
        ).items
        assert agent_guardrails(patchbay) == {kind: [] for kind in guardrails}
        # The profiles stay with the operator's finalizer, the DRA profile's DeviceClass too.
        for p in profiles:
            assert "patchbay.dev/cleanup" in (cluster.profile(p) or {})["metadata"]["finalizers"], p
        assert cluster.custom.get_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", driver)
        assert node_view(cluster, real_node, static_res) == before
        assert holders_running(core, namespace, holders)
        # With no agent the kubelet takes the resources away from new pods (docs/operations.md).
        gone = ("0", None)
        wait_for(
            "no serial adapter allocatable", lambda: cluster.values(real_node, serial_res)[1] in gone, 120
        )
        wait_for("no DRA device published", lambda: not slice_devices(cluster, driver, real_node), 120)
        assert holders_running(core, namespace, holders)

        # 3. Installed again: every holder still runs, every count is back, no node rewritten.
        helm_install(e2e_cluster, patchbay.release.chart, patchbay.images, patchbay.release.values)
        assert settled_stats(patchbay)["nodePatches"] == 0
        wait_for("serial adapters back", lambda: cluster.values(real_node, serial_res) == full, 180)
        wait_for(
            "the DRA devices back", lambda: len(slice_devices(cluster, driver, real_node)) == DEVICES, 180
        )
        assert node_view(cluster, real_node, static_res) == before
        assert holders_running(core, namespace, holders)
        assert settled_stats(patchbay)["nodePatches"] == 0
        # The static profile is served as before: deleting it removes its capacity (the new
        # operator knows what it owns from the node's annotations, not from memory).
        cluster.delete_profile(static)
        wait_for("the profile gone", lambda: cluster.profile(static) is None, 60)
        assert cluster.values(real_node, static_res) == (None, None)
    finally:
        restore(e2e_cluster, patchbay)
        for pod in ("dp-holder", "dra-holder", "dra-new"):
            with contextlib.suppress(client.ApiException):
                core.delete_namespaced_pod(pod, namespace)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-helm": None})


def restore(e2e_cluster: DevCluster, patchbay: Installed) -> None:
    """The session's release as the fixture installed it, whatever state a failure left: rolled
    back first when Helm still says ``uninstalling`` (``helm upgrade`` refuses that)."""
    status = helm_status(e2e_cluster, patchbay)
    if status is not None and status["info"]["status"] != "deployed":
        helm_run(
            e2e_cluster, "rollback", patchbay.release.name, str(status["version"]), "-n", patchbay.namespace
        )
    if status is None or status["info"]["status"] != "deployed" or patchbay.operator_ready() is None:
        helm_install(e2e_cluster, patchbay.release.chart, patchbay.images, patchbay.release.values)
        wait_for("the operator pod Ready", patchbay.operator_ready, 120)
