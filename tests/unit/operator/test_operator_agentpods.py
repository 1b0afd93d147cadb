"""Why an agent pod does not work, from the pod object the kubelet reports and its Warnings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from patchbay_operator.agentpods import STALL_AFTER, AgentPod, Warning, trouble

T0 = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)


def pod(**status: Any) -> AgentPod:
    return AgentPod.from_object(
        {
            "metadata": {
                "name": "patchbay-serial-x1",
                "labels": {"patchbay.dev/profile": "serial"},
                "creationTimestamp": T0.strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
            "spec": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchFields": [
                                        {"key": "metadata.name", "operator": "In", "values": ["node-a"]}
                                    ]
                                }
                            ]
                        }
                    }
                }
            },
            "status": status,
        }
    )


def waiting(reason: str, message: str = "", **extra: Any) -> dict[str, Any]:
    return {
        "phase": "Pending",
        "containerStatuses": [{"state": {"waiting": {"reason": reason, "message": message}}, **extra}],
    }


def test_a_ready_pod_is_fine_and_names_its_pinned_node() -> None:
    p = pod(phase="Running", conditions=[{"type": "Ready", "status": "True"}])
    assert p.node == "node-a" and p.profile == "serial"
    assert trouble(p, None, T0) is None


def test_permanent_reasons_are_stalled_at_once() -> None:
    for reason in ("ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError"):
        t = trouble(pod(**waiting(reason, "why")), None, T0 + timedelta(seconds=1))
        assert t is not None and t.stalled and t.reason == reason and t.node == "node-a", reason


def test_a_crash_loop_carries_the_last_termination_message() -> None:
    st = waiting(
        "CrashLoopBackOff",
        "back-off 10s",
        restartCount=3,
        lastState={
            "terminated": {"exitCode": 3, "reason": "Error", "message": "invalid config: plugin.discovery"}
        },
    )
    t = trouble(pod(**st), None, T0 + timedelta(seconds=5))
    assert t is not None and t.stalled
    assert t.message == "restarted 3 times; last exit: invalid config: plugin.discovery"


def test_backing_off_pulls_and_sandbox_failures_stall_only_after_a_while() -> None:
    early, late = T0 + timedelta(seconds=10), T0 + STALL_AFTER + timedelta(seconds=1)
    t = trouble(pod(**waiting("ImagePullBackOff", "back-off pulling")), None, early)
    assert t is not None and not t.stalled and t.recheck_at == T0 + STALL_AFTER
    t = trouble(pod(**waiting("ImagePullBackOff", "back-off pulling")), None, late)
    assert t is not None and t.stalled
    sandbox = Warning("patchbay-serial-x1", "FailedCreatePodSandBox", "failed to setup network for sandbox")
    t = trouble(pod(phase="Pending"), sandbox, late)
    assert t is not None and t.stalled and t.reason == "FailedCreatePodSandBox"
    assert t.message == "failed to setup network for sandbox"


def test_unschedulable_and_never_ready() -> None:
    late = T0 + STALL_AFTER + timedelta(seconds=1)
    unsched = pod(
        phase="Pending",
        conditions=[
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}
        ],
    )
    t = trouble(unsched, None, late)
    assert t is not None and (t.reason, t.message, t.stalled) == ("Unschedulable", "0/3 nodes", True)
    t = trouble(pod(phase="Running", conditions=[{"type": "Ready", "status": "False"}]), None, late)
    assert t is not None and t.reason == "AgentNotReady" and t.stalled


def test_a_pod_going_away_is_no_trouble() -> None:
    p = AgentPod(
        "x",
        "serial",
        "node-a",
        T0.isoformat(),
        phase="Pending",
        deleting=True,
        waiting=("ErrImageNeverPull", ""),
    )
    assert trouble(p, None, T0) is None
