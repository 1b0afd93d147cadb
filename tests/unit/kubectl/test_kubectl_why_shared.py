"""`kubectl patchbay why` for a profile the shared node agent serves: its agent pods are the node
agent's on the nodes where its config serves the profile, not none (the demo printed "Agent pods:
0/0"), and not those of a node it does not serve it on.
A recording stand-in for the API (what each LIST asked for, what it answers); the command against
a real cluster is tests/integration/test_kubectl_plugin.py."""

from __future__ import annotations

import argparse
from typing import Any

from patchbay_kubectl import agentpods, cli, kube


class Lists:
    def __init__(self, answers: dict[tuple[str, str], list[dict[str, Any]]], profile: dict[str, Any]) -> None:
        self.answers, self.profile = answers, profile
        self.asked: list[tuple[str, str]] = []

    def get(self, path: str) -> dict[str, Any] | None:
        return self.profile

    def list(self, path: str, label_selector: str = "", field_selector: str = "") -> list[dict[str, Any]]:
        self.asked.append((path, label_selector))
        return self.answers.get((path, label_selector), [])


def _pod(name: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "patchbay-system",
            "labels": {agentpods.LABEL_SHARED: "shared"},
        },
        "spec": {"nodeName": node},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_a_shared_profile_counts_the_node_agents_pods_on_its_nodes() -> None:
    ns = "patchbay-system"
    profile = {
        "metadata": {"name": "serial"},
        "spec": {"mode": "DevicePlugin", "resourceName": "example.com/serial", "plugin": {}},
        "status": {},
    }
    pods, reports = kube.pods_path(ns), kube.reports_path(ns)
    config = (
        "profiles:\n- profile: serial\n  nodeSelectorTerms: [[{key: pick, operator: In, values: ['yes']}]]\n"
    )
    fake = Lists(
        {
            (reports, f"{agentpods.LABEL_PROFILE}=serial"): [{"nodeName": "n1"}],
            (pods, agentpods.SHARED_AGENT_SELECTOR): [_pod("a", "n1"), _pod("b", "n2"), _pod("c", "n3")],
            ("/api/v1/nodes", ""): [
                {"metadata": {"name": n, "labels": {"pick": "yes" if n != "n3" else "no"}}}
                for n in ("n1", "n2", "n3")
            ],
            (kube.configmaps_path(ns), agentpods.SHARED_AGENT_SELECTOR): [{"data": {"node.yaml": config}}],
        },
        profile,
    )
    args = argparse.Namespace(profile="serial", output="json", namespace=ns, all_namespaces=False)
    import json

    doc = json.loads(cli.cmd_why(fake, args))  # type: ignore[arg-type]
    assert doc["agentPods"]["total"] == 2 and doc["agentPods"]["notReady"] == 0
    # A profile with an agent of its own never looks at the shared agent.
    own = {**profile, "spec": {**profile["spec"], "agent": {"resources": {}}}}
    fake = Lists({}, own)
    doc = json.loads(cli.cmd_why(fake, args))  # type: ignore[arg-type]
    assert doc["agentPods"]["total"] == 0
    assert all(sel != agentpods.SHARED_AGENT_SELECTOR for _, sel in fake.asked)
