"""Session fixtures: ONE real control plane per test session; tests isolate themselves by name.

The cluster starts lazily, the first time a test asks for it, so `pytest tests/unit` never
starts one. A missing binary is an error, never a skip: a skipped smoke test would pass for
nothing.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from patchbay_devcluster import DevCluster, find_bin_dir

REPO = Path(__file__).resolve().parents[1]


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
def devcluster(tmp_path_factory: pytest.TempPathFactory, bin_dir: Path) -> Iterator[DevCluster]:
    cluster = DevCluster(tmp_path_factory.mktemp("devcluster"), bin_dir)
    cluster.up(timeout=120)
    try:
        yield cluster
    finally:
        # Keep certificates and logs under pytest's tmp dir for post-mortems; stop every PID.
        cluster.down(purge=False)


@pytest.fixture(scope="session")
def api(devcluster: DevCluster) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(devcluster.kubeconfig))


@pytest.fixture
def name_prefix() -> str:
    """A short unique prefix so tests sharing the session's cluster never see each other's objects."""
    return f"t{uuid.uuid4().hex[:6]}-"
