"""Staged rollouts: the wave state machine (pure; docs/design/staged-rollouts.md).

A profile whose update revision differs from its current one moves its nodes in waves: a canary
wave (``spec.rollout.canary``: a count of nodes taken in ``node_hash`` order, or a node
selector), then waves of ``maxNodesPerWave`` of the selected nodes (a count or a percentage,
rounded up). A wave is ONE change of the ``rollout`` stanza in the agents' config (its threshold
moves). It is held until every node of the wave reports ``revision == update`` and has been
healthy on it for ``healthySeconds``:

- its DeviceReport has no ``agentError``;
- its healthy devices are not fewer than at the wave's start (``baseline``: one integer per node
  of the wave, kept in ``status.rollout.baseline`` so a restarted operator has it), or, with
  ``minHealthyPercent``, not below that share of it;
- the node's allocatable agrees with the report (the status's ``DevicesNotAllocatable``, past its
  grace) and the agent pod on the node has no stalled trouble;
- DRA: at the gate's end, the node's ResourceSlices publish every device its report says healthy
  (``NodeView.slices``, read then: ``Step.read_slices`` asks for the reads, one LIST per wave node;
  a read older than the gate's end does not count). Slices short of the report fail the gate once
  read ``SLICES_SETTLE`` seconds or more after the gate's start (the agent writes its slices and
  its report separately: a shorter gate reads them again then);
- no pod failed to start for the resource on it during the wave: the report's
  ``allocationFailures.count`` (the kubelet's Allocate / PreStartContainer calls and DRA claims
  the agent answered with an error) is not above the count at the wave's start. That starting
  count is kept in memory only (``State.failures``), as ``gate_since`` is: a restarted operator
  takes the count it first sees as the start. A count under another ``since`` is a new agent's,
  counted from 0 (every failure it counts came after the wave's start).

A wave that fails its gate, or one not through it within ``progressDeadlineSeconds`` of its
start, halts the rollout: the threshold stops, the failed nodes go back to the current revision
(``exceptions``; ``onFailure: Rollback``, the default) or stay (``Pause``), the phase is Halted and
a stalled ``RolloutHalted`` problem names the nodes and what regressed. Only a new update revision
(a spec change) starts again. When every selected node serves the update, the rollout completes:
``current = update``.

What "through the gate" means per node is the mode's (``Gate``): ``agent_gate`` for the modes
served by an agent (the checks above, on its DeviceReport), ``capacity_gate`` for Static, where
the operator itself writes the count into the node's status: a node is through once its capacity
and allocatable show what the update revision says (``NodeView.revision``), and a failed write
of the wave's node halts at once.

``step`` takes the policy (``spec.rollout``), the selected nodes as the caches see them, the state
(``State``: ``status.rollout`` and the revisions, plus ``gate_since``, kept in memory only: a
restarted operator starts the healthy period of a wave's gate again) and the time, and returns the
next state; nothing here reads a clock or writes anything.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from patchbay_api.revisions import EVERYONE, NOBODY, Rollout, node_hash, threshold_for
from patchbay_api.selectors import label_selector_matches
from patchbay_operator.constants import Reason
from patchbay_operator.status.conditions import Problem
from patchbay_operator.timestamps import parse_rfc3339, rfc3339, rfc3339_precise

IMMEDIATE, STAGED = "Immediate", "Staged"
ROLLBACK, PAUSE = "Rollback", "Pause"
DEFAULT_CANARY_NODES = 1
DEFAULT_MAX_PER_WAVE = "25%"
DEFAULT_HEALTHY_SECONDS = 30
DEFAULT_DEADLINE_SECONDS = 600
ROLLOUT_HALTED = Reason.ROLLOUT_HALTED.value
"""The stalled problem's reason (the Stalled condition's, and the Warning Event's)."""
ROLLOUT_WAVE = "RolloutWave"
"""The reason of the ONE Normal Event a wave posts when it moves (``Step.note``)."""
MAX_NAMED = 10
"""Nodes named in a message; the rest are counted."""
SLICES_SETTLE = 10.0
"""DRA: seconds from the gate's start after which a node's ResourceSlices short of its report fail
the gate (an agent writes its slices within a second of its report, each coalesced 0.5 s)."""
SLICES_RETRY = 5.0
"""DRA: seconds until the wave's slices are asked for again while a read is missing (failed)."""


class Phase(StrEnum):
    """``status.rollout.phase`` (the CRD's enum)."""

    PROGRESSING = "Progressing"
    PAUSED = "Paused"
    HALTED = "Halted"
    COMPLETE = "Complete"


