"""Staged rollouts of Static profiles (issue 45): the same state machine (rollouts.py) with the
capacity gate, each node's capacity planned for the revision it serves (staging.py, nodes.py), the
status judged per node against that revision (evaluation.py), and one Normal Event per wave."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from patchbay_api.revisions import node_hash, revision_data, spec_revision
from patchbay_operator import capacity
from patchbay_operator.capacity import NodeState, Owner, owner_annotation_key
from patchbay_operator.evaluation import Inputs, evaluate
from patchbay_operator.events import EventRecorder
from patchbay_operator.nodes import NodeSync
from patchbay_operator.profiles import Profile
from patchbay_operator.rollouts import (
    ROLLOUT_HALTED,
    NodeView,
    Phase,
    Policy,
    State,
    agent_gate,
    capacity_gate,
    step,
)
from patchbay_operator.staging import Staging, as_revision
from patchbay_operator.timestamps import parse_rfc3339

UID = "uid-dongles"
R = "example.com/dongle"
T0 = datetime(2026, 11, 29, tzinfo=UTC)
NOW = "2026-11-29T00:00:00Z"
FAST = Policy(healthy_seconds=10, deadline_seconds=100, per_wave=2)
NAMES = [f"n{i}" for i in range(6)]


def profile(count: int = 1, **static: Any) -> Profile:
    return Profile.from_body(
        {
            "metadata": {"name": "dongles", "uid": UID, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {
                "resourceName": R,
                "mode": "Static",
                "static": {"capacity": count, **static},
                "rollout": {"healthySeconds": 10, "maxNodesPerWave": 2, "progressDeadlineSeconds": 100},
            },
        }
    )


def node(name: str, value: int | None, labels: dict[str, str] | None = None) -> NodeState:
    """A node whose status carries ``value`` of R, set by the profile (None: nothing)."""
    if value is None:
        return NodeState(name, "1", dict(labels or {}))
    owner = Owner(R, "dongles", owner_annotation_key(R))
    return NodeState(name, "1", dict(labels or {}), {R: str(value)}, {R: str(value)}, {R: owner})


def by_hash(names: list[str]) -> list[str]:
    return sorted(names, key=lambda n: node_hash(UID, n))


def staging(*profiles: Profile, nodes: list[NodeState] | None = None) -> Staging:
    bodies = {spec_revision(p.spec): revision_data(p.spec) for p in profiles}
    return Staging(lambda _p, d: bodies.get(d), lambda: nodes or [], lambda _n: {})


# --- the machine with the capacity gate ---------------------------------------------------------


def test_the_capacity_gate_waits_passes_and_halts_on_a_failed_write() -> None:
    view = NodeView("a", {}, "old")
    assert capacity_gate(FAST, view, 0, "new") is None, "not shown yet: waiting"
    assert capacity_gate(FAST, NodeView("a", {}, "new"), 0, "new") == "", "shown: through"
    failed = capacity_gate(FAST, NodeView("a", {}, "old", error="422 Unprocessable"), 0, "new")
    assert failed == "writing its capacity failed: 422 Unprocessable", "a failed write halts at once"
    shown = capacity_gate(FAST, NodeView("a", {}, "new", error="409 of another resource"), 0, "new")
    assert shown == "", "shown already: a later failed write of the node is no reason to halt"
    # The agents' gate is unchanged: a report on the update with fewer healthy devices fails.
    assert agent_gate(FAST, NodeView("a", {}, "new", 1), 2, "new") == "1 healthy devices, 2 before the change"


def views(state: State, *, failing: str = "", stuck: str = "") -> list[NodeView]:
    """Every node shows the revision the stanza gives it (Static: the operator wrote it), except
    ``stuck`` (still shows the current one) and ``failing`` (its write failed)."""
    stanza = state.stanza()
    out = []
    for n in NAMES:
        served = stanza.served(UID, n, {})
        out.append(
            NodeView(n, {}, state.current if n in (stuck, failing) else served, error="boom" * (n == failing))
        )
    return out


def test_a_static_change_rolls_canary_then_waves_each_with_one_note() -> None:
    state, now = State.begin("old", "new"), T0
    s = step(FAST, UID, views(state), state, now, gate=capacity_gate)
    assert s.new_wave and s.state.wave_nodes == 1 and s.state.baseline == {by_hash(NAMES)[0]: 0}
    assert s.note == f"canary wave: 1 node(s) moved to revision new, 1 of {len(NAMES)} updated"
    notes, waves = [s.note], [1]
    state = s.state
    while not state.settled_now:
        first = step(FAST, UID, views(state), state, now, gate=capacity_gate)
        assert not first.new_wave and not first.note, "held for healthySeconds: no wave, no note"
        now += timedelta(seconds=10)
        s = step(FAST, UID, views(first.state), first.state, now, gate=capacity_gate)
        state = s.state
        if s.new_wave:
            notes.append(s.note)
            waves.append(state.wave_nodes)
    assert waves == [1, 2, 2, 1]
    assert notes[1:] == [
        "wave 1: 2 node(s) moved to revision new, 3 of 6 updated",
        "wave 2: 2 node(s) moved to revision new, 5 of 6 updated",
        "wave 3: 1 node(s) moved to revision new, 6 of 6 updated",
    ]
    assert state.phase is Phase.COMPLETE and state.current == "new"


def test_a_failed_write_on_the_wave_halts_it_and_a_node_never_shown_halts_at_the_deadline() -> None:
    state = step(
        FAST, UID, views(State.begin("old", "new")), State.begin("old", "new"), T0, gate=capacity_gate
    ).state
    canary = by_hash(NAMES)[0]
    s = step(FAST, UID, views(state, failing=canary), state, T0 + timedelta(seconds=1), gate=capacity_gate)
    assert s.state.phase is Phase.HALTED and s.state.halted == (canary,)
    assert s.state.exceptions == {canary: "old"}, "Rollback: its previous capacity written back"
    (problem,) = s.problems
    assert problem.reason == ROLLOUT_HALTED and "writing its capacity failed: boom" in problem.message
    # A failed write elsewhere (a node not in the wave) holds nothing up.
    other = by_hash(NAMES)[-1]
    ok = step(FAST, UID, views(state, failing=other), state, T0 + timedelta(seconds=1), gate=capacity_gate)
    assert ok.state.phase is Phase.PROGRESSING
    waiting = step(
        FAST, UID, views(state, stuck=canary), state, T0 + timedelta(seconds=99), gate=capacity_gate
    )
    assert waiting.state.phase is Phase.PROGRESSING and waiting.recheck_at == T0 + timedelta(seconds=100)
    late = step(FAST, UID, views(state, stuck=canary), state, T0 + timedelta(seconds=100), gate=capacity_gate)
    assert late.state.phase is Phase.HALTED and late.state.halted == (canary,)


# --- staging: a Static change is staged; each node is planned for the revision it serves -------


def test_a_static_change_is_staged_and_each_node_is_planned_for_its_revision() -> None:
    first, second = profile(1), profile(2)
    nodes = [node(n, 1) for n in NAMES]
    s = staging(first, second, nodes=nodes)
    assert s.state(first).settled_now, "a new profile: at once"
    st = s.state(second)
    assert not st.settled_now and st.pending, "a change of its count is staged"
    old = s.current(second)
    assert old is not None and old.static_capacity == 1 and old.spec["static"] == {"capacity": 1}
    assert as_revision(second, revision_data(first.spec)).static_capacity == 1
    # Nobody moved yet: every node keeps its count (no patch).
    assert all(capacity.plan(n, {R: s.served(second, n)}) == [] for n in nodes)
    canary = by_hash(NAMES)[0]
    wave = step(FAST, UID, views(st), st, T0, gate=capacity_gate)
    s.commit("dongles", wave)
    plans = {n.name: capacity.plan(n, {R: s.served(second, n)}) for n in nodes}
    assert [n for n, ops in plans.items() if ops] == [canary], "only the canary is written"
    assert {"op": "add", "path": "/status/capacity/example.com~1dongle", "value": "2"} in plans[canary]
    # Halted with Rollback: the canary is planned back to its previous count.
    moved = node(canary, 2)
    halted = step(FAST, UID, views(wave.state, failing=canary), wave.state, T0, gate=capacity_gate)
    s.commit("dongles", halted)
    assert s.served(second, moved).static_capacity == 1
    assert {"op": "add", "path": "/status/allocatable/example.com~1dongle", "value": "1"} in capacity.plan(
        moved, {R: s.served(second, moved)}
    )


def test_a_static_change_that_only_adds_nodes_goes_at_once() -> None:
    narrow = Profile.from_body(
        {
            "metadata": {"name": "dongles", "uid": UID},
            "spec": {
                "resourceName": R,
                "mode": "Static",
                "nodeSelector": {"matchLabels": {"zone": "a"}},
                "static": {"capacity": 1},
            },
        }
    )
    wide = profile(1)
    wide = Profile.from_body(
        {"metadata": {"name": "dongles", "uid": UID}, "spec": {**wide.spec, "rollout": {}}}
    )
    s = staging(narrow, wide, nodes=[node("a", 1, {"zone": "a"}), node("b", None, {"zone": "b"})])
    s.state(narrow)
    assert s.state(wide).settled_now and "only adds nodes" in s.state(wide).message


def test_node_sync_plans_each_node_for_the_revision_it_serves() -> None:
    first, second = profile(1), profile(2)
    nodes = [node(n, 1) for n in NAMES]
    s = staging(first, second, nodes=nodes)
    s.state(first)
    s.commit("dongles", step(FAST, UID, views(s.state(second)), s.state(second), T0, gate=capacity_gate))
    sync = NodeSync(None, None, lambda: {R: second}, lambda: None)  # type: ignore[arg-type]
    for n in nodes:
        sync.fold("LISTED", n)
    assert len(sync.queue) == len(NAMES), "unstaged: every node planned for the spec"
    sync = NodeSync(None, None, lambda: {R: second}, lambda: None)  # type: ignore[arg-type]
    sync.serves = s.served
    for n in nodes:
        sync.fold("LISTED", n)
    assert len(sync.queue) == 1, "staged: only the canary's capacity is written"


# --- evaluate(): counts and the gate from the nodes' status -------------------------------------


def test_the_static_status_counts_nodes_by_revision_and_halts_on_a_bad_label() -> None:
    first, second = profile(1), profile(2)
    old, new = spec_revision(first.spec), spec_revision(second.spec)
    canary = by_hash(NAMES)[0]
    begun = State.begin(old, new)
    nodes = [node(n, 1) for n in NAMES]
    result = evaluate(Inputs(second, {}, NOW, nodes, rollout=(FAST, begun), current_profile=first))
    assert result.rollout is not None and result.rollout.state.baseline == {canary: 0}
    st = result.status
    assert st is not None
    assert [(p.node, p.reason, p.transient) for p in result.problems] == [(canary, "ValueMismatch", True)], (
        "the nodes on the current revision are as they should be; the canary is being written"
    )
    assert (st["currentRevision"], st["updateRevision"]) == (f"dongles-{old}", f"dongles-{new}")
    assert (st["desiredNumberScheduled"], st["updatedNumberScheduled"], st["updatedNumberReady"]) == (6, 0, 0)
    moving = result.rollout.state
    # The canary's capacity written and seen: updated 1; then past healthySeconds the next wave.
    nodes = [node(n, 2 if n == canary else 1) for n in NAMES]
    seen = evaluate(Inputs(second, {}, NOW, nodes, rollout=(FAST, moving), current_profile=first))
    assert seen.status is not None and seen.status["updatedNumberScheduled"] == 1
    assert seen.rollout is not None and parse_rfc3339(seen.rollout.state.gate_since) == parse_rfc3339(NOW)
    later = "2026-11-29T00:00:10Z"
    passed = evaluate(
        Inputs(second, {}, later, nodes, rollout=(FAST, seen.rollout.state), current_profile=first)
    )
    assert passed.rollout is not None and passed.rollout.state.wave == 1 and passed.rollout.new_wave
    # A failed write of the canary (its status still shows 1) halts it.
    unwritten = [node(n, 1) for n in NAMES]
    failed = evaluate(
        Inputs(
            second,
            {},
            NOW,
            unwritten,
            rollout=(FAST, moving),
            current_profile=first,
            failures={canary: "boom"},
        )
    )
    assert failed.rollout is not None and failed.rollout.state.halted == (canary,)
    assert failed.status is not None and failed.status["rollout"]["phase"] == "Halted"
    # A change to a capacity label the canary's value makes unusable: halted at once, not at the deadline.
    labelled = Profile.from_body(
        {
            "metadata": {"name": "dongles", "uid": UID},
            "spec": {**first.spec, "static": {"capacityFromLabel": "x/n"}},
        }
    )
    nodes = [node(n, 1, {"x/n": "many"}) for n in NAMES]
    begun = State.begin(old, spec_revision(labelled.spec))
    moved = step(FAST, UID, views(begun), begun, T0, gate=capacity_gate).state
    bad = evaluate(Inputs(labelled, {}, NOW, nodes, rollout=(FAST, moved), current_profile=first))
    assert bad.rollout is not None and bad.rollout.state.halted == (canary,)
    assert "is not a non-negative integer" in bad.rollout.state.message


def test_one_normal_event_per_wave_through_the_recorder() -> None:
    posted: list[dict[str, Any]] = []

    async def post(_ns: str, body: dict[str, Any]) -> None:
        posted.append(body)

    recorder = EventRecorder(post, clock=lambda: 0.0)
    note = "wave 2: 3 node(s) moved to revision abc123, 7 of 20 updated"
    asyncio.run(recorder.note(profile(), "RolloutWave", note))
    asyncio.run(recorder.note(profile(), "RolloutWave", note))
    assert [(e["type"], e["reason"], e["message"]) for e in posted] == [("Normal", "RolloutWave", note)]
    assert posted[0]["involvedObject"]["name"] == "dongles" and recorder.suppressed == 1
