"""The README's two commands in either order, and again: `make demo` then `make test`, `make test`
then `make demo`, `make demo` twice. The machine has one real node (the kubelet's directories are
machine-wide), so the test targets first make room (`hack/demo.py make-room`): a running demo is
stopped with a line that says so, any other cluster's node stops the target at once with a line
that says how to stop it. A second `make demo` reuses the running cluster, whose image import
must find the binaries (it failed with "no ctr in None": the cluster object had not looked for
them, since nothing started). The decisions are tested here; the Makefile's wiring is checked
as text."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType

import pytest

from patchbay_devcluster import cluster as cluster_module
from patchbay_devcluster import hostdirs
from patchbay_devcluster import node as node_module
from patchbay_devcluster.cluster import DevCluster, real_node_holder

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("demo_under_test", REPO / "hack" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_test_targets_make_room_for_the_real_node_first() -> None:
    makefile = (REPO / "Makefile").read_text().split("\n\n")
    for target in ("test:", "test-release:", "test-e2e:", "test-integration:"):
        (recipe,) = [
            block for block in makefile if any(line.startswith(target) for line in block.splitlines())
        ]
        lines = recipe.splitlines()
        room = next(i for i, line in enumerate(lines) if "hack/demo.py make-room" in line)
        tests = next(i for i, line in enumerate(lines) if "-m pytest" in line)
        assert room < tests, recipe


def test_what_the_test_targets_do_about_the_real_node(demo: ModuleType, tmp_path: Path) -> None:
    demo_dir = tmp_path / "demo"
    demo_dir.mkdir()
    assert demo.room_for_tests(None, demo_dir) == ""
    assert demo.room_for_tests(demo_dir, demo_dir) == "stop-demo"
    other = demo.room_for_tests(tmp_path / "pytest-7" / "e2e-cluster0", demo_dir)
    assert "another cluster's real node runs" in other
    assert f"patchbay-devcluster --state-dir {tmp_path / 'pytest-7' / 'e2e-cluster0'} down" in other


def test_the_holder_is_the_owner_whose_kubelet_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    owner = tmp_path / "owner.json"
    monkeypatch.setattr(hostdirs, "OWNER_FILE", owner)
    assert real_node_holder() is None
    me = os.getpid()
    exe = Path(f"/proc/{me}/cmdline").read_bytes().split(b"\0")[0].decode()
    owner.write_text(json.dumps({"stateDir": str(tmp_path / "demo")}))
    assert real_node_holder() is None  # no kubelet recorded
    kubelet = {"name": "kubelet", "pid": me, "binary": exe, "log": "/dev/null"}
    owner.write_text(json.dumps({"stateDir": str(tmp_path / "demo"), "kubelet": kubelet}))
    assert real_node_holder() == tmp_path / "demo"


def test_images_are_imported_with_the_binaries_of_a_cluster_that_was_already_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second `make demo`: DevCluster made without a bin dir, nothing started; the import
    looks the binaries up ($PATCHBAY_KUBE_BIN) instead of failing with "no ctr in None"."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in cluster_module.BINARIES:
        (bin_dir / name).write_text("")
    monkeypatch.setenv(cluster_module.BIN_ENV, str(bin_dir))
    seen: list[Path | None] = []

    class Recorder(node_module.RealNode):
        def import_archive(self, ref: str, archive: Path) -> bool:
            seen.append(self.bin_dir)
            return False

    monkeypatch.setattr(cluster_module, "RealNode", Recorder)
    c = DevCluster(tmp_path / "state")
    monkeypatch.setattr(DevCluster, "running", lambda self: [cluster_module.Proc("containerd", 1, "x", "y")])
    c.load_images([("example/img:1", tmp_path / "img.tar")])
    assert seen == [bin_dir]
