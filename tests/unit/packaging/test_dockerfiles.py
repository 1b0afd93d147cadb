"""Packaging by program: each image installs exactly its program, from the program's own metadata.

Checked as text and metadata (the images themselves are built and run by the e2e tests): the
four programs each have a pyproject.toml; the top-level one installs them all for development;
each Dockerfile takes its base as a build argument (pinned by default), copies nothing but the
wheelhouse, installs its own distribution offline, and runs its own console script; the operator
runs as non-root; what goes into the agent image holds no operator-side dependency.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from patchbay_devcluster.imagebuild import (
    PROGRAMS,
    SHARED,
    input_hash,
    installed_from,
    pinned_closure,
    shared_in,
)

REPO = Path(__file__).resolve().parents[3]
ALL_PROGRAMS = {
    "operator": "operator",
    "agent": "plugin-agent",
    "devcluster": "devcluster",
    "kubectl": "kubectl-patchbay",
}
#: The console scripts of each program (kubectl finds its plugin by kubectl's naming rules).
SCRIPTS = {
    "kubectl": ["kubectl-patchbay", "kubectl_complete-patchbay"],
    # The chart's pre-delete hook runs from the operator image (templates/uninstall-hook.yaml).
    "operator": ["patchbay-operator", "patchbay-uninstall-check"],
}


def pyproject(folder: str) -> dict[str, Any]:
    return tomllib.loads((REPO / folder / "pyproject.toml").read_text())


def instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def final_stage(ins: list[tuple[str, str]]) -> list[tuple[str, str]]:
    starts = [i for i, (w, _) in enumerate(ins) if w == "FROM"]
    return ins[starts[-1] :]


def test_the_top_level_project_installs_the_three_programs_at_their_versions() -> None:
    top = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {
        f"patchbay-{name}=={pyproject(folder)['project']['version']}"
        for name, folder in {**ALL_PROGRAMS, "api": "api"}.items()
    }
    assert set(top["dependencies"]) == wanted
    for name, folder in ALL_PROGRAMS.items():
        meta = pyproject(folder)
        assert meta["project"]["name"] == f"patchbay-{name}"
        assert list(meta["project"]["scripts"]) == SCRIPTS.get(name, [f"patchbay-{name}"])
        assert meta["tool"]["setuptools"]["packages"]["find"]["include"][0] == f"patchbay_{name}"


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_dockerfile_copies_only_the_wheelhouse_and_installs_its_program_offline(program: Any) -> None:
    ins = instructions(REPO / program.folder / "Dockerfile")
    copies = [rest for w, rest in ins if w == "COPY" and "--from=" not in rest]
    assert copies == ["wheels/ /wheels/"]
    runs = " ".join(rest for w, rest in ins if w == "RUN")
    assert f"--no-index --no-cache-dir --find-links /wheels {program.distribution}" in runs


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_base_is_a_build_argument_with_a_pinned_default(program: Any) -> None:
    ins = instructions(REPO / program.folder / "Dockerfile")
    args = dict(rest.split("=", 1) for w, rest in ins if w == "ARG" and "=" in rest)
    assert re.fullmatch(r"[\w./-]+:\d+\.\d+\.\d+[\w.-]*", args["BASE_IMAGE"]), args
    froms = [rest.split()[0] for w, rest in ins if w == "FROM"]
    assert froms == ["${BASE_IMAGE}", "${BASE_IMAGE}"], "multi-stage, both on the base argument"


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_entrypoint_is_the_programs_own_console_script(program: Any) -> None:
    final = final_stage(instructions(REPO / program.folder / "Dockerfile"))
    entry = [rest for w, rest in final if w == "ENTRYPOINT"]
    script = re.findall(r'"([^"]+)"', entry[-1])[0]
    assert script == program.distribution
    assert script in pyproject(program.folder)["project"]["scripts"]


def test_operator_runs_as_non_root() -> None:
    users = [rest for w, rest in final_stage(instructions(REPO / "operator" / "Dockerfile")) if w == "USER"]
    uid = users[-1].split(":")[0]
    assert uid.isdigit()
    assert int(uid) != 0


def test_the_agent_image_gets_no_operator_side_dependency() -> None:
    """The closure pinned into the agent image (from the installed metadata, transitively)."""
    agent = {p.split("==")[0] for p in pinned_closure("patchbay-agent")}
    assert {"grpcio", "protobuf", "pyyaml", "inotify-simple"} <= agent
    assert not agent & {
        "kopf",
        "kubernetes",
        # no client library: the agent's own client on http.client (docs/facts.md#client-memory)
        "pykube-ng",
        "requests",
        "urllib3",
        "cryptography",
        "jinja2",
        "patchbay-operator",
        "patchbay-devcluster",
    }
    operator = {p.split("==")[0] for p in pinned_closure("patchbay-operator")}
    assert {"kopf", "kubernetes", "jinja2", "pyyaml"} <= operator
    assert not operator & {"grpcio", "cryptography", "patchbay-agent", "patchbay-devcluster"}


def test_an_older_checkout_is_pinned_from_its_own_declared_dependencies(tmp_path: Path) -> None:
    """The upgrade test builds release 0.1.0's images from a checkout of it. Its agent declared
    pykube-ng, which this tree's agent no longer does: its image's pins come from ITS
    pyproject.toml (at this virtualenv's versions), not from this tree's installed metadata."""
    agent = next(p for p in PROGRAMS if p.name == "agent")
    assert installed_from(REPO, agent)
    assert not installed_from(tmp_path, agent)
    old = {p.split("==")[0] for p in pinned_closure("patchbay-agent", requirements=["pykube-ng>=23.6,<24"])}
    assert {"pykube-ng", "requests", "urllib3"} <= old
    assert "pykube-ng" not in {p.split("==")[0] for p in pinned_closure("patchbay-agent")}


def test_the_programs_that_read_the_api_pin_the_api_package_of_their_release() -> None:
    """The operator, the agent and the kubectl plugin share ONE package of the API (``api/``),
    pinned to the release they are; it depends on nothing (the agent's memory: only itself)."""
    api = pyproject("api")["project"]
    assert (api["name"], api["dependencies"]) == ("patchbay-api", [])
    for name in ("operator", "agent", "kubectl"):
        meta = pyproject(ALL_PROGRAMS[name])["project"]
        assert f"patchbay-api=={meta['version']}" in meta["dependencies"], name
        assert api["version"] == meta["version"]
    assert not any("patchbay-api" in d for d in pyproject("devcluster")["project"]["dependencies"])


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_both_images_get_the_api_package_built_from_its_folder(program: Any) -> None:
    """The API package is in each image's closure and is built from ``api/`` (never downloaded:
    no index has it), and a change to it changes the image's content hash (a new tag)."""
    pins = pinned_closure(program.distribution)
    shared = [s.distribution for s in shared_in(REPO, pins)]
    assert shared == ["patchbay-api"] == [s.distribution for s in SHARED]
    assert shared_in(REPO, [p for p in pins if not p.startswith("patchbay-api==")]) == []


def test_the_image_hash_covers_the_api_package(tmp_path: Path) -> None:
    for folder in ("api/patchbay_api", "operator/patchbay_operator"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "x.py").write_text("X = 1\n")
    operator = next(p for p in PROGRAMS if p.name == "operator")
    pins = ["patchbay-api==0.2.0", "kopf==1.0"]
    before = input_hash(tmp_path, operator, pins, "base")
    (tmp_path / "api" / "patchbay_api" / "x.py").write_text("X = 2\n")
    assert input_hash(tmp_path, operator, pins, "base") != before
    # An older checkout without the package (its program did not depend on it) hashes its own folder.
    assert input_hash(tmp_path, operator, ["kopf==1.0"], "base") == input_hash(
        tmp_path, operator, ["kopf==1.0"], "base"
    )
