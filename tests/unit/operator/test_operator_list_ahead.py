"""``kube.continue_token``: a LIST page's continue token read from its body without decoding its
items, so the next page can be requested while this one is decoded (``Kube.list_pages``).

The real API server's bytes are in tests/integration/operator/test_operator_informer.py; here,
bodies shaped the way it writes them, and the ones that must never give a wrong token.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from patchbay_operator.kube import continue_token


def crd_list(items: list[dict[str, Any]], meta: dict[str, Any]) -> bytes:
    """A custom resource's list as the API server writes it: keys sorted, ``metadata`` last."""
    return json.dumps(
        {"apiVersion": "patchbay.dev/v1beta1", "items": items, "kind": "DeviceReportList", "metadata": meta},
        separators=(",", ":"),
        sort_keys=True,
    ).encode()


def builtin_list(items: list[dict[str, Any]], meta: dict[str, Any]) -> bytes:
    """A built-in kind's list as the API server writes it: kind, apiVersion, metadata, items."""
    body = {"kind": "NodeList", "apiVersion": "v1", "metadata": meta, "items": items}
    return json.dumps(body, separators=(",", ":")).encode()


def item(name: str, **annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": annotations}, "spec": {"node": name}}


TOKEN = "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTIsInN0YXJ0Ijoibm9kZS0wMDEifQ"


@pytest.mark.parametrize("shape", [crd_list, builtin_list])
def test_the_token_of_a_page_with_more_to_come(shape: Any) -> None:
    raw = shape([item("a"), item("b")], {"resourceVersion": "12", "continue": TOKEN})
    assert continue_token(raw) == TOKEN


@pytest.mark.parametrize("shape", [crd_list, builtin_list])
def test_the_last_page_and_an_empty_list_have_none(shape: Any) -> None:
    assert continue_token(shape([item("a")], {"resourceVersion": "12"})) == ""
    assert continue_token(shape([], {"resourceVersion": "12"})) == ""


def test_an_item_that_says_continue_is_never_taken_for_the_list() -> None:
    """The last page of a custom resource's list, whose last item carries a ``metadata`` key and a
    ``continue`` annotation, and text that looks like the list's metadata inside a string: no
    token, since the list's own metadata has none."""
    sly = item("z", **{"continue": TOKEN, "note": '"metadata":{"continue":"x"}'})
    sly["spec"]["metadata"] = {"continue": "fake"}
    raw = crd_list([item("a"), sly], {"resourceVersion": "12"})
    assert continue_token(raw) == ""
    raw = builtin_list([item("a"), sly], {"resourceVersion": "12"})
    assert continue_token(raw) == ""
    # With a token, the list's own is the one read.
    assert continue_token(crd_list([sly], {"resourceVersion": "1", "continue": TOKEN})) == TOKEN
    assert continue_token(builtin_list([sly], {"resourceVersion": "1", "continue": TOKEN})) == TOKEN


def test_a_body_it_cannot_read_so_gives_none() -> None:
    """Whatever is not one of the two shapes: "" (the caller waits for the decode instead)."""
    for raw in (
        b"",
        b"not json",
        b'{"items":[',  # cut short
        b'[{"metadata":{"continue":"x"}}]',  # not an object
        b'{"a":{"b":1},"metadata":{"continue":"x"},"items":[]}',  # a brace before it: not sure
        b'{"items":[{"metadata":{"continue":"x"}}],"kind":"L"}',  # only an item's metadata
        b'{"metadata":{"continue":"x"',  # no closing brace
    ):
        assert continue_token(raw) == "", raw


def test_whitespace_around_the_body_is_allowed() -> None:
    raw = crd_list([item("a")], {"continue": TOKEN}) + b"\n"
    assert continue_token(raw) == TOKEN
    pretty = json.dumps({"kind": "PodList", "metadata": {"continue": TOKEN}, "items": [item("a")]}, indent=2)
    assert continue_token(pretty.encode()) == TOKEN
