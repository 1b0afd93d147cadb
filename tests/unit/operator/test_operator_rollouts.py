"""Staged rollouts: the wave state machine (rollouts.py) and each profile's state (staging.py),
by value: every transition, a halt that stops the threshold, and the property that no node
outside the first k waves ever serves the update revision."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from patchbay_api.revisions import EVERYONE, NOBODY, node_hash, revision_data, spec_revision
from patchbay_operator import render
from patchbay_operator.capacity import NodeState
from patchbay_operator.config import Settings
from patchbay_operator.profiles import Profile
from patchbay_operator.rollouts import ROLLOUT_HALTED, NodeView, Phase, Policy, State, Step, step
from patchbay_operator.staging import Staging, as_revision, only_adds_nodes

UID = "uid-serial"
T0 = datetime(2026, 11, 29, tzinfo=UTC)
FAST = Policy(healthy_seconds=10, deadline_seconds=100)


def by_hash(names: list[str]) -> list[str]:
    return sorted(names, key=lambda n: node_hash(UID, n))


def fleet(state: State, names: list[str], *, healthy: int = 4, **on_update: Any) -> list[NodeView]:
    """Every node reports the revision the stanza gives it, `healthy` devices; `on_update`
    overrides fields of the nodes serving the update revision."""
    stanza = state.stanza()
    out = []
    for n in names:
        served = stanza.served(UID, n, {})
        view = NodeView(n, {}, served, healthy)
        if served == state.update and on_update:
            view = NodeView(n, {}, served, **{"healthy": healthy, **on_update})
        out.append(view)
    return out


def moved(state: State, names: list[str]) -> set[str]:
    stanza = state.stanza()
    return {n for n in names if stanza.served(UID, n, {}) == state.update}


def run_gate(
    policy: Policy, state: State, names: list[str], now: datetime, **kw: Any
) -> tuple[Step, datetime]:
    """Step twice: the nodes are seen on the update, then again past healthySeconds."""
    first = step(policy, UID, fleet(state, names, **kw), state, now)
    later = now + timedelta(seconds=policy.healthy_seconds)
    return step(policy, UID, fleet(first.state, names, **kw), first.state, later), later


NAMES = [f"n{i}" for i in range(8)]


def test_a_new_revision_moves_the_canary_first_then_waves_of_a_quarter_then_completes() -> None:
    state = State.begin("old", "new")
    assert state.stanza().threshold == NOBODY and not moved(state, NAMES)
    s = step(FAST, UID, fleet(state, NAMES), state, T0)
    assert s.new_wave and s.state.wave == 0 and s.state.phase is Phase.PROGRESSING
    assert moved(s.state, NAMES) == {by_hash(NAMES)[0]}, "the canary: the first node by hash"
    assert s.state.baseline == {by_hash(NAMES)[0]: 4} and s.state.wave_nodes == 1
    assert s.recheck_at == T0 + timedelta(seconds=100)
    # Held: seen on the update, healthy, but not yet for healthySeconds.
    held = step(FAST, UID, fleet(s.state, NAMES), s.state, T0 + timedelta(seconds=1))
    assert held.state.wave == 0 and held.state.gate_since and not held.new_wave
    assert held.recheck_at == T0 + timedelta(seconds=11)
    passed = step(FAST, UID, fleet(held.state, NAMES), held.state, T0 + timedelta(seconds=11))
    assert passed.new_wave and passed.state.wave == 1
    assert moved(passed.state, NAMES) == set(by_hash(NAMES)[:3]), "canary + 25% of 8 = 2"
    state, now = passed.state, T0 + timedelta(seconds=11)
    waves = [len(moved(state, NAMES))]
    while not state.settled_now:
        result, now = run_gate(FAST, state, NAMES, now)
        state = result.state
        waves.append(len(moved(state, NAMES)) if not state.settled_now else len(NAMES))
    assert waves == [3, 5, 7, 8, 8]
    assert state.current == state.update == "new" and state.phase is Phase.COMPLETE
    assert state.stanza().threshold == EVERYONE
    assert state.status() == {"phase": "Complete", "message": "complete: every node serves new"}


def test_the_gate_holds_for_the_whole_of_healthy_seconds_from_a_moment_within_a_second() -> None:
    """The gate's start is kept to the microsecond: nodes healthy from T0+1.9 s pass at T0+11.9 s,
    not at T0+11 s (a start cut to whole seconds let a gate pass up to 1 s early)."""
    state = canary()
    start = T0 + timedelta(seconds=1.9)
    seen = step(FAST, UID, fleet(state, NAMES), state, start)
    assert seen.recheck_at == start + timedelta(seconds=10)
    early = step(FAST, UID, fleet(seen.state, NAMES), seen.state, T0 + timedelta(seconds=11.5))
    assert not early.new_wave and early.state.wave == 0, "held: 9.6 s of the 10"
    assert early.recheck_at == start + timedelta(seconds=10)
    through = step(FAST, UID, fleet(early.state, NAMES), early.state, start + timedelta(seconds=10))
    assert through.new_wave and through.state.wave == 1


def test_the_evaluation_judges_the_gate_with_the_clock_to_the_microsecond() -> None:
    """evaluate() steps the rollout with ``Inputs.clock`` (the condition times keep whole seconds)."""
    from patchbay_operator.devicereports import Report
    from patchbay_operator.evaluation import Inputs, evaluate

    first, second = profile(), profile("/dev/ttyACM*")
    old, new = spec_revision(first.spec), spec_revision(second.spec)
    nodes = [NodeState(n, labels={}) for n in NAMES]
    state = step(FAST, second.uid, [NodeView(n, {}, old, 0) for n in NAMES], State.begin(old, new), T0).state
    stanza = state.stanza()
    reports = [Report(f"serial.{n}", "serial", n, revision=stanza.served(second.uid, n, {})) for n in NAMES]
    at = T0 + timedelta(seconds=1.9)

    def gate(now: datetime, previous: State) -> State:
        inputs = Inputs(second, {}, "2026-11-29T00:00:01Z", nodes, reports=reports, rollout=(FAST, previous))
        result = evaluate(replace(inputs, clock=now))
        assert result.rollout is not None
        return result.rollout.state

    held = gate(at, state)
    assert held.gate_since == "2026-11-29T00:00:01.900000Z"
    assert gate(T0 + timedelta(seconds=11.5), held).wave == 0


def test_a_canary_selector_moves_the_nodes_it_selects() -> None:
    policy = Policy(canary_selector={"matchLabels": {"canary": "yes"}})
    views = [NodeView(n, {"canary": "yes"} if n == "n5" else {}, "old", 4) for n in NAMES]
    s = step(policy, UID, views, State.begin("old", "new"), T0)
    stanza = s.state.stanza()
    assert [n for n in NAMES if stanza.served(UID, n, views[NAMES.index(n)].labels) == "new"] == ["n5"]
    assert s.state.threshold == NOBODY and s.state.baseline == {"n5": 4}


def canary(policy: Policy = FAST) -> State:
    return step(policy, UID, fleet(State.begin("old", "new"), NAMES), State.begin("old", "new"), T0).state


def test_fewer_healthy_devices_halts_and_puts_the_node_back() -> None:
    state = canary()
    node = next(iter(state.baseline))
    views = [NodeView(n, {}, state.stanza().served(UID, n, {}), 0 if n == node else 4) for n in NAMES]
    s = step(FAST, UID, views, state, T0 + timedelta(seconds=2))
    halted = s.state
    assert halted.phase is Phase.HALTED and halted.halted == (node,)
    assert halted.exceptions == {node: "old"} and halted.threshold == state.threshold
    assert not moved(halted, NAMES), "put back on the current revision"
    (problem,) = s.problems
    assert problem.reason == ROLLOUT_HALTED and problem.stalled
    assert node in problem.message and "0 healthy devices, 4 before the change" in problem.message
    # Frozen: whatever the nodes say later, the threshold does not move and nothing moves.
    later = step(FAST, UID, fleet(halted, NAMES), halted, T0 + timedelta(hours=1))
    assert later.state == halted and later.problems == s.problems
    status = halted.status()
    assert status["phase"] == "Halted" and status["haltedNodes"] == [node]
    assert status["threshold"] == str(state.threshold)


def test_min_healthy_percent_allows_a_change_meant_to_drop_devices() -> None:
    policy = Policy(healthy_seconds=10, min_healthy_percent=50)
    state = canary(policy)
    half = [NodeView(n, {}, state.stanza().served(UID, n, {}), 2) for n in NAMES]
    ok = step(policy, UID, half, state, T0 + timedelta(seconds=1))
    assert ok.state.phase is Phase.PROGRESSING
    bad = step(policy, UID, [NodeView(n, {}, state.stanza().served(UID, n, {}), 1) for n in NAMES], state, T0)
    assert bad.state.phase is Phase.HALTED and "minHealthyPercent 50%" in bad.state.message


def test_allocation_failures_that_rise_during_the_wave_halt_and_earlier_ones_do_not() -> None:
    """The report's allocationFailures: a count present before the wave is the start; the same
    count passes the gate, a rise fails the node naming the last failure; a new agent's count
    (another ``since``) counts from 0; a restarted operator takes the count it first sees."""
    since, message = "2026-11-28T00:00:00Z", "Allocate: unknown device nope::0"
    before = State.begin("old", "new")
    # 3 failures before the wave, on every node: the start.
    views = [NodeView(n, {}, "old", 4, failures=3, failures_since=since) for n in NAMES]
    state = step(FAST, UID, views, before, T0).state
    (node,) = state.baseline
    assert state.failures == {node: (since, 3)}
    same = fleet(state, NAMES, failures=3, failures_since=since, last_failure=message)
    held = step(FAST, UID, same, state, T0 + timedelta(seconds=1))
    assert held.state.phase is Phase.PROGRESSING, "the same count passes"
    passed = step(FAST, UID, same, held.state, T0 + timedelta(seconds=11))
    assert passed.new_wave and passed.state.wave == 1, "failures from before the wave do not fail it"
    rose = fleet(state, NAMES, failures=4, failures_since=since, last_failure=message)
    s = step(FAST, UID, rose, held.state, T0 + timedelta(seconds=2))
    assert s.state.phase is Phase.HALTED and s.state.halted == (node,)
    (problem,) = s.problems
    assert f"node {node}: 1 allocation failure(s) during the wave, the last: {message}" in problem.message
    # A new agent (another since) counting 1: every one of its failures came after the start.
    new_agent = fleet(state, NAMES, failures=1, failures_since="2026-11-29T00:00:05Z", last_failure=message)
    assert step(FAST, UID, new_agent, state, T0 + timedelta(seconds=2)).state.phase is Phase.HALTED
    # A restarted operator keeps no start: the count it first sees is the start, a rise later fails.
    restarted = State.from_status("old", "new", state.status(), rollback=True)
    assert not restarted.failures
    seen = step(FAST, UID, fleet(restarted, NAMES, failures=7, failures_since=since), restarted, T0)
    assert seen.state.phase is Phase.PROGRESSING and seen.state.failures == {node: (since, 7)}
    later = fleet(restarted, NAMES, failures=8, failures_since=since, last_failure=message)
    assert step(FAST, UID, later, seen.state, T0 + timedelta(seconds=1)).state.phase is Phase.HALTED


def test_an_agent_error_allocatable_short_or_a_stalled_agent_pod_halts() -> None:
    for field, value, said in (
        ("error", "no device matches", "agent error: no device matches"),
        ("short", "node allocatable counts 0 of the 4", "allocatable counts 0"),
        ("trouble", "CrashLoopBackOff", "agent pod: CrashLoopBackOff"),
    ):
        state = canary()
        s = step(FAST, UID, fleet(state, NAMES, **{field: value}), state, T0 + timedelta(seconds=1))
        assert s.state.phase is Phase.HALTED and said in s.state.message, field


def test_no_progress_within_the_deadline_halts_naming_the_waiting_nodes() -> None:
    state = canary()
    node = next(iter(state.baseline))
    stuck = [NodeView(n, {}, "old", 4) for n in NAMES]  # nobody reports the update
    waiting = step(FAST, UID, stuck, state, T0 + timedelta(seconds=99))
    assert waiting.state.phase is Phase.PROGRESSING and waiting.recheck_at == T0 + timedelta(seconds=100)
    s = step(FAST, UID, stuck, state, T0 + timedelta(seconds=100))
    assert s.state.phase is Phase.HALTED and s.state.halted == (node,)
    assert "made no progress" in s.state.message and "within 100 s" in s.state.message


def test_on_failure_pause_keeps_the_failed_nodes_on_the_update() -> None:
    policy = Policy(healthy_seconds=10, rollback=False)
    state = canary(policy)
    s = step(policy, UID, fleet(state, NAMES, error="boom"), state, T0)
    assert s.state.phase is Phase.HALTED and s.state.exceptions == {}
    assert moved(s.state, NAMES) == set(state.baseline) and "for diagnosis" in s.state.message


def test_paused_freezes_the_threshold_and_resume_restarts_the_wave_clock() -> None:
    state = canary()
    paused = step(Policy(paused=True), UID, fleet(state, NAMES), state, T0 + timedelta(seconds=500))
    assert paused.state.phase is Phase.PAUSED and paused.state.threshold == state.threshold
    resumed = step(FAST, UID, fleet(paused.state, NAMES), paused.state, T0 + timedelta(seconds=600))
    assert resumed.state.phase is Phase.PROGRESSING, "not halted by a deadline that ran while paused"
    assert resumed.state.wave_start == "2026-11-29T00:10:00Z"
    # Paused before any node moved: resuming moves the canary then.
    pending = step(Policy(paused=True), UID, fleet(State.begin("a", "b"), NAMES), State.begin("a", "b"), T0)
    assert pending.state.pending
    assert step(FAST, UID, fleet(pending.state, NAMES), pending.state, T0).state.wave_nodes == 1


def test_immediate_moves_every_node_at_once_even_a_halted_rollout() -> None:
    halted = step(FAST, UID, fleet(canary(), NAMES, error="x"), canary(), T0).state
    s = step(Policy(immediate=True), UID, fleet(halted, NAMES), halted, T0)
    assert s.state.settled_now and s.state.update == "new" and not s.problems


def test_the_status_round_trips_for_a_restarted_operator() -> None:
    state = canary()
    back = State.from_status("old", "new", state.status(), rollback=True)
    assert (back.threshold, back.wave, back.wave_start, back.baseline) == (
        state.threshold,
        state.wave,
        state.wave_start,
        state.baseline,
    )
    assert back.stanza() == state.stanza() and back.gate_since == ""
    halted = step(FAST, UID, fleet(state, NAMES, error="x"), state, T0).state
    again = State.from_status("old", "new", halted.status(), rollback=True)
    assert again.phase is Phase.HALTED and again.stanza() == halted.stanza()
    assert State.from_status("old", "new", None, rollback=True).pending
    assert State.from_status("new", "new", halted.status(), rollback=True).settled_now


def test_the_message_and_halted_nodes_stay_within_the_crd_bounds() -> None:
    names = [f"node-with-a-long-name-{i:04}" for i in range(300)]
    state = step(
        Policy(canary_nodes=250), UID, fleet(State.begin("a", "b"), names), State.begin("a", "b"), T0
    )
    s = step(FAST, UID, fleet(state.state, names, error="e" * 200), state.state, T0)
    status = s.state.status()
    assert len(status["message"]) <= 1024 and len(status["haltedNodes"]) == 100
    assert len(s.state.halted) == 250


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.text("abcdefgh", min_size=1, max_size=6), min_size=1, max_size=40, unique=True),
    st.integers(1, 3),
    st.one_of(st.integers(1, 10), st.sampled_from(["10%", "25%", "50%"])),
    st.data(),
)
def test_no_node_outside_the_first_k_waves_ever_serves_the_update(
    names: list[str], canaries: int, per_wave: int | str, data: st.DataObject
) -> None:
    """Through a whole rollout, after k waves exactly the first canaries + (k-1) * wave size
    nodes by hash serve the update; a failure in any wave halts it there and nothing moves after."""
    policy = Policy(canary_nodes=canaries, per_wave=per_wave, healthy_seconds=5)
    size = policy.wave_size(len(names))
    fail_at = data.draw(st.integers(0, 12))
    ordered = by_hash(names)
    state, now, k = State.begin("a", "b"), T0, 0
    for _ in range(60):
        views = fleet(state, names, error="bad" if k > fail_at else "")
        result = step(policy, UID, views, state, now)
        state, now = result.state, now + timedelta(seconds=5)
        if state.settled_now:
            break
        if result.new_wave:
            k += 1
        expected = set(ordered[: min(len(names), canaries + (k - 1) * size)])
        if state.phase is Phase.HALTED:
            assert moved(state, names) == expected - set(state.halted)
            frozen = step(policy, UID, fleet(state, names), state, now + timedelta(hours=1)).state
            assert frozen.threshold == state.threshold and moved(frozen, names) == moved(state, names)
            return
        assert moved(state, names) == expected
    assert state.settled_now, "a rollout with healthy nodes completes"


# --- staging.py: when a revision goes at once, and what the agents' config says ---------------


def profile(glob: str = "/dev/ttyUSB*", uid: str = UID, **spec: Any) -> Profile:
    return Profile.from_body(
        {
            "metadata": {"name": "serial", "uid": uid, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {
                "resourceName": "example.com/serial",
                "mode": "DevicePlugin",
                "plugin": {"discovery": {"paths": {"globs": [glob]}}},
                **spec,
            },
        }
    )


def staging(previous: dict[str, Any] | None = None, nodes: list[NodeState] | None = None) -> Staging:
    from patchbay_api.revisions import revision_data

    bodies = {spec_revision(p.spec): revision_data(p.spec) for p in (profile(), profile("/dev/none*"))}
    return Staging(lambda _p, d: bodies.get(d), lambda: nodes or [], lambda _n: previous or {})


def test_a_new_profile_goes_at_once_and_a_change_of_it_is_staged() -> None:
    s = staging()
    first = profile()
    assert s.entry(first) == (None, s.state(first).stanza()) and s.state(first).settled_now
    bad = profile("/dev/none*")
    current, stanza = s.entry(bad)
    assert current is not None and current.spec["plugin"] == first.spec["plugin"]
    assert (stanza.current, stanza.update, stanza.threshold) == (
        spec_revision(first.spec),
        spec_revision(bad.spec),
        NOBODY,
    )
    entry = render.node_entry(bad, None, current, stanza)
    assert entry["revision"] == spec_revision(bad.spec)
    assert entry["revisions"][spec_revision(first.spec)]["plugin"] == first.spec["plugin"]
    assert entry["plugin"] == bad.spec["plugin"] and entry["rollout"] == stanza.as_dict()
    assert s.in_use(bad) == {f"serial-{spec_revision(first.spec)}", f"serial-{spec_revision(bad.spec)}"}


def test_what_goes_at_once() -> None:
    for changed, why in ((profile("/dev/none*", rollout={"strategy": "Immediate"}), "strategy Immediate"),):
        s = staging()
        s.state(profile())
        st_ = s.state(changed)
        assert st_.settled_now and why in st_.message, why
    unknown = Staging(lambda _p, _d: None, list, lambda _n: {})
    unknown.state(profile())
    assert "is not known" in unknown.state(profile("/dev/none*")).message


def test_a_profile_with_an_agent_of_its_own_is_staged_in_its_own_configmap() -> None:
    """An own agent's profile stages as a shared one: the change of `plugin` starts with no node
    moved, and its own ConfigMap's one entry carries both revisions and the stanza. A change of
    its node selector (its DaemonSet's node affinity: the pods follow it at once) is not staged."""
    agent = {"image": "example.invalid/agent:2"}
    first, bad = profile(agent=agent), profile("/dev/none*", agent=agent)
    s = staging()
    s.state(first)
    st_ = s.state(bad)
    assert not st_.settled_now and (st_.current, st_.update) == (
        spec_revision(first.spec),
        spec_revision(bad.spec),
    )
    cfg = Settings(namespace="patchbay-test", agent_image="example.invalid/agent:1")
    cm, _ = render.agent_objects(bad, cfg, None, s.entry)
    (entry,) = yaml.safe_load(cm["data"]["node.yaml"])["profiles"]
    assert entry["rollout"] == st_.stanza().as_dict() and entry["rollout"]["threshold"] == 0
    assert entry["revisions"][st_.current]["plugin"] == first.spec["plugin"]
    moved = profile(agent=agent, nodeSelector={"matchLabels": {"zone": "x"}})
    elsewhere = [NodeState("b", labels={"zone": "y"})]  # the new selector drops it: not only added
    s = Staging(lambda _p, _d: revision_data(first.spec), lambda: elsewhere, lambda _n: {})
    s.state(first)
    st_ = s.state(moved)
    assert st_.settled_now and "node affinity" in st_.message, st_.message
    # The same change of a shared profile is staged.
    s = Staging(lambda _p, _d: revision_data(profile().spec), lambda: elsewhere, lambda _n: {})
    s.state(profile())
    assert not s.state(profile(nodeSelector={"matchLabels": {"zone": "x"}})).settled_now


def test_a_change_that_only_adds_nodes_goes_at_once() -> None:
    nodes = [NodeState("a", labels={"zone": "x"}), NodeState("b", labels={"zone": "y"})]
    old = {"mode": "DevicePlugin", "nodeSelector": {"matchLabels": {"zone": "x"}}}
    assert only_adds_nodes(old, {"mode": "DevicePlugin"}, nodes)
    assert not only_adds_nodes(
        old, {"mode": "DevicePlugin", "nodeSelector": {"matchLabels": {"zone": "y"}}}, nodes
    )
    assert not only_adds_nodes(old, {"mode": "DRA"}, nodes)


def test_a_restarted_operator_resumes_from_the_status() -> None:
    first, bad = profile(), profile("/dev/none*")
    rolling = canary()
    status = {
        "currentRevision": f"serial-{spec_revision(first.spec)}",
        "updateRevision": f"serial-{spec_revision(bad.spec)}",
        "rollout": rolling.status(),
    }
    s = staging(status)
    resumed = s.state(bad)
    assert (resumed.current, resumed.update) == (spec_revision(first.spec), spec_revision(bad.spec))
    assert resumed.threshold == rolling.threshold and resumed.baseline == rolling.baseline
    assert (
        as_revision(bad, {**bad.spec, "plugin": first.spec["plugin"]}).spec["plugin"] == first.spec["plugin"]
    )


def test_the_status_of_a_rolling_profile_reconciles_and_a_halted_one_stalls() -> None:
    """evaluate() with the rollout: currentRevision is the rollout's, status.rollout is written,
    a moving wave is Reconciling (RollingOut: Flux and Argo CD wait), a halt is Stalled."""
    from patchbay_operator.devicereports import Report
    from patchbay_operator.evaluation import Inputs, evaluate

    first, bad = profile(), profile("/dev/none*")
    old, new = spec_revision(first.spec), spec_revision(bad.spec)
    nodes = [NodeState(n, labels={}) for n in NAMES]
    reports = [Report(f"serial.{n}", "serial", n, revision=old) for n in NAMES]
    state = State.begin(old, new)

    def conds(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
        return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}

    result = evaluate(Inputs(bad, {}, "2026-11-29T00:00:00Z", nodes, reports=reports, rollout=(FAST, state)))
    assert result.rollout is not None and result.rollout.state.wave_nodes == 1
    status = result.status
    assert status is not None
    assert (status["currentRevision"], status["updateRevision"]) == (f"serial-{old}", f"serial-{new}")
    assert status["rollout"]["phase"] == "Progressing" and conds(status)["Reconciling"] == (
        "True",
        "RollingOut",
    )
    halted = step(FAST, UID, fleet(result.rollout.state, NAMES, error="x"), result.rollout.state, T0).state
    status = evaluate(
        Inputs(bad, {}, "2026-11-29T00:00:01Z", nodes, reports=reports, rollout=(FAST, halted))
    ).status
    assert status is not None and conds(status)["Stalled"] == ("True", ROLLOUT_HALTED)
    assert conds(status)["Reconciling"][0] == "False"
