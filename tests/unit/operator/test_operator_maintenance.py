"""The DeviceTaintRules on a DRA profile's devices, as its status shows them (pure)."""

from __future__ import annotations

from typing import Any

from patchbay_operator.maintenance import Rule, entries, served


def rule(name: str, selector: dict[str, Any] | None, effect: str = "None", **status: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"taint": {"key": "patchbay.dev/maintenance", "effect": effect}}
    if selector is not None:
        spec["deviceSelector"] = selector
    obj: dict[str, Any] = {"metadata": {"name": name, "generation": 1}, "spec": spec}
    if status:
        obj["status"] = {"conditions": [{"type": "EvictionInProgress", "observedGeneration": 1, **status}]}
    return obj


def test_the_rules_on_the_profiles_driver_with_the_controllers_words() -> None:
    rules = [
        Rule.from_object(
            rule(
                "b",
                {"driver": "serial.patchbay.dev", "pool": "n1"},
                status="False",
                message="2 pods would be",
            )
        ),
        Rule.from_object(
            rule("a", {"driver": "serial.patchbay.dev", "pool": "n1", "device": "tty0"}, "NoExecute")
        ),
        Rule.from_object(rule("other", {"driver": "gpu.example.com"})),
        Rule.from_object(rule("every-driver", {"pool": "n2"}, "NoSchedule")),
        Rule.from_object(rule("no-selector", None)),
    ]
    shown = entries(rules, "serial")
    assert [e["rule"] for e in shown] == ["a", "b", "every-driver"]
    assert shown[0] == {
        "rule": "a",
        "node": "n1",
        "device": "tty0",
        "effect": "NoExecute",
        "taintKey": "patchbay.dev/maintenance",
        "evictionInProgress": None,
        "message": None,
    }
    assert shown[1]["evictionInProgress"] == "False" and shown[1]["message"] == "2 pods would be"
    assert shown[2]["node"] == "n2" and shown[2]["device"] == ""
    assert entries(rules, "sensor") == [entries(rules, "serial")[2]]


def test_an_answer_about_an_older_spec_is_not_shown() -> None:
    obj = rule("a", {"driver": "serial.patchbay.dev"}, status="True", message="old")
    obj["metadata"]["generation"] = 2
    assert Rule.from_object(obj).message == ""


def test_served_reads_the_discovery_document() -> None:
    assert served({"resources": [{"name": "devicetaintrules"}, {"name": "devicetaintrules/status"}]})
    assert not served({"resources": [{"name": "resourceslices"}]})
    assert not served(None)
