"""Each profile's rollout as the operator holds it: the state machine's state (rollouts.py), seeded
from the status at start, and what the agents' config is rendered with (``entry``).

A new update revision (a spec change) begins here, when the agents' objects are rendered for it:
at once (every node serves it, as before staged rollouts) for a new profile, ``strategy:
Immediate``, a change that only adds nodes (the node selector widened, nothing else), a change of
mode or resourceName, or a change of the node selector of a profile with an agent of its own (its
DaemonSet's node affinity: its pods follow it at once); otherwise staged, with no node moved yet
(wave 0): the status loop (profilestatus.py) then moves the canary wave and the next ones
(``rollouts.step``) and the agents' ConfigMap (the shared one, or the profile's own) is written
once per wave. A Static
profile rolls in the same waves: the operator writes each node's capacity itself, for the
revision the node serves (``served``: nodes.py plans its patch with it), so a wave is the node
patches of the nodes that moved.

Nothing lives only here: ``status.currentRevision``, ``updateRevision`` and ``status.rollout``
(threshold, wave, its start, halted nodes, the wave's baseline) say all of it, so a restarted
operator or a standby taking over resumes from the status it finds (``seed``), with the current
revision's body from its ControllerRevision (kept while in use).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from patchbay_api.revisions import Rollout, revision_data, revision_hash, revision_name, spec_revision
from patchbay_api.selectors import LabelSelector
from patchbay_operator.capacity import NodeState
from patchbay_operator.profiles import Profile
from patchbay_operator.rollouts import IMMEDIATE, Phase, Policy, State, Step

log = logging.getLogger(__name__)
DATA_FIELDS = ("resourceName", "mode", "plugin", "nodeGroups", "nodeSelector")
"""The spec fields a revision's data holds (``patchbay_api.revisions.revision_data``)."""


def digest_of(profile: str, name: Any) -> str:
    """The hash part of a ControllerRevision name ``<profile>-<hash>`` ("" when not one)."""
    prefix = f"{profile}-"
    return name[len(prefix) :] if isinstance(name, str) and name.startswith(prefix) else ""


def only_adds_nodes(old: Mapping[str, Any], new: Mapping[str, Any], nodes: Iterable[NodeState]) -> bool:
    """The change from ``old`` to ``new`` (revision data) only adds nodes: nothing but the node
    selector differs, and every known node the old one selected the new one selects too."""
    if {k: v for k, v in old.items() if k != "nodeSelector"} != {
        k: v for k, v in new.items() if k != "nodeSelector"
    }:
        return False
    was = LabelSelector.parse(old.get("nodeSelector") or {})
    now = LabelSelector.parse(new.get("nodeSelector") or {})
    return all(now.matches(n.labels) for n in nodes if was.matches(n.labels))


def as_revision(profile: Profile, data: Mapping[str, Any]) -> Profile:
    """``profile`` as its revision ``data`` had it (what its agents are rendered with)."""
    spec = {k: v for k, v in profile.spec.items() if k not in DATA_FIELDS and k != "static"}
    spec |= {k: data[k] for k in DATA_FIELDS if k in data}
    if isinstance(data.get("capacity"), Mapping):  # Static: spec.static as the revision had it
        spec["static"] = dict(data["capacity"])
    body = {
        "metadata": {
            "name": profile.name,
            "uid": profile.uid,
            "generation": profile.generation,
            "creationTimestamp": profile.created,
        },
        "spec": spec,
    }
    return replace(Profile.from_body(body), deleting=profile.deleting)


