"""What Argo CD and Flux say about a profile, computed by their own code (tests/conformance/gitopshealth).

``evaluate`` runs the project's Argo CD health check (examples/gitops/argocd/...; the Lua VM Argo
CD embeds, under its conventions) and kstatus (sigs.k8s.io/cli-utils, what Flux reads) on each
object, through the Go program built by hack/go-peer.sh (cached outside the repository). ``agrees``
is the one rule both tests hold the two tools to, state for state; docs/operations.md#gitops says
the same rule in words.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support import gopeer

REPO = Path(__file__).resolve().parents[2]
CHECK_DIR = REPO / "examples/gitops/argocd/resource_customizations/patchbay.dev/DevicePluginProfile"
HEALTH_LUA = CHECK_DIR / "health.lua"


@dataclass(frozen=True)
class Verdict:
    """Each tool's answer for one object: Argo CD's (status, message) with argocd-cm's libraries and
    with all of them (built-in scripts), and kstatus's (status, message)."""

    argocd: tuple[str, str]
    argocd_open_libs: tuple[str, str]
    kstatus: tuple[str, str]


def build() -> Path:
    """The gitopshealth binary (a cold build downloads and compiles its modules: a minute or two).
    A failed build raises: never a skip."""
    return gopeer.build("gitopshealth")


def evaluate(binary: Path, objects: list[dict[str, Any]], script: Path = HEALTH_LUA) -> list[Verdict]:
    """One Verdict per object, in order; an object the script or kstatus cannot evaluate raises
    with the tool's own error."""
    stdin = "".join(json.dumps(o) + "\n" for o in objects)
    out = subprocess.run(
        [str(binary), str(script)], input=stdin, capture_output=True, text=True, timeout=120, check=True
    )
    verdicts = []
    for obj, line in zip(objects, out.stdout.splitlines(), strict=True):
        r = json.loads(line)
        if "error" in r:
            name = (obj.get("metadata") or {}).get("name")
            raise AssertionError(f"{name}: {r['error']}")
        verdicts.append(
            Verdict(
                (r["argocd"]["status"], r["argocd"]["message"]),
                (r["argocdOpenLibs"]["status"], r["argocdOpenLibs"]["message"]),
                (r["kstatus"]["status"], r["kstatus"]["message"]),
            )
        )
    return verdicts


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def agrees(obj: dict[str, Any], verdict: Verdict) -> str | None:
    """None when Argo CD's and Flux's answers agree for ``obj``, else why not.

    The rule: Healthy is Current; Progressing is InProgress (or Terminating, while the profile is
    deleted); Degraded is Failed when the profile is Stalled. Two gaps of kstatus, where the rule
    says what kstatus does instead: it has no state for "works, but not all of it" (Degraded=True,
    not Stalled), where Argo CD says Degraded and kstatus what Ready says (Current, or
    InProgress); and it reads an object with no status at all (a profile the operator has not
    written to yet, in the moment after its creation) as Current, where the check says
    Progressing; and it has no Suspended (a paused rollout, as Argo CD says of a paused
    Deployment), where kstatus says what the conditions say. The script gives the same answer
    with argocd-cm's libraries as with all of them."""
    argo, ks = verdict.argocd[0], verdict.kstatus[0]
    if verdict.argocd != verdict.argocd_open_libs:
        return (
            f"the script answers {verdict.argocd} with argocd-cm's libraries,"
            f" {verdict.argocd_open_libs} with all of them"
        )
    conds = conditions(obj)
    stalled = (conds.get("Stalled") or {}).get("status") == "True"
    expected: set[str]
    if argo == "Healthy":
        expected = {"Current"}
    elif argo == "Progressing":
        expected = {"InProgress", "Terminating"} | ({"Current"} if not obj.get("status") else set())
    elif argo == "Degraded":
        expected = {"Failed"} if stalled else {"Current", "InProgress"}
    elif argo == "Suspended":
        # kstatus has no "paused": what the conditions say (a paused rollout is not finished).
        expected = {"Current", "InProgress"}
    else:
        return f"Argo CD status {argo!r} is not one the check should give for a profile"
    if ks not in expected:
        return f"Argo CD says {argo} ({verdict.argocd[1]!r}) but kstatus says {ks} ({verdict.kstatus[1]!r})"
    return None
