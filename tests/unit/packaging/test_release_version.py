"""One release version, from the VERSION file: what hack/generate.py writes from it, the image tag,
and the changelog's entry for it. (`make verify` fails when a generated place is stale; these say
what the places must agree on, so `make test-unit` says it too.)"""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

import pytest
import yaml
from support.scripts import load

from patchbay_devcluster.imagebuild import PROGRAMS, version_of
from patchbay_operator.config import DEFAULT_AGENT_IMAGE

REPO = Path(__file__).resolve().parents[3]
VERSION = (REPO / "VERSION").read_text().strip()


def test_the_version_is_semver_and_every_place_says_it() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+(-(alpha|beta|rc)\.\d+)?", VERSION)
    chart = yaml.safe_load((REPO / "charts" / "patchbay" / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION)
    values = yaml.safe_load((REPO / "charts" / "patchbay" / "values.yaml").read_text())
    assert (
        values["agent"]["image"] == DEFAULT_AGENT_IMAGE == f"ghcr.io/kube-patchbay/patchbay-agent:{VERSION}"
    )
    _, pep440 = load("generate").release_version()
    for folder in ("api", "operator", "plugin-agent", "devcluster", "kubectl-patchbay", "."):
        meta = tomllib.loads((REPO / folder / "pyproject.toml").read_text())
        assert meta["project"]["version"] == pep440, folder
        pins = [d for d in meta["project"]["dependencies"] if d.startswith("patchbay-api")]
        assert pins in ([], [f"patchbay-api=={pep440}"]), folder


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.2.0", ("0.2.0", "0.2.0")),
        ("1.0.0-rc.2", ("1.0.0-rc.2", "1.0.0rc2")),
        ("0.3.0-beta.1", ("0.3.0-beta.1", "0.3.0b1")),
    ],
)
def test_a_pre_release_is_spelled_for_pip_too(
    text: str, expected: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gen = load("generate")
    (tmp_path / "VERSION").write_text(text + "\n")
    monkeypatch.setattr(gen, "VERSION_FILE", tmp_path / "VERSION")
    assert gen.release_version() == expected


@pytest.mark.parametrize("text", ["0.2", "v0.2.0", "0.2.0-dev", "0.2.0+build.1"])
def test_a_version_helm_or_pip_would_read_otherwise_is_refused(
    text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gen = load("generate")
    (tmp_path / "VERSION").write_text(text)
    monkeypatch.setattr(gen, "VERSION_FILE", tmp_path / "VERSION")
    with pytest.raises(SystemExit, match="VERSION"):
        gen.release_version()


def test_images_are_tagged_with_the_release_or_the_old_checkouts_package_version(tmp_path: Path) -> None:
    for program in PROGRAMS:
        assert version_of(REPO, program) == VERSION
    # A checkout from before the VERSION file (0.1.0): the program's own version.
    old = tmp_path / "old"
    for program in PROGRAMS:
        (old / program.folder).mkdir(parents=True)
        shutil.copy(REPO / program.folder / "pyproject.toml", old / program.folder / "pyproject.toml")
        text = (old / program.folder / "pyproject.toml").read_text()
        (old / program.folder / "pyproject.toml").write_text(
            re.sub(r'(?m)^version = ".*"$', 'version = "0.1.0"', text)
        )
        assert version_of(old, program) == "0.1.0"


def test_the_changelog_has_an_entry_for_this_release_and_the_one_before() -> None:
    text = (REPO / "CHANGELOG.md").read_text()
    headings = re.findall(r"(?m)^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text)
    names = [h[0] for h in headings]
    assert names[0] == "Unreleased"
    assert VERSION in names, names
    assert "0.1.0" in names
    # Every released entry is dated; every version has a link target at the bottom.
    assert all(date for name, date in headings if name != "Unreleased"), headings
    for name in names:
        assert re.search(rf"(?m)^\[{re.escape(name)}\]: \S+$", text), name
