"""A profile's observed state -> everything its status needs, computed once, with no effect.

`evaluate(inputs)` is pure: the status dict (None for a profile being deleted), the problems its
Events are posted from, when to look again (a pod's trouble that turns stalled later, with no
other event to say so), the nodes whose DeviceReports should be pruned (reports of nodes the
profile no longer selects), and the agent DaemonSet to nudge while the API server refuses its
pods (agentpods.refusal). profilestatus.py gathers the inputs from the caches and performs those
effects (`ProfileStatus.compute`); here nothing reads a clock, writes a field or starts a
request, so every mode is tested by value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from patchbay_api.constants import AgentPodReason
from patchbay_api.revisions import revision_name, spec_revision
from patchbay_operator import capacity, render, rollouts
from patchbay_operator.agentpods import AgentPod, Trouble, Warning, refusal
from patchbay_operator.capacity import NodeState
from patchbay_operator.constants import KUBELET_BEHIND_GRACE, STALL_AFTER_SECONDS, Mode, Reason
from patchbay_operator.devicereports import Report
from patchbay_operator.maintenance import Rule
from patchbay_operator.profiles import Profile
from patchbay_operator.status import deviceplugin, dra, nodegroups, static
from patchbay_operator.status.conditions import Problem, conflict_status
from patchbay_operator.status.daemonset import AgentDaemonSet
from patchbay_operator.status.dra import StoredDeviceClass
from patchbay_operator.timestamps import parse_rfc3339, rfc3339


@dataclass(frozen=True)
class Inputs:
    """What the operator's caches say about one profile at one moment."""

    profile: Profile
    #: the status as last written (conditions keep their lastTransitionTime)
    previous: Mapping[str, Any]
    #: the wall clock, once: for condition times (whole seconds)
    now: str
    #: every node the operator knows
    nodes: Sequence[NodeState]
    #: the profile that holds the resource name when this one lost the conflict; None: no conflict
    winner: str | None = None
    #: what the winner holds, when not the resource name ("CDI kind <kind>")
    conflict_on: str = ""
    #: the profile that serves the same resource the other way (node capacity vs DRA)
    twin: Profile | None = None
    #: static mode: the last patch failure per node
    failures: Mapping[str, str] = field(default_factory=dict)
    #: agent modes: the agent DaemonSet, its pods' troubles and the DeviceReports
    daemonset: AgentDaemonSet | None = None
    troubles: Sequence[Trouble] = ()
    reports: Sequence[Report] = ()
    #: the latest FailedCreate event about that DaemonSet (the API server refused one of its pods)
    create_warning: Warning | None = None
    #: DRA mode: the profile's DeviceClass as the API server stored it
    device_class: StoredDeviceClass | None = None
    #: the shared node agent's pods when the profile is served by it (None: its own DaemonSet);
    #: `daemonset` and `troubles` are then the shared agent's, narrowed here to the profile's nodes
    shared_pods: Sequence[AgentPod] | None = None
    #: the labels the shared node agent's nodes must carry (Settings.node_agent_node_selector)
    shared_node_selector: Sequence[tuple[str, str]] = ()
    #: DRA mode: the cluster's DeviceTaintRules (device maintenance; empty where not served)
    maintenance: Sequence[Rule] = ()
    #: DevicePlugin mode: since when each node has counted fewer devices allocatable than its agent
    #: serves healthy, as far as the operator has seen (`Evaluation.short_nodes` feeds it)
    short_since: Mapping[str, datetime] = field(default_factory=dict)
    #: how long a node may be short before that is a problem (Settings.kubelet_behind_grace)
    short_grace: float = KUBELET_BEHIND_GRACE
    #: how long the DaemonSet's refused pods may last before the profile is Stalled
    #: (Settings.stall_after)
    stall_after: float = STALL_AFTER_SECONDS
    #: the nodes of EVERY DeviceReport of the profile, believed or not: a node that left the
    #: profile has its agent pod deleted, so its report is no longer believed (`reports` leaves it
    #: out) but must still be pruned
    report_nodes: frozenset[str] = frozenset()
    #: agent modes: the objects the operator renders for it that are missing (being recreated) or
    #: whose fields another manager took (repairs.py)
    owned: Sequence[Problem] = ()
    #: the rollout's policy (spec.rollout) and state (staging.py); None: not staged (every node
    #: serves the spec's revision, as before staged rollouts)
    rollout: tuple[rollouts.Policy, rollouts.State] | None = None
    #: Static mode while a rollout is in progress: the profile as its current revision had it
    #: (what the nodes the rollout has not moved still carry; staging.Staging.current)
    current_profile: Profile | None = None
    #: DRA while a rollout's gate ends: each wave node's ResourceSlices as last read
    slices: Mapping[str, dra.SliceRead] = field(default_factory=dict)
    #: the same moment as ``now`` to the microsecond, for the rollout's gate (None: ``now``'s
    #: whole second)
    clock: datetime | None = None

    @property
    def moment(self) -> datetime | None:
        """Now for the rollout: ``clock``, else ``now`` parsed."""
        return self.clock if self.clock is not None else parse_rfc3339(self.now)