MAX_MESSAGE, MAX_HALTED = 1024, 100
"""The CRD's bounds on ``status.rollout.message`` and ``haltedNodes``."""


@dataclass(frozen=True)
class Policy:
    """``spec.rollout`` with its documented defaults (absent fields are never written back)."""

    immediate: bool = False
    paused: bool = False
    canary_nodes: int = DEFAULT_CANARY_NODES
    canary_selector: Mapping[str, Any] | None = None
    per_wave: int | str = DEFAULT_MAX_PER_WAVE
    healthy_seconds: float = DEFAULT_HEALTHY_SECONDS
    #: None: not fewer healthy devices than at the wave's start
    min_healthy_percent: int | None = None
    deadline_seconds: float = DEFAULT_DEADLINE_SECONDS
    rollback: bool = True

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None) -> Policy:
        raw = raw or {}
        canary = raw.get("canary") or {}
        per_wave = raw.get("maxNodesPerWave")
        return cls(
            immediate=raw.get("strategy") == IMMEDIATE,
            paused=bool(raw.get("paused")),
            canary_nodes=int(canary["nodes"]) if canary.get("nodes") is not None else DEFAULT_CANARY_NODES,
            canary_selector=canary.get("nodeSelector"),
            per_wave=per_wave if per_wave is not None else DEFAULT_MAX_PER_WAVE,
            healthy_seconds=float(raw.get("healthySeconds", DEFAULT_HEALTHY_SECONDS)),
            min_healthy_percent=raw.get("minHealthyPercent"),
            deadline_seconds=float(raw.get("progressDeadlineSeconds", DEFAULT_DEADLINE_SECONDS)),
            rollback=raw.get("onFailure", ROLLBACK) != PAUSE,
        )

    def wave_size(self, selected: int) -> int:
        """Nodes per wave after the canary: a count, or a percentage of the selected nodes
        rounded up; at least one."""
        raw = self.per_wave
        if isinstance(raw, str) and raw.endswith("%"):
            return max(1, math.ceil(selected * int(raw[:-1]) / 100))
        return max(1, int(raw))