class Staging:
    """Every profile's rollout state (see the module doc)."""

    def __init__(
        self,
        data: Callable[[str, str], Mapping[str, Any] | None],
        nodes: Callable[[], Iterable[NodeState]],
        previous: Callable[[str], Mapping[str, Any]],
    ) -> None:
        """``data(profile, hash)``: a revision's data as its ControllerRevision holds it (None when
        not known); ``nodes()``: every node the operator knows; ``previous(profile)``: its status
        as last written or found on the object (StatusWriter.previous)."""
        self._data, self._nodes, self._previous = data, nodes, previous
        #: profile -> (its uid, its rollout's state); a standby taking over clears it
        self.states: dict[str, State] = {}
        self._uids: dict[str, str] = {}
        #: waves begun (for /metrics)
        self.waves = 0
        #: profile -> (uid, generation, current revision) and that revision as a profile
        self._as_current: dict[str, tuple[tuple[str, int, bool, str], Profile | None]] = {}

    def in_use(self, profile: Profile) -> set[str]:
        """The ControllerRevisions the profile's nodes may serve (never pruned): its spec's, and
        the current one while a rollout from it is in progress."""
        st = self.state(profile)
        return {revision_name(profile.name, st.current), revision_name(profile.name, st.update)}

    def state(self, profile: Profile) -> State:
        """The profile's rollout state now; a new update revision begins here."""
        update = spec_revision(profile.spec)
        st = self.states.get(profile.name)
        if st is None or self._uids.get(profile.name) != profile.uid:
            st = self._resumed(profile, update)
            self._uids[profile.name] = profile.uid
        if st.update != update:
            st = self._begin(profile, st.current, update)
            log.info("DevicePluginProfile %s: %s", profile.name, st.message)
        self.states[profile.name] = st
        return st

    def _resumed(self, profile: Profile, update: str) -> State:
        seed = self._previous(profile.name)
        current = digest_of(profile.name, seed.get("currentRevision"))
        was = digest_of(profile.name, seed.get("updateRevision"))
        if not current or not was:
            return State.settled(update)  # a new profile (or one from before revisions): at once
        policy = Policy.parse(profile.spec.get("rollout"))
        return State.from_status(current, was, seed.get("rollout"), policy.rollback)

    def _begin(self, profile: Profile, current: str, update: str) -> State:
        if current == update:
            return State.settled(update, f"every node serves {update}")
        policy = Policy.parse(profile.spec.get("rollout"))
        why = ""
        old = self._data(profile.name, current)
        new = revision_data(profile.spec)
        if policy.immediate:
            why = f"strategy {IMMEDIATE}"
        elif old is None or revision_hash(old) != current:
            why = f"the previous revision {current} is not known: every node at once"
        elif (old.get("mode"), old.get("resourceName")) != (new.get("mode"), new.get("resourceName")):
            why = "a change of mode or resourceName goes to every node at once"
        elif only_adds_nodes(old, new, self._nodes()):
            why = "the change only adds nodes: at once"
        elif not profile.uses_shared_agent and old.get("nodeSelector") != new.get("nodeSelector"):
            why = "an agent of its own runs where its node selector says (its DaemonSet's node affinity)"
        if why:
            return State.settled(update, f"{why}: every node serves {update}")
        return State.begin(current, update)

    def entry(self, profile: Profile) -> tuple[Profile | None, Rollout]:
        """What the profile's entry in the agents' config is rendered with: the current revision
        as a profile (None when every node serves the update) and the rollout stanza."""
        st = self.state(profile)
        if st.settled_now:
            return None, st.stanza()
        data = self._data(profile.name, st.current)
        if data is None:  # the current revision went away: every node moves (nothing else to serve)
            self.states[profile.name] = State.settled(st.update, f"the revision {st.current} is gone")
            return None, Rollout.settled(st.update)
        return as_revision(profile, data), st.stanza()

    def entries(self, profiles: Iterable[Profile]) -> Callable[[Profile], tuple[Profile | None, Rollout]]:
        """`entry` of each of `profiles`, asked at once (one call for an apply of several agents'
        objects); a profile not among them, or changed since (the registry moves while the apply
        awaits the API), is asked then."""
        table = {(p.name, p.uid, p.generation): self.entry(p) for p in profiles}
        return lambda p: table.get((p.name, p.uid, p.generation)) or self.entry(p)

    def current(self, profile: Profile) -> Profile | None:
        """The profile as its current revision had it while a rollout is in progress (None when
        every node serves the spec, or that revision is gone)."""
        st = self.state(profile)
        if st.settled_now:
            return None
        key = (profile.uid, profile.generation, profile.deleting, st.current)
        cached = self._as_current.get(profile.name)
        if cached is not None and cached[0] == key:
            return cached[1]
        data = self._data(profile.name, st.current)
        old = as_revision(profile, data) if data is not None else None
        self._as_current[profile.name] = (key, old)
        return old

    def served(self, profile: Profile, node: NodeState) -> Profile:
        """The profile as ``node`` serves it now (Static: what its capacity is written for): the
        spec, or its current revision while the rollout has not moved the node."""
        old = self.current(profile)
        if old is None:
            return profile
        st = self.states[profile.name]
        if st.stanza().served(profile.uid, node.name, node.labels) == st.update:
            return profile
        return old

    def commit(self, name: str, step: Step) -> bool:
        """The state machine's next state; True when the stanza changed (the agents' config must
        be written again)."""
        before = self.states.get(name)
        self.states[name] = step.state
        if step.new_wave:
            self.waves += 1
        return before is None or before.stanza() != step.state.stanza()

    def stats(self) -> dict[str, Any]:
        """For /metrics: profile -> 1 while its rollout is halted (patchbay_rollout_halted), and
        the waves begun."""
        halted = {n: int(s.phase is Phase.HALTED) for n, s in self.states.items()}
        return {"rolloutHalted": halted, "rolloutWaves": self.waves}
