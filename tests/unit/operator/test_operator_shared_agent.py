"""The shared node agent: profiles that leave spec.agent alone share one DaemonSet and one config
that the agent's own parser reads; which profile a node gets is the same on both sides; a profile
the node agent cannot serve shows in that profile's status only."""

from __future__ import annotations

import re
from typing import Any

import yaml

from patchbay_operator import render
from patchbay_operator.capacity import NodeState
from patchbay_operator.config import Settings
from patchbay_operator.devicereports import Report
from patchbay_operator.evaluation import Inputs, evaluate
from patchbay_operator.profiles import Profile

SETTINGS = Settings(namespace="patchbay-test", agent_image="example.invalid/agent:1")


def prof(name: str, mode: str, labels: dict[str, str], **spec: Any) -> Profile:
    body = {
        "metadata": {"name": name, "uid": f"uid-{name}", "generation": 1},
        "spec": {
            "resourceName": f"example.com/{name}",
            "mode": mode,
            "nodeSelector": {"matchLabels": labels},
            "plugin": {"discovery": {"paths": {"globs": [f"/dev/{name}*"]}}},
            **spec,
        },
    }
    return Profile.from_body(body)


SERIAL = prof("serial", "DevicePlugin", {"serial": "yes"})
TOKENS = prof("tokens", "DevicePlugin", {"tokens": "yes"})
SENSORS = prof("sensors", "DRA", {"sensors": "yes"})


def test_only_profiles_without_agent_settings_share_the_agent() -> None:
    assert SERIAL.uses_shared_agent
    assert not prof("own", "DevicePlugin", {}, agent={"tolerations": []}).uses_shared_agent


def test_one_daemonset_serves_both_modes_and_every_profile_owns_it() -> None:
    """...and its pod template is the same whatever the profiles are, so a profile change never
    rolls the agents."""
    cm, ds = render.shared_agent_objects(
        [(SERIAL, None), (TOKENS, None), (SENSORS, SERIAL.selector)], SETTINGS
    )
    assert cm["metadata"]["name"] == ds["metadata"]["name"] == render.SHARED_AGENT
    owners = ds["metadata"]["ownerReferences"]
    assert [o["name"] for o in owners] == ["sensors", "serial", "tokens"]
    assert not any(o["controller"] for o in owners)
    pod = ds["spec"]["template"]["spec"]
    mounts = {m["name"] for m in pod["containers"][0]["volumeMounts"]}
    assert {"device-plugins", "plugins-registry", "kubelet-plugins", "cdi-specs"} <= mounts
    # It may serve DRA profiles: the account with the DRA rights, whatever it serves now.
    assert pod["serviceAccountName"] == SETTINGS.agent_dra_service_account
    # The pod template depends on no profile: every node, every mount (only the image rolls it).
    assert "affinity" not in pod
    _, alone = render.shared_agent_objects([(SERIAL, None)], SETTINGS)
    assert alone["spec"]["template"] == ds["spec"]["template"]
    assert ds["spec"]["selector"]["matchLabels"] == render.shared_selector_labels()

    # The agent's own parser takes the command and the config; each node gets the profiles that
    # select it, the DRA one never where the node-capacity twin serves the same resource.
    from patchbay_agent.nodeconfig import parse_node_config, selected
    from patchbay_agent.options import build_parser

    command = pod["containers"][0]["command"]
    env = {"NODE_NAME": "node-1", "POD_NAME": "agent-abcde", "POD_NAMESPACE": "patchbay-system"}
    args = build_parser().parse_args(
        [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in command[1:]]
    )
    assert args.node_config.endswith("/node.yaml") and args.profile is None and args.dra_driver is None
    entries = parse_node_config(yaml.safe_load(cm["data"]["node.yaml"]))
    assert [e.error for e in entries] == ["", "", ""]
    by_name = {e.profile: e for e in entries}
    assert by_name["sensors"].driver == "sensors.patchbay.dev"

    def served(labels: dict[str, str]) -> list[str]:
        return sorted(e.profile for e in selected(entries, labels))

    assert served({"serial": "yes", "tokens": "yes"}) == ["serial", "tokens"]
    assert served({"sensors": "yes"}) == ["sensors"]
    assert served({"sensors": "yes", "serial": "yes"}) == ["serial"]  # KEP-5004
    assert served({}) == []


def test_an_agent_error_is_that_profiles_problem_only() -> None:
    nodes = [NodeState("n1", labels={"serial": "yes"})]
    report = Report.from_object(
        {
            "metadata": {"name": "serial.n1"},
            "profile": "serial",
            "nodeName": "n1",
            "devices": [],
            "agentError": {"reason": "ConfigInvalid", "message": "plugin.discovery: bad", "since": "T0"},
        }
    )
    result = evaluate(Inputs(SERIAL, {}, "T1", nodes, reports=[report], shared_pods=[]))
    (problem,) = result.problems
    assert (problem.node, problem.reason, problem.stalled) == ("n1", "ConfigInvalid", True)
    assert result.status is not None
    stalled = next(c for c in result.status["conditions"] if c["type"] == "Stalled")
    assert stalled["status"] == "True"


def test_the_node_agent_can_be_kept_to_labelled_nodes_and_a_profile_says_where_it_is_missing() -> None:
    """--node-agent-node-selector (the chart's agent.nodeSelector): the shared DaemonSet gets the
    labels as required node affinity, and a profile that selects a node without them is Stalled
    there with reason NodeAgentExcluded (nothing would ever serve it), its other nodes unaffected."""
    settings = Settings(
        namespace="patchbay-test",
        agent_image="example.invalid/agent:1",
        node_agent_node_selector=(("patchbay.dev/devices", "true"),),
    )
    _, ds = render.shared_agent_objects([(SERIAL, None)], settings)
    terms = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "patchbay.dev/devices", "operator": "In", "values": ["true"]}]}
    ]
    nodes = [
        NodeState("in", labels={"serial": "yes", "patchbay.dev/devices": "true"}),
        NodeState("out", labels={"serial": "yes"}),
        NodeState("other", labels={}),
    ]
    selector = settings.node_agent_node_selector
    result = evaluate(Inputs(SERIAL, {}, "T1", nodes, shared_pods=[], shared_node_selector=selector))
    excluded = [p for p in result.problems if p.reason == "NodeAgentExcluded"]
    assert [(p.node, p.stalled) for p in excluded] == [("out", True)]
    assert "agent.nodeSelector" in excluded[0].message and "patchbay.dev/devices=true" in excluded[0].message
    assert result.status is not None
    stalled = next(c for c in result.status["conditions"] if c["type"] == "Stalled")
    assert stalled["status"] == "True"
    # Without the setting: no such problem.
    plain = evaluate(Inputs(SERIAL, {}, "T1", nodes, shared_pods=[]))
    assert not [p for p in plain.problems if p.reason == "NodeAgentExcluded"]
