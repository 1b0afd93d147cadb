"""Reading the agent's /metrics the way Prometheus would: prometheus-client's own parser (a dev
dependency; the agent itself never imports it), plus the checks that parser does not make
(it is lax: a sample before its TYPE line becomes an untyped family instead of an error)."""

from __future__ import annotations

import math
import re
from itertools import pairwise
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
#: What each family TYPE may name its samples (the parser keeps counters' `_total` on samples
#: and strips it from the family name).
SAMPLE_SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def parse(text: str) -> dict[str, Metric]:
    """Every family by name, after checking what Prometheus requires of the exposition.

    Every family has HELP and TYPE (exactly once each), names and label names are valid, every
    sample belongs to its family, no series appears twice, and every histogram is coherent (see
    `check_histogram`; its observations must be >= 0, as durations are).
    """
    assert text.endswith("\n"), "the exposition must end with a line feed"
    families: dict[str, Metric] = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in families, f"family {family.name} appears twice"
        families[family.name] = family
        assert family.type in SAMPLE_SUFFIXES, f"{family.name}: TYPE {family.type} (missing TYPE line?)"
        assert family.documentation, f"{family.name}: no HELP"
        raw_name = family.name + ("_total" if family.type == "counter" else "")
        assert text.count(f"# HELP {raw_name} ") == 1, f"{raw_name}: HELP not exactly once"
        assert text.count(f"# TYPE {raw_name} {family.type}\n") == 1, f"{raw_name}: TYPE not exactly once"
        assert METRIC_NAME.fullmatch(family.name), family.name
        names = {family.name + suffix for suffix in SAMPLE_SUFFIXES[family.type]}
        seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        for s in family.samples:
            assert s.name in names, f"{s.name} does not belong to {family.type} {family.name}"
            for label in s.labels:
                assert LABEL_NAME.fullmatch(label) and not label.startswith("__"), f"{s.name}: {label!r}"
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in seen, f"series {key} appears twice"
            seen.add(key)
            assert s.timestamp is None
            if family.type != "gauge":
                assert s.value >= 0, f"{s.name}{s.labels} = {s.value}"
        if family.type == "histogram":
            for series in histogram_series(family):
                check_histogram(series)
    return families


def histogram_series(family: Metric) -> list[Metric]:
    """A histogram family as one family per series (its labels but `le`): the node agent's
    histograms carry a `profile` label, one series per profile."""
    groups: dict[tuple[tuple[str, str], ...], list[Any]] = {}
    for s in family.samples:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        groups.setdefault(key, []).append(s._replace(labels={k: v for k, v in s.labels.items() if k == "le"}))
    out = []
    for samples in groups.values():
        series = Metric(family.name, family.documentation, family.type)
        series.samples = samples
        out.append(series)
    return out


def histogram_parts(family: Metric) -> tuple[list[tuple[float, float]], float, float]:
    """([(le, cumulative count)...] in the exposition's order, _sum, _count)."""
    buckets = [(float(s.labels["le"]), s.value) for s in family.samples if s.name == family.name + "_bucket"]
    (total,) = [s.value for s in family.samples if s.name == family.name + "_sum"]
    (count,) = [s.value for s in family.samples if s.name == family.name + "_count"]
    return buckets, total, count


def check_histogram(family: Metric) -> None:
    """Bounds strictly increase up to le="+Inf"; cumulative counts never decrease; the +Inf
    bucket equals _count; _sum lies within what the buckets allow for observations >= 0: at
    least each bucket's count times the bound below it, at most times its own bound."""
    buckets, total, count = histogram_parts(family)
    assert buckets, f"{family.name}: no buckets"
    for s in family.samples:
        expected = {"le"} if s.name.endswith("_bucket") else set()
        assert set(s.labels) == expected, f"{s.name}: labels {s.labels}"
    bounds = [le for le, _ in buckets]
    cumulative = [n for _, n in buckets]
    assert all(a < b for a, b in pairwise(bounds)), f"{family.name}: bounds {bounds}"
    assert bounds[-1] == math.inf, f'{family.name}: no le="+Inf" bucket'
    assert all(a <= b for a, b in pairwise(cumulative)), f"{family.name}: buckets {cumulative}"
    assert all(n == int(n) for n in cumulative), f"{family.name}: fractional counts {cumulative}"
    assert cumulative[-1] == count, f'{family.name}: le="+Inf" {cumulative[-1]} != _count {count}'
    lowest = highest = 0.0
    below, before = 0.0, 0.0
    for le, n in buckets:
        lowest += below * (n - before)
        highest += le * (n - before) if n > before else 0.0
        below, before = le, n
    slack = 1e-9 * max(1.0, abs(total))
    assert lowest - slack <= total <= highest + slack, (
        f"{family.name}: _sum {total} is outside [{lowest}, {highest}]"
    )
    if count == 0:
        assert total == 0


def value(families: dict[str, Metric], sample: str, **labels: str) -> float:
    """One sample's value, by its sample name (counters end in `_total`) and exact labels."""
    for family in families.values():
        for s in family.samples:
            if s.name == sample and s.labels == labels:
                return float(s.value)
    raise KeyError(f"no sample {sample}{labels}")
