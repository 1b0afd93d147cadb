"""A staged rollout at scale (issue 45, "Scale"): N kwok nodes, one DevicePlugin profile served by
the shared node agent selecting them all, the chart installed without its operator pod and the
operator as a process. kwok runs no process, so the agents are SIMULATED, and named so
(``patchbay_bench.simagents``): per node, the node agent's follows (GET + WATCH of its ConfigMap
and its Node), the revision it serves decided by the real agent's function from the ConfigMap, and
its DeviceReport written naming it (a ``virtual`` discovery's devices, all healthy; a glob finds
nothing on a kwok node: 0 devices).

Rounds, interleaved: one change of the profile (``plugin.allocation.envs``) rolled

- A: staged, a canary node then waves of ``wave`` (10%) of the nodes, each held ``healthy``
  seconds by its gate;
- B: ``strategy: Immediate`` on the same fleet (every node at once, as before staged rollouts).

Each ends when the profile's status counts every node updated on the new revision (and, staged,
the rollout complete). Staged, the gates' own waiting (``healthySeconds`` per wave) is taken out:
what is left is what staging costs beyond its deliberate waits. A wave starts when the simulated
agents first see its threshold in the ConfigMap; it ends when the next one starts (the last: when
the status says complete). The API requests per node changed come from the API server's metrics
over the rollout, less the rate of an idle window just before it (each side's own). The
operator's memory (VmRSS, VmHWM) with the profile's first revision only, and once ``revisions``
changes have been rolled (the default ``revisionHistoryLimit`` keeps 10): not interleaved
(revisions only accumulate), read in the same process. Then ``halts`` bad changes (a glob that
matches nothing: 0 healthy devices), each reverted after its halt: the nodes that ever served the
bad revision (at most the canary: one wave) and the time from the change to ``Halted``.
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from typing import Any

import yaml

from patchbay_api.revisions import NOBODY, spec_revision
from patchbay_bench import kube
from patchbay_bench.apicost import Counts, served, writes
from patchbay_bench.harness import Run, wait
from patchbay_bench.kube import PROFILES, Api
from patchbay_bench.setup import kwok_cluster, operator, status_mib
from patchbay_bench.simagents import Followers, SimAgents, client_files, shared_agent_pods

NS, PROFILE, CANARY, DEVICES = "patchbay-system", "bench-roll", 1, 2
# Merge patches: each names the other's discovery as null (one discovery backend at a time).
GOOD = {"discovery": {"virtual": {"count": DEVICES}, "paths": None}}
BAD = {"discovery": {"paths": {"globs": ["/dev/patchbay-bench-nothing*"]}, "virtual": None}}
# A merge patch: the staged settings go (the API refuses them with Immediate).
IMMEDIATE = {
    "strategy": "Immediate",
    "canary": None,
    "maxNodesPerWave": None,
    "healthySeconds": None,
    "progressDeadlineSeconds": None,
}
HALT_FIGURE = "rollout at scale: a bad change -> nodes that ever served it"


def wave_overheads(starts: list[float], end: float, healthy: float) -> list[float]:
    """Per wave, its time beyond its gate's own waiting: from its start to the next wave's (the
    last: to ``end``) less ``healthy`` seconds. ``starts`` in order."""
    ends = [*starts[1:], end] if starts else []
    return [b - a - healthy for a, b in zip(starts, ends, strict=True)]


def less(counts: Counts, own: dict[str, float], before: dict[str, float]) -> Counts:
    """``counts`` without the bench's own requests since ``before`` (its polls of the status, its
    patch of the profile)."""
    requests = {k: v - (own.get(k, 0) - before.get(k, 0)) for k, v in counts["requests"].items()}
    return {**counts, "requests": requests}


def per_node(
    counts: Counts, idle: Counts, seconds: float, idle_seconds: float, nodes: int
) -> tuple[float, float, float]:
    """(requests, writes, watch events) per node changed: those served during the rollout less the
    idle rate over as many seconds, over the nodes changed."""
    scale = seconds / idle_seconds if idle_seconds else 0.0
    req = sum(counts["requests"].values()) - scale * sum(idle["requests"].values())
    wr = writes(counts["requests"]) - scale * writes(idle["requests"])
    ev = sum(counts["events"].values()) - scale * sum(idle["events"].values())
    return max(0.0, req) / nodes, max(0.0, wr) / nodes, max(0.0, ev) / nodes


class Fleet:
    def __init__(self, api: Api, sims: SimAgents, followers: Followers, n: int) -> None:
        self.api, self.sims, self.followers, self.n = api, sims, followers, n
        self.stamp = self.good = 0
        #: the bench's own requests ("verb/resource", as the API server's metrics count them)
        self.own: dict[str, float] = {}

    def status(self) -> dict[str, Any]:
        self.own["GET/devicepluginprofiles"] = self.own.get("GET/devicepluginprofiles", 0) + 1
        return dict(((self.api.get(f"{PROFILES}/{PROFILE}") or {}).get("status")) or {})

    def change(self, rollout: dict[str, Any], plugin: dict[str, Any] | None = None) -> str:
        """One change of the profile's revision (and its rollout settings); its hash."""
        self.stamp += 1
        if plugin is None:
            self.good = self.stamp
        return self._patch(rollout, plugin or GOOD, self.stamp)

    def revert(self, rollout: dict[str, Any]) -> str:
        """Back to the last good change's settings exactly (its revision: nothing to roll)."""
        return self._patch(rollout, GOOD, self.good)

    def _patch(self, rollout: dict[str, Any], plugin: dict[str, Any], stamp: int) -> str:
        body = {**plugin, "allocation": {"envs": {"CHANGE": str(stamp)}}}
        self.own["PATCH/devicepluginprofiles"] = self.own.get("PATCH/devicepluginprofiles", 0) + 1
        got = self.api.merge(f"{PROFILES}/{PROFILE}", {"spec": {"rollout": rollout, "plugin": body}})
        return spec_revision(got["spec"])

    def done(self, digest: str, halt_fails: bool = True) -> bool:
        """Every node counted on ``digest`` in the status, and the rollout complete. Raises when
        the rollout of a good change halted (no use waiting: the gate's message says why);
        ``halt_fails=False`` for a revert, which the status shows Halted until it is computed."""
        self.failing()
        st = self.status()
        rollout = st.get("rollout") or {}
        if halt_fails and rollout.get("phase") == "Halted":
            raise RuntimeError(f"the rollout of a good change halted: {rollout.get('message', '')}")
        name = f"{PROFILE}-{digest}"
        return (
            st.get("currentRevision") == name == st.get("updateRevision")
            and st.get("updatedNumberScheduled") == self.n
        )

    def failing(self) -> bool:
        """Raises when the simulation fails (a write refused, a handler's error): no use waiting."""
        if self.sims.errors or self.followers.errors or self.followers.failed:
            raise RuntimeError(
                f"simulated agents failing: {self.followers.failed} follows failed; "
                f"{self.sims.errors[:3]}; {self.followers.errors[:3]}"
            )
        return False

    def wave_starts(self, digest: str, since: float) -> list[float]:
        """When the simulated agents first saw each new rollout stanza of ``digest`` (a wave)."""
        out, last = [], None
        for seen, entries in sorted(self.sims.configs.values(), key=lambda v: v[0]):
            if seen < since:
                continue
            e = next((e for e in entries if e.profile == PROFILE), None)
            ro = e.rollout if e is not None else None
            if ro is None or ro.update != digest or ro.current == digest:
                continue
            if ro.threshold == NOBODY and ro.canary_selector is None and not ro.exceptions:
                continue  # the change written, no node moved yet
            key = (ro.threshold, json.dumps(ro.canary_selector, sort_keys=True), tuple(sorted(ro.exceptions)))
            if key != last:
                out.append(seen)
                last = key
        return out


