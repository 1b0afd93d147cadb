"""`make setup`'s first step, hack/host_check.py: which host stops it, in one line that says what to
do, and in which order (an old python3 first, then not root, then cgroups the real node cannot
use). The cgroups verdict is the real node's own (patchbay_devcluster.cgroups, loaded by path with
the machine's python3, before the virtualenv exists)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from patchbay_devcluster import cgroups

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "hack" / "host_check.py"


@pytest.fixture(scope="module")
def host_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("host_check_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NO_MEMORY = "cgroup v2 at /sys/fs/cgroup lacks the memory controller(s) the kubelet's pods need"


@pytest.mark.parametrize(
    ("python", "euid", "cgroups_problem", "expected"),
    [
        ((3, 11, 2), 0, None, None),
        ((3, 13, 0), 0, None, None),
        ((3, 9, 18), 0, None, "python3 is 3.9.18; Patchbay needs Python 3.11 or newer"),
        ((3, 9, 18), 1000, NO_MEMORY, "python3 is 3.9.18"),  # the first problem only
        ((3, 11, 2), 1000, None, "make setup needs root"),
        ((3, 11, 2), 1000, NO_MEMORY, "make setup needs root"),
        ((3, 11, 2), 0, NO_MEMORY, f"the real node cannot run here: {NO_MEMORY}"),
    ],
)
def test_the_first_problem_stops_setup_in_one_line(
    host_check: ModuleType,
    python: tuple[int, int, int],
    euid: int,
    cgroups_problem: str | None,
    expected: str | None,
) -> None:
    found = host_check.problem(python, euid, cgroups_problem)
    if expected is None:
        assert found is None
    else:
        assert found is not None
        assert found.startswith(expected)
        assert "\n" not in found


def test_setup_and_the_node_judge_cgroups_with_the_same_module(host_check: ModuleType) -> None:
    """The script loads the very file the node imports, so the two cannot disagree."""
    assert Path(host_check.CGROUPS).resolve() == Path(cgroups.__file__).resolve()
    loaded = host_check.load_cgroups()
    fake = Path("/nonexistent-cgroup-base")
    assert loaded.detect("cgroup2fs", fake).problem() == cgroups.detect("cgroup2fs", fake).problem()
    assert loaded.detect("tmpfs", fake).problem() == cgroups.detect("tmpfs", fake).problem()


def test_the_script_runs_on_this_host() -> None:
    """It says one line either way: what it found, or the first problem."""
    res = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    out = (res.stdout + res.stderr).strip()
    assert out.startswith("[host-check] ")
    assert "\n" not in out
    host = cgroups.host_cgroups()
    if res.returncode == 0:
        assert host.describe() in out
    else:
        assert res.returncode == 1
