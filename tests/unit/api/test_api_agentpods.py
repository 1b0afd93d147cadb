"""The one explanation of agent-pod trouble (patchbay_api.agentpods.explain), which the operator's
status and ``kubectl patchbay why`` both print: the order in which it reads a pod."""

from __future__ import annotations

from typing import Any

import pytest

from patchbay_api.agentpods import SHARED_KEY, AgentPod, Warning, explain, profile_key


def pod(**status: Any) -> AgentPod:
    return AgentPod.from_object(
        {
            "metadata": {"name": "a-x", "labels": {"patchbay.dev/profile": "serial"}},
            "spec": {"nodeName": "n1"},
            "status": status,
        }
    )


def waiting(reason: str, message: str = "", **extra: Any) -> dict[str, Any]:
    return {"state": {"waiting": {"reason": reason, "message": message}}, **extra}


SANDBOX = Warning("a-x", "FailedCreatePodSandBox", "cni failed")


@pytest.mark.parametrize(
    ("status", "warning", "expected"),
    [
        ({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}, None, None),
        (
            {"phase": "Pending", "containerStatuses": [waiting("ErrImageNeverPull")]},
            None,
            ("ErrImageNeverPull", "the image is not on the node and its pull policy is Never", True),
        ),
        (
            {
                "phase": "Running",
                "containerStatuses": [
                    waiting(
                        "CrashLoopBackOff",
                        "back-off",
                        restartCount=3,
                        lastState={"terminated": {"reason": "Error", "exitCode": 2}},
                    )
                ],
            },
            None,
            ("CrashLoopBackOff", "restarted 3 times; last exit: Error (exit code 2)", True),
        ),
        (
            {"phase": "Pending", "containerStatuses": [waiting("ImagePullBackOff", "slow")]},
            None,
            ("ImagePullBackOff", "slow", False),
        ),
        # Progress is not trouble of its own: the sandbox warning explains it.
        (
            {"phase": "Pending", "containerStatuses": [waiting("ContainerCreating")]},
            SANDBOX,
            ("FailedCreatePodSandBox", "cni failed", False),
        ),
        (
            {
                "phase": "Pending",
                "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3"}
                ],
            },
            SANDBOX,
            ("Unschedulable", "0/3", False),
        ),
        (
            {"phase": "Pending"},
            Warning("a-x", "BackOff", "x"),
            ("AgentStarting", "the agent pod is Pending, not Ready yet", False),
        ),
        (
            {"phase": "Running"},
            None,
            ("AgentNotReady", "the agent runs but has not registered with the kubelet", False),
        ),
    ],
)
def test_a_pod_is_explained_by_the_first_thing_that_says_why(
    status: dict[str, Any], warning: Warning | None, expected: tuple[str, str, bool] | None
) -> None:
    found = explain(pod(**status), warning)
    assert (found and (found.reason, found.message, found.permanent)) == expected


def test_a_pod_knows_its_node_and_whose_it_is() -> None:
    p = pod(phase="Pending")
    assert (p.node, p.profile) == ("n1", "serial")
    assert profile_key({"patchbay.dev/agent": "shared", "patchbay.dev/profile": "x"}) == SHARED_KEY
    assert explain(AgentPod("p", "x", "n", "", phase="Pending", deleting=True), None) is None
