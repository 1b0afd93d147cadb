"""The one label-selector evaluator (patchbay_api.selectors) against the API server's own answers.

GO_SELECTORS is what k8s.io/apimachinery v0.37.1 says of each case: ``metav1.LabelSelectorAsSelector``
then ``Matches`` (None: the selector is refused), printed by hack/apimachinery-cases.
"""

from __future__ import annotations

from typing import Any

import pytest

from patchbay_api.selectors import (
    NO_NODE_TERM,
    LabelSelector,
    Requirement,
    SelectorError,
    any_term_matches,
    label_selector_matches,
)

In = "In"
GO_SELECTORS: list[tuple[dict[str, Any] | None, dict[str, str], bool | None]] = [
    ({}, {}, True),
    ({}, {"a": "1"}, True),
    (None, {"a": "1"}, False),
    (None, {}, False),
    ({"matchLabels": {"a": "1"}}, {"a": "1"}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
    ({"matchLabels": {"a": "1"}}, {}, False),
    ({"matchLabels": {"a": ""}}, {}, False),
    ({"matchLabels": {"a": ""}}, {"a": ""}, True),
    ({"matchLabels": {"a": "1", "b": "2"}}, {"a": "1"}, False),
    ({"matchLabels": {"a": "1", "b": "2"}}, {"a": "1", "b": "2", "c": "3"}, True),
    ({"matchExpressions": [{"key": "a", "operator": In, "values": ["1", "2"]}]}, {"a": "2"}, True),
    ({"matchExpressions": [{"key": "a", "operator": In, "values": ["1", "2"]}]}, {"a": "3"}, False),
    ({"matchExpressions": [{"key": "a", "operator": In, "values": ["1", "2"]}]}, {}, False),
    ({"matchExpressions": [{"key": "a", "operator": In, "values": [""]}]}, {}, False),
    ({"matchExpressions": [{"key": "a", "operator": In, "values": [""]}]}, {"a": ""}, True),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "2"}, True),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": [""]}]}, {"a": ""}, False),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"b": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"b": "1"}, True),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
    (
        {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]},
        {"a": "1"},
        False,
    ),
    (
        {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]},
        {"a": "1", "b": "x"},
        True,
    ),
    (
        {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]},
        {"a": "1"},
        False,
    ),
    (
        {"matchExpressions": [{"key": "a", "operator": "Exists"}, {"key": "a", "operator": "DoesNotExist"}]},
        {"a": "1"},
        False,
    ),
    ({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, {"a": "2"}, None),
    ({"matchExpressions": [{"key": "a", "operator": "Bogus"}]}, {"a": "2"}, None),
]


@pytest.mark.parametrize(("selector", "labels", "matches"), GO_SELECTORS)
def test_a_label_selector_matches_as_the_api_server_says(
    selector: dict[str, Any] | None, labels: dict[str, str], matches: bool | None
) -> None:
    if matches is None:
        with pytest.raises(SelectorError, match=r"selector\.matchExpressions\[0\]\.operator"):
            label_selector_matches(selector, labels)
    else:
        assert label_selector_matches(selector, labels) is matches


@pytest.mark.parametrize(
    ("operator", "values", "label", "matches"),
    [
        ("Gt", ["3"], "4", True),
        ("Gt", ["3"], "3", False),
        ("Gt", ["-1"], "0", True),
        ("Lt", ["3"], "2", True),
        ("Lt", ["3"], "+3", False),
        ("Lt", ["3"], "two", False),
        ("Gt", ["3"], None, False),
    ],
)
def test_node_selector_requirements_compare_integers(
    operator: str, values: list[str], label: str | None, matches: bool
) -> None:
    """Gt/Lt, the node affinity operators: the label and the one value as integers."""
    r = Requirement.parse({"key": "n", "operator": operator, "values": values}, "terms[0][0]")
    assert r.matches({} if label is None else {"n": label}) is matches


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"key": "n", "operator": "Gt", "values": ["1", "2"]}, "t.values"),
        ({"key": "n", "operator": "Lt", "values": ["x"]}, "t.values"),
        ({"key": "n", "operator": ["In"]}, "t.operator"),
        ({"operator": "In"}, "t"),
        ({"key": "n", "operator": "In", "values": "a"}, "t.values"),
    ],
)
def test_a_bad_requirement_is_refused_naming_its_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(SelectorError) as e:
        Requirement.parse(raw, "t")
    assert e.value.field == field


def test_negation_is_exact_and_terms_exclude_a_selector() -> None:
    """``node_selector_terms(excluding)`` selects exactly the nodes this selector matches and
    the other does not, for every combination of the labels involved."""
    mine = LabelSelector.parse({"matchLabels": {"gpu": "yes"}})
    other = LabelSelector.parse({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]})
    terms = [
        LabelSelector.of_requirements(Requirement.parse(e, "e") for e in term)
        for term in mine.node_selector_terms(excluding=other)
    ]
    for gpu in (None, "yes", "no"):
        for zone in (None, "a", "b"):
            labels = {k: v for k, v in {"gpu": gpu, "zone": zone}.items() if v is not None}
            want = mine.matches(labels) and not other.matches(labels)
            assert any_term_matches(terms, labels) is want, labels
    # Excluding the empty selector (every node) leaves one term no node meets.
    assert mine.node_selector_terms(excluding=LabelSelector()) == [
        [{"key": "gpu", "operator": "In", "values": ["yes"]}, NO_NODE_TERM]
    ]
    assert not any_term_matches([], {"gpu": "yes"})