@dataclass(frozen=True)
class NodeView:
    """One selected node as the gate sees it."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    #: the revision its agent reports serving ("" without a report); Static: the one whose
    #: capacity the node shows
    revision: str = ""
    #: healthy devices its report counts (None: no report)
    healthy: int | None = None
    #: its report's agentError ("" none)
    error: str = ""
    #: the node's allocatable disagrees with the report (DevicesNotAllocatable past its grace)
    short: str = ""
    #: a stalled trouble of the agent's pod on the node ("" none)
    trouble: str = ""
    #: its report's allocationFailures: the count, since when the agent counts ("" and 0 while
    #: none failed), the last failure's message
    failures: int = 0
    failures_since: str = ""
    last_failure: str = ""
    #: the count at the wave's start under the same ``since`` (set by the state machine; None:
    #: not known, nothing to compare)
    failures_before: int | None = None
    #: DRA: what its ResourceSlices lack of its report, as read at ``slices_read`` ("" nothing;
    #: ``slices_read`` None: not read)
    slices: str = ""
    slices_read: datetime | None = None


@dataclass(frozen=True)
class State:
    """Where a profile's rollout stands: ``status.rollout`` and the revisions, plus ``gate_since``
    (memory only)."""

    current: str
    update: str
    threshold: int = EVERYONE
    canary: Mapping[str, Any] | None = None
    phase: Phase = Phase.COMPLETE
    #: the wave moving or held: 0 the canary (status.rollout.wave)
    wave: int = 0
    #: when the wave was given the update revision; "" while no node has been moved yet
    wave_start: str = ""
    wave_nodes: int = 0
    halted: tuple[str, ...] = ()
    exceptions: Mapping[str, str] = field(default_factory=dict)
    #: node of the wave -> its healthy devices at the wave's start
    baseline: Mapping[str, int] = field(default_factory=dict)
    message: str = ""
    #: since when every node of the wave has served the update revision, healthy (memory only;
    #: to the microsecond, so that ``healthySeconds`` is never cut short)
    gate_since: str = ""
    #: node of the wave -> (allocationFailures.since, count) at the wave's start (memory only:
    #: a restarted operator takes the count it first sees)
    failures: Mapping[str, tuple[str, int]] = field(default_factory=dict)

    @classmethod
    def settled(cls, revision: str, message: str = "") -> State:
        return cls(revision, revision, message=message)

    @classmethod
    def begin(cls, current: str, update: str) -> State:
        """A new update revision: no node moved yet (the stanza written with the spec change)."""
        return cls(current, update, NOBODY, phase=Phase.PROGRESSING, message=f"rolling out {update}")

    @property
    def settled_now(self) -> bool:
        return self.current == self.update

    @property
    def pending(self) -> bool:
        """A new update revision that no node has been moved to yet."""
        return not self.wave_start

    def stanza(self) -> Rollout:
        if self.settled_now:
            return Rollout.settled(self.update)
        return Rollout(self.current, self.update, self.canary, self.threshold, dict(self.exceptions))

    def status(self) -> dict[str, Any]:
        """``status.rollout`` (every field, so a merge patch replaces the last one)."""
        if self.settled_now:
            return {"phase": Phase.COMPLETE.value, "message": self.message[:MAX_MESSAGE]}
        return {
            "phase": self.phase.value,
            "wave": self.wave,
            "waveStartTime": self.wave_start or None,
            "waveNodes": self.wave_nodes,
            "threshold": str(self.threshold),
            "haltedNodes": list(self.halted[:MAX_HALTED]),
            "message": self.message[:MAX_MESSAGE],
            "baseline": dict(sorted(self.baseline.items())),
        }

    @classmethod
    def from_status(cls, current: str, update: str, raw: Mapping[str, Any] | None, rollback: bool) -> State:
        """The state a restarted operator (or a standby taking over) finds in the status; the
        exceptions follow from ``haltedNodes`` and ``onFailure``."""
        if current == update or not isinstance(raw, Mapping) or not raw.get("phase"):
            return cls.settled(update) if current == update else cls.begin(current, update)
        try:
            threshold = int(str(raw.get("threshold", NOBODY)))
        except ValueError:
            threshold = NOBODY
        halted = tuple(str(n) for n in raw.get("haltedNodes") or ())
        try:
            phase = Phase(str(raw["phase"]))
        except ValueError:
            phase = Phase.PROGRESSING
        return cls(
            current,
            update,
            max(NOBODY, min(EVERYONE, threshold)),
            phase=phase,
            wave=int(raw.get("wave") or 0),
            wave_start=str(raw.get("waveStartTime") or ""),
            wave_nodes=int(raw.get("waveNodes") or 0),
            halted=halted,
            exceptions={n: current for n in halted} if rollback and phase is Phase.HALTED else {},
            baseline={str(k): int(v) for k, v in (raw.get("baseline") or {}).items()},
            message=str(raw.get("message") or ""),
        )


@dataclass(frozen=True)
class Step:
    state: State
    #: the stalled RolloutHalted problem while halted
    problems: list[Problem] = field(default_factory=list)
    #: when to look again although nothing happens (the gate's end, the deadline)
    recheck_at: datetime | None = None
    #: a wave began (for the metric)
    new_wave: bool = False
    #: what the wave that began did, for its one Normal Event ("" no wave began)
    note: str = ""
    #: DRA: the wave's nodes whose ResourceSlices to read now (the gate's end)
    read_slices: tuple[str, ...] = ()


Gate = Callable[[Policy, NodeView, int, str], "str | None"]
"""A mode's gate for one node of the wave: ``gate(policy, node, baseline, update)`` is None while
the node does not show the update revision yet, "" when it shows it and nothing regressed, else
what failed (the node halts the rollout)."""


def agent_gate(policy: Policy, node: NodeView, before: int, update: str) -> str | None:
    """An agent's node: its DeviceReport says it serves ``update``, and nothing regressed."""
    if node.revision != update:
        return None
    return _regressed(policy, node, before)


def capacity_gate(policy: Policy, node: NodeView, before: int, update: str) -> str | None:
    """A Static node: its status shows the capacity ``update`` says (``revision``: through), or the
    operator's write of it failed (``error``: halt at once), or not yet."""
    if node.revision == update:
        return node.short
    if node.error:
        return f"writing its capacity failed: {node.error}"
    return None


def _names(nodes: Sequence[str]) -> str:
    shown = ", ".join(nodes[:MAX_NAMED])
    return shown + (f" and {len(nodes) - MAX_NAMED} more" if len(nodes) > MAX_NAMED else "")


def halt_problem(state: State) -> Problem:
    return Problem("", "", ROLLOUT_HALTED, state.message, stalled=True)


