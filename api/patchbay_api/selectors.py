"""Label selectors with the API server's semantics: the one evaluator every Patchbay program uses.

A ``LabelSelector`` is metav1.LabelSelector: ``matchLabels`` and ``matchExpressions``, all of which
must hold (apimachinery's ``LabelSelectorAsSelector`` and ``labels.Requirement.Matches``):

- ``In``: the label is set and its value is listed; ``NotIn``: the label is absent or its value is
  not listed (a node without the key satisfies NotIn); ``Exists`` / ``DoesNotExist``: the key is
  set / absent, whatever its value;
- the EMPTY selector (``{}``) matches everything; a NULL one (``None``) matches nothing
  (``label_selector_matches``). Where Patchbay's API gives an absent selector another meaning
  (a profile's ``spec.nodeSelector``: every node), the caller says so by passing ``{}``.

Node selector requirements (a pod's node affinity, the node agent's ``nodeSelectorTerms``) add
``Gt`` and ``Lt``: the label is set, it and the one value are integers, and it is greater / less.
``parse`` refuses what the API server refuses for the operator (an unknown operator; ``Gt``/``Lt``
without exactly one integer value) with a ``SelectorError`` naming the field, and evaluates the
rest as the API server would.

A selector also turns into node affinity terms (``node_selector_terms``): a DaemonSet's
``nodeSelector`` cannot say ``NotIn``, so the operator pins its agents with nodeAffinity.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from patchbay_api.constants import NO_NODE_LABEL

#: The operators of a metav1.LabelSelector's matchExpressions.
LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
#: The operators of a node selector requirement (node affinity): the label operators, Gt and Lt.
NODE_OPERATORS = (*LABEL_OPERATORS, "Gt", "Lt")
_NEGATION = {"In": "NotIn", "NotIn": "In", "Exists": "DoesNotExist", "DoesNotExist": "Exists"}


class SelectorError(ValueError):
    """A selector the API server would refuse; the message names the field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class Requirement:
    """One requirement: ``key``, ``operator``, ``values`` (ANDed with the others of its selector)."""

    key: str
    operator: str
    values: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, raw: Any, field: str, operators: Iterable[str] = NODE_OPERATORS) -> Requirement:
        """One matchExpressions item; ``operators`` are those allowed where it stands."""
        if not isinstance(raw, Mapping) or not isinstance(raw.get("key"), str):
            raise SelectorError(field, "must be an expression with a key")
        allowed = tuple(operators)
        operator = raw.get("operator")
        if not isinstance(operator, str) or operator not in allowed:  # a list is unhashable
            raise SelectorError(f"{field}.operator", f"must be one of {sorted(allowed)}")
        values = raw.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise SelectorError(f"{field}.values", "must be a list of strings")
        if operator in ("Gt", "Lt") and (len(values) != 1 or _integer(values[0]) is None):
            raise SelectorError(f"{field}.values", f"{operator} needs exactly one integer value")
        return cls(raw["key"], operator, frozenset(values))

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if op in ("Gt", "Lt"):
            have = _integer(value) if value is not None else None
            want = _integer(next(iter(self.values))) if len(self.values) == 1 else None
            if have is None or want is None:
                return False
            return have > want if op == "Gt" else have < want
        raise SelectorError("operator", f"{op!r} is not one of {list(NODE_OPERATORS)}")

    def negated(self) -> Requirement:
        """The requirement a node meets exactly when it does not meet this one (a node without
        the key meets NotIn and DoesNotExist, so the pairs are exact); label operators only."""
        return Requirement(self.key, _NEGATION[self.operator], self.values)

    def as_expression(self) -> dict[str, Any]:
        """The requirement as the API writes it (values sorted; none for Exists/DoesNotExist)."""
        e: dict[str, Any] = {"key": self.key, "operator": self.operator}
        if self.values:
            e["values"] = sorted(self.values)
        return e


def _integer(text: str) -> int | None:
    """A label value as Gt/Lt compare it (Go's strconv.ParseInt, base 10), or None."""
    body = text[1:] if text[:1] in ("+", "-") else text
    return int(text) if body.isascii() and body.isdigit() else None


#: A node selector term no node meets: the label is ours and never set.
NO_NODE_TERM: dict[str, Any] = {"key": NO_NODE_LABEL, "operator": "Exists"}


@dataclass(frozen=True)
class LabelSelector:
    """A metav1.LabelSelector; the empty one matches everything."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[Requirement, ...] = ()

    @classmethod
    def parse(cls, raw: Mapping[str, Any], field: str = "selector") -> LabelSelector:
        """``raw`` as the API returns it (``{}``: the empty selector). SelectorError names the
        field of anything the API server would refuse."""
        if not isinstance(raw, Mapping):
            raise SelectorError(field, "must be a label selector (matchLabels, matchExpressions)")
        match_labels = raw.get("matchLabels") or {}
        if not isinstance(match_labels, Mapping):
            raise SelectorError(f"{field}.matchLabels", "must be a mapping of labels")
        exprs = raw.get("matchExpressions") or []
        if not isinstance(exprs, list):
            raise SelectorError(f"{field}.matchExpressions", "must be a list of expressions")
        return cls(
            tuple(sorted((str(k), str(v)) for k, v in match_labels.items())),
            tuple(
                Requirement.parse(e, f"{field}.matchExpressions[{i}]", LABEL_OPERATORS)
                for i, e in enumerate(exprs)
            ),
        )

    @classmethod
    def of_requirements(cls, requirements: Iterable[Requirement]) -> LabelSelector:
        """A selector of requirements alone (a node selector term's matchExpressions)."""
        return cls((), tuple(requirements))

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            r.matches(labels) for r in self.match_expressions
        )

    def requirements(self) -> tuple[Requirement, ...]:
        """matchLabels as ``In`` requirements, then matchExpressions: the selector is their AND."""
        return (
            tuple(Requirement(k, "In", frozenset({v})) for k, v in self.match_labels) + self.match_expressions
        )

    def as_node_affinity_terms(self) -> list[dict[str, Any]]:
        """The selector as nodeAffinity matchExpressions (a DaemonSet's nodeSelector cannot say NotIn)."""
        return [r.as_expression() for r in self.requirements()]

    def node_selector_terms(self, excluding: LabelSelector | None = None) -> list[list[dict[str, Any]]]:
        """nodeAffinity nodeSelectorTerms (ORed lists of ANDed expressions) for this selector, and
        with ``excluding``, for "this selector AND NOT that one": NOT(r1 AND r2 ...) is
        (NOT r1) OR (NOT r2) ..., so one term per requirement of ``excluding``, each this
        selector's expressions plus that requirement negated. An empty ``excluding`` selects every
        node, so nothing is left: one term no node meets."""
        own = self.as_node_affinity_terms()
        if excluding is None:
            return [own]
        others = excluding.requirements()
        if not others:
            return [[*own, NO_NODE_TERM]]
        return [[*own, r.negated().as_expression()] for r in others]


def label_selector_matches(raw: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A label selector as the API returns it against ``labels``: a null selector matches
    nothing, an empty one everything (``LabelSelectorAsSelector``)."""
    if raw is None:
        return False
    return LabelSelector.parse(raw).matches(labels)


def any_term_matches(terms: Iterable[LabelSelector], labels: Mapping[str, str]) -> bool:
    """ORed terms, each ANDed requirements; no term at all matches nothing (a NodeSelector)."""
    return any(term.matches(labels) for term in terms)
