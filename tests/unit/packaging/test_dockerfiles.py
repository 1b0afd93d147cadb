"""The Dockerfiles match the package: no engine runs here, so their contract is checked as text.

Checked: every COPY source exists; bases are pinned to an exact version (never :latest);
the entry point is one of pyproject's console scripts; the operator runs as non-root; the
agent installs exactly the runtime dependencies pyproject declares for it, at the same pins.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
DOCKERFILES = {"operator": REPO / "operator" / "Dockerfile", "agent": REPO / "plugin-agent" / "Dockerfile"}
AGENT_DEPS = {"grpcio", "protobuf", "pykube-ng", "pyyaml", "inotify-simple"}


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


@pytest.mark.parametrize("name", DOCKERFILES)
def test_copy_sources_exist(name: str) -> None:
    for word, rest in instructions(DOCKERFILES[name]):
        if word == "COPY" and "--from=" not in rest:
            *sources, _dest = rest.split()
            for src in sources:
                assert (REPO / src).exists(), f"{name}: COPY {src} does not exist"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_base_images_are_pinned(name: str) -> None:
    ins = instructions(DOCKERFILES[name])
    args = dict(rest.split("=", 1) for w, rest in ins if w == "ARG" and "=" in rest)
    froms = [rest.split()[0] for w, rest in ins if w == "FROM"]
    assert len(froms) >= 2, "multi-stage build expected"
    for raw in froms:
        ref = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], raw)
        assert re.fullmatch(r"[\w./-]+:\d+\.\d+\.\d+[\w.-]*", ref), f"{name}: base {ref} is not pinned"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_entrypoint_is_a_console_script(name: str) -> None:
    final = final_stage(instructions(DOCKERFILES[name]))
    entry = [rest for w, rest in final if w == "ENTRYPOINT"]
    assert entry, f"{name}: no ENTRYPOINT"
    script = re.findall(r'"([^"]+)"', entry[-1])[0]
    assert script in PYPROJECT["project"]["scripts"], f"{name}: {script} is not a console script"
    assert script == f"patchbay-{name}"


def test_operator_runs_as_non_root() -> None:
    users = [rest for w, rest in final_stage(instructions(DOCKERFILES["operator"])) if w == "USER"]
    assert users
    uid = users[-1].split(":")[0]
    assert uid.isdigit()
    assert int(uid) != 0


def test_agent_installs_its_declared_dependencies_at_the_same_pins() -> None:
    declared = {}
    for dep in PYPROJECT["project"]["dependencies"]:
        m = re.match(r"([A-Za-z0-9_.-]+)(.*)", dep)
        assert m
        declared[m.group(1).lower()] = m.group(2).strip()
    text = DOCKERFILES["agent"].read_text()
    installed = dict(re.findall(r'"([A-Za-z0-9_.-]+)([<>=!~][^"]*)"', text))
    installed = {k.lower(): v for k, v in installed.items()}
    assert set(installed) == AGENT_DEPS
    for name, spec in installed.items():
        assert declared[name] == spec, f"{name}: Dockerfile {spec} vs pyproject {declared[name]}"
    assert "--no-deps ." in text
