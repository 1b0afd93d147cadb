"""The e2e tests run Patchbay as a cluster runs it, on a cluster of their own.

Session-scoped, started on first use: a control plane, the real node ``localhost`` (kubelet,
containerd, runc, the private pod network), the operator and agent images built here with
podman and imported into the node, and ``helm install`` of charts/patchbay as ``helm package``
makes it (the archive ``make release`` ships, so what is released is what is tested). The
operator is the chart's Deployment pod; every agent is a pod of the DaemonSet the operator
renders. No Patchbay process runs on the host in these tests.

A cluster of their own, not the integration tests' one: the integration tests run the operator
as a host process with the CRD applied from crds/, and the chart must own its CRD here.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from support.clusters import Cluster, running_devcluster, wait_for
from support.realnode import REPO, Installed, OnNode

from patchbay_devcluster import DevCluster
from patchbay_devcluster.imagebuild import BuiltImage, build_all
from patchbay_devcluster.install import helm_install, package_chart
from patchbay_devcluster.node import NODE_NAME

FAKE_DEV_ROOT = Path("/dev/patchbay-e2e")
FAILURE_LOG_LINES = 3000
"""Lines kept of each Patchbay container's log when a test fails (its tail)."""
FAILURE_SHOWN_LINES = 25
"""Of those, the lines of each operator replica shown in the failure's report."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """A failed test on the real node keeps the logs of every Patchbay pod (operator replicas and
    agents, the previous container's too) beside the cluster's own logs, and shows the operator
    replicas' last lines in its report: a pod's log lives in the node's directories, which go
    when the session ends, and a CI failure is read afterwards from its output."""
    outcome = yield
    report = outcome.get_result()
    installed = _installed(item)
    if report.when != "call" or not report.failed or installed is None:
        return
    where = installed.cluster.log_dir / "failures" / item.name[:120]
    try:
        logs = save_pod_logs(installed, where)
    except Exception as e:  # the failure's own report must come out whatever happens here
        report.sections.append(("Patchbay pod logs", f"could not be saved: {e}"))
        return
    shown = [f"{len(logs)} container log(s) saved under {where}"]
    for path, text in sorted(logs.items()):
        if ".operator" in path.name:
            lines = [line for line in text.splitlines() if "/healthz" not in line and "/metrics" not in line]
            shown.append(f"--- {path.name}, its last {FAILURE_SHOWN_LINES} lines:")
            shown += lines[-FAILURE_SHOWN_LINES:]
    report.sections.append(("Patchbay pod logs", "\n".join(shown)))


def _installed(item: pytest.Item) -> Installed | None:
    """The release the test ran against: its ``patchbay`` fixture, or the one inside ``on_node``
    (which takes its fixtures by name, so they are not among the item's arguments)."""
    for value in getattr(item, "funcargs", {}).values():
        for candidate in (value, getattr(value, "patchbay", None)):
            if isinstance(candidate, Installed):
                return candidate
    return None


def save_pod_logs(installed: Installed, where: Path) -> dict[Path, str]:
    """Each container's log (and its previous one's, after a restart) of every pod in the
    release's namespace, written as ``<pod>.<container>[.previous].log``; returns them."""
    where.mkdir(parents=True, exist_ok=True)
    core, ns, saved = installed.core, installed.namespace, {}
    for pod in core.list_namespaced_pod(ns).items:
        for status in pod.status.container_statuses or []:
            for previous in (False, True) if status.restart_count else (False,):
                try:
                    text = str(
                        core.read_namespaced_pod_log(
                            pod.metadata.name,
                            ns,
                            container=status.name,
                            previous=previous,
                            tail_lines=FAILURE_LOG_LINES,
                            timestamps=True,
                        )
                    )
                except Exception as e:
                    text = f"(not read: {e})"
                path = where / f"{pod.metadata.name}.{status.name}{'.previous' if previous else ''}.log"
                path.write_text(text)
                saved[path] = text
    return saved


@pytest.fixture(scope="session")
def images() -> dict[str, BuiltImage]:
    """The operator and agent images of this checkout (built once, then cached by content)."""
    return build_all(REPO)


@pytest.fixture(scope="session")
def e2e_cluster(tmp_path_factory: pytest.TempPathFactory, bin_dir: Path) -> Iterator[DevCluster]:
    with running_devcluster(tmp_path_factory.mktemp("e2e-cluster"), bin_dir) as cluster:
        cluster.start_real_node(timeout=180)
        yield cluster


@pytest.fixture(scope="session")
def e2e_api(e2e_cluster: DevCluster) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(e2e_cluster.kubeconfig))


@pytest.fixture(scope="session")
def real_node(e2e_cluster: DevCluster) -> str:
    return NODE_NAME


@pytest.fixture(scope="session")
def packaged_chart(tmp_path_factory: pytest.TempPathFactory, bin_dir: Path) -> Path:
    """charts/patchbay packaged (``helm package``, as ``make release`` does): ``patchbay-<version>.tgz``."""
    return package_chart(bin_dir / "helm", REPO / "charts" / "patchbay", tmp_path_factory.mktemp("chart"))


@pytest.fixture(scope="session")
def patchbay(
    e2e_cluster: DevCluster, e2e_api: client.ApiClient, images: dict[str, BuiltImage], packaged_chart: Path
) -> Installed:
    """The packaged chart installed (``helm upgrade --install --wait``) with its default values but
    the images: the operator pod is Running."""
    release = helm_install(e2e_cluster, packaged_chart, images)
    installed = Installed(e2e_cluster, e2e_api, release, images)
    wait_for("the operator pod Ready", installed.operator_ready, 120)
    return installed


@pytest.fixture
def cluster(e2e_api: client.ApiClient, e2e_cluster: DevCluster, name_prefix: str) -> Iterator[Cluster]:
    """Assertion helpers over the e2e cluster; deletes the test's profiles and nodes afterwards."""
    c = Cluster(e2e_api, e2e_cluster, name_prefix)
    try:
        yield c
    finally:
        c.cleanup()


@pytest.fixture
def namespace(e2e_api: client.ApiClient, name_prefix: str) -> Iterator[str]:
    """A namespace of the test's own, with its default ServiceAccount (pods need it)."""
    core = client.CoreV1Api(e2e_api)
    ns = f"{name_prefix}node"
    core.create_namespace({"metadata": {"name": ns}})
    wait_for("default ServiceAccount", lambda: core.list_namespaced_service_account(ns).items, 60)
    yield ns
    core.delete_namespace(ns)


@pytest.fixture
def fake_dev(name_prefix: str) -> Iterator[Path]:
    """A directory under the machine's /dev for the test's FAKE devices (mknod 1:3, the null
    device): the agent pod finds them through its /host/dev mount exactly as real ones."""
    path = FAKE_DEV_ROOT / name_prefix.rstrip("-")
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if FAKE_DEV_ROOT.exists() and not any(FAKE_DEV_ROOT.iterdir()):
            FAKE_DEV_ROOT.rmdir()


@pytest.fixture
def on_node(request: pytest.FixtureRequest) -> OnNode:
    """The fixtures most tests on the real node take, as one (``OnNode``'s fields name them)."""
    return OnNode(*(request.getfixturevalue(name) for name in OnNode._fields))
