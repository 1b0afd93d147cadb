"""The Helm chart against the real API server: lint, template + server-side dry run, install,
upgrade with a changed CRD, uninstall, and least-privilege RBAC checked by impersonation.

The chart owns the DevicePluginProfile CRD, which other tests apply straight from crds/, so
these tests run on a control plane of their own (a second DevCluster, about 5 s to start).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException
from support.clusters import profile_spec, running_devcluster, wait_for
from support.releases import has

from patchbay_agent.dra.slices import slice_base_name, taint_probe_document
from patchbay_devcluster import DevCluster

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "patchbay"
CRD_NAME = "devicepluginprofiles.patchbay.dev"
VALUES_FILES = sorted((CHART / "ci").glob("*-values.yaml"))


@pytest.fixture(scope="module")
def chart_cluster(tmp_path_factory: pytest.TempPathFactory, bin_dir: Path) -> Iterator[DevCluster]:
    with running_devcluster(tmp_path_factory.mktemp("chart-cluster"), bin_dir) as cluster:
        yield cluster


class Tools:
    def __init__(self, bin_dir: Path, kubeconfig: Path) -> None:
        self.bin_dir = bin_dir
        self.kubeconfig = kubeconfig

    def _run(
        self, tool: str, args: tuple[str, ...], *, stdin: str | None = None, check: bool, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """`tool` (helm or kubectl) on this kubeconfig; with `check`, it must succeed."""
        res = subprocess.run(
            [str(self.bin_dir / tool), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check:
            assert res.returncode == 0, f"{tool} {' '.join(args)}\n{res.stdout}\n{res.stderr}"
        return res

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._run("helm", args, check=check, timeout=180)

    def impersonating(
        self, user: str, extra: dict[str, str] | None = None, groups: list[str] | None = None
    ) -> Tools:
        """kubectl as ``user`` with user ``extra`` (e.g. a token's node-name claim), through the
        kubeconfig's ``as``/``as-user-extra`` fields: every kubectl of the matrix reads those,
        while its ``--as-user-extra`` flag is new in 1.35."""
        config = yaml.safe_load(self.kubeconfig.read_text())
        for entry in config["users"]:
            entry["user"]["as"] = user
            if extra:
                entry["user"]["as-user-extra"] = {k: [v] for k, v in extra.items()}
            if groups:
                entry["user"]["as-groups"] = groups
        digest = hashlib.sha256(json.dumps([user, extra, groups], sort_keys=True).encode()).hexdigest()[:12]
        path = self.kubeconfig.parent / f"kubeconfig-as-{digest}"
        path.write_text(yaml.safe_dump(config))
        return Tools(self.bin_dir, path)

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self._run("kubectl", args, stdin=stdin, check=check, timeout=120)


@pytest.fixture(scope="module")
def tools(chart_cluster: DevCluster, bin_dir: Path) -> Tools:
    return Tools(bin_dir, chart_cluster.kubeconfig)


def test_lint_is_clean_for_every_values_file(tools: Tools) -> None:
    for values in VALUES_FILES:
        res = tools.helm("lint", "--strict", str(CHART), "-f", str(values))
        assert "0 chart(s) failed" in res.stdout, res.stdout


def test_schema_rejects_unknown_and_bad_values(tools: Tools) -> None:
    bad = {
        "operator.bogus=1": "additional properties 'bogus' not allowed",
        "operator.logFormat=xml": "operator.logFormat",
        "operator.concurrency=0": "operator.concurrency",
        "operator.startupSeconds=0": "operator.startupSeconds",
        "image.pullPolicy=Sometimes": "image.pullPolicy",
        "uninstall.force=true": "additional properties 'force' not allowed",
        "uninstall.allowWithProfiles=maybe": "uninstall.allowWithProfiles",
    }
    for setting, expected in bad.items():
        res = tools.helm("template", "x", str(CHART), "--set", setting, check=False)
        assert res.returncode != 0, setting
        assert expected in res.stderr.replace("/", "."), (setting, res.stderr)


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.name)
def test_rendered_manifests_pass_server_side_dry_run(tools: Tools, values: Path) -> None:
    ns = "dry-" + values.name.split("-")[0]
    tools.kubectl("create", "namespace", ns, check=False)
    rendered = tools.helm("template", "patchbay", str(CHART), "-n", ns, "-f", str(values)).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert docs
    for doc in docs:
        assert doc["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm", doc["kind"]
        assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == "patchbay"
    res = tools.kubectl("apply", "--dry-run=server", "-n", ns, "-f", "-", stdin=rendered)
    assert "(server dry run)" in res.stdout


def test_deployment_defaults_are_hardened(tools: Tools) -> None:
    rendered = tools.helm("template", "patchbay", str(CHART), "-n", "patchbay-system").stdout
    deploy = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment")
    assert deploy["spec"]["replicas"] == 1
    # One operator at a time, as Recreate, but never a type change between 1 and more replicas.
    assert deploy["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    pod = deploy["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PATCHBAY_NAMESPACE"] == "patchbay-system"
    assert "PATCHBAY_PEERING" not in env
    ha = tools.helm("template", "patchbay", str(CHART), "-f", str(CHART / "ci" / "ha-values.yaml")).stdout
    deploy = next(d for d in yaml.safe_load_all(ha) if d and d["kind"] == "Deployment")
    assert deploy["spec"]["strategy"]["type"] == "RollingUpdate"
    assert {e["name"] for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]} >= {
        "PATCHBAY_PEERING"
    }


def test_a_slow_start_gets_its_grace_before_liveness_counts(tools: Tools) -> None:
    """/healthz answers only after the operator's first LISTs (kopf serves it after the startup
    handler), which at thousands of nodes take longer than the liveness probe's three misses
    allow: a startup probe on the same endpoint holds liveness off for `operator.startupSeconds`."""
    for sets, grace in (((), 600), (("operator.startupSeconds=95",), 95)):
        _, c = _operator_pod(tools, *sets)
        startup = c["startupProbe"]
        assert startup["httpGet"] == c["livenessProbe"]["httpGet"]
        waited = startup["periodSeconds"] * startup["failureThreshold"]
        assert grace <= waited < grace + startup["periodSeconds"], (sets, startup)
    _, c = _operator_pod(tools, "operator.hostNetwork=true")
    assert c["startupProbe"]["httpGet"]["host"] == "127.0.0.1"


def _operator_pod(tools: Tools, *values: str) -> tuple[dict[str, Any], dict[str, Any]]:
    sets = [a for v in values for a in ("--set", v)]
    rendered = tools.helm("template", "patchbay", str(CHART), "-n", "patchbay-system", *sets).stdout
    deploy = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment")
    pod = deploy["spec"]["template"]
    return pod, pod["spec"]["containers"][0]


def test_a_digest_pins_the_operator_image_and_pull_secrets_reach_every_pod(tools: Tools) -> None:
    """``image.digest`` renders ``repository@digest`` (the tag then unused); ``imagePullSecrets``
    go on the operator's pod and on every ServiceAccount the chart makes, the agents' among them:
    the operator creates the agents' pods, and the API server copies the ServiceAccount's pull
    secrets into them."""
    digest = "sha256:" + "ab" * 32
    secret = "imagePullSecrets[0].name=regcred"
    pod, c = _operator_pod(tools, f"image.digest={digest}", "image.tag=moved", secret)
    assert c["image"] == f"ghcr.io/kube-patchbay/patchbay-operator@{digest}"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    _, c = _operator_pod(tools, "image.tag=1.2.3")
    assert c["image"] == "ghcr.io/kube-patchbay/patchbay-operator:1.2.3"
    rendered = tools.helm("template", "patchbay", str(CHART), "-n", "patchbay-system", "--set", secret).stdout
    accounts = {
        d["metadata"]["name"]: d.get("imagePullSecrets")
        for d in yaml.safe_load_all(rendered)
        if d and d["kind"] == "ServiceAccount"
    }
    wanted = [{"name": "regcred"}]
    # The uninstall hook's pod names the pull secrets itself (its ServiceAccount lives only while it runs).
    assert accounts == {
        **{name: wanted for name in ("patchbay", "patchbay-agent", "patchbay-agent-dra")},
        "patchbay-uninstall": None,
    }
    plain = tools.helm("template", "patchbay", str(CHART), "-n", "patchbay-system").stdout
    assert all(
        "imagePullSecrets" not in d for d in yaml.safe_load_all(plain) if d and d["kind"] == "ServiceAccount"
    )
    res = tools.helm("template", "x", str(CHART), "--set", "image.digest=latest", check=False)
    assert res.returncode != 0 and "image.digest" in res.stderr.replace("/", "."), res.stderr


def test_host_network_keeps_health_on_loopback_and_names_the_api_server(tools: Tools) -> None:
    """The option for clusters without kube-proxy: off by default; when on, the pod is on the
    node's network, its health endpoint listens on 127.0.0.1 only (the probe asks there), and
    the API server address replaces the Service's."""
    pod, c = _operator_pod(tools)
    assert not pod["spec"].get("hostNetwork")
    assert c["args"] == ["--liveness=http://0.0.0.0:8080/healthz"]
    assert "host" not in c["livenessProbe"]["httpGet"]
    assert not {"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"} & {e["name"] for e in c["env"]}

    pod, c = _operator_pod(
        tools,
        "operator.hostNetwork=true",
        "operator.healthPort=18080",
        "apiServer.host=10.1.2.3",
        "apiServer.port=6443",
    )
    assert pod["spec"]["hostNetwork"] is True
    assert pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert c["args"] == ["--liveness=http://127.0.0.1:18080/healthz"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health", "host": "127.0.0.1"}
    assert c["ports"][0]["containerPort"] == 18080
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["KUBERNETES_SERVICE_HOST"] == "10.1.2.3"
    assert env["KUBERNETES_SERVICE_PORT"] == "6443"


def test_a_crd_change_changes_the_operator_pod_template(tools: Tools, tmp_path: Path) -> None:
    """The CRD's checksum is on the pod template, so `helm upgrade` with a new CRD rolls the
    operator onto it (the e2e lifecycle test watches the pod being replaced)."""
    pod, _ = _operator_pod(tools)
    before = pod["metadata"]["annotations"]["patchbay.dev/crds-checksum"]
    chart = tmp_path / "patchbay"
    shutil.copytree(CHART, chart)
    crd = chart / "templates" / "crds" / "patchbay.dev_devicepluginprofiles.yaml"
    crd.write_text(crd.read_text().replace("The extended resource name pods request.", "Changed."))
    rendered = tools.helm("template", "patchbay", str(chart)).stdout
    deploy = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment")
    assert deploy["spec"]["template"]["metadata"]["annotations"]["patchbay.dev/crds-checksum"] != before


HOOK_DELETE_POLICY = "before-hook-creation,hook-succeeded,hook-failed"


def _uninstall_hook(tools: Tools, *values: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The chart's pre-delete hook objects, by (kind, name), rendered with ``values``."""
    sets = [a for v in values for a in ("--set", v)]
    rendered = tools.helm("template", "patchbay", str(CHART), "-n", "patchbay-system", *sets).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    hooks = [d for d in docs if (d["metadata"].get("annotations") or {}).get("helm.sh/hook")]
    assert all(d["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete" for d in hooks), hooks
    return {(d["kind"], d["metadata"]["name"]): d for d in hooks}


def test_uninstall_hook_refuses_with_profiles_and_holds_only_what_it_needs(tools: Tools) -> None:
    """docs/operations.md#uninstall: a pre-delete Job (the operator image's check) with a
    ServiceAccount and RBAC of its own, all hooks that go when it ends, whatever its outcome; by
    default it may only list profiles (it refuses; it changes nothing)."""
    hooks = _uninstall_hook(tools)
    name = "patchbay-uninstall"
    assert set(hooks) == {
        ("ServiceAccount", name),
        ("ClusterRole", name),
        ("ClusterRoleBinding", name),
        ("Job", name),
    }
    for obj in hooks.values():
        assert obj["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == HOOK_DELETE_POLICY, obj
    weight = {k: int(o["metadata"]["annotations"]["helm.sh/hook-weight"]) for k, o in hooks.items()}
    assert max(w for (kind, _), w in weight.items() if kind != "Job") < weight[("Job", name)]
    assert hooks[("ClusterRole", name)]["rules"] == [
        {"apiGroups": ["patchbay.dev"], "resources": ["devicepluginprofiles"], "verbs": ["list"]}
    ]
    assert hooks[("ClusterRoleBinding", name)]["subjects"] == [
        {"kind": "ServiceAccount", "name": name, "namespace": "patchbay-system"}
    ]
    job = hooks[("Job", name)]
    # Helm 4 prints the check's line when the hook fails (and when it stopped the agents).
    assert job["metadata"]["annotations"]["helm.sh/hook-output-log-policy"] == "hook-succeeded,hook-failed"
    spec = job["spec"]
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] <= 180
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == name and pod["restartPolicy"] == "Never"
    assert pod["securityContext"]["runAsNonRoot"] is True and not pod.get("hostNetwork")
    (c,) = pod["containers"]
    operator_pod, operator = _operator_pod(tools)
    assert (c["image"], c["imagePullPolicy"]) == (operator["image"], operator["imagePullPolicy"])
    assert c["command"] == ["patchbay-uninstall-check"]
    args = dict(a.removeprefix("--").split("=", 1) for a in c["args"])
    assert "allow-with-profiles" not in c["args"] + ["--" + k for k in args]
    selector = ",".join(f"{k}={v}" for k, v in operator_pod["metadata"]["labels"].items())
    assert args == {
        "namespace": "patchbay-system",
        "operator-deployment": "patchbay",
        "operator-selector": selector,
        "timeout": "150",
    }
    assert float(args["timeout"]) < spec["activeDeadlineSeconds"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert "env" not in c


def test_uninstall_hook_with_profiles_allowed_may_stop_the_operator_and_the_agents(tools: Tools) -> None:
    """uninstall.allowWithProfiles: the check stops the operator (only its Deployment's scale)
    and deletes the agent DaemonSets (this namespace only), and reaches the API server as the
    operator does."""
    hooks = _uninstall_hook(
        tools,
        "uninstall.allowWithProfiles=true",
        "operator.hostNetwork=true",
        "apiServer.host=10.1.2.3",
        "apiServer.port=6443",
    )
    name = "patchbay-uninstall"
    role = hooks[("Role", name)]
    assert role["metadata"]["namespace"] == "patchbay-system"
    assert role["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["deployments/scale"],
            "resourceNames": ["patchbay"],
            "verbs": ["patch"],
        },
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["list", "delete"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    ]
    assert hooks[("RoleBinding", name)]["roleRef"]["name"] == name
    assert hooks[("RoleBinding", name)]["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == (
        HOOK_DELETE_POLICY
    )
    pod = hooks[("Job", name)]["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    (c,) = pod["containers"]
    assert "--allow-with-profiles" in c["args"]
    assert {e["name"]: e["value"] for e in c["env"]} == {
        "KUBERNETES_SERVICE_HOST": "10.1.2.3",
        "KUBERNETES_SERVICE_PORT": "6443",
    }
    # Without the chart's RBAC the ServiceAccount and the Job stay (someone else grants the rules).
    assert set(_uninstall_hook(tools, "rbac.create=false")) == {("ServiceAccount", name), ("Job", name)}


def _chart_crds_deleted(tools: Tools) -> list[str]:
    """The chart's CRDs still on the API server that nobody asked to delete: empty once Helm has
    deleted each (gone, or Terminating while the API server finalizes it)."""
    res = tools.kubectl("get", "crd", "-o", "json")
    return [
        crd["metadata"]["name"]
        for crd in json.loads(res.stdout)["items"]
        if crd["metadata"]["name"].endswith((".patchbay.dev", ".kopf.dev"))
        and not crd["metadata"].get("deletionTimestamp")
    ]


def _crd(tools: Tools) -> dict[str, object] | None:
    res = tools.kubectl("get", "crd", CRD_NAME, "-o", "json", check=False)
    return json.loads(res.stdout) if res.returncode == 0 else None


@pytest.fixture
def own_tools(tmp_path: Path, bin_dir: Path) -> Iterator[Tools]:
    """A control plane of its own for a test that leaves CRDs being deleted. The API server may
    take minutes to finalize a deleted CRD: on 1.37 its CRD finalizer can meet the CRD's storage
    re-initializing (after its own Terminating status write), and then waits for the informer's
    5-minute resync (seen in CI: "crd_finalizer ... storage is (re)initializing", then nothing
    for 3 minutes). A later install on the same control plane would find those CRDs still owned
    by the release that went."""
    with running_devcluster(tmp_path / "own-cluster", bin_dir) as cluster:
        yield Tools(bin_dir, cluster.kubeconfig)


def test_install_upgrade_with_changed_crd_and_uninstall(own_tools: Tools, tmp_path: Path) -> None:
    tools = own_tools
    ns = "patchbay-system"
    tools.helm("install", "patchbay", str(CHART), "-n", ns, "--create-namespace", "--wait=false")
    crd = _crd(tools)
    assert crd is not None
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"  # type: ignore[index]
    deploy = json.loads(tools.kubectl("get", "deploy", "patchbay", "-n", ns, "-o", "json").stdout)
    assert deploy["spec"]["template"]["spec"]["serviceAccountName"] == "patchbay"

    # Upgrade with a chart whose CRD changed: with Helm's crds/ folder this change would be
    # silently ignored; templated, it must reach the API server.
    changed = tmp_path / "patchbay"
    shutil.copytree(CHART, changed)
    crd_file = changed / "templates" / "crds" / "patchbay.dev_devicepluginprofiles.yaml"
    include = '    {{- include "patchbay.labels" . | nindent 4 }}\n'
    text = crd_file.read_text()
    assert include in text
    crd_file.write_text(text.replace(include, include + "    patchbay.dev/upgrade-test: changed\n", 1))
    tools.helm("upgrade", "patchbay", str(changed), "-n", ns, "--wait=false")
    crd = _crd(tools)
    assert crd is not None
    assert crd["metadata"]["labels"]["patchbay.dev/upgrade-test"] == "changed"  # type: ignore[index]

    # A profile exists when the release goes: with crds.keep the CRD and the profile stay.
    profile = _dpp_document(
        "kept", {"resourceName": "example.com/kept", "mode": "Static", "static": {"capacity": 1}}
    )
    tools.kubectl("apply", "-f", "-", stdin=json.dumps(profile))
    # --no-hooks: this control plane runs no pods, so the pre-delete hook's Job would never run
    # (the e2e test test_helm_lifecycle.py runs it on the real node).
    tools.helm("uninstall", "patchbay", "-n", ns, "--wait=false", "--no-hooks")
    assert tools.kubectl("get", "deploy", "patchbay", "-n", ns, check=False).returncode != 0
    assert _crd(tools) is not None
    assert tools.kubectl("get", "dpp", "kept", check=False).returncode == 0
    tools.kubectl("delete", "dpp", "kept", "--wait=false")
    # Profiles keep their finalizer only while an operator runs; none ran here.

    # crds.keep=false: the CRD goes with the release. Adopt the kept CRD first (as a user would).
    tools.kubectl("delete", "crd", CRD_NAME)
    tools.helm("install", "patchbay", str(CHART), "-n", ns, "--set", "crds.keep=false", "--wait=false")
    crd = _crd(tools)
    assert crd is not None
    assert "helm.sh/resource-policy" not in (crd["metadata"].get("annotations") or {})  # type: ignore[union-attr]
    tools.helm("uninstall", "patchbay", "-n", ns, "--wait=false", "--no-hooks")
    # Helm deletes every chart CRD; the API server finalizes them in the background (own_tools).
    wait_for("Helm to delete every chart CRD", lambda: _chart_crds_deleted(tools) == [], 60)


@pytest.fixture(scope="module")
def installed(tools: Tools) -> Iterator[str]:
    ns = "patchbay-rbac"
    # With the CRD (crds.keep=false, so the release takes it away again): `can-i` asks discovery.
    tools.helm("install", "rbac", str(CHART), "-n", ns, "--create-namespace", "--set", "crds.keep=false")
    _node_scope_in_force(tools, ns)
    yield ns
    tools.helm("uninstall", "rbac", "-n", ns, "--wait=false", "--no-hooks")  # no pods run here
    # Nothing installs on this control plane after the module's tests; it goes next.


def _node_scope_in_force(tools: Tools, ns: str) -> None:
    """Wait until the API server enforces the agents' node-scope policies: it loads a policy, and
    the CRDs it names, a moment after the install returns (a dry run for another node, refused)."""
    extra = {
        "authentication.kubernetes.io/node-name": "node-a",
        "authentication.kubernetes.io/pod-name": "agent-node-a",
    }
    agent = tools.impersonating(f"system:serviceaccount:{ns}:patchbay-agent-dra", extra)
    apply = ("apply", "--server-side", "--dry-run=server", "--field-manager=patchbay-agent", "-f", "-")

    def refused() -> bool:
        report = agent.kubectl(*apply, "-n", ns, stdin=_report("node-b", agent="agent-node-a"), check=False)
        inventory = agent.kubectl(*apply, stdin=_inventory("node-b", agent="agent-node-a"), check=False)
        return "Forbidden" in report.stderr and "Forbidden" in inventory.stderr

    deadline = time.monotonic() + 60
    while not refused():
        assert time.monotonic() < deadline, "the agents' node-scope policies were not in force within 60 s"
        time.sleep(0.5)


def _can(tools: Tools, ns: str, verb: str, resource: str, namespace: str | None = None) -> bool:
    resource, _, sub = resource.partition("/")
    args = ["auth", "can-i", verb, resource, f"--as=system:serviceaccount:{ns}:rbac-patchbay"]
    if sub:
        args.append(f"--subresource={sub}")
    if namespace:
        args += ["-n", namespace]
    res = tools.kubectl(*args, check=False)
    assert res.stdout.strip() in ("yes", "no"), res.stderr
    return res.stdout.strip() == "yes"


def test_rbac_allows_what_the_operator_needs(tools: Tools, installed: str, kube_release: str) -> None:
    ns = installed
    needed = [
        ("watch", "devicepluginprofiles.patchbay.dev", None),
        ("patch", "devicepluginprofiles.patchbay.dev", None),
        ("patch", "devicepluginprofiles.patchbay.dev/status", None),
        ("list", "nodes", None),
        ("watch", "nodes", None),
        ("patch", "nodes/status", None),
        ("create", "events", ns),
        ("create", "daemonsets.apps", ns),
        ("patch", "daemonsets.apps", ns),
        ("delete", "daemonsets.apps", ns),
        ("create", "controllerrevisions.apps", ns),  # profiles' revisions
        ("patch", "controllerrevisions.apps", ns),
        ("watch", "controllerrevisions.apps", ns),
        ("delete", "controllerrevisions.apps", ns),
        ("create", "configmaps", ns),
        ("delete", "configmaps", ns),
        ("watch", "customresourcedefinitions.apiextensions.k8s.io", None),  # kopf's observer
        ("watch", "pods", ns),  # why an agent pod does not work
        ("watch", "events", ns),
        ("watch", "devicereports.patchbay.dev", ns),  # the agents' reports
        ("delete", "devicereports.patchbay.dev", ns),  # of nodes a profile no longer selects
        ("create", "deviceclasses.resource.k8s.io", None),  # DRA profiles' DeviceClasses
        ("patch", "deviceclasses.resource.k8s.io", None),
        ("delete", "deviceclasses.resource.k8s.io", None),
        ("watch", "deviceclasses.resource.k8s.io", None),  # put back when deleted or edited
        ("list", "resourceslices.resource.k8s.io", None),  # a DRA rollout's gate: its wave's slices
        ("watch", "configmaps", ns),
    ]
    # Device maintenance (1.37 on). kubectl answers "no" for a resource the API server does not
    # serve whatever RBAC says, so there the rule itself is checked.
    if has("device-taint-rules", kube_release):
        needed.append(("watch", "devicetaintrules.resource.k8s.io", None))
    else:
        role = json.loads(tools.kubectl("get", "clusterrole", "rbac-patchbay", "-o", "json").stdout)
        assert any(
            "devicetaintrules" in r.get("resources", []) and "watch" in r.get("verbs", [])
            for r in role["rules"]
        ), role["rules"]
    denied = [(v, r, n) for v, r, n in needed if not _can(tools, ns, v, r, n)]
    assert not denied


def _report(node: str, profile: str = "p", name: str = "", agent: str | None = None) -> str:
    """A DeviceReport as the agent on ``node`` writes it; ``agent`` (its pod) defaults to
    ``agent-<node>``, the pod name the impersonated tokens below carry."""
    return json.dumps(
        {
            "apiVersion": "patchbay.dev/v1beta1",
            "kind": "DeviceReport",
            "metadata": {"name": name or f"{profile}.{node}"},
            "profile": profile,
            "nodeName": node,
            "agent": f"agent-{node}" if agent is None else agent,
            "resourceName": "example.com/serial",
            "summary": {"total": 1, "healthy": 1, "unhealthy": 0, "allocated": 0},
            "devices": [{"id": "ttyUSB0", "health": "Healthy"}],
        }
    )


def test_an_agent_writes_only_its_own_nodes_report(tools: Tools, installed: str) -> None:
    """The chart's ValidatingAdmissionPolicy on the node-name claim of pod-bound tokens, tried by
    impersonation: the agents' ServiceAccount with the user extra a pod-bound token carries."""
    ns = installed
    agent = f"system:serviceaccount:{ns}:patchbay-agent"
    claim, pod_claim = "authentication.kubernetes.io/node-name", "authentication.kubernetes.io/pod-name"

    def as_agent(
        node: str | None, *args: str, stdin: str | None = None, pod: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        extra = {claim: node, pod_claim: pod or f"agent-{node}"} if node else None
        who = tools.impersonating(agent, extra)
        return who.kubectl(*args, "-n", ns, stdin=stdin, check=False)

    apply = ("apply", "--server-side", "--field-manager=patchbay-agent", "-f", "-")
    own = as_agent("node-a", *apply, stdin=_report("node-a"))
    assert own.returncode == 0, own.stderr
    again = as_agent("node-a", *apply, stdin=_report("node-a").replace("Healthy", "Unhealthy"))
    assert again.returncode == 0, again.stderr  # updating its own: allowed
    other = as_agent("node-a", *apply, stdin=_report("node-b", agent="agent-node-a"))
    assert other.returncode != 0
    assert "an agent on node node-a may write only its own node's DeviceReport, not one for node node-b" in (
        " ".join(other.stderr.split())
    ), other.stderr
    unbound = as_agent(None, *apply, stdin=_report("node-c"))
    assert unbound.returncode != 0 and "names no node" in unbound.stderr, unbound.stderr
    # The report names the pod that writes it: not another pod (the operator believes a report
    # only from an agent pod of its profile on its node), not none.
    for forged in ("agent-of-another-profile", ""):
        res = as_agent("node-a", *apply, stdin=_report("node-a", agent=forged))
        assert res.returncode != 0
        assert "must name the pod that writes it: agent: agent-node-a" in " ".join(res.stderr.split()), (
            res.stderr
        )
    # A rollout's new pod takes over its node's report (the report now names it).
    successor = as_agent(
        "node-a", *apply, stdin=_report("node-a", agent="agent-node-a-2"), pod="agent-node-a-2"
    )
    assert successor.returncode == 0, successor.stderr
    # The name is <profile>.<nodeName>, from the report's own fields (the CRD's own rule).
    misnamed = as_agent("node-a", *apply, stdin=_report("node-a", name="q.node-a"))
    assert misnamed.returncode != 0 and "metadata.name must be <profile>.<nodeName>" in misnamed.stderr
    # Names with dots can collide (profile p on node q.r, profile p.q on node r: both p.q.r); the
    # report that exists stays its node's: another node's agent cannot take it over.
    assert tools.kubectl(*apply, "-n", ns, stdin=_report("q.r", "p")).returncode == 0
    takeover = as_agent("r", *apply, stdin=_report("r", "p.q"))
    assert takeover.returncode != 0
    assert "may not take over the DeviceReport of node q.r" in " ".join(takeover.stderr.split()), (
        takeover.stderr
    )
    # Deleting: its own node's report only (to replace one someone else wrote over it).
    assert tools.kubectl(*apply, "-n", ns, stdin=_report("node-b")).returncode == 0
    other_delete = as_agent("node-a", "delete", "devicereport", "p.node-b")
    assert other_delete.returncode != 0
    assert "may delete only its own node's DeviceReport, not the one of node node-b" in " ".join(
        other_delete.stderr.split()
    ), other_delete.stderr
    own_delete = as_agent("node-a", "delete", "devicereport", "p.node-a")
    assert own_delete.returncode == 0, own_delete.stderr
    # Reading is not writing: an agent lists and watches the reports (RBAC cannot narrow a watch
    # to its own report's name on every node), to write its own again when someone deletes it.
    listed = as_agent("node-a", "get", "devicereports", "--field-selector=metadata.name=p.node-a")
    assert listed.returncode == 0, listed.stderr
    # And nothing else: not another kind, not reading other objects.
    cm = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}})
    for args, stdin in (
        (apply, cm),
        (("get", "configmaps"), None),
        (
            ("apply", "--server-side", "-f", "-"),
            _report("node-a").replace("DeviceReport", "DevicePluginProfile"),
        ),
    ):
        res = as_agent("node-a", *args, stdin=stdin)
        assert res.returncode != 0 and "forbidden" in res.stderr.lower(), (args, res.stderr)
    # DRA agents (their own ServiceAccount) are bound by the same policy.
    dra = tools.impersonating(
        f"system:serviceaccount:{ns}:patchbay-agent-dra", {claim: "node-a", pod_claim: "agent-node-a"}
    )
    dra_own = dra.kubectl(*apply, "-n", ns, stdin=_report("node-a", "d"), check=False)
    assert dra_own.returncode == 0, dra_own.stderr
    dra_other = dra.kubectl(*apply, "-n", ns, stdin=_report("node-b", "d", agent="agent-node-a"), check=False)
    assert dra_other.returncode != 0 and "may write only its own node's DeviceReport" in " ".join(
        dra_other.stderr.split()
    ), dra_other.stderr
    # The policy binds the agents only: the operator (or an admin) is not node-scoped.
    assert tools.kubectl(*apply, "-n", ns, stdin=_report("node-b")).returncode == 0
    tools.kubectl("delete", "devicereports", "--all", "-n", ns)


def _inventory(node: str, agent: str | None = None) -> str:
    """A NodeInventory as the shared node agent on ``node`` writes it (one FTDI adapter)."""
    return json.dumps(
        {
            "apiVersion": "patchbay.dev/v1beta1",
            "kind": "NodeInventory",
            "metadata": {"name": node},
            "nodeName": node,
            "agent": f"agent-{node}" if agent is None else agent,
            "summary": {"pci": 0, "usb": 1, "char": 1, "gpus": 0},
            "usb": [{"port": "1-1", "vendor": "0403", "product": "6001", "devNodes": ["/dev/ttyUSB0"]}],
        }
    )


def test_an_agent_writes_only_its_own_nodes_inventory(tools: Tools, installed: str) -> None:
    """The NodeInventory policy, by impersonation of the shared node agent's pod-bound token: its
    own node's inventory is written; another node's is refused, by the API server's policy (RBAC
    alone would allow it: cluster-scoped); the view role reads them all."""
    ns = installed
    claim, pod_claim = "authentication.kubernetes.io/node-name", "authentication.kubernetes.io/pod-name"

    def as_agent(node: str | None, *args: str, stdin: str | None = None, pod: str | None = None) -> Any:
        extra = {claim: node, pod_claim: pod or f"agent-{node}"} if node else None
        who = tools.impersonating(f"system:serviceaccount:{ns}:patchbay-agent-dra", extra)
        return who.kubectl(*args, stdin=stdin, check=False)

    apply = ("apply", "--server-side", "--field-manager=patchbay-agent", "-f", "-")
    own = as_agent("node-a", *apply, stdin=_inventory("node-a"))
    assert own.returncode == 0, own.stderr
    again = as_agent("node-a", *apply, stdin=_inventory("node-a").replace("6001", "6015"))
    assert again.returncode == 0, again.stderr
    other = as_agent("node-a", *apply, stdin=_inventory("node-b", agent="agent-node-a"))
    assert other.returncode != 0
    assert (
        "an agent on node node-a may write only its own node's NodeInventory, not the one of node node-b"
        in (" ".join(other.stderr.split()))
    ), other.stderr
    forged = as_agent("node-a", *apply, stdin=_inventory("node-a", agent="someone-else"))
    assert forged.returncode != 0 and "must name the pod that writes it" in forged.stderr, forged.stderr
    unbound = as_agent(None, *apply, stdin=_inventory("node-c"))
    assert unbound.returncode != 0 and "names no node" in unbound.stderr, unbound.stderr
    # The name is the node's (the CRD's own rule), so an agent cannot file another node's
    # inventory under its own name either.
    misnamed = as_agent(
        "node-a", *apply, stdin=_inventory("node-a").replace('"nodeName": "node-a"', '"nodeName": "x"')
    )
    assert misnamed.returncode != 0 and "metadata.name must be the nodeName" in misnamed.stderr, (
        misnamed.stderr
    )
    # Reading is not writing: the agent lists and watches its own inventory by name, to write it
    # again when someone else deletes or edits it; it deletes none (the Node's garbage collection
    # does).
    listed = as_agent(
        "node-a", "get", "nodeinventories", "--field-selector=metadata.name=node-a", "-o", "name"
    )
    assert listed.returncode == 0 and "nodeinventory.patchbay.dev/node-a" in listed.stdout, listed.stderr
    watch = as_agent("node-a", "auth", "can-i", "watch", "nodeinventories.patchbay.dev")
    assert watch.stdout.strip() == "yes", (watch.stdout, watch.stderr)
    deleted = as_agent("node-a", "delete", "nodeinventory", "node-a")
    assert deleted.returncode != 0 and "forbidden" in deleted.stderr.lower(), deleted.stderr
    # A profile's own device-plugin agent (the other ServiceAccount) keeps no inventory.
    plugin_agent = tools.impersonating(
        f"system:serviceaccount:{ns}:patchbay-agent", {claim: "node-a", pod_claim: "agent-node-a"}
    )
    denied = plugin_agent.kubectl(*apply, stdin=_inventory("node-a"), check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), denied.stderr
    # Whoever holds the built-in view role reads them (aggregated), and writes none.
    viewer = tools.impersonating("jane", groups=["viewers"])
    tools.kubectl(
        "create", "clusterrolebinding", "inventory-viewers", "--clusterrole=view", "--group=viewers"
    )
    try:
        listed = viewer.kubectl("get", "nodeinventories", "-o", "name", check=False)
        assert listed.returncode == 0 and "nodeinventory.patchbay.dev/node-a" in listed.stdout, listed.stderr
        written = viewer.kubectl(*apply, stdin=_inventory("node-x"), check=False)
        assert written.returncode != 0 and "forbidden" in written.stderr.lower(), written.stderr
    finally:
        tools.kubectl("delete", "clusterrolebinding", "inventory-viewers")
    tools.kubectl("delete", "nodeinventories", "--all")


def _slice(node: str, name: str = "", driver: str = "p.patchbay.dev", **spec: Any) -> str:
    """A ResourceSlice as a DRA agent publishes it (one pool per node, one device)."""
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "ttyusb0"}],
            **(spec or {"nodeName": node}),
        },
    }
    return json.dumps(body)