@dataclass(frozen=True)
class Evaluation:
    """The result, and the effects the operator performs for it (profilestatus.py)."""

    status: dict[str, Any] | None
    problems: list[Problem] = field(default_factory=list)
    #: when the status must be computed again although nothing happens (None: no need)
    recheck_at: datetime | None = None
    #: prune the profile's DeviceReports of every node but these (None: nothing to prune)
    keep_reports: frozenset[str] | None = None
    #: the agent DaemonSet whose pods the API server refuses: nudge it to try again soon (None: none)
    retry_create: str | None = None
    #: DevicePlugin mode: the nodes that count fewer devices allocatable than their agent serves
    #: healthy now (profilestatus.py keeps since when, for `Inputs.short_since`)
    short_nodes: frozenset[str] = frozenset()
    #: the rollout's next state (None: not staged)
    rollout: rollouts.Step | None = None


def _rollout_step(
    inputs: Inputs,
    matching: Sequence[NodeState],
    reports: Sequence[Report],
    troubles: Sequence[Trouble],
    short: Mapping[str, str],
    *,
    driver: str = "",
) -> rollouts.Step | None:
    """The rollout's next state from what the selected nodes say now (rollouts.step); ``driver``:
    DRA, the wave's ResourceSlices of it are compared with the reports at the gate's end."""
    if inputs.rollout is None:
        return None
    policy, state = inputs.rollout
    clock = inputs.moment
    if clock is None:
        return rollouts.Step(state)
    by_node = {r.node: r for r in reports}
    stuck = {t.node: t.message for t in troubles if t.stalled and t.node}
    views = []
    for n in matching:
        r = by_node.get(n.name)
        read = inputs.slices.get(n.name) if driver else None
        if read is not None and (read.devices is None or r is None):
            read = None  # failed, or nothing to compare with: read again
        views.append(
            rollouts.NodeView(
                n.name,
                n.labels,
                r.revision if r is not None else "",
                r.healthy if r is not None else None,
                r.error.message if r is not None and r.error is not None else "",
                short.get(n.name, ""),
                stuck.get(n.name, ""),
                failures=r.failures if r is not None else 0,
                failures_since=r.failures_since if r is not None else "",
                last_failure=r.last_failure if r is not None else "",
                slices=dra.slices_short(driver, r, read.devices or 0) if read is not None and r else "",
                slices_read=read.at if read is not None else None,
            )
        )
    return rollouts.step(policy, inputs.profile.uid, views, state, clock, slices=bool(driver))


