"""The plugin's pure parts: selectors, ages, an agent pod's trouble in the kubelet's words, the
completion candidates, and the krew manifest's shape. Objects are written as the API returns them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from patchbay_kubectl import output
from patchbay_kubectl.arguments import build_parser
from patchbay_kubectl.completion import completions
from patchbay_kubectl.views import diagnosis
from patchbay_kubectl.views.devices import device_rows
from patchbay_kubectl.views.diagnosis import pod_trouble
from patchbay_kubectl.views.objects import Inputs, age, selector_matches

REPO = Path(__file__).resolve().parents[3]
NOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)


def ts(delta: timedelta) -> str:
    return (NOW - delta).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_selector_matches_labels_and_expressions() -> None:
    labels = {"zone": "a", "gpu": "yes"}
    assert selector_matches(None, labels) and selector_matches({}, labels)
    assert selector_matches({"matchLabels": {"zone": "a"}}, labels)
    assert not selector_matches({"matchLabels": {"zone": "b"}}, labels)
    expr = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
    assert selector_matches(expr, labels)
    assert not selector_matches({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, labels)
    assert selector_matches(
        {"matchExpressions": [{"key": "x", "operator": "NotIn", "values": ["1"]}]}, labels
    )
    assert not selector_matches({"matchExpressions": [{"key": "x", "operator": "Exists"}]}, labels)


def test_age_is_kubectls_short_form() -> None:
    assert age(ts(timedelta(seconds=45)), NOW) == "45s"
    assert age(ts(timedelta(minutes=7, seconds=3)), NOW) == "7m3s"
    assert age(ts(timedelta(minutes=42)), NOW) == "42m"
    assert age(ts(timedelta(hours=5, minutes=2)), NOW) == "5h2m"
    assert age(ts(timedelta(days=3, hours=4)), NOW) == "3d4h"
    assert age(None, NOW) == "<unknown>" and age("garbage", NOW) == "<unknown>"


def test_a_crash_looping_agent_pod_is_explained_with_its_last_exit_and_events() -> None:
    pod = {
        "metadata": {"name": "patchbay-serial-x1", "namespace": "patchbay-system"},
        "spec": {"nodeName": "n1"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [
                {
                    "ready": False,
                    "restartCount": 5,
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
                    "lastState": {
                        "terminated": {
                            "exitCode": 2,
                            "reason": "Error",
                            "message": "invalid config: plugin.x\n",
                        }
                    },
                }
            ],
        },
    }
    events = [{"reason": "BackOff", "message": "Back-off restarting failed container", "count": 5}]
    t = pod_trouble(pod, events)
    assert t is not None
    # The operator's words for it (the API package's one explanation), not the kubelet's back-off.
    assert (t["reason"], t["message"], t["node"]) == (
        "CrashLoopBackOff",
        "restarted 5 times; last exit: invalid config: plugin.x",
        "n1",
    )
    assert t["lastExit"] == {"exitCode": 2, "reason": "Error", "message": "invalid config: plugin.x"}
    assert t["events"] == [
        {"reason": "BackOff", "message": "Back-off restarting failed container", "count": 5}
    ]
    ready = {**pod, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    assert pod_trouble(ready, []) is None


def test_an_unschedulable_agent_pod_says_the_schedulers_words() -> None:
    pod = {
        "metadata": {"name": "p"},
        "spec": {},
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/5 nodes"}
            ],
        },
    }
    t = pod_trouble(pod, [])
    assert t is not None and (t["reason"], t["message"]) == ("Unschedulable", "0/5 nodes")


def serial(generation: int = 1, **status: Any) -> dict[str, Any]:
    """The DevicePlugin profile ``serial`` at ``generation``, observed, with ``status``."""
    return {
        "metadata": {"name": "serial", "generation": generation},
        "spec": {"mode": "DevicePlugin", "resourceName": "example.com/serial"},
        "status": {"observedGeneration": generation, **status},
    }


def test_why_names_what_to_do_for_each_reason_once() -> None:
    profile = serial(
        generation=2,
        conditions=[
            {"type": "Ready", "status": "False", "reason": "NodesNotReady", "message": "1/2"},
            {"type": "Stalled", "status": "True", "reason": "ErrImageNeverPull", "message": "x"},
            {"type": "Degraded", "status": "False", "reason": "AsExpected", "message": ""},
        ],
        problemCount=2,
        problems=[
            {"node": "n1", "reason": "ErrImageNeverPull", "message": "x"},
            {"node": "n2", "device": "d0", "reason": "Vanished", "message": "gone"},
        ],
    )
    doc = diagnosis.why(profile, [], [], NOW)
    assert not doc["ready"]
    assert [h["reason"] for h in doc["next"]] == ["NodesNotReady", "ErrImageNeverPull", "Vanished"]
    text = output.why(doc, None)
    assert "Profile serial (DevicePlugin, example.com/serial): NOT Ready" in text
    assert "  - Vanished: the hardware" in text
    assert (
        diagnosis.why({"metadata": {"name": "x"}, "spec": {}}, [], [], NOW)["next"][0]["reason"] == "NoStatus"
    )


def test_why_names_a_missing_configmap_as_the_cause_not_a_wait() -> None:
    profile = serial(
        conditions=[
            {"type": "Ready", "status": "False", "reason": "NodesNotReady"},
            {"type": "Reconciling", "status": "True", "reason": "RollingOut"},
        ],
        problems=[{"node": "n1", "reason": "FailedMount", "message": "MountVolume.SetUp failed"}],
    )
    pod = {
        "metadata": {"name": "patchbay-node-agent-x", "namespace": "patchbay-system"},
        "spec": {"nodeName": "n1"},
        "status": {
            "phase": "Pending",
            "containerStatuses": [{"ready": False, "state": {"waiting": {"reason": "ContainerCreating"}}}],
        },
    }
    warning = {
        "type": "Warning",
        "reason": "FailedMount",
        "message": 'MountVolume.SetUp failed for volume "config" : configmap "patchbay-node-agent" not found',
        "involvedObject": {"kind": "Pod", "name": "patchbay-node-agent-x", "namespace": "patchbay-system"},
    }
    out = diagnosis.why(profile, [pod], [warning], NOW)
    reasons = [h["reason"] for h in out["next"]]
    assert reasons[0] == "OwnedObjectMissing" and "patchbay-node-agent" in out["next"][0]["do"]
    assert "NodesNotReady" not in reasons and "RollingOut" not in reasons
    # Without a missing object, the waits keep their hints.
    out = diagnosis.why(profile, [], [], NOW)
    assert [h["reason"] for h in out["next"]][:2] == ["NodesNotReady", "RollingOut"]


def test_static_rows_compare_allocatable_with_the_intended_count() -> None:
    profile = {
        "metadata": {"name": "d"},
        "spec": {
            "mode": "Static",
            "resourceName": "example.com/d",
            "static": {"capacity": 2, "capacityFromLabel": "n"},
        },
    }
    nodes = [
        {"metadata": {"name": "a", "labels": {}}, "status": {"allocatable": {"example.com/d": "2"}}},
        {"metadata": {"name": "b", "labels": {"n": "4"}}, "status": {"allocatable": {"example.com/d": "2"}}},
        {"metadata": {"name": "c", "labels": {}}, "status": {}},
    ]
    rows = device_rows(Inputs(profiles=[profile], nodes=nodes))
    assert [(r.node, r.health, r.reason) for r in rows] == [
        ("a", "Healthy", ""),
        ("b", "Unhealthy", "ValueMismatch"),
        ("c", "Unhealthy", "NotAdvertised"),
    ]


def test_a_static_rows_holders_are_the_nodes_pods_that_ask_for_the_resource() -> None:
    profile = {
        "metadata": {"name": "d"},
        "spec": {"mode": "Static", "resourceName": "example.com/d", "static": {"capacity": 2}},
    }
    nodes = [
        {"metadata": {"name": n, "labels": {}}, "status": {"allocatable": {"example.com/d": "2"}}}
        for n in "ab"
    ]

    def pod(name: str, node: str, limits: dict[str, str], phase: str = "Running") -> dict[str, Any]:
        container = {"name": "c", "resources": {"limits": limits}}
        return {
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"nodeName": node, "containers": [container]},
            "status": {"phase": phase},
        }

    pods = [
        pod("uses", "a", {"example.com/d": "1"}),
        pod("other", "a", {"example.com/x": "1"}),
        pod("ended", "a", {"example.com/d": "1"}, phase="Succeeded"),
        pod("elsewhere", "b", {"example.com/d": "2"}),
    ]
    rows = device_rows(Inputs(profiles=[profile], nodes=nodes, pods=pods))
    assert [(r.node, r.holders) for r in rows] == [("a", ["ns/uses"]), ("b", ["ns/elsewhere"])]


def test_completion_candidates() -> None:
    def lookup(kind: str) -> list[str]:
        return {"profiles": ["serial", "sensors"], "nodes": ["n1", "n2"]}.get(kind, [])

    assert completions([""], lookup) == [
        "cordon",
        "devices",
        "diff",
        "discover",
        "drain",
        "nodes",
        "rollout",
        "uncordon",
        "why",
    ]
    assert completions(["d"], lookup) == ["devices", "diff", "discover", "drain"]
    assert completions(["drain", "se"], lookup) == ["sensors", "serial"]
    assert "--preview" in completions(["drain", "serial", "--"], lookup)
    assert "--device" in completions(["uncordon", "serial", "--"], lookup)
    assert "--wait" not in completions(["uncordon", "serial", "--"], lookup)
    assert completions(["why", "se"], lookup) == ["sensors", "serial"]
    assert completions(["why", "serial", ""], lookup) == ["n1", "n2"]  # why PROFILE NODE
    assert completions(["why", "serial", "n1", ""], lookup) == []
    assert completions(["devices", "--node", ""], lookup) == ["n1", "n2"]
    assert completions(["devices", "-o", ""], lookup) == ["json", "wide", "yaml"]
    assert "--unhealthy" in completions(["devices", "--"], lookup)
    assert "--unhealthy" not in completions(["nodes", "--"], lookup)


def test_kubectl_flags_are_accepted_after_the_command() -> None:
    args = build_parser().parse_args(["devices", "--context", "c", "-A", "-o", "wide", "--unhealthy"])
    assert (args.context, args.all_namespaces, args.output, args.unhealthy) == ("c", True, "wide", True)


def test_the_krew_manifest_has_what_krew_requires() -> None:
    doc = yaml.safe_load((REPO / "kubectl-patchbay" / "krew" / "patchbay.yaml").read_text())
    assert doc["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2" and doc["kind"] == "Plugin"
    assert doc["metadata"]["name"] == "patchbay"
    spec = doc["spec"]
    for key in ("version", "shortDescription", "description", "homepage", "platforms"):
        assert spec[key], key
    for platform in spec["platforms"]:
        assert platform["bin"] and platform["uri"].endswith(".tar.gz") and platform["selector"]
        assert any(f["to"] == "." for f in platform["files"])


def test_a_dra_partition_is_a_row_named_by_its_slots_and_its_device_is_not_listed_again() -> None:
    profile = {"metadata": {"name": "fpga"}, "spec": {"mode": "DRA", "resourceName": "example.com/fpga"}}
    attrs = {"patchbay.dev/id": {"string": "fpga0"}}

    def part(first: int, size: int) -> dict[str, Any]:
        return {
            "name": f"fpga0-s{first}-{first + size - 1}",
            "attributes": {
                **attrs,
                "patchbay.dev/slots": {"int": size},
                "patchbay.dev/firstSlot": {"int": first},
            },
            "consumesCounters": [{"counterSet": "fpga0", "counters": {"s0": {"value": "1"}}}],
        }

    counters = {
        "spec": {
            "driver": "fpga.patchbay.dev",
            "nodeName": "n1",
            "pool": {"name": "n1"},
            "sharedCounters": [],
        }
    }
    slc = {
        "spec": {
            "driver": "fpga.patchbay.dev",
            "nodeName": "n1",
            "pool": {"name": "n1"},
            "devices": [part(0, 1), part(0, 2)],
        }
    }
    report = {"profile": "fpga", "nodeName": "n1", "devices": [{"id": "fpga0", "health": "Healthy"}]}
    rows = device_rows(Inputs(profiles=[profile], slices=[counters, slc], reports=[report]))
    assert [r.device for r in rows] == ["fpga0 slots 0-0", "fpga0 slots 0-1"]
    assert [r.physical for r in rows] == ["fpga0", "fpga0"]