def test_rbac_lets_agents_publish_dra_devices_and_nothing_more(tools: Tools, installed: str) -> None:
    """DRA agents and the shared node agent (their own ServiceAccount) publish devices and nothing
    more; profiles' own device-plugin agents (the other one) cannot even do that."""
    ns = installed
    agent = f"system:serviceaccount:{ns}:patchbay-agent-dra"
    plugin_agent = f"system:serviceaccount:{ns}:patchbay-agent"

    def can(verb: str, resource: str, namespace: str | None = None, who: str = agent) -> bool:
        args = ["auth", "can-i", verb, resource, f"--as={who}"] + (["-n", namespace] if namespace else [])
        res = tools.kubectl(*args, check=False)
        assert res.stdout.strip() in ("yes", "no"), res.stderr
        return res.stdout.strip() == "yes"

    allowed = [
        ("get", "resourceclaims.resource.k8s.io", "default"),  # any namespace: the pods'
        ("get", "resourceslices.resource.k8s.io", None),
        ("list", "resourceslices.resource.k8s.io", None),
        ("watch", "resourceslices.resource.k8s.io", None),  # its own, to re-publish at once
        ("create", "resourceslices.resource.k8s.io", None),
        ("patch", "resourceslices.resource.k8s.io", None),
        ("delete", "resourceslices.resource.k8s.io", None),
    ]
    denied = [
        ("list", "resourceclaims.resource.k8s.io", "default"),
        ("patch", "resourceclaims.resource.k8s.io", "default"),
        ("update", "resourceclaims.resource.k8s.io/status", "default"),
        ("deletecollection", "resourceslices.resource.k8s.io", None),
        ("create", "deviceclasses.resource.k8s.io", None),
        ("get", "secrets", ns),
    ]
    assert [a for a in allowed if not can(*a)] == []
    assert [d for d in denied if can(*d)] == []
    assert [a for a in allowed if can(*a, who=plugin_agent)] == []
    # Both read nodes (the node agent its labels, every agent its kubelet's version).
    assert can("get", "nodes") and can("get", "nodes", None, plugin_agent)
    # Both write their node's DeviceReport (and may delete it, to replace one someone else wrote),
    # and watch it, to write it again at once when someone else deletes or edits it.
    for verb in ("patch", "delete", "list", "watch"):
        assert can(verb, "devicereports.patchbay.dev", ns) and can(
            verb, "devicereports.patchbay.dev", ns, plugin_agent
        )
    # Both list the pods of their namespace (their successor on SIGTERM: plugin-agent's
    # successor.py), and nothing more of pods, nor pods elsewhere.
    for who in (agent, plugin_agent):
        assert can("list", "pods", ns, who)
        denied_pods = [("get", ns), ("watch", ns), ("delete", ns), ("patch", ns), ("list", "default")]
        assert [(v, n) for v, n in denied_pods if can(v, "pods", n, who)] == []
    # Claim status: patch (server-side apply) only, on the status subresource only.
    status = ["auth", "can-i", "--subresource=status", f"--as={agent}", "-n", "default"]
    assert (
        tools.kubectl(*status, "patch", "resourceclaims.resource.k8s.io", check=False).stdout.strip() == "yes"
    )
    assert (
        tools.kubectl(*status, "update", "resourceclaims.resource.k8s.io", check=False).stdout.strip() == "no"
    )


