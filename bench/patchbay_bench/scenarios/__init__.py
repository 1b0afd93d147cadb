"""Every scenario, as ``catalogue.toml`` declares it (in the order ``make bench SCENARIO=all`` runs
them: those that need no real node first, then those on the real node, which share one cluster
with the real node and the chart), with its measuring code from the module of its name here."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path
from typing import Any

from patchbay_bench.harness import Param, Scenario, Target

CATALOGUE = Path(__file__).with_name("catalogue.toml")

KEYS = {"sitting", "about", "needs", "per_release", "quick_note", "figures", "params", "targets"}
"""What a scenario's table may hold (a misspelt key is refused, not ignored)."""


def scenario(name: str, table: dict[str, Any]) -> Scenario:
    """The scenario ``name`` of the catalogue's ``table``: its run (and, where the table names
    no figures, its figures) from the module ``scenarios/<name>.py``."""
    unknown = set(table) - KEYS
    if unknown:
        raise ValueError(
            f"{CATALOGUE.name}: [{name}] has unknown keys {sorted(unknown)}; known: {sorted(KEYS)}"
        )
    module = importlib.import_module(f"{__name__}.{name}")
    return Scenario(
        name=name,
        about=table["about"],
        run=module.run,
        params={key: Param(*value) for key, value in table.get("params", {}).items()},
        figures=tuple(table["figures"]) if "figures" in table else module.figures,
        needs=tuple(table.get("needs", ())),
        quick_note=table.get("quick_note", ""),
        per_release=table.get("per_release", False),
        sitting=table.get("sitting", "per-node"),
        targets=tuple(Target(**target) for target in table.get("targets", ())),
    )


def load(path: Path = CATALOGUE) -> dict[str, Scenario]:
    """Every scenario ``path`` declares, in its order."""
    return {name: scenario(name, table) for name, table in tomllib.loads(path.read_text()).items()}


SCENARIOS: dict[str, Scenario] = load()
