"""The hand-written Prometheus text format's edges, read back with prometheus-client's parser:
escaping, special values, and the names it refuses when a metric is declared. (What the agent
exports after real activity: tests/agent/test_agent_metrics.py.)"""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from patchbay_agent.metrics import Counter, Gauge, Histogram, Registry


def _parsed(registry: Registry) -> dict[str, tuple[str, str, list[tuple[str, dict[str, str], float]]]]:
    return {
        f.name: (f.type, f.documentation, [(s.name, s.labels, s.value) for s in f.samples])
        for f in text_string_to_metric_families(registry.render().decode())
    }


def test_help_and_label_values_are_escaped_and_read_back_unchanged() -> None:
    r = Registry()
    g = Gauge(r, "x_things", 'Help with a \\ backslash,\na line feed and "quotes".', ["path"])
    g.labels('C:\\dir\n"q"').set(2)
    g.labels("").set(3)
    assert _parsed(r) == {
        "x_things": (
            "gauge",
            'Help with a \\ backslash,\na line feed and "quotes".',
            [("x_things", {"path": ""}, 3.0), ("x_things", {"path": 'C:\\dir\n"q"'}, 2.0)],
        )
    }
    assert r.render().count(b"\n") == 4  # HELP, TYPE, two samples: no raw line feed leaked


def test_special_values_are_written_as_the_format_spells_them() -> None:
    r = Registry()
    g = Gauge(r, "x_value", "A value.", ["kind"])
    for kind, v in (("nan", math.nan), ("inf", math.inf), ("ninf", -math.inf), ("tiny", 1e-7)):
        g.labels(kind).set(v)
    text = r.render().decode()
    assert 'x_value{kind="nan"} NaN\n' in text
    assert 'x_value{kind="inf"} +Inf\n' in text
    assert 'x_value{kind="ninf"} -Inf\n' in text
    values = {s[1]["kind"]: s[2] for s in _parsed(r)["x_value"][2]}
    assert math.isnan(values.pop("nan"))
    assert values == {"inf": math.inf, "ninf": -math.inf, "tiny": 1e-7}


def test_a_histogram_without_observations_is_complete_and_zero() -> None:
    r = Registry()
    Histogram(r, "x_seconds", "Durations.", [0.5, 0.1])
    _, _, samples = _parsed(r)["x_seconds"]
    assert samples == [
        ("x_seconds_bucket", {"le": "0.1"}, 0.0),
        ("x_seconds_bucket", {"le": "0.5"}, 0.0),
        ("x_seconds_bucket", {"le": "+Inf"}, 0.0),
        ("x_seconds_sum", {}, 0.0),
        ("x_seconds_count", {}, 0.0),
    ]


@pytest.mark.parametrize(
    ("declare", "message"),
    [
        (lambda r: Gauge(r, "0starts_with_a_digit", "x"), "invalid metric name"),
        (lambda r: Gauge(r, "has-dash", "x"), "invalid metric name"),
        (lambda r: Gauge(r, "x_ok", "x", ["bad-label"]), "invalid label name"),
        (lambda r: Gauge(r, "x_ok", "x", ["__reserved"]), "invalid label name"),
        (lambda r: Gauge(r, "x_ok", "x", ["le"]), "invalid label name"),
        (lambda r: Gauge(r, "x_ok", "x", ["a", "a"]), "duplicate label names"),
        (lambda r: Histogram(r, "x_h", "x", []), "buckets"),
        (lambda r: Histogram(r, "x_h", "x", [1.0, 1.0]), "buckets"),
        (lambda r: Histogram(r, "x_h", "x", [1.0, math.inf]), "buckets"),
    ],
)
def test_bad_declarations_fail_at_once(declare: object, message: str) -> None:
    assert callable(declare)
    with pytest.raises(ValueError, match=message):
        declare(Registry())


def test_names_that_collide_are_refused() -> None:
    r = Registry()
    Histogram(r, "x_seconds", "Durations.", [1.0])
    Counter(r, "x_total", "Things.")
    with pytest.raises(ValueError, match="collides"):
        Gauge(r, "x_seconds_count", "Would be read as the histogram's count.")
    with pytest.raises(ValueError, match="collides"):
        Counter(r, "x_total", "Twice.")


def test_counters_only_go_up_and_labels_must_match() -> None:
    r = Registry()
    c = Counter(r, "x_calls_total", "Calls.", ["method"])
    c.labels("A").inc(2)
    with pytest.raises(ValueError, match="only goes up"):
        c.labels("A").inc(-1)
    with pytest.raises(ValueError, match="takes labels"):
        c.labels("A", "B")
    with pytest.raises(ValueError, match="takes labels"):
        c.inc()
    assert c.labels("A").value == 2
