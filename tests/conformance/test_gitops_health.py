"""The project's Argo CD health check, run as Argo CD runs it, on statuses recorded on the real node.

examples/gitops/argocd/resource_customizations/patchbay.dev/DevicePluginProfile/ is laid out as
the argo-cd repository's own resource_customizations/ (health.lua, health_test.yaml, testdata/),
so it can be offered upstream unchanged. Its testdata were recorded by
tests/e2e/test_gitops_health_on_real_node.py (`make record-gitops-health`), not written by hand.

Here each test case is evaluated by the Lua VM Argo CD embeds under Argo CD's conventions, with
argocd-cm's libraries and with all of them, and by kstatus (Flux's library): the expected health
holds, the two tools agree state for state (support/gitopshealth.agrees), and every condition type
the CRD allows is one the check maps.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.gitopshealth import CHECK_DIR, HEALTH_LUA, REPO, agrees, build, conditions, evaluate

CRD = REPO / "crds" / "patchbay.dev_devicepluginprofiles.yaml"


@pytest.fixture(scope="module")
def gitopshealth() -> Path:
    return build()


def cases() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    spec = yaml.safe_load((CHECK_DIR / "health_test.yaml").read_text())
    return [
        (t["healthStatus"], yaml.safe_load((CHECK_DIR / t["inputPath"]).read_text())) for t in spec["tests"]
    ]


def test_each_recorded_status_gets_its_health_and_kstatus_agrees(gitopshealth: Path) -> None:
    recorded = cases()
    verdicts = evaluate(gitopshealth, [obj for _, obj in recorded])
    for (expected, obj), verdict in zip(recorded, verdicts, strict=True):
        name = obj["metadata"]["name"]
        assert verdict.argocd == (expected["status"], expected["message"]), (name, verdict)
        assert agrees(obj, verdict) is None, (name, agrees(obj, verdict))
    assert {e["status"] for e, _ in recorded} >= {"Healthy", "Progressing", "Degraded"}


def test_a_check_that_calls_a_stalled_profile_healthy_is_caught(gitopshealth: Path, tmp_path: Path) -> None:
    """The judge can fail: the same cases against a check broken on purpose (Stalled read as
    Healthy) give a wrong expected health AND a disagreement with kstatus."""
    broken = tmp_path / "health.lua"
    text = HEALTH_LUA.read_text()
    marker = 'if conds.Stalled ~= nil and conds.Stalled.status == "True" then\n  hs.status = "Degraded"'
    assert marker in text
    broken.write_text(text.replace(marker, marker.replace('"Degraded"', '"Healthy"')))
    recorded = cases()
    verdicts = evaluate(gitopshealth, [obj for _, obj in recorded], script=broken)
    stalled = [
        (e, v, obj)
        for (e, obj), v in zip(recorded, verdicts, strict=True)
        if e["status"] == "Degraded" and (conditions(obj).get("Stalled") or {}).get("status") == "True"
    ]
    assert stalled, "the recorded cases hold no profile Degraded for being Stalled"
    for expected, verdict, obj in stalled:
        assert verdict.argocd[0] != expected["status"]
        assert agrees(obj, verdict) is not None


def condition_types_in_crd() -> set[str]:
    """The condition types the CRD allows (an enum in every served version's status schema)."""
    types: set[str] = set()
    for doc in yaml.safe_load_all(CRD.read_text()):
        for version in doc["spec"]["versions"]:
            conds = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"]
            types.update(conds["items"]["properties"]["type"]["enum"])
    return types


def test_every_condition_type_of_the_crd_is_mapped_by_the_check() -> None:
    mapped = set(re.findall(r"\bconds\.(\w+)\b", HEALTH_LUA.read_text()))
    crd = condition_types_in_crd()
    assert crd, "the CRD lists no condition types"
    assert crd <= mapped, f"condition types the Argo CD check does not map: {sorted(crd - mapped)}"


def rollout_states() -> list[tuple[str, str, dict[str, Any]]]:
    """A staged rollout's states (issue 45), each made from the recorded Healthy profile
    (testdata/fixed.yaml) by what the operator's waves write by the CRD's contract (spec.rollout,
    status.rollout, Stalled; Reconciling True while a wave moves, or Flux would read the profile
    as Current while Argo CD says Progressing): (expected Argo CD status and message, the object).
    Written here, not recorded: `make record-gitops-health` rewrites testdata/ from the real node."""
    base = yaml.safe_load((CHECK_DIR / "testdata" / "fixed.yaml").read_text())

    def state(rollout: dict[str, Any] | None, paused: bool = False, stalled: str = "") -> dict[str, Any]:
        obj = copy.deepcopy(base)
        if rollout is not None:
            obj["status"]["rollout"] = rollout
        if (rollout or {}).get("phase") == "Progressing":
            # A wave moving is work that finishes by itself: Reconciling, as kstatus reads it.
            for c in obj["status"]["conditions"]:
                if c["type"] == "Reconciling":
                    c.update(status="True", reason="RollingOut", message=rollout["message"])
        if paused:
            obj["spec"]["rollout"] = {"paused": True}
        if stalled:
            for c in obj["status"]["conditions"]:
                if c["type"] == "Stalled":
                    c.update(status="True", reason="RolloutHalted", message=stalled)
                if c["type"] == "Ready":
                    c.update(status="False", reason="RolloutHalted", message=stalled)
        return obj

    wave = {"phase": "Progressing", "wave": 2, "waveNodes": 3, "message": "wave 2: 3 nodes held for 30s"}
    halted = "rollout halted in wave 1: node n1 reports 0 of 4 devices healthy (was 4)"
    return [
        ("Progressing", "wave 2: 3 nodes held for 30s", state(wave)),
        ("Suspended", "paused at wave 2", state({**wave, "phase": "Paused", "message": "paused at wave 2"})),
        # The user's field alone, before the operator says Paused: already Suspended.
        ("Suspended", "wave 2: 3 nodes held for 30s", state(wave, paused=True)),
        ("Degraded", halted, state({"phase": "Halted", "wave": 1, "message": "m"}, stalled=halted)),
        (
            "Degraded",
            "node n1 regressed",
            state({"phase": "Halted", "wave": 1, "message": "node n1 regressed"}),
        ),
        ("Healthy", "1 agent available", state({"phase": "Complete", "wave": 4, "message": ""})),
    ]


def test_a_staged_rollout_maps_to_argo_cds_suspended_degraded_and_progressing(gitopshealth: Path) -> None:
    states = rollout_states()
    verdicts = evaluate(gitopshealth, [obj for _, _, obj in states])
    for (status, message, obj), verdict in zip(states, verdicts, strict=True):
        assert verdict.argocd == (status, message), (status, message, verdict)
        assert agrees(obj, verdict) is None, agrees(obj, verdict)


def test_a_check_that_ignores_a_paused_rollout_is_caught(gitopshealth: Path, tmp_path: Path) -> None:
    broken = tmp_path / "health.lua"
    text = HEALTH_LUA.read_text()
    marker = 'if paused or rollout.phase == "Paused" then'
    assert marker in text
    broken.write_text(text.replace(marker, "if false then"))
    states = [s for s in rollout_states() if s[0] == "Suspended"]
    verdicts = evaluate(gitopshealth, [obj for _, _, obj in states], script=broken)
    assert all(v.argocd[0] != "Suspended" for v in verdicts), verdicts
