"""Events on a profile's transitions: posted once, rate-limited, never for old news."""

from __future__ import annotations

from typing import Any

from patchbay_operator.events import BURST, EventRecorder, transitions
from patchbay_operator.profiles import Profile
from patchbay_operator.status.conditions import Problem

PROFILE = Profile.from_body(
    {
        "metadata": {"name": "serial", "uid": "u1"},
        "spec": {"resourceName": "example.com/serial", "mode": "DevicePlugin"},
    }
)


def problem(node: str, device: str = "", reason: str = "OpenFailed") -> Problem:
    return Problem(node, device, reason, f"{reason} on {node}")


def test_transitions_are_new_and_resolved_problems() -> None:
    before = {p.key: p for p in [problem("a", "d0"), problem("b")]}
    out = transitions(before, [problem("b"), problem("c", "d1", "Vanished")])
    assert [(t.type, t.reason) for t in out] == [("Warning", "Vanished"), ("Normal", "Recovered")]
    assert out[0].message == "node c, device d1: Vanished on c"
    assert out[1].message == "node a, device d0: OpenFailed resolved"


async def test_the_first_status_is_a_baseline_and_repeats_are_posted_once() -> None:
    posted: list[dict[str, Any]] = []
    clock = [0.0]

    async def post(namespace: str, body: dict[str, Any]) -> None:
        posted.append(body)

    rec = EventRecorder(post, clock=lambda: clock[0])
    await rec.record(PROFILE, [problem("a")])  # what was already wrong when we started
    assert posted == []
    await rec.record(PROFILE, [])
    await rec.record(PROFILE, [problem("a")])
    await rec.record(PROFILE, [])  # the same Recovered again, within the window: deduplicated
    assert [(e["type"], e["reason"]) for e in posted] == [("Normal", "Recovered"), ("Warning", "OpenFailed")]
    assert posted[0]["involvedObject"] == {
        "apiVersion": "patchbay.dev/v1beta1",
        "kind": "DevicePluginProfile",
        "name": "serial",
        "uid": "u1",
    }
    assert rec.suppressed == 1


async def test_a_flood_is_rate_limited_per_profile() -> None:
    posted: list[dict[str, Any]] = []

    async def post(namespace: str, body: dict[str, Any]) -> None:
        posted.append(body)

    rec = EventRecorder(post, clock=lambda: 0.0)
    await rec.record(PROFILE, [])
    await rec.record(PROFILE, [problem(f"n{i}") for i in range(50)])
    assert len(posted) == BURST
    assert rec.suppressed == 50 - BURST


def test_a_wait_that_ends_by_itself_posts_nothing_until_it_is_stuck() -> None:
    starting = Problem("a", "", "ImagePullBackOff", "pulling", transient=True)
    stuck = Problem("a", "", "ImagePullBackOff", "pulling for 60 s", stalled=True)
    assert transitions({}, [starting]) == []
    assert transitions({starting.key: starting}, []) == []
    (warning,) = transitions({starting.key: starting}, [stuck])
    assert (warning.type, warning.reason) == ("Warning", "ImagePullBackOff")
    (recovered,) = transitions({stuck.key: stuck}, [])
    assert recovered.reason == "Recovered"
