"""The kopf glue registers handlers on profiles only; nodes are the operator's own informer's.

Checked on the source of handlers.py (every kopf decorator and what it names), because kopf
offers no public way to list a registry's handlers; the integration tests check the effect on
a real API server (no kopf annotation or finalizer ever lands on a Node).
"""

from __future__ import annotations

import ast
import inspect

import kopf

from patchbay_operator import handlers
from patchbay_operator.constants import API_GROUP, API_VERSION, PLURAL

RESOURCE_DECORATORS = {
    "on.resume",
    "on.create",
    "on.update",
    "on.delete",
    "on.field",
    "on.event",
    "index",
    "timer",
    "daemon",
}


def kopf_decorators() -> list[tuple[str, list[str]]]:
    """(decorator, its positional arguments as source) for every ``@kopf...`` in handlers.py."""
    tree = ast.parse(inspect.getsource(handlers))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call):
                    name = ast.unparse(dec.func)
                    if name.startswith("kopf."):
                        found.append((name.removeprefix("kopf."), [ast.unparse(a) for a in dec.args]))
    return found


def test_every_resource_handler_is_on_profiles_and_none_watches_nodes() -> None:
    decorators = kopf_decorators()
    on_resources = [(name, args) for name, args in decorators if name in RESOURCE_DECORATORS]
    assert {name for name, _ in on_resources} == {"on.resume", "on.create", "on.update", "on.delete"}
    for name, args in on_resources:
        assert args == ["API_GROUP", "API_VERSION", "PLURAL"], (name, args)
    assert (API_GROUP, API_VERSION, PLURAL) == ("patchbay.dev", "v1beta1", "devicepluginprofiles")
    # No daemons, timers, indexes or event handlers anywhere: each would touch every object of
    # its kind (docs/facts.md#kopf-on-nodes).
    assert not {"timer", "daemon", "index", "on.event"} & {name for name, _ in decorators}


def test_handlers_are_registered_with_stable_ids() -> None:
    source = inspect.getsource(handlers)
    for handler_id in ('id="reconcile"', 'id="release"', 'id="login"', 'id="startup"', 'id="cleanup"'):
        assert handler_id in source
    assert isinstance(kopf.get_default_registry(), kopf.OperatorRegistry)