def _static(inputs: Inputs) -> Evaluation:
    """Static mode: the rollout's next state first (its gate is the capacity written and seen,
    ``rollouts.capacity_gate``), then each node judged against the revision it serves after that
    step (the spec's, or the current one while the rollout has not moved it or put it back)."""
    profile, previous, now, failures = inputs.profile, inputs.previous, inputs.now, inputs.failures
    old = inputs.current_profile if inputs.rollout is not None else None
    step = None
    clock = inputs.moment
    if inputs.rollout is not None:
        policy, state = inputs.rollout
        views = [
            rollouts.NodeView(
                n.name,
                n.labels,
                state.update
                if capacity.shows(profile, n)
                else state.current
                if old is not None and capacity.shows(old, n)
                else "",
                error=_write_failed(profile, old, n, failures),
            )
            for n in inputs.nodes
            if profile.selector.matches(n.labels) or (old is not None and old.selector.matches(n.labels))
        ]
        step = (
            rollouts.step(policy, profile.uid, views, state, clock, gate=rollouts.capacity_gate)
            if clock is not None
            else rollouts.Step(state)
        )
    stanza = step.state.stanza() if step is not None else None

    def served(n: NodeState) -> Profile:
        if old is None or stanza is None or stanza.served(profile.uid, n.name, n.labels) == stanza.update:
            return profile
        return old

    seen = [r for n in inputs.nodes if (r := capacity.report(served(n), n, failures.get(n.name))) is not None]
    problems = static.static_problems(seen) + (step.problems if step is not None else [])
    new = _no_dra(static.static_status(profile, seen, previous, now, problems=problems), previous)
    selected = [n for n in inputs.nodes if profile.selector.matches(n.labels)]
    updated = [n.name for n in selected if capacity.shows(profile, n)]
    counts = (len(selected), len(updated), len(updated))
    new = _with_revisions(new, profile, None, step=step, now=now, counts=counts)
    return Evaluation(new, problems, step.recheck_at if step is not None else None, rollout=step)


def _write_failed(profile: Profile, old: Profile | None, node: NodeState, failures: Mapping[str, str]) -> str:
    """Why the update revision's capacity cannot be written on ``node`` ("" nothing known): the
    operator's last patch there failed, or the change made its capacity label unusable (a problem
    the current revision did not have there: waiting will not fix it)."""
    if node.name in failures:
        return failures[node.name]
    want = capacity.desired(profile, node).problem
    if want and (old is None or capacity.desired(old, node).problem is None):
        return want
    return ""