def run(r: Run) -> None:
    n, rounds, healthy = r.integer("nodes"), r.rounds(), r.number("healthy")
    staged = {
        "strategy": "Staged",
        "canary": {"nodes": CANARY},
        "maxNodesPerWave": r.text("wave"),
        "healthySeconds": int(healthy),
        "progressDeadlineSeconds": 900,
    }
    with kwok_cluster(r, n, crds=False) as cluster:
        api = cluster.api
        cluster.chart_without_operator(NS)
        with operator(r, cluster.kubeconfig, NS) as op:
            assert op.proc is not None
            spec = {
                "resourceName": "bench.patchbay.dev/roll",
                "mode": "DevicePlugin",
                "nodeSelector": {"matchLabels": {"type": "kwok"}},
                "plugin": GOOD,
                "rollout": staged,
            }
            # The revision is the spec as stored (the CRD's defaults in it).
            first = spec_revision(api.create(PROFILES, kube.profile(PROFILE, spec))["spec"])
            agents = shared_agent_pods(api, NS, n)
            kubeconfig = yaml.safe_load(cluster.kubeconfig.read_text())
            sims = SimAgents(cluster.dev.server, client_files(kubeconfig, r.work), NS, agents)
            followers = Followers(cluster.dev.server, kubeconfig, r.work, NS, sims.on_config, sims.on_node)
            fleet = Fleet(api, sims, followers, n)
            t0 = time.monotonic()
            followers.start(cluster.nodes)
            try:
                wait(
                    "every simulated agent following",
                    lambda: followers.open >= 2 * n or fleet.failing(),
                    1800,
                    0.5,
                )
                wait("every node's first report counted", lambda: fleet.done(first), 900, 0.5)
                r.log(f"{n} simulated agents following and reported in {time.monotonic() - t0:.0f} s")
                time.sleep(r.number("settle"))
                rss1 = (status_mib(op.proc.pid, "VmRSS"), status_mib(op.proc.pid, "VmHWM"))
                idle_s = r.number("idle")
                took: dict[str, list[float]] = {"staged": [], "immediate": []}
                beyond, gates, waves_n, per_wave = [], [], [], []
                reqs: dict[str, list[float]] = {"staged": [], "immediate": []}
                wrs: dict[str, list[float]] = {"staged": [], "immediate": []}
                evs: dict[str, list[float]] = {"staged": [], "immediate": []}
                changes = 0
                for i in range(rounds):
                    for side in ("staged", "immediate"):
                        rollout = staged if side == "staged" else IMMEDIATE
                        # The background just before this change (kwok's pod status, informers' relists).
                        before = api.metrics()
                        time.sleep(idle_s)
                        idle = served(before, api.metrics())
                        before, own = api.metrics(), dict(fleet.own)
                        start = time.monotonic()
                        digest = fleet.change(rollout)
                        wait(
                            f"round {i + 1}, {side}: every node on {digest}",
                            functools.partial(fleet.done, digest),
                            1800,
                            0.1,
                        )
                        end = time.monotonic()
                        counts = less(served(before, api.metrics()), fleet.own, own)
                        changes += 1
                        took[side].append(end - start)
                        rq, wr, ev = per_node(counts, idle, end - start, idle_s, n)
                        reqs[side].append(rq)
                        wrs[side].append(wr)
                        evs[side].append(ev)
                        if side == "staged":
                            starts = fleet.wave_starts(digest, start)
                            over = wave_overheads(starts, end, healthy)
                            per_wave += over
                            waves_n.append(len(starts))
                            gates.append(healthy * len(starts))
                            beyond.append(end - start - healthy * len(starts))
                            r.log(
                                f"round {i + 1}: staged {end - start:.1f} s, {len(starts)} waves, beyond the "
                                f"gates {beyond[-1]:.1f} s "
                                f"(to the canary {starts[0] - start if starts else 0:.1f} s; "
                                f"per wave {', '.join(f'{x:.2f}' for x in over)})"
                            )
                        else:
                            r.log(f"round {i + 1}: immediate {end - start:.1f} s")
                        r.note(
                            f"round {i + 1}, {side}: {json.dumps(counts)}; "
                            f"idle {idle_s:g} s before: {json.dumps(idle)}"
                        )
                while changes < r.integer("revisions"):
                    digest = fleet.change(IMMEDIATE)
                    wait(
                        f"change {changes + 1} on every node",
                        functools.partial(fleet.done, digest),
                        1800,
                        0.1,
                    )
                    changes += 1
                time.sleep(r.number("settle"))
                kept = len(
                    api.items(
                        f"/apis/apps/v1/namespaces/{NS}/controllerrevisions",
                        labelSelector=f"patchbay.dev/profile={PROFILE}",
                    )
                )
                rss10 = (status_mib(op.proc.pid, "VmRSS"), status_mib(op.proc.pid, "VmHWM"))
                halts, to_halt = [], []
                for _ in range(r.integer("halts")):
                    start = time.monotonic()
                    good = fleet.status().get("currentRevision", "")
                    bad = fleet.change(staged, BAD)
                    wait(
                        "the bad change halted",
                        lambda: (fleet.status().get("rollout") or {}).get("phase") == "Halted",
                        900,
                        0.05,
                    )
                    to_halt.append(time.monotonic() - start)
                    time.sleep(r.number("after_halt"))
                    halts.append(float(len(sims.ever.get((PROFILE, bad), set()))))
                    r.log(f"halted in {to_halt[-1]:.2f} s; {halts[-1]:.0f} node(s) ever served {bad}")
                    digest = fleet.revert(staged)
                    if f"{PROFILE}-{digest}" != good:
                        raise AssertionError(f"the revert made {digest}, not {good}")
                    wait("the revert on every node", functools.partial(fleet.done, digest, False), 1800, 0.1)
            finally:
                followers.stop()
                sims.close()
    note = (
        f"{n} kwok nodes, the agents simulated (follows + DeviceReports); staged: canary {CANARY} node, "
        f"waves of {r.text('wave')}, healthySeconds {healthy:g}; waves per rollout "
        f"{statistics.median(waves_n) if waves_n else 0:g}"
    )
    r.figure(
        "rollout at scale: a change on every node, beyond the gates' own waiting",
        "s",
        {"staged, less healthySeconds per wave": beyond, "Immediate (every node at once)": took["immediate"]},
        headline=True,
        note=note,
    )
    r.figure(
        "rollout at scale: a staged change on every node, all of it",
        "s",
        {"staged": took["staged"], "of which the gates' healthySeconds": gates},
        ratio=False,
        note=note,
    )
    r.figure(
        "rollout at scale: per wave, beyond its gate's healthySeconds",
        "s",
        {"per wave": per_wave},
        ratio=False,
        note=note + "; every wave of every round",
    )
    r.figure(
        "rollout at scale: API requests per node changed",
        "requests",
        {"staged": reqs["staged"], "Immediate": reqs["immediate"]},
        headline=True,
        note=note + "; requests to configmaps, daemonsets, profiles, reports, pods, revisions, events, "
        "less the idle rate; the simulated agents' report writes (1 per node) included",
    )
    r.figure(
        "rollout at scale: API writes per node changed",
        "writes",
        {"staged": wrs["staged"], "Immediate": wrs["immediate"]},
        note=note,
    )
    r.figure(
        "rollout at scale: API watch events per node changed",
        "events",
        {"staged": evs["staged"], "Immediate": evs["immediate"]},
        note=note + "; every write of the node agent's ConfigMap (one per wave) goes to every node's watch",
    )
    rev_note = (
        f"{n} kwok nodes; {changes} changes rolled, {kept} ControllerRevisions kept; read in the same "
        "operator process after the first report of every node and after the changes "
        "(not interleaved: revisions only accumulate)"
    )
    r.figure(
        "rollout at scale: operator RSS (VmRSS) with 10 revisions kept",
        "MiB",
        {f"{kept} revisions kept": [rss10[0]], "1 revision": [rss1[0]]},
        headline=True,
        note=rev_note,
    )
    r.figure(
        "rollout at scale: operator peak RSS (VmHWM) with 10 revisions kept",
        "MiB",
        {f"{kept} revisions kept": [rss10[1]], "1 revision": [rss1[1]]},
        note=rev_note,
    )
    halt_note = (
        f"{n} kwok nodes, canary {CANARY} node then waves of {r.text('wave')}; a glob matching nothing"
    )
    r.figure(HALT_FIGURE, "nodes", {"staged": halts}, ratio=False, headline=True, note=halt_note)
    r.figure(
        "rollout at scale: a bad change -> Halted", "s", {"staged": to_halt}, ratio=False, note=halt_note
    )
