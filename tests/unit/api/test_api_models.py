"""The typed models and the names of patchbay_api, held to the CRDs in crds/ (the API's truth):
every field a model names exists in the schema with a matching type, and every enum the
package declares is the schema's."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints, is_typeddict

import pytest
import yaml

from patchbay_api import constants, models

REPO = Path(__file__).resolve().parents[3]
SCHEMA_TYPES = {str: "string", int: "integer", bool: "boolean", dict: "object", list: "array"}


def schema(crd: str) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "crds" / crd).read_text())
    version = next(v for v in doc["spec"]["versions"] if v["name"] == constants.API_VERSION)
    return dict(version["schema"]["openAPIV3Schema"])


PROFILE = schema("patchbay.dev_devicepluginprofiles.yaml")
REPORT = schema("patchbay.dev_devicereports.yaml")


def mismatches(model: Any, node: dict[str, Any], path: str) -> list[str]:
    """Every field of ``model`` (a TypedDict) the schema ``node`` lacks or types otherwise."""
    out = []
    props = node.get("properties") or {}
    for name, hint in get_type_hints(model).items():
        where = f"{path}.{name}"
        if name not in props:
            out.append(f"{where}: not in the CRD")
            continue
        out += type_mismatches(hint, props[name], where)
    return out


def type_mismatches(hint: Any, node: dict[str, Any], where: str) -> list[str]:
    if hint is models.ObjectMeta:
        return [] if node.get("type") == "object" else [f"{where}: metadata is not an object"]
    if is_typeddict(hint):
        if node.get("type") != "object":
            return [f"{where}: the CRD says {node.get('type')}, the model an object"]
        return mismatches(hint, node, where)
    origin = get_origin(hint) or hint
    if (origin is typing.Union or origin is types.UnionType) and node.get("x-kubernetes-int-or-string"):
        return [] if set(get_args(hint)) == {int, str} else [f"{where}: int-or-string, the model {hint}"]
    if origin is typing.Union or origin is types.UnionType:
        return [] if any(not type_mismatches(a, node, where) for a in get_args(hint)) else [f"{where}: type"]
    if node.get("type") != SCHEMA_TYPES.get(origin):
        return [f"{where}: the CRD says {node.get('type')}, the model {hint}"]
    if origin is list:
        return type_mismatches(get_args(hint)[0], node.get("items") or {}, f"{where}[]")
    return []


@pytest.mark.parametrize(("model", "crd"), [(models.Profile, PROFILE), (models.DeviceReport, REPORT)])
def test_every_field_a_model_names_is_in_its_crd(model: Any, crd: dict[str, Any]) -> None:
    assert mismatches(model, crd, model.__name__) == []


def test_the_check_sees_a_field_the_crd_lacks() -> None:
    """The judge can fail: a misspelt field and a wrong type are reported."""

    class Bad(typing.TypedDict, total=False):
        nodeNmae: str
        summary: list[str]

    assert mismatches(Bad, REPORT, "Bad") == [
        "Bad.nodeNmae: not in the CRD",
        "Bad.summary: the CRD says object, the model list[str]",
    ]


def enum(node: dict[str, Any], *path: str) -> list[str]:
    for step in path:
        node = node["items"] if step == "[]" else node["properties"][step]
    return list(node["enum"])


def test_the_enums_are_the_crds() -> None:
    assert [m.value for m in constants.Mode] == enum(PROFILE, "spec", "mode")
    assert [h.value for h in constants.DeviceHealth] == enum(REPORT, "devices", "[]", "health")
    for field in ("deviceTaints", "consumableCapacity", "partitionableDevices"):
        assert [s.value for s in constants.Served] == enum(REPORT, field)
        assert [s.value for s in constants.Served] == enum(PROFILE, "status", "dra", field)


def test_reasons_are_camel_case() -> None:
    for kind in (constants.Reason, constants.ConditionType, constants.AgentPodReason, constants.HealthReason):
        for member in kind:
            assert member.value[:1].isupper() and member.value.isalnum(), member