def _sooner(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None else a if b is None else min(a, b)


def evaluate(inputs: Inputs) -> Evaluation:
    """The profile's status and problems, each computed once (see the module doc)."""
    profile, previous, now = inputs.profile, inputs.previous, inputs.now
    if profile.deleting:
        return Evaluation(None)
    if inputs.winner is not None:
        lost = conflict_status(profile, inputs.winner, previous, now, inputs.conflict_on)
        return Evaluation(_no_dra(lost, previous))
    nodes = inputs.nodes
    if profile.mode is Mode.STATIC:
        return _static(inputs)
    troubles = list(inputs.troubles)
    ds = inputs.daemonset
    refused = None
    if ds is not None:
        when = parse_rfc3339(now)
        if when is not None:
            refused = refusal(
                ds.name,
                ds.uid,
                ds.status,
                inputs.create_warning,
                when,
                stall_after=timedelta(seconds=inputs.stall_after),
            )
    if refused is not None:
        troubles.append(refused)
    retry = ds.name if refused is not None and ds is not None else None
    rechecks = [t.recheck_at for t in troubles if t.recheck_at is not None]
    recheck_at = min(rechecks) if rechecks else None
    matching = [n for n in nodes if profile.selector.matches(n.labels)]
    selected = frozenset(n.name for n in matching)
    reports = inputs.reports
    keep = (
        selected
        if any(n not in selected for n in {*inputs.report_nodes, *(r.node for r in reports)})
        else None
    )
    if inputs.shared_pods is not None:
        # A refusal (node "") is the shared DaemonSet's: every profile it serves is held up.
        troubles = [t for t in troubles if t.node in selected or not t.node]
        troubles += excluded_by_node_agent(matching, inputs.shared_node_selector)
        ds = shared_view(profile.name, ds, [p for p in inputs.shared_pods if p.node in selected])
    else:
        troubles = agreeing(troubles, ds)
    overlaps = nodegroups.overlap_problems(profile, matching)
    if profile.mode is Mode.DRA:
        # KEP-5004: the same resource name through node capacity on the same node is reported.
        twin = inputs.twin
        twice = dra.served_twice(profile, twin, matching)
        twin_name = twin.name if twin is not None else ""
        problems = dra.dra_problems(profile, matching, troubles, reports)
        problems += dra.served_twice_problems(profile, twin_name, twice)
        problems += overlaps
        problems += inputs.owned
        driver = render.driver_name(profile.name)
        step = _rollout_step(inputs, matching, _believed(reports, selected), troubles, {}, driver=driver)
        if step is not None:
            problems += step.problems
            recheck_at = _sooner(recheck_at, step.recheck_at)
        new = dra.dra_status(
            profile,
            ds,
            nodes,
            previous,
            now,
            troubles=troubles,
            reports=reports,
            twin=twin_name,
            twice=twice,
            device_class=inputs.device_class,
            problems=problems,
            maintenance=inputs.maintenance,
        )
        new = nodegroups.with_node_groups(new, profile, matching, _believed(reports, selected), previous)
        new = _with_revisions(new, profile, _believed(reports, selected), len(selected), step=step, now=now)
        return Evaluation(new, problems, recheck_at, keep, retry, rollout=step)
    problems = deviceplugin.plugin_problems(profile, matching, troubles, reports)
    short = deviceplugin.kubelet_short(profile, matching, reports)
    clock = parse_rfc3339(now)
    past_grace: dict[str, str] = {}
    for node in short:
        since = inputs.short_since.get(node, clock)
        if since is None:
            continue
        due = since + timedelta(seconds=inputs.short_grace)
        if clock is not None and clock >= due:
            past_grace[node] = rfc3339(since)
        else:
            recheck_at = due if recheck_at is None else min(recheck_at, due)
    problems += deviceplugin.kubelet_short_problems(short, past_grace)
    problems += overlaps
    problems += inputs.owned
    gone_short = {n: m for n, m in short.items() if n in past_grace}
    step = _rollout_step(inputs, matching, _believed(reports, selected), troubles, gone_short)
    if step is not None:
        problems += step.problems
        recheck_at = _sooner(recheck_at, step.recheck_at)
    new = deviceplugin.plugin_status(
        profile, ds, nodes, previous, now, troubles=troubles, reports=reports, problems=problems
    )
    new = nodegroups.with_node_groups(new, profile, matching, _believed(reports, selected), previous)
    believed = _believed(reports, selected)
    new = _with_revisions(_no_dra(new, previous), profile, believed, len(selected), step=step, now=now)
    return Evaluation(new, problems, recheck_at, keep, retry, frozenset(short), step)


def _with_revisions(
    new: dict[str, Any],
    profile: Profile,
    reports: Sequence[Report] | None,
    selected: int = 0,
    *,
    step: rollouts.Step | None = None,
    now: str = "",
    counts: tuple[int, int, int] | None = None,
) -> dict[str, Any]:
    """The revisions and their node counts, in a DaemonSet's words: ``currentRevision`` and
    ``updateRevision`` (the ControllerRevisions ``<profile>-<hash>``: with every node moved at
    once, as now, both the spec's), ``desiredNumberScheduled`` (the nodes that should serve the
    profile: the `selected` ones), ``updatedNumberScheduled`` (of them, those whose agent says it
    serves the update revision: its DeviceReport's ``revision``) and ``updatedNumberReady`` (of
    those, the ones serving it without an agent error). Static (``reports`` None): no agent, the
    node's capacity as intended is the update revision served. Staged (`step`): the current
    revision is the rollout's, and ``status.rollout`` says where it stands. Static with
    `counts` (selected, updated, ready): a node is updated, and ready, when its status shows the
    capacity the update revision says (the API's "as intended")."""
    digest = spec_revision(profile.spec)
    nodes = new.get("nodes") or {}
    desired = selected
    if counts is not None:
        desired, updated, ready = counts
    elif reports is None:
        desired = int(nodes.get("desired") or 0)
        updated = ready = int(nodes.get("ready") or 0)
    else:
        on_update = [r for r in reports if r.revision == digest]
        updated, ready = len(on_update), sum(r.error is None for r in on_update)
    name = revision_name(profile.name, digest)
    current = name if step is None else revision_name(profile.name, step.state.current)
    if step is not None:
        new["rollout"] = step.state.status()
        if step.state.phase is rollouts.Phase.PROGRESSING and not step.state.settled_now:
            _reconciling(new, step.state.message, now)
    new.update(
        currentRevision=current,
        updateRevision=name,
        desiredNumberScheduled=desired,
        updatedNumberScheduled=min(updated, desired),
        updatedNumberReady=min(ready, desired),
    )
    return new


def _reconciling(new: dict[str, Any], message: str, now: str) -> None:
    """A wave moving or held by its gate is work in progress (kstatus: InProgress, so Flux and
    Argo CD wait): Reconciling True, RollingOut, unless something already stalls the profile."""
    conds = new.get("conditions") or []
    if any(c.get("type") == "Stalled" and c.get("status") == "True" for c in conds):
        return
    for c in conds:
        if c.get("type") == "Reconciling" and (c.get("status"), c.get("reason")) != (
            "True",
            Reason.ROLLING_OUT.value,
        ):
            if c.get("status") != "True":
                c["lastTransitionTime"] = now
            c.update(
                status="True", reason=Reason.ROLLING_OUT.value, message=f"staged rollout: {message}"[:32768]
            )


def _believed(reports: Sequence[Report], selected: frozenset[str]) -> list[Report]:
    """The reports of the nodes the profile selects now (a node that left keeps its report until
    it is pruned; it is no longer the profile's)."""
    return [r for r in reports if r.node in selected]


def excluded_by_node_agent(nodes: Sequence[NodeState], selector: Sequence[tuple[str, str]]) -> list[Trouble]:
    """A stalled trouble for each of the profile's nodes where the shared node agent does not run
    (it lacks a label of the operator's --node-agent-node-selector): nothing will ever serve the
    profile there until the node is labelled or the profile gets an agent of its own."""
    if not selector:
        return []
    wanted = ", ".join(f"{k}={v}" for k, v in selector)
    return [
        Trouble(
            n.name,
            Reason.NODE_AGENT_EXCLUDED.value,
            f"the profile selects node {n.name}, but the shared node agent runs only on nodes labelled "
            f"{wanted} (the chart's agent.nodeSelector): label the node, or give the profile an "
            "agent section of its own",
            stalled=True,
        )
        for n in nodes
        if any(n.labels.get(k) != v for k, v in selector)
    ]


def _no_dra(new: dict[str, Any], previous: Mapping[str, Any]) -> dict[str, Any]:
    """A profile that is not served through DRA (any more) drops an earlier ``status.dra`` (the
    status goes as a merge patch: only None removes a key)."""
    if previous.get("dra") is not None:
        new["dra"] = None
    return new


#: A pod's troubles that say only "not Ready yet", which the DaemonSet's own count also says.
NOT_READY_YET = frozenset({AgentPodReason.AGENT_STARTING, AgentPodReason.AGENT_NOT_READY})


def agreeing(troubles: list[Trouble], ds: AgentDaemonSet | None) -> list[Trouble]:
    """A profile's own agent DaemonSet: its status counts the nodes (`nodesReady`), the pod
    watch explains the pods, and the two arrive apart (a pod's Ready reaches the DaemonSet
    controller, which writes its status, and the operator's pod watch, each in its own time).
    Once the DaemonSet's status counts every pod of its generation available, a pod's trouble
    that only says "not Ready yet" (and has not stalled) is a watch behind it: dropped, so that a
    status never reads "3/3" and "AgentStarting" at once (seen by an integration test). The
    reverse lag (a pod gone unready, the DaemonSet's status not written yet) shows the count and
    the trouble a moment later, together. The shared agent's counts come from the pods
    themselves (`shared_view`): nothing to agree there."""
    if ds is None or not ds.rolled_out:
        return troubles
    return [t for t in troubles if t.stalled or t.reason not in NOT_READY_YET]


def shared_view(profile: str, ds: AgentDaemonSet | None, pods: Sequence[AgentPod]) -> AgentDaemonSet | None:
    """The shared node agent's DaemonSet as ONE profile sees it: its counts over the pods on the
    nodes the profile selects (scheduled, available = Ready), its rollout state as a whole (a
    rollout of the shared agent is a rollout for every profile it serves)."""
    if ds is None:
        return None
    st = ds.status
    live = [p for p in pods if not p.deleting]
    desired = len(live)
    available = sum(p.ready for p in live)
    return AgentDaemonSet(
        profile,
        ds.generation,
        {
            "desiredNumberScheduled": desired,
            "numberAvailable": available,
            "numberUnavailable": desired - available,
            "updatedNumberScheduled": min(desired, int(st.get("updatedNumberScheduled") or 0)),
            "observedGeneration": st.get("observedGeneration") or 0,
        },
        ds.name,
        ds.uid,
    )