def _claim(name: str, node: str) -> dict[str, Any]:
    """A ResourceClaim allocated (as the scheduler would write it) on `node`: one device of a
    Patchbay driver and one of another driver."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "serial", "exactly": {"deviceClassName": "p.patchbay.dev"}},
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}},
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "serial", "driver": "p.patchbay.dev", "pool": node, "device": "ttyusb0"},
                        {"request": "gpu", "driver": "gpu.example.com", "pool": node, "device": "gpu0"},
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                },
            }
        },
    }


def _device_status(claim: str, uid: str, driver: str, node: str, device: str, **extra: Any) -> str:
    """What an agent applies to a claim's status (dra/claimstatus.py's shape)."""
    entry = {
        "driver": driver,
        "pool": node,
        "device": device,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Prepared",
                "message": "prepared",
                "lastTransitionTime": "2026-11-25T00:00:00Z",
            }
        ],
        "data": {"id": device},
    }
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": claim, "namespace": "default", "uid": uid},
        "status": {"devices": [entry] if device else [], **extra},
    }
    return json.dumps(body)


def test_an_agent_writes_only_its_own_nodes_claims_device_status(tools: Tools, installed: str) -> None:
    """The chart's claim-status policy (and, from 1.36, the API server's own per-driver check,
    which the chart's RBAC answers with associated-node:patch), by impersonation: an agent writes
    status.devices entries of a Patchbay driver into claims allocated on its node, removes them
    again, and nothing else: not another node's claim, not another driver's entry, not the
    allocation."""
    ns = installed
    agent = f"system:serviceaccount:{ns}:patchbay-agent-dra"
    node_claim = "authentication.kubernetes.io/node-name"
    apply = (
        "apply",
        "--server-side",
        "--force-conflicts",
        "--subresource=status",
        "--field-manager=patchbay-p.patchbay.dev",
    )

    def as_agent(node: str, body: str, *flags: str) -> subprocess.CompletedProcess[str]:
        who = tools.impersonating(agent, {node_claim: node})
        return who.kubectl(*apply, *flags, "-f", "-", stdin=body, check=False)

    def said(res: subprocess.CompletedProcess[str]) -> str:
        return " ".join(res.stderr.split())

    created = []
    try:
        for name, node in (("on-a", "node-a"), ("on-b", "node-b")):
            doc = _claim(name, node)
            allocation = doc.pop("status")
            tools.kubectl("create", "-f", "-", stdin=json.dumps(doc))
            created.append(name)
            patch = json.dumps({"status": allocation})
            tools.kubectl(
                "patch",
                "resourceclaim",
                name,
                "-n",
                "default",
                "--subresource=status",
                "--type=merge",
                "-p",
                patch,
            )
        uid = tools.kubectl(
            "get", "resourceclaim", "on-a", "-n", "default", "-o", "jsonpath={.metadata.uid}"
        ).stdout
        uid_b = tools.kubectl(
            "get", "resourceclaim", "on-b", "-n", "default", "-o", "jsonpath={.metadata.uid}"
        ).stdout
        ours = _device_status("on-a", uid, "p.patchbay.dev", "node-a", "ttyusb0")
        wait_for(
            "the claim-status policy in force",
            # A server-side dry run: before the policy is in force such a write would land (and
            # then pass the policy as unchanged).
            lambda: (
                "Patchbay driver"
                in said(
                    as_agent(
                        "node-a",
                        _device_status("on-a", uid, "gpu.example.com", "node-a", "gpu0"),
                        "--dry-run=server",
                    )
                )
            ),
            60,
            0.5,
        )
        mine = as_agent("node-a", ours)
        assert mine.returncode == 0, mine.stderr
        stored = json.loads(
            tools.kubectl("get", "resourceclaim", "on-a", "-n", "default", "-o", "json").stdout
        )
        (entry,) = stored["status"]["devices"]
        assert (entry["driver"], entry["device"], entry["data"]) == (
            "p.patchbay.dev",
            "ttyusb0",
            {"id": "ttyusb0"},
        )

        # Another node's claim: refused (by the policy; from 1.36 by the API server's own check
        # of resourceclaims/driver first).
        theirs = as_agent("node-a", _device_status("on-b", uid_b, "p.patchbay.dev", "node-b", "ttyusb0"))
        assert theirs.returncode != 0
        assert "may write the status of only the claims allocated on its node" in said(
            theirs
        ) or 'requires resource="resourceclaims/driver"' in said(theirs), theirs.stderr
        # Another driver's entry, even on its own node's claim: refused.
        foreign = as_agent("node-a", _device_status("on-a", uid, "gpu.example.com", "node-a", "gpu0"))
        assert foreign.returncode != 0 and "only status.devices entries of a Patchbay driver" in said(
            foreign
        ), foreign.stderr
        # The reservations: never (the allocation is immutable for everyone once set).
        reserving = json.loads(ours)
        reserving["status"]["reservedFor"] = [
            {"resource": "pods", "name": "someone", "uid": "6a9e6a0e-0000-4000-8000-00000000000a"}
        ]
        reserve = as_agent("node-a", json.dumps(reserving))
        assert reserve.returncode != 0 and "status.allocation or status.reservedFor" in said(reserve), (
            reserve.stderr
        )
        # Another driver's entry, written by its own driver (an admin here), stays when ours goes.
        admin_apply = (
            "apply",
            "--server-side",
            "--subresource=status",
            "--field-manager=gpu-driver",
            "-f",
            "-",
        )
        tools.kubectl(*admin_apply, stdin=_device_status("on-a", uid, "gpu.example.com", "node-a", "gpu0"))
        gone = as_agent("node-a", _device_status("on-a", uid, "p.patchbay.dev", "node-a", ""))
        assert gone.returncode == 0, gone.stderr
        stored = json.loads(
            tools.kubectl("get", "resourceclaim", "on-a", "-n", "default", "-o", "json").stdout
        )
        assert [e["driver"] for e in stored["status"]["devices"]] == ["gpu.example.com"]
        # A claim replaced under the same name: the old UID makes the write fail, not land.
        stale = as_agent(
            "node-a",
            _device_status(
                "on-a", "00000000-0000-4000-8000-000000000000", "p.patchbay.dev", "node-a", "ttyusb0"
            ),
        )
        assert stale.returncode != 0 and "metadata.uid" in stale.stderr, stale.stderr
    finally:
        for name in created:
            tools.kubectl("delete", "resourceclaim", name, "-n", "default", "--wait=false", check=False)


def test_an_agent_writes_only_its_own_nodes_resource_slices(tools: Tools, installed: str) -> None:
    """The chart's second ValidatingAdmissionPolicy, tried by impersonation like the reports':
    its node's slices only (CREATE, UPDATE and, checked on the old object, DELETE), always with
    spec.nodeName, and only of a Patchbay driver."""
    ns = installed
    agent = f"system:serviceaccount:{ns}:patchbay-agent-dra"
    claim = "authentication.kubernetes.io/node-name"

    def as_agent(node: str | None, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        who = tools.impersonating(agent, {claim: node} if node else None)
        return who.kubectl(*args, stdin=stdin, check=False)

    def said(res: subprocess.CompletedProcess[str]) -> str:
        return " ".join(res.stderr.split())

    apply = ("apply", "--server-side", "--field-manager=patchbay-agent", "-f", "-")
    # In force moments after the install: asked with a server-side dry run until it refuses.
    wait_for(
        "the slice policy in force",
        lambda: as_agent("node-a", *apply, "--dry-run=server", stdin=_slice("node-b")).returncode != 0,
        60,
        0.5,
    )
    own = as_agent("node-a", *apply, stdin=_slice("node-a"))
    assert own.returncode == 0, own.stderr
    changed = _slice("node-a").replace("ttyusb0", "ttyusb1")
    again = as_agent("node-a", *apply, stdin=changed)
    assert again.returncode == 0, again.stderr  # updating its own: allowed

    other = as_agent("node-a", *apply, stdin=_slice("node-b"))
    assert other.returncode != 0
    assert "an agent on node node-a may write only its own node's ResourceSlices" in said(other), other.stderr
    everywhere = as_agent("node-a", *apply, stdin=_slice("node-a", "all-nodes", allNodes=True))
    assert everywhere.returncode != 0 and "spec.allNodes" in said(everywhere), everywhere.stderr
    selector = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "x", "operator": "Exists"}]}]}
    selected = as_agent("node-a", *apply, stdin=_slice("node-a", "by-selector", nodeSelector=selector))
    assert selected.returncode != 0 and "spec.nodeSelector" in said(selected), selected.stderr
    foreign = as_agent("node-a", *apply, stdin=_slice("node-a", driver="gpu.example.com"))
    assert foreign.returncode != 0 and "spec.driver ending in .patchbay.dev" in said(foreign), foreign.stderr
    unbound = as_agent(None, *apply, stdin=_slice("node-c"))
    assert unbound.returncode != 0 and "names no node" in said(unbound), unbound.stderr
    # The pool and the name are the node's: no squatting on what node-b's agent will publish.
    squat = as_agent("node-a", *apply, stdin=_slice("node-a", name="node-b-p.patchbay.dev"))
    assert squat.returncode != 0 and "names its ResourceSlices node-a-p.patchbay.dev[-<n>]" in said(squat), (
        squat.stderr
    )
    # Past 248 characters the agent shortens a name with a hash (which CEL cannot check); its
    # first 230 characters still are: one long-named node cannot take another's slice name.
    long_a, long_b = "a" * 245, "b" * 245
    mine = as_agent(long_a, *apply, stdin=_slice(long_a, name=slice_base_name(long_a, "p.patchbay.dev")))
    assert mine.returncode == 0, mine.stderr
    assert (
        as_agent(long_a, "delete", "resourceslice", slice_base_name(long_a, "p.patchbay.dev")).returncode == 0
    )
    taken = as_agent(long_a, *apply, stdin=_slice(long_a, name=slice_base_name(long_b, "p.patchbay.dev")))
    assert taken.returncode != 0 and "(past 248 characters: its first 230 and a hash)" in said(taken), (
        taken.stderr
    )
    pool = json.loads(_slice("node-a", name="node-a-p.patchbay.dev-2"))
    pool["spec"]["pool"]["name"] = "node-b"
    wrong_pool = as_agent("node-a", *apply, stdin=json.dumps(pool))
    assert wrong_pool.returncode != 0 and "not spec.pool.name 'node-b'" in said(wrong_pool), wrong_pool.stderr
    chunk = as_agent("node-a", *apply, stdin=_slice("node-a", name="node-a-p.patchbay.dev-1"))
    assert chunk.returncode == 0, chunk.stderr  # a pool's second slice
    assert as_agent("node-a", "delete", "resourceslice", "node-a-p.patchbay.dev-1").returncode == 0
    # The agent's own dry-run probe (does this API server keep device taints?) passes the policy:
    # it is named and pooled like the node's slices. Refused, a DRA agent would never learn that
    # taints are kept and would hold back its unhealthy devices.
    probe = json.dumps(taint_probe_document("p.patchbay.dev", "node-a"))
    dry = as_agent("node-a", "create", "--dry-run=server", "-o", "json", "-f", "-", stdin=probe)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["spec"]["driver"] == "p.patchbay.dev"

    # DELETE is judged on the slice as it was: another node's slice (an admin's) stays.
    assert tools.kubectl(*apply, stdin=_slice("node-b")).returncode == 0
    theirs = as_agent("node-a", "delete", "resourceslice", "node-b-p.patchbay.dev")
    assert theirs.returncode != 0 and "not one with spec.nodeName 'node-b'" in said(theirs), theirs.stderr
    mine = as_agent("node-a", "delete", "resourceslice", "node-a-p.patchbay.dev")
    assert mine.returncode == 0, mine.stderr
    tools.kubectl("delete", "resourceslice", "node-b-p.patchbay.dev")


def test_only_the_operator_writes_the_static_ledger(tools: Tools, installed: str) -> None:
    """The chart's ledger policy: a `static.patchbay.dev/*` node annotation (the operator's record
    of the resource it set) can be set, changed or removed by the operator's ServiceAccount only,
    through the node or its status (the operator's way); anyone else, a cluster admin included, is
    refused with the key named; other annotations are not the policy's business."""
    ns = installed
    accounts = tools.kubectl("-n", ns, "get", "sa", "-o", "jsonpath={.items[*].metadata.name}").stdout.split()
    (operator_sa,) = [a for a in accounts if a not in ("default", "patchbay-agent", "patchbay-agent-dra")]
    operator_user = f"system:serviceaccount:{ns}:{operator_sa}"
    node = json.dumps(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "ledger-node", "labels": {"t": "ledger"}}}
    )
    tools.kubectl("create", "-f", "-", stdin=node)
    admin = tools.impersonating("alice", groups=["system:masters"])
    key = "static.patchbay.dev/0"

    def status_patch(user: str, op: str, value: str | None = None) -> int:
        """A JSON patch of nodes/status as `user`, with no GET before it (the operator may patch
        nodes/status, not read it): the HTTP status."""
        patch: dict[str, Any] = {"op": op, "path": "/metadata/annotations/static.patchbay.dev~10"}
        if value is not None:
            patch["value"] = value
        api = k8s_config.new_client_from_config(config_file=str(tools.kubeconfig))
        api.set_default_header("Impersonate-User", user)
        if user == "alice":
            api.set_default_header("Impersonate-Group", "system:masters")
        try:
            k8s_client.CoreV1Api(api).patch_node_status("ledger-node", [patch])
        except ApiException as e:
            # a refusal must be the policy's, naming the key (not RBAC's)
            return int(e.status) if e.status != 403 or key in str(e.body) else -1
        finally:
            api.close()
        return 200

    try:
        # The policy is in force moments after the install: asked with a server-side dry run.
        def refused() -> str | None:
            res = admin.kubectl(
                "annotate",
                "--dry-run=server",
                "node",
                "ledger-node",
                f"{key}=example.com/dongle",
                check=False,
            )
            return " ".join(res.stderr.split()) if res.returncode != 0 else None

        said = wait_for("the ledger policy in force", refused, 60, 0.5)
        assert f"only Patchbay's operator ({operator_user}) may set" in said and key in said, said
        forged = admin.kubectl("annotate", "node", "ledger-node", f"{key}=example.com/dongle", check=False)
        assert forged.returncode != 0 and key in forged.stderr, forged.stderr
        assert status_patch("alice", "add", "example.com/dongle") == 403
        assert admin.kubectl("annotate", "node", "ledger-node", "example.com/note=fine").returncode == 0
        # The operator may; then no one else may change or remove its record.
        assert status_patch(operator_user, "add", "example.com/dongle") == 200
        changed = admin.kubectl(
            "annotate", "--overwrite", "node", "ledger-node", f"{key}=x.com/y", check=False
        )
        assert changed.returncode != 0 and key in changed.stderr, changed.stderr
        removed = admin.kubectl("annotate", "node", "ledger-node", f"{key}-", check=False)
        assert removed.returncode != 0 and key in removed.stderr, removed.stderr
        assert status_patch(operator_user, "remove") == 200
    finally:
        tools.kubectl("delete", "node", "ledger-node")


