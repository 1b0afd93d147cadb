"""Staged rollouts of DRA profiles: at the end of a wave's gate the wave's nodes' ResourceSlices are
read (``Step.read_slices``, one LIST per node) and must publish every device the node's report
says healthy (``status.dra.published``, ``slices_short``); a node whose slices lack some fails
the gate, named with what is short."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from patchbay_api.revisions import spec_revision
from patchbay_operator.capacity import NodeState
from patchbay_operator.devicereports import Counts, Report
from patchbay_operator.evaluation import Inputs, evaluate
from patchbay_operator.profiles import Profile
from patchbay_operator.rollouts import SLICES_SETTLE, NodeView, Phase, Policy, State, step
from patchbay_operator.status.dra import SliceRead, published, slices_short

UID = "uid-sensors"
T0 = datetime(2026, 11, 29, tzinfo=UTC)
FAST = Policy(healthy_seconds=20, deadline_seconds=100)
NAMES = [f"n{i}" for i in range(8)]
DRIVER = "sensors.patchbay.dev"


def dra(count: int) -> Profile:
    return Profile.from_body(
        {
            "metadata": {"name": "sensors", "uid": UID, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {
                "resourceName": "example.com/sensors",
                "mode": "DRA",
                "plugin": {"discovery": {"virtual": {"count": count}}},
            },
        }
    )


def device(ident: str, *taints: dict[str, str], name: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"name": name or ident, "attributes": {"patchbay.dev/id": {"string": ident}}}
    if taints:
        out["taints"] = list(taints)
    return out


def a_slice(*devices: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"driver": DRIVER, "nodeName": "n0", "devices": list(devices)}}


def test_published_counts_the_physical_devices_a_claim_may_get() -> None:
    fault = {"key": "patchbay.dev/vanished", "value": "Vanished", "effect": "NoSchedule"}
    info = {"key": "patchbay.dev/probe-failed", "value": "ProbeFailed", "effect": "None"}
    held = {"key": "patchbay.dev/held-by-device-plugin", "value": "in-use", "effect": "NoSchedule"}
    slices = [
        a_slice(device("a"), device("b", fault), device("c", info)),
        a_slice(device("d", held), device("a", name="a-s0-1"), device("a", name="a-s2-3")),
        {"spec": {"sharedCounters": [{"name": "a"}]}},
    ]
    assert published(slices) == 3  # a (and its partitions), c (informational), d (handed over)
    assert published([]) == 0


def test_slices_short_compares_with_the_healthy_devices_the_agent_did_not_withhold() -> None:
    report = Report("sensors.n0", "sensors", "n0", revision="r")
    four = replace(report, counts=Counts(total=5, healthy=4, withheld=1, withheld_healthy=1))
    assert slices_short(DRIVER, four, 3) == ""
    said = slices_short(DRIVER, four, 1)
    assert said == f"its ResourceSlices of {DRIVER} publish 1 of the 3 devices its DeviceReport says healthy"


def wave0(policy: Policy = FAST) -> State:
    """The canary moved (at T0) and seen healthy on the update from T0."""
    views = [NodeView(n, {}, "old", 4) for n in NAMES]
    return step(policy, UID, views, State.begin("old", "new"), T0, slices=True).state


def views(state: State, *, read: datetime | None = None, short: str = "") -> list[NodeView]:
    stanza = state.stanza()
    out = []
    for n in NAMES:
        on = stanza.served(UID, n, {})
        view = NodeView(n, {}, on, 4)
        if on == state.update and read is not None:
            view = replace(view, slices=short, slices_read=read)
        out.append(view)
    return out


def test_the_gate_reads_the_waves_slices_at_its_end_and_passes_when_they_agree() -> None:
    state = wave0()
    (canary,) = state.baseline
    held = step(FAST, UID, views(state), state, T0, slices=True)
    assert held.read_slices == () and held.recheck_at == T0 + timedelta(seconds=20)
    end = T0 + timedelta(seconds=20)
    asked = step(FAST, UID, views(held.state), held.state, end, slices=True)
    assert asked.read_slices == (canary,) and not asked.new_wave, "read once, at the gate's end"
    # A read made before the gate's end does not count: asked again.
    stale = step(FAST, UID, views(held.state, read=end - timedelta(seconds=1)), held.state, end, slices=True)
    assert stale.read_slices == (canary,)
    through = step(
        FAST, UID, views(held.state, read=end), held.state, end + timedelta(seconds=0.2), slices=True
    )
    assert through.new_wave and through.state.wave == 1 and through.read_slices == ()
    # Without the slice check (DevicePlugin), the same gate passes at once.
    assert step(FAST, UID, views(held.state), held.state, end).new_wave


def short_of(published: int) -> str:
    return (
        f"its ResourceSlices of {DRIVER} publish {published} of the 4 devices its DeviceReport says healthy"
    )


def held_canary(policy: Policy) -> tuple[State, str]:
    """The canary wave seen healthy on the update from T0 (its gate running), and the canary."""
    state = wave0(policy)
    (canary,) = state.baseline
    return step(policy, UID, views(state), state, T0, slices=True).state, canary


def test_slices_short_of_the_report_halt_naming_the_node_once_settled() -> None:
    held, canary = held_canary(FAST)
    end = T0 + timedelta(seconds=20)
    short = short_of(1)
    s = step(FAST, UID, views(held, read=end, short=short), held, end, slices=True)
    assert s.state.phase is Phase.HALTED and s.state.halted == (canary,)
    assert f"node {canary}: {short}" in s.state.message
    assert s.state.exceptions == {canary: "old"}, "put back"


def test_a_short_gate_reads_short_slices_again_once_the_agent_had_time_to_write_them() -> None:
    quick = Policy(healthy_seconds=2, deadline_seconds=100)
    held, canary = held_canary(quick)
    end = T0 + timedelta(seconds=2)
    short = short_of(0)
    early = step(quick, UID, views(held, read=end, short=short), held, end, slices=True)
    assert early.state.phase is Phase.PROGRESSING and early.read_slices == ()
    assert early.recheck_at == T0 + timedelta(seconds=SLICES_SETTLE)
    settled = T0 + timedelta(seconds=SLICES_SETTLE)
    again = step(quick, UID, views(held, read=end, short=short), held, settled, slices=True)
    assert again.read_slices == (canary,) and again.state.phase is Phase.PROGRESSING
    # Written meanwhile: through; still short: halted.
    assert step(quick, UID, views(held, read=settled), held, settled, slices=True).new_wave
    halted = step(quick, UID, views(held, read=settled, short=short), held, settled, slices=True)
    assert halted.state.phase is Phase.HALTED and canary in halted.state.message


def test_slices_that_cannot_be_read_halt_at_the_deadline() -> None:
    held, _ = held_canary(FAST)
    late = T0 + timedelta(seconds=100)
    s = step(FAST, UID, views(held), held, late, slices=True)
    assert s.state.phase is Phase.HALTED and "could not be read within 100 s" in s.state.message


def test_the_evaluation_of_a_dra_profile_compares_the_slices_read_with_the_report() -> None:
    """evaluate(): a DRA profile's wave node whose slices, read at the gate's end, publish fewer
    devices than its report says healthy halts the rollout naming the node and what is short."""
    first, second = dra(2), dra(3)
    old, new = spec_revision(first.spec), spec_revision(second.spec)
    nodes = [NodeState(n, labels={}) for n in NAMES]
    state = step(FAST, UID, [NodeView(n, {}, old, 2) for n in NAMES], State.begin(old, new), T0).state
    (canary,) = state.baseline
    stanza = state.stanza()

    def reports() -> list[Report]:
        out = []
        for n in NAMES:
            on = stanza.served(UID, n, {})
            healthy = 3 if on == new else 2
            out.append(Report(f"sensors.{n}", "sensors", n, revision=on, counts=Counts(healthy, healthy)))
        return out

    def gate(now: datetime, previous: State, slices: dict[str, SliceRead]) -> Any:
        inputs = Inputs(
            second, {}, "2026-11-29T00:00:00Z", nodes, reports=reports(), rollout=(FAST, previous)
        )
        result = evaluate(replace(inputs, clock=now, slices=slices))
        assert result.rollout is not None
        return result.rollout

    held = gate(T0, state, {}).state
    end = T0 + timedelta(seconds=20)
    assert gate(end, held, {}).read_slices == (canary,)
    agree = gate(end, held, {canary: SliceRead(end, 3)})
    assert agree.new_wave
    failed = gate(end, held, {canary: SliceRead(end, 1)})
    assert failed.state.phase is Phase.HALTED and failed.state.halted == (canary,)
    assert (
        f"node {canary}: its ResourceSlices of {DRIVER} publish 1 of the 3 devices its DeviceReport "
        "says healthy" in failed.state.message
    )
    # A failed read is no verdict: read again.
    assert gate(end, held, {canary: SliceRead(end, None, "403")}).read_slices == (canary,)
