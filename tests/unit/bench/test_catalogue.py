"""The scenarios' one declaration, bench/patchbay_bench/scenarios/catalogue.toml: every scenario
module has its table and every table its module, a misspelt key is refused, and what the
catalogue repeats of a module's constants agrees with them."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchbay_bench import scenarios
from patchbay_bench.scenarios import CATALOGUE, SCENARIOS, load, rollout_scale, rollouts


def test_every_scenario_module_has_a_table_and_every_table_a_module() -> None:
    modules = {p.stem for p in CATALOGUE.parent.glob("*.py") if p.stem != "__init__"}
    assert set(SCENARIOS) == modules


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_scenario_names_its_figures_at_either_size_and_helps_with_each_parameter(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # rollouts names its figures after the release of the Kubernetes binaries: none here.
    monkeypatch.setattr(rollouts, "kube_release", lambda: "v1.0.0")
    sc = SCENARIOS[name]
    assert sc.about and sc.run.__module__ == f"{scenarios.__name__}.{name}"
    for size in ("full", "quick"):
        assert sc.figure_names({k: getattr(p, size) for k, p in sc.params.items()}), size
    for key, p in sc.params.items():
        assert p.help, key
        assert type(p.quick) is type(p.full), key  # the quick size parses as the full one does


def test_a_misspelt_key_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "catalogue.toml"
    bad.write_text('[devcluster]\nabout = "x"\nfigure = ["a"]\n')
    with pytest.raises(ValueError, match=r"\[devcluster\] has unknown keys \['figure'\]"):
        load(bad)


def test_the_halt_target_is_the_canary_of_the_code() -> None:
    (target,) = SCENARIOS["rollout_scale"].targets
    assert (target.figure, target.at_most) == (rollout_scale.HALT_FIGURE, float(rollout_scale.CANARY))
