"""The chart's alerting rules as Prometheus gets them: its PrometheusRule, rendered by ``helm
template`` from charts/patchbay (the promtool unit tests and the e2e Prometheus both read them)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "patchbay"


def prometheus_rule(helm: Path, *sets: str) -> dict[str, Any]:
    """The PrometheusRule with ``metrics.prometheusRule.enabled=true`` and the values ``sets``
    (``key=value``, as ``helm --set`` takes them)."""
    args = [str(helm), "template", "t", str(CHART), "--show-only", "templates/prometheusrule.yaml"]
    for s in ("metrics.prometheusRule.enabled=true", *sets):
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    doc: dict[str, Any] = yaml.safe_load(out)
    return doc