def test_the_operator_changes_only_inventory_labels_of_a_node(tools: Tools, installed: str) -> None:
    """The operator may `patch` nodes (the opt-in inventory labels), and the chart's policy
    <release>-inventory-labels narrows it: through `nodes` it may set labels under
    inventory.patchbay.dev/ (a merge patch, a server-side apply by its inventory-label manager)
    and no other label (refused, the label named), no annotation, taint or cordon."""
    ns = installed
    accounts = tools.kubectl("-n", ns, "get", "sa", "-o", "jsonpath={.items[*].metadata.name}").stdout.split()
    (operator_sa,) = [a for a in accounts if a not in ("default", "patchbay-agent", "patchbay-agent-dra")]
    operator = tools.impersonating(f"system:serviceaccount:{ns}:{operator_sa}")
    node = json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "labels-node"}})
    tools.kubectl("create", "-f", "-", stdin=node)
    key = "inventory.patchbay.dev/usb-0403-6001"
    try:

        def refused() -> str | None:
            res = operator.kubectl("label", "--dry-run=server", "node", "labels-node", "zone=a", check=False)
            return " ".join(res.stderr.split()) if res.returncode != 0 else None

        said = wait_for("the inventory-labels policy in force", refused, 60, 0.5)
        assert "may change only inventory.patchbay.dev/ labels of a node, not zone" in said, said
        assert operator.kubectl("label", "node", "labels-node", f"{key}=present").returncode == 0
        applied = json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": "labels-node", "labels": {key: "present"}},
            }
        )
        apply = ("apply", "--server-side", "--field-manager=patchbay-inventory-labels", "-f", "-")
        assert operator.kubectl(*apply, stdin=applied).returncode == 0
        # Nothing else of the Node through `nodes`: an annotation, a taint, a cordon.
        for verb in (
            ("annotate", "node", "labels-node", "example.com/a=b"),
            ("taint", "node", "labels-node", "example.com/t=v:NoSchedule"),
            ("cordon", "labels-node"),
        ):
            # (kubectl cordon prints the refusal and still exits 0: the Node is what tells.)
            said = " ".join(operator.kubectl(*verb, check=False).stderr.split())
            assert "may change only inventory.patchbay.dev/ labels of a node" in said, (verb, said)
        stored = json.loads(tools.kubectl("get", "node", "labels-node", "-o", "json").stdout)
        assert "example.com/a" not in (stored["metadata"].get("annotations") or {}), stored["metadata"]
        assert not stored["spec"].get("taints") and not stored["spec"].get("unschedulable"), stored["spec"]
    finally:
        tools.kubectl("delete", "node", "labels-node")