def step(
    policy: Policy,
    uid: str,
    nodes: Sequence[NodeView],
    state: State,
    now: datetime,
    *,
    gate: Gate = agent_gate,
    slices: bool = False,
) -> Step:
    """The next state of a profile's rollout (see the module doc); ``gate``: the mode's;
    ``slices``: DRA, the wave's ResourceSlices are read at the gate's end."""
    if state.settled_now:
        return Step(state)
    if policy.immediate:
        return Step(State.settled(state.update, f"strategy {IMMEDIATE}: every node serves {state.update}"))
    if state.phase is Phase.HALTED:
        return Step(state, [halt_problem(state)])
    if policy.paused:
        held = replace(
            state,
            phase=Phase.PAUSED,
            gate_since="",
            message=f"paused at wave {state.wave} (spec.rollout.paused): the threshold does not move",
        )
        return Step(held)
    if state.phase is Phase.PAUSED:  # resumed: the wave's clocks start again
        start = "" if state.pending else rfc3339(now)
        state = replace(state, phase=Phase.PROGRESSING, wave_start=start, gate_since="")
    if state.pending:
        return _next_wave(policy, uid, nodes, state, now)
    return _gate(policy, uid, nodes, state, now, gate=gate, slices=slices)


def _next_wave(policy: Policy, uid: str, nodes: Sequence[NodeView], state: State, now: datetime) -> Step:
    """Move the next wave (the canary first), or complete when every node serves the update."""
    names = [n.name for n in nodes]
    before = state.stanza()
    moved = {n.name for n in nodes if before.served(uid, n.name, n.labels) == state.update}
    if not state.pending and len(moved) == len(nodes) and not state.exceptions:
        return Step(State.settled(state.update, f"complete: every node serves {state.update}"))
    wave = 0 if state.pending else state.wave + 1
    canary, threshold = state.canary, state.threshold
    if wave == 0 and policy.canary_selector is not None:
        canary, threshold = policy.canary_selector, NOBODY
    else:
        ordinary = [n.name for n in nodes if canary is None or not label_selector_matches(canary, n.labels)]
        already = sum(node_hash(uid, n) < threshold for n in ordinary)
        count = policy.canary_nodes if wave == 0 else already + policy.wave_size(len(names))
        threshold = threshold_for(uid, ordinary, count) if count < len(ordinary) else EVERYONE
    after = replace(state, canary=canary, threshold=threshold).stanza()
    wave_nodes = sorted(
        n.name for n in nodes if n.name not in moved and after.served(uid, n.name, n.labels) == state.update
    )
    if not wave_nodes and threshold == EVERYONE:
        return Step(State.settled(state.update, f"complete: every node serves {state.update}"))
    healthy = {n.name: n.healthy or 0 for n in nodes}
    new_nodes = set(wave_nodes)
    what = "canary wave" if wave == 0 else f"wave {wave}"
    new = replace(
        state,
        canary=canary,
        threshold=threshold,
        phase=Phase.PROGRESSING,
        wave=wave,
        wave_start=rfc3339(now),
        wave_nodes=len(wave_nodes),
        baseline={n: healthy[n] for n in wave_nodes},
        failures={n.name: (n.failures_since, n.failures) for n in nodes if n.name in new_nodes},
        gate_since="",
        message=f"{what}: {len(wave_nodes)} node(s) moving to {state.update} ({_names(wave_nodes)})",
    )
    recheck = now + timedelta(seconds=policy.deadline_seconds)
    updated = len(moved) + len(wave_nodes)
    note = (
        f"{what}: {len(wave_nodes)} node(s) moved to revision {state.update}, "
        f"{updated} of {len(nodes)} updated"
    )
    return Step(new, recheck_at=recheck, new_wave=True, note=note)


def _regressed(policy: Policy, node: NodeView, before: int) -> str:
    """What regressed on a node of the wave that serves the update ("" nothing)."""
    if node.error:
        return f"agent error: {node.error}"
    if node.failures_before is not None and node.failures > node.failures_before:
        return (
            f"{node.failures - node.failures_before} allocation failure(s) during the wave, "
            f"the last: {node.last_failure}"
        )
    healthy = node.healthy or 0
    if healthy < before:
        floor = policy.min_healthy_percent
        if floor is None:
            return f"{healthy} healthy devices, {before} before the change"
        if healthy * 100 < floor * before:
            return f"{healthy} healthy devices, below minHealthyPercent {floor}% of {before}"
    if node.short:
        return node.short
    if node.trouble:
        return f"agent pod: {node.trouble}"
    return ""


