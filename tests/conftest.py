"""Session fixtures: ONE real control plane per test session; tests isolate themselves by name.

The cluster starts lazily, the first time a test asks for it. A missing binary is an error, never
a skip: a skipped smoke test would pass for nothing.

Markers say what a test needs, and they are given by folder, so they cannot be forgotten:

| folder | markers | needs |
| --- | --- | --- |
| unit/ | (none) | nothing: pure code, no process, no socket of a cluster |
| sockets/ | (none) | the agent on real Unix sockets against a Python kubelet peer |
| integration/ | cluster | a real control plane (etcd, API server, controllers, kwok) |
| conformance/ | peer | the upstream kubelet device manager, compiled from Go |
| e2e/ | cluster, node | the machine's real kubelet node (root), images, the chart |

A test that uses a cluster fixture without the ``cluster`` marker fails, so ``-m "not cluster"``
(``make test-unit``) really starts no cluster.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from support import paths
from support.clusters import (
    CRD_FILE,
    GROUP,
    NAMESPACE,
    PLURAL,
    REPORT_CRD_FILE,
    VERSION,
    Cluster,
    apply_crd,
    running_devcluster,
    wait_for,
)
from support.operator import Operator
from support.tiertimes import TierTimes

from patchbay_devcluster import DevCluster, find_bin_dir
from patchbay_devcluster.releases import release_of

REPO = Path(__file__).resolve().parents[1]
FOLDER_MARKERS = {"integration": ("cluster",), "conformance": ("peer",), "e2e": ("cluster", "node")}
CLUSTER_FIXTURES = {"devcluster", "e2e_cluster", "chart_cluster", "cluster", "api", "e2e_api"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(str(item.fspath)).relative_to(REPO / "tests").parts[0]
        for name in FOLDER_MARKERS.get(folder, ()):
            item.add_marker(name)


_tier_times = TierTimes()


def pytest_sessionstart(session: pytest.Session) -> None:
    _tier_times.start()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _tier_times.add(report.nodeid, report.duration)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The wall time of each tier, fixtures' setup and teardown included (support/tiertimes.py)."""
    terminalreporter.write_sep("=", "wall time per tier")
    for line in _tier_times.lines():
        terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def _cluster_fixtures_need_the_cluster_marker(request: pytest.FixtureRequest) -> None:
    used = CLUSTER_FIXTURES & set(request.fixturenames)
    if used and request.node.get_closest_marker("cluster") is None:
        pytest.fail(f"{request.node.nodeid} uses {sorted(used)} but is not marked `cluster`")


def kube_bin_dir() -> Path:
    """The pinned binaries: $PATCHBAY_KUBE_BIN (the Makefile sets it) or the build script's answer."""
    env = os.environ.get("PATCHBAY_KUBE_BIN")
    if env:
        return Path(env)
    out = subprocess.run(
        [str(REPO / "hack" / "kube-binaries.sh"), "--print-bin-dir"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    return find_bin_dir(kube_bin_dir())


@pytest.fixture(scope="session")
def kube_release(bin_dir: Path) -> str:
    """The Kubernetes release of this session's binaries (``v1.34.4``), read from kube-apiserver."""
    return release_of(bin_dir)


@pytest.fixture(scope="session")
def devcluster(tmp_path_factory: pytest.TempPathFactory, bin_dir: Path) -> Iterator[DevCluster]:
    with running_devcluster(tmp_path_factory.mktemp("devcluster"), bin_dir) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def api(devcluster: DevCluster) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(devcluster.kubeconfig))


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory for Unix sockets, short enough for their paths (support/paths.py)."""
    with paths.short_dir() as d:
        yield d


@pytest.fixture
def name_prefix() -> str:
    """A short unique prefix so tests sharing the session's cluster never see each other's objects."""
    return f"t{uuid.uuid4().hex[:6]}-"


# --- the operator: one subprocess per session, shared by integration and e2e tests ---------


@pytest.fixture(scope="session")
def crd(api: client.ApiClient) -> dict[str, Any]:
    """Patchbay's CRDs from crds/ (profiles and the agents' reports), applied and Established;
    returns the profile CRD."""
    apply_crd(api, REPORT_CRD_FILE)
    body = apply_crd(api, CRD_FILE)
    # Discovery of the new group lags a little behind Established.
    custom = client.CustomObjectsApi(api)
    wait_for("the profile API to be served", lambda: _served(custom))
    return body


def _served(custom: client.CustomObjectsApi) -> bool:
    try:
        custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    except ApiException:
        return False
    return True


@pytest.fixture(scope="session")
def operator_namespace(api: client.ApiClient) -> str:
    """The operator's namespace with the agents' ServiceAccounts in it (the chart makes them)."""
    core = client.CoreV1Api(api)
    for create in (
        lambda: core.create_namespace({"metadata": {"name": NAMESPACE}}),
        lambda: core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": "patchbay-agent"}}),
        lambda: core.create_namespaced_service_account(
            NAMESPACE, {"metadata": {"name": "patchbay-agent-dra"}}
        ),
    ):
        try:
            create()
        except ApiException as e:
            if e.status != 409:
                raise
    return NAMESPACE


@pytest.fixture(scope="session")
def operator_process(
    devcluster: DevCluster,
    crd: dict[str, Any],
    operator_namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Operator]:
    op = Operator(devcluster.kubeconfig, tmp_path_factory.mktemp("operator"))
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture
def operator(operator_process: Operator) -> Operator:
    """The running operator (restarted if a previous test stopped it)."""
    operator_process.ensure()
    return operator_process


@pytest.fixture
def cluster(
    api: client.ApiClient, devcluster: DevCluster, name_prefix: str, crd: dict[str, Any]
) -> Iterator[Cluster]:
    c = Cluster(api, devcluster, name_prefix)
    try:
        yield c
    finally:
        c.cleanup()