def test_rbac_denies_everything_else(tools: Tools, installed: str) -> None:
    ns = installed
    forbidden = [
        ("get", "secrets", ns),
        ("list", "secrets", "default"),
        ("patch", "pods/status", ns),
        ("delete", "nodes", None),
        ("update", "nodes", None),
        ("create", "daemonsets.apps", "default"),  # agents live in the release namespace only
        ("create", "configmaps", "kube-system"),
        ("create", "pods", ns),
        ("delete", "customresourcedefinitions.apiextensions.k8s.io", None),
        ("create", "devicepluginprofiles.patchbay.dev", None),  # users write profiles, not it
        ("delete", "devicepluginprofiles.patchbay.dev", None),
        ("escalate", "clusterroles.rbac.authorization.k8s.io", None),
    ]
    allowed = [(v, r, n) for v, r, n in forbidden if _can(tools, ns, v, r, n)]
    assert not allowed


@pytest.fixture(scope="module")
def operator_as_its_service_account(
    tools: Tools, chart_cluster: DevCluster, installed: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """The chart installed, and the real operator running with ONLY its ServiceAccount's token.

    If the chart's RBAC lacked anything the operator needs, the profiles below would never
    become Ready (and the operator's log would show 403s).
    """
    ns = installed
    token = tools.kubectl("create", "token", "rbac-patchbay", "-n", ns, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(chart_cluster.kubeconfig.read_text())
    kubeconfig = tmp_path_factory.mktemp("sa") / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": admin["clusters"],
                "users": [{"name": "sa", "user": {"token": token}}],
                "contexts": [
                    {"name": "sa", "context": {"cluster": admin["clusters"][0]["name"], "user": "sa"}}
                ],
                "current-context": "sa",
            }
        )
    )
    log = kubeconfig.parent / "operator.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "patchbay_operator.main",
                "--kubeconfig",
                str(kubeconfig),
                "--namespace",
                ns,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield ns, log
    finally:
        for dpp in ("sa-static", "sa-plugin", "sa-dra", "lab-licenses", "lab-slots"):
            tools.kubectl("delete", "dpp", dpp, "--ignore-not-found", "--timeout=60s", check=False)
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _dpp_document(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The DevicePluginProfile `name` of `spec`, as `kubectl apply` takes it."""
    return {
        "apiVersion": "patchbay.dev/v1beta1",
        "kind": "DevicePluginProfile",
        "metadata": {"name": name},
        "spec": spec,
    }


def _dpp(tools: Tools, name: str) -> dict[str, Any]:
    res = tools.kubectl("get", "dpp", name, "-o", "json", "--show-managed-fields", check=False)
    return json.loads(res.stdout) if res.returncode == 0 else {}


def _ready(obj: dict[str, Any]) -> bool:
    """kstatus: current when observedGeneration == generation and Ready=True."""
    st = obj.get("status") or {}
    if st.get("observedGeneration") != obj.get("metadata", {}).get("generation"):
        return False
    return any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions") or [])


def _agents_detail(tools: Tools, profile: str, ns: str, log: Path) -> str:
    """What explains a profile that does not count its agents: its status, its DaemonSet's
    status and pods, and the operator's last log lines (seen once on v1.34.4, not explained)."""
    ds = tools.kubectl("get", "ds", f"patchbay-{profile}", "-n", ns, "-o", "json", check=False)
    pods = tools.kubectl("get", "pods", "-n", ns, "-o", "wide", check=False)
    ds_status = json.dumps(json.loads(ds.stdout).get("status")) if ds.returncode == 0 else ds.stderr
    return (
        f"profile status: {json.dumps(_dpp(tools, profile).get('status') or {})}\n"
        f"DaemonSet status: {ds_status}\n"
        f"pods:\n{pods.stdout}{pods.stderr}\n"
        f"operator log (tail):\n{log.read_text()[-4000:]}"
    )


def test_the_operator_works_with_only_the_charts_rbac(
    tools: Tools, chart_cluster: DevCluster, operator_as_its_service_account: tuple[str, Path]
) -> None:
    ns, log = operator_as_its_service_account
    nodes = chart_cluster.add_kwok_nodes(2, prefix="sa-node-", labels={"patchbay.dev/sa": "yes"})
    on_sa_nodes = {"patchbay.dev/sa": "yes"}
    static = _dpp_document(
        "sa-static", profile_spec("example.com/sa-dongle", "Static", on_sa_nodes, static={"capacity": 3})
    )
    plugin = _dpp_document(
        "sa-plugin",
        profile_spec(
            "example.com/sa-token",
            "DevicePlugin",
            on_sa_nodes,
            plugin={"discovery": {"virtual": {"count": 2}}},
            agent={"tolerations": [{"operator": "Exists"}]},
        ),
    )
    tools.kubectl("apply", "-f", "-", stdin=json.dumps(static))
    tools.kubectl("apply", "-f", "-", stdin=json.dumps(plugin))
    wait_for("the static profile Ready", lambda: _ready(_dpp(tools, "sa-static")))
    for node in nodes:
        st = json.loads(tools.kubectl("get", "node", node, "-o", "json").stdout)["status"]
        assert st["capacity"]["example.com/sa-dongle"] == "3"
        assert st["allocatable"]["example.com/sa-dongle"] == "3"
    # DevicePlugin: the ConfigMap and DaemonSet in the release namespace (kwok "runs" the pods).
    wait_for(
        "the agent DaemonSet",
        lambda: tools.kubectl("get", "ds", "patchbay-sa-plugin", "-n", ns, check=False).returncode == 0,
    )
    assert tools.kubectl("get", "cm", "patchbay-sa-plugin", "-n", ns, check=False).returncode == 0
    wait_for(
        "the plugin profile to count its agents",
        lambda: (_dpp(tools, "sa-plugin").get("status") or {}).get("nodes", {}).get("ready") == 2,
    )
    # DRA: the agents and the cluster-scoped DeviceClass, with the same permissions; the same
    # resource name as sa-plugin would be served twice, so it has a name of its own.
    dra = json.loads(json.dumps(plugin))
    dra["metadata"]["name"] = "sa-dra"
    dra["spec"] |= {"mode": "DRA", "resourceName": "example.com/sa-dra-token"}
    tools.kubectl("apply", "-f", "-", stdin=json.dumps(dra))
    wait_for(
        "the DRA profile's DeviceClass",
        lambda: tools.kubectl("get", "deviceclass", "sa-dra.patchbay.dev", check=False).returncode == 0,
    )
    wait_for(
        "the DRA profile to count its agents",
        lambda: (_dpp(tools, "sa-dra").get("status") or {}).get("nodes", {}).get("ready") == 2,
        timeout=120,
        detail=lambda: _agents_detail(tools, "sa-dra", ns, log),
    )
    # Leaving DRA mode removes the DeviceClass (get + delete are in the chart's RBAC).
    tools.kubectl("patch", "dpp", "sa-dra", "--type=merge", "-p", '{"spec": {"mode": "DevicePlugin"}}')
    wait_for(
        "the DeviceClass gone",
        lambda: tools.kubectl("get", "deviceclass", "sa-dra.patchbay.dev", check=False).returncode != 0,
    )
    # Cleanup through the finalizer, with the same permissions.
    tools.kubectl("delete", "dpp", "sa-static", "--timeout=60s")
    for node in nodes:
        st = json.loads(tools.kubectl("get", "node", node, "-o", "json").stdout)["status"]
        assert "example.com/sa-dongle" not in st["capacity"]
    text = log.read_text()
    # Without the log lines' timestamps, whose milliseconds can read "403" too.
    messages = re.sub(r"^\[[^]]*\]", "", text, flags=re.MULTILINE)
    refused = "403" in messages or "Forbidden" in messages.replace("forbidden_modules", "")
    assert not refused, text[-3000:]


def test_gitops_apply_twice_changes_nothing_and_reports_kstatus(
    tools: Tools, chart_cluster: DevCluster, operator_as_its_service_account: tuple[str, Path]
) -> None:
    """examples/gitops as a GitOps controller applies it: the operator never writes a spec."""
    chart_cluster.add_kwok_nodes(1, prefix="lab-sim-", labels={"example.com/pool": "sim"})
    chart_cluster.add_kwok_nodes(1, prefix="lab-media-", labels={"example.com/pool": "media"})
    overlay = str(REPO / "examples" / "gitops" / "overlays" / "production")
    rendered = tools.kubectl("kustomize", overlay).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    renamed = []
    for d in docs:  # names of their own, so this module's other profiles are untouched
        d["metadata"]["name"] = {"sim-licenses": "lab-licenses", "encoder-slots": "lab-slots"}[
            d["metadata"]["name"]
        ]
        d["spec"]["agent"] = (
            {"tolerations": [{"operator": "Exists"}]} if d["spec"]["mode"] == "DevicePlugin" else None
        )
        if d["spec"]["agent"] is None:
            del d["spec"]["agent"]
        renamed.append(d)
    manifest = "\n---\n".join(yaml.safe_dump(d) for d in renamed)
    apply = ["apply", "--server-side", "--field-manager=gitops", "-f", "-"]
    tools.kubectl(*apply, stdin=manifest)
    wait_for(
        "both profiles current and Ready",
        lambda: all(_ready(_dpp(tools, n)) for n in ("lab-licenses", "lab-slots")),
    )
    before = {n: _dpp(tools, n)["metadata"] for n in ("lab-licenses", "lab-slots")}
    second = tools.kubectl(*apply, stdin=manifest).stdout
    assert "serverside-applied" in second
    # Both profiles are Ready for their generation: the operator has reconciled them, which is
    # when it would have written a spec field, had it ever done so.
    for name in ("lab-licenses", "lab-slots"):
        meta = _dpp(tools, name)["metadata"]
        assert meta["generation"] == before[name]["generation"], name  # the spec did not change
        spec_managers = {
            m["manager"] for m in meta["managedFields"] if "f:spec" in json.dumps(m.get("fieldsV1", {}))
        }
        assert spec_managers == {"gitops"}, spec_managers  # nobody else owns any spec field
    lic = _dpp(tools, "lab-licenses")
    assert lic["spec"]["static"]["capacity"] == 4  # the production overlay's patch


def _rendered_profile(name: str, *, own_agent: bool) -> Any:
    """A one-token DevicePlugin profile as the operator parses it: with agent settings of its own
    (its own DaemonSet) or without (the shared node agent serves it)."""
    from patchbay_operator.profiles import Profile

    spec: dict[str, Any] = {
        "resourceName": f"example.com/{name}",
        "mode": "DevicePlugin",
        "plugin": {"discovery": {"virtual": {"count": 1}}},
    }
    if own_agent:
        spec["agent"] = {"resources": {"limits": {"memory": "64Mi"}}}
    body = {"metadata": {"name": name, "uid": f"uid-{name}", "generation": 1}, "spec": spec}
    return Profile.from_body(body)


def test_pod_monitor_selects_the_agent_pods_the_operator_renders(tools: Tools) -> None:
    """Off by default; when on, its selector and port match the DaemonSet the operator renders."""
    from patchbay_operator import render
    from patchbay_operator.config import Settings

    default = tools.helm("template", "p", str(CHART)).stdout
    assert "PodMonitor" not in default
    rendered = tools.helm("template", "p", str(CHART), "--set", "metrics.podMonitor.enabled=true").stdout
    monitor = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "PodMonitor")
    _, ds = render.agent_objects(_rendered_profile("m", own_agent=False), Settings())
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    ports = {p["name"] for p in ds["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] in ports


def test_the_agents_network_policy_and_holder_labels_follow_the_values(tools: Tools) -> None:
    """Off by default. On, the NetworkPolicy selects the agent pods the operator renders (its own
    and the shared node agent's) and opens their metrics port to the listed peers only; with no
    peers, to nobody but the node. metricsHolderLabels reaches the operator, which passes
    --metrics-holder-labels to every agent it renders."""
    from patchbay_operator import render
    from patchbay_operator.config import Settings, load

    default = [d for d in yaml.safe_load_all(tools.helm("template", "p", str(CHART)).stdout) if d]
    assert "NetworkPolicy" not in {d["kind"] for d in default}
    (deployment,) = [d for d in default if d["kind"] == "Deployment"]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PATCHBAY_AGENT_METRICS_HOLDER_LABELS"] == "false"
    assert (
        load([], env={k: v for k, v in env.items() if isinstance(v, str)}).agent_metrics_holder_labels
        is False
    )

    values = CHART / "ci" / "netpol-values.yaml"
    docs = [
        d for d in yaml.safe_load_all(tools.helm("template", "p", str(CHART), "-f", str(values)).stdout) if d
    ]
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    settings = load([], env={k: v for k, v in env.items() if isinstance(v, str)})
    assert settings.agent_metrics_holder_labels is True
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 9464, "protocol": "TCP"}]
    assert rule["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"
    }
    assert policy["spec"]["policyTypes"] == ["Ingress"]

    own = render.agent_objects(_rendered_profile("m", own_agent=True), settings)[1]
    shared = render.shared_agent_objects([(_rendered_profile("s", own_agent=False), None)], settings)[1]
    for ds in (own, shared):
        pod = ds["spec"]["template"]
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        (container,) = pod["spec"]["containers"]
        assert 9464 in {p["containerPort"] for p in container["ports"]}
        assert "--metrics-holder-labels" in container["command"]
    plain = render.agent_objects(_rendered_profile("m", own_agent=True), Settings())[1]
    assert "--metrics-holder-labels" not in plain["spec"]["template"]["spec"]["containers"][0]["command"]

    closed = tools.helm("template", "p", str(CHART), "--set", "agent.networkPolicy.enabled=true").stdout
    (policy,) = [d for d in yaml.safe_load_all(closed) if d and d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["ingress"] == []


def _profile(name: str, **spec: Any) -> str:
    base: dict[str, Any] = {
        "resourceName": "example.com/guarded",
        "mode": "DevicePlugin",
        "plugin": {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}},
    }
    for key, value in spec.items():
        if key == "plugin":
            base["plugin"] = {**base["plugin"], **value}
        else:
            base[key] = value
    return json.dumps(_dpp_document(name, base))