def _gate(
    policy: Policy,
    uid: str,
    nodes: Sequence[NodeView],
    state: State,
    now: datetime,
    *,
    gate: Gate,
    slices: bool = False,
) -> Step:
    by_name = {n.name: n for n in nodes}
    wave = [by_name[n] for n in sorted(state.baseline) if n in by_name]
    state, wave = _failures_before(state, wave)
    failed: dict[str, str] = {}
    waiting: list[str] = []
    for node in wave:
        why = gate(policy, node, state.baseline[node.name], state.update)
        if why is None:
            waiting.append(node.name)
        elif why:
            failed[node.name] = why
    if failed:
        return _halt(policy, state, failed, "failed its health gate")
    start = parse_rfc3339(state.wave_start) or now
    deadline = start + timedelta(seconds=policy.deadline_seconds)
    if waiting:
        if now >= deadline:
            why = f"did not report serving {state.update} within {policy.deadline_seconds:g} s"
            return _halt(policy, state, dict.fromkeys(waiting, why), "made no progress")
        return Step(replace(state, gate_since=""), recheck_at=deadline)
    since = parse_rfc3339(state.gate_since) or now
    state = replace(state, gate_since=rfc3339_precise(since))
    passed = since + timedelta(seconds=policy.healthy_seconds)
    if now >= passed:
        held = (
            _slices_held(policy, state, wave, since=since, passed=passed, now=now, deadline=deadline)
            if slices
            else None
        )
        return held if held is not None else _next_wave(policy, uid, nodes, state, now)
    if now >= deadline:
        why = f"not healthy for {policy.healthy_seconds:g} s within {policy.deadline_seconds:g} s"
        return _halt(policy, state, {n.name: why for n in wave}, "made no progress")
    return Step(state, recheck_at=min(passed, deadline))


def _slices_held(
    policy: Policy,
    state: State,
    wave: Sequence[NodeView],
    *,
    since: datetime,
    passed: datetime,
    now: datetime,
    deadline: datetime,
) -> Step | None:
    """DRA, at the gate's end: None when the wave's ResourceSlices, read since then, agree with the
    reports; else the reads to make, or the wait until a short read counts, or the halt."""
    unread = [n.name for n in wave if n.slices_read is None or n.slices_read < passed]
    if unread:
        if now >= deadline:
            why = f"its ResourceSlices could not be read within {policy.deadline_seconds:g} s"
            return _halt(policy, state, dict.fromkeys(unread, why), "made no progress")
        return Step(state, recheck_at=now + timedelta(seconds=SLICES_RETRY), read_slices=tuple(unread))
    short = {n.name: n.slices for n in wave if n.slices}
    if not short:
        return None
    settled = since + timedelta(seconds=SLICES_SETTLE)
    early = tuple(n.name for n in wave if n.slices and n.slices_read is not None and n.slices_read < settled)
    if not early:
        return _halt(policy, state, short, "failed its health gate")
    if now < settled:
        return Step(state, recheck_at=settled)
    return Step(state, recheck_at=now + timedelta(seconds=SLICES_RETRY), read_slices=early)


def _failures_before(state: State, wave: list[NodeView]) -> tuple[State, list[NodeView]]:
    """The wave's nodes with the allocation failures counted at the wave's start: the count kept
    then (a node not known yet, as after an operator restart: its count now), or 0 when the
    agent counts since another time (a new agent: every failure it counts came later)."""
    starts = dict(state.failures)
    views = []
    for node in wave:
        since, count = starts.setdefault(node.name, (node.failures_since, node.failures))
        views.append(replace(node, failures_before=count if since == node.failures_since else 0))
    if starts != state.failures:
        state = replace(state, failures=starts)
    return state, views


def _halt(policy: Policy, state: State, failed: Mapping[str, str], what: str) -> Step:
    nodes = sorted(failed)
    detail = "; ".join(f"node {n}: {failed[n]}" for n in nodes[:MAX_NAMED])
    if len(nodes) > MAX_NAMED:
        detail += f"; and {len(nodes) - MAX_NAMED} more"
    undo = (
        f"put back on {state.current}"
        if policy.rollback
        else f"kept on {state.update} for diagnosis (onFailure: {PAUSE})"
    )
    where = "canary wave" if state.wave == 0 else f"wave {state.wave}"
    message = (
        f"rollout of {state.update} halted: {where} {what} on {_names(nodes)} ({undo}); {detail}. "
        "A new change of the spec (a fix, or the revert) starts a new rollout"
    )
    halted = replace(
        state,
        phase=Phase.HALTED,
        halted=tuple(nodes),
        exceptions={n: state.current for n in nodes} if policy.rollback else {},
        gate_since="",
        message=message,
    )
    return Step(halted, [halt_problem(halted)])