def _allow_privileged(tools: Tools, ns: str, allowed: bool) -> None:
    """The release `rbac` upgraded with `admission.profiles.allowPrivileged` set to `allowed`."""
    value = "true" if allowed else "false"
    tools.helm(
        "upgrade",
        "rbac",
        str(CHART),
        "-n",
        ns,
        "--reuse-values",
        "--set",
        f"admission.profiles.allowPrivileged={value}",
    )


def _group(name: str, plugin: dict[str, Any]) -> str:
    """A profile whose one node group (every node) sets `plugin`."""
    return _profile(name, nodeGroups=[{"name": "all", "nodeSelector": {}, "plugin": plugin}])


def test_profile_guardrails_refuse_dangerous_fields_to_authors_who_are_not_administrators(
    tools: Tools, installed: str
) -> None:
    """The chart's profile guardrails, by impersonation: a profile author with RBAC to write
    profiles (not an administrator) is refused every field that amounts to root on a node or to
    another vendor's resource, each with the field and the chart value named; the same profiles
    pass for a cluster administrator; an administrator's privileged profile stays manageable by
    the author as long as its spec is left alone; a chart value widens exactly its field."""
    ns = installed
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "profile-author"},
        "rules": [
            {
                "apiGroups": ["patchbay.dev"],
                "resources": ["devicepluginprofiles"],
                "verbs": ["get", "list", "create", "update", "patch", "delete"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "profile-author"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "profile-author"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"}],
    }
    tools.kubectl(
        "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [role, binding]})
    )
    bob = tools.impersonating("bob")
    admin = tools.impersonating("alice", groups=["system:masters"])

    def as_bob(doc: str) -> str | None:
        """None when the server (admission included) accepts `doc` (nothing is stored); else
        what it said."""
        res = bob.kubectl("create", "--dry-run=server", "-f", "-", stdin=doc, check=False)
        return " ".join(res.stderr.split()) if res.returncode != 0 else None

    dangerous = {
        "spec.agent.privileged": _profile("g1", agent={"privileged": True}),
        "spec.agent.image": _profile("g2", agent={"image": "evil.example.com/agent:1"}),
        "spec.plugin.health.exec": _profile("g3", plugin={"health": {"exec": {"command": ["/bin/true"]}}}),
        "spec.plugin.preStart": _profile("g4", plugin={"preStart": {"command": ["/bin/true"]}}),
        "spec.agent.tolerations": _profile("g5", agent={"tolerations": [{"operator": "Exists"}]}),
        "spec.plugin.allocation.mounts": _profile(
            "g6", plugin={"allocation": {"mounts": [{"hostPath": "/etc", "containerPath": "/host-etc"}]}}
        ),
        "spec.resourceName": _profile("g8", resourceName="nvidia.com/gpu"),
        "spec.plugin.allocation.cdi.kind": _profile(
            "g9", plugin={"allocation": {"cdi": {"kind": "nvidia.com/gpu"}}}
        ),
        # A node group's plugin is merged over spec.plugin on its nodes: guarded the same way.
        "spec.nodeGroups[].plugin.health.exec": _group(
            "g13", {"health": {"exec": {"command": ["/bin/true"]}}}
        ),
        "spec.nodeGroups[].plugin.preStart": _group("g14", {"preStart": {"command": ["/bin/true"]}}),
        "spec.nodeGroups[].plugin.allocation.mounts": _group(
            "g15", {"allocation": {"mounts": [{"hostPath": "/etc", "containerPath": "/host-etc"}]}}
        ),
        "spec.nodeGroups[].plugin.allocation.cdi.kind": _group(
            "g16", {"allocation": {"cdi": {"kind": "nvidia.com/gpu"}}}
        ),
    }
    try:
        safe = _profile("g0")
        # In force moments after the install: wait until the first refusal comes.
        said = wait_for(
            "the guardrails in force", lambda: as_bob(dangerous["spec.agent.privileged"]), 60, 0.5
        )
        assert as_bob(safe) is None
        assert as_bob(_group("g17", {"sharing": {"replicas": 2}, "health": {"failureThreshold": 5}})) is None
        for field, doc in dangerous.items():
            said = as_bob(doc)
            assert said is not None and field in said, (field, said)
            assert "admission.profiles." in said, (field, said)
            # An administrator may.
            res = admin.kubectl("create", "--dry-run=server", "-f", "-", stdin=doc, check=False)
            assert res.returncode == 0, (field, res.stderr)
        # Subtler forms of the same: a subdomain of a denied vendor, a path that climbs out of /dev.
        assert "spec.resourceName" in (as_bob(_profile("g10", resourceName="gpu.nvidia.com/x")) or "")
        # Device paths are the CRD's business, for everyone: under /dev/, never climbing out.
        climbing = _profile(
            "g11", plugin={"discovery": {"paths": {"groups": [{"id": "a", "paths": ["/dev/../etc/shadow"]}]}}}
        )
        refused = admin.kubectl("create", "--dry-run=server", "-f", "-", stdin=climbing, check=False)
        assert refused.returncode != 0 and "never climb out" in refused.stderr, refused.stderr
        # The chart's own agent image is allowed to anyone.
        chart_image = yaml.safe_load((CHART / "values.yaml").read_text())["agent"]["image"]
        assert as_bob(_profile("g12", agent={"image": chart_image})) is None

        # An administrator's privileged profile: the author may relabel it, not change its spec.
        admin.kubectl("create", "-f", "-", stdin=_profile("admins", agent={"privileged": True}))
        assert bob.kubectl("label", "devicepluginprofile", "admins", "team=devices").returncode == 0
        changed = bob.kubectl(
            "patch",
            "devicepluginprofile",
            "admins",
            "--type=merge",
            "-p",
            json.dumps({"spec": {"plugin": {"health": {"periodSeconds": 30}}}}),
            check=False,
        )
        assert changed.returncode != 0 and "spec.agent.privileged" in changed.stderr, changed.stderr

        # A chart value widens exactly its field.
        _allow_privileged(tools, ns, True)
        wait_for("privileged allowed", lambda: as_bob(dangerous["spec.agent.privileged"]) is None, 60, 0.5)
        assert "spec.agent.tolerations" in (as_bob(dangerous["spec.agent.tolerations"]) or "")
    finally:
        _allow_privileged(tools, ns, False)
        tools.kubectl("delete", "devicepluginprofile", "admins", "--ignore-not-found")
        tools.kubectl("delete", "clusterrolebinding,clusterrole", "profile-author", "--ignore-not-found")
