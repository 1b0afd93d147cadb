"""What the operator renders, put back when someone deletes it or edits a field it manages.

The agents' ConfigMaps and DaemonSets (the shared node agent's and profiles' own) and DRA
profiles' DeviceClasses are watched (the DaemonSets through agentwatch.py's informer, the others
through two of their own, label-selected like it) and kept as ``owned.Owned`` values. A deletion,
or an edit that took fields from the operator's apply (``owned.change``), is repaired
``REPAIR_DELAY`` seconds later: the object is rendered from the registry as it is THEN and
server-side applied with the operator's field manager, so fields other managers own stay theirs.

What is not repaired: an object nothing wants any more (its profile deleted or deleting, a mode
or agent change, the last shared profile gone: rendered from the registry, there is nothing to
apply), and fields another manager took by server-side apply (on purpose: ``owned.taken_over``).
The repair's apply is not forced: a 409 that names such a manager is ONE Warning Event and the
fields stay as they are; one that names only managers that edited by an update (``kubectl edit``,
``set image``) is applied again with force, restoring them.

Each repair is visible: a Normal Event on each profile the object serves (``Recreated``,
``Restored``), a counter by kind (/metrics), and while a deleted object waits for its repair, a
problem in the status (``OwnedObjectMissing``). Repairs of one object are rate-limited (``BURST``,
then one per ``EVERY`` seconds): a script deleting it in a loop gets each deletion repaired, never a
hot loop of writes. Only the working replica repairs (peering).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass
from operator import attrgetter
from typing import Any

from patchbay_operator import render
from patchbay_operator.agentwatch import AGENTS, AgentWatch
from patchbay_operator.constants import DEVICE_CLASS_API_VERSION, SHARED_KEY, Mode, Reason
from patchbay_operator.deviceclasses import DeviceClasses
from patchbay_operator.events import EVENT_NAMESPACE, Transition, event
from patchbay_operator.informer import Event, Snapshot, Source, Store
from patchbay_operator.kube import KubeError, collection
from patchbay_operator.owned import Change, Owned, change, conflict_managers, restored, taken_over
from patchbay_operator.parts import Part
from patchbay_operator.peering import Gate, writes
from patchbay_operator.profiles import Profile
from patchbay_operator.scheduler import OnPending, Timers
from patchbay_operator.status.conditions import Problem
from patchbay_operator.status.daemonset import AgentDaemonSet

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (kind, name)

REPAIR_DELAY = 0.5
"""Seconds from the first event about an object to its repair: a burst of events about it (a
delete, kubectl's several writes) is one repair, and the repair renders what the registry says
after the operator's own change in flight (a profile being deleted deletes its objects first)."""

BURST, EVERY = 5, 5.0
"""Per object: at most 5 repairs at once, then one every 5 s (deletions meanwhile: one repair)."""

RETRY_SECONDS = 5.0
"""After a repair failed (API server unreachable, RBAC): the next try."""


def sources(namespace: str) -> tuple[Source[Owned], Source[Owned]]:
    """The agents' ConfigMaps (the operator's namespace) and DeviceClasses (cluster-scoped),
    selected by the label every object the operator renders carries (``AGENTS``)."""
    return (
        Source(
            "agent ConfigMaps",
            collection("v1", "ConfigMap", namespace),
            functools.partial(Owned.from_object, "ConfigMap"),
            AGENTS,
        ),
        Source(
            "DeviceClasses",
            collection(DEVICE_CLASS_API_VERSION, "DeviceClass"),
            functools.partial(Owned.from_object, "DeviceClass"),
            AGENTS,
        ),
    )


@dataclass(eq=False)
class Repairs(Part):
    """The owned objects as watched, and their repairs (see the module doc)."""

    _: KW_ONLY
    watch: AgentWatch
    classes: DeviceClasses
    mark: Callable[[Iterable[str]], None]
    gate: Gate | None = None
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.stores: dict[str, Store[Owned]] = {
            kind: Store(attrgetter("name"), functools.partial(self._changed, kind))
            for kind in ("ConfigMap", "DaemonSet", "DeviceClass")
        }
        #: by object: its repair (KEEP: the first event's delay stands, later ones join it)
        self._timers: Timers[Key] = Timers(OnPending.KEEP)
        #: by object: (tokens, when) of its rate limit
        self._tokens: dict[Key, tuple[float, float]] = {}
        #: deleted objects waiting for their repair -> whose they are (the status says so)
        self._missing: dict[Key, str] = {}
        #: objects whose fields another applier took -> (whose, that applier, the fields hash then)
        self._taken: dict[Key, tuple[str, str, str]] = {}
        #: repairs done and fields left to another applier, by kind (/metrics)
        self.repairs: dict[str, int] = {}
        self.taken_over: dict[str, int] = {}

    # --- what the informers tell ----------------------------------------------------------------

    def observe_daemonsets(self, events: list[Event[AgentDaemonSet]]) -> None:
        """agentwatch.py's DaemonSet events, as owned objects."""
        self.stores["DaemonSet"].observe([Event(e.type, e.obj.owned) for e in events])

    def resync_daemonsets(self, snapshot: Snapshot[AgentDaemonSet]) -> None:
        owned = [d.owned for d in snapshot.items]
        self.stores["DaemonSet"].resync(Snapshot(owned, snapshot.resource_version))

    def _changed(self, kind: str, old: Owned | None, new: Owned | None) -> None:
        what = change(old, new)
        obj = new or old
        if what is None or obj is None:
            return
        key = (kind, obj.name)
        log.debug("%s %s was %s", kind, obj.name, what.value)
        if what is Change.DELETED and self._desired(kind, obj.name, obj.profile) is not None:
            # Not for what the operator deleted itself (nothing wants it): that is no problem.
            self._missing[key] = obj.profile
            self.mark(self._profile_names(obj.profile))
        self._timers.schedule(key, REPAIR_DELAY, functools.partial(self._repair, key, obj.profile))

    # --- what the status reads ------------------------------------------------------------------

    def problems(self, keys: Iterable[str]) -> list[Problem]:
        """The objects of ``keys`` (a profile, SHARED_KEY) that are missing, or whose fields another
        applier holds, as problems of the profile's status. Transient: the Events are the
        repair's own, posted once each."""
        keys = set(keys)
        out = []
        missing = sorted(f"{k} {n}" for (k, n), whose in self._missing.items() if whose in keys)
        if missing:
            were = "was" if len(missing) == 1 else "were"
            message = f"{', '.join(missing)} {were} deleted; the operator recreates it within seconds"
            out.append(Problem("", "", Reason.OWNED_OBJECT_MISSING.value, message, transient=True))
        taken = sorted(f"{k} {n} ({by})" for (k, n), (whose, by, _) in self._taken.items() if whose in keys)
        if taken:
            message = f"fields the operator manages were taken over by server-side apply: {', '.join(taken)}"
            out.append(Problem("", "", Reason.FIELDS_TAKEN_OVER.value, message, transient=True))
        return out

    # --- repairs ------------------------------------------------------------------------------

    def _desired(self, kind: str, name: str, whose: str) -> tuple[dict[str, Any], list[Profile]] | None:
        """The object as the registry wants it now, and the profiles it serves; None when nothing
        wants it (the profile is gone or being deleted, serves another way, or lost a conflict)."""
        reg = self.registry
        if kind == "DeviceClass":
            p = reg.get(whose)
            if p is None or p.deleting or p.mode is not Mode.DRA or reg.conflict(p) is not None:
                return None
            return (render.device_class(p), [p]) if render.driver_name(p.name) == name else None
        if whose == SHARED_KEY:
            profiles = reg.shared_agent_profiles()
            if (not profiles and not self.settings.node_agent_always_on) or name != render.SHARED_AGENT:
                return None
            objects = render.shared_agent_objects(
                [(p, reg.exclusion(p)) for p in profiles], self.settings, self.stage
            )
        else:
            p = reg.get(whose)
            if (
                p is None
                or p.deleting
                or not p.mode.runs_agents
                or p.uses_shared_agent
                or reg.conflict(p) is not None
                or name != render.object_name(p.name)
            ):
                return None
            profiles, objects = [p], render.agent_objects(p, self.settings, reg.exclusion(p), self.stage)
        obj = next((o for o in objects if o["kind"] == kind), None)
        return (obj, profiles) if obj is not None else None

    def _wait(self, key: Key) -> float:
        """Seconds until ``key`` may be repaired (0: now, a token taken)."""
        now = self.clock()
        tokens, at = self._tokens.get(key, (float(BURST), now))
        tokens = min(float(BURST), tokens + (now - at) / EVERY)
        if tokens < 1:
            self._tokens[key] = (tokens, now)
            return (1 - tokens) * EVERY
        self._tokens[key] = (tokens - 1, now)
        return 0.0

    def _later(self, key: Key, whose: str, delay: float) -> None:
        self._timers.schedule(key, delay, functools.partial(self._repair, key, whose))

    async def _repair(self, key: Key, whose: str) -> None:
        # Rendered and written under the agent's lock (parts.Writing): a wave written meanwhile
        # is never put back by this repair's older rendering.
        async with self.writing(whose):
            await self._repair_locked(key, whose)

    async def _repair_locked(self, key: Key, whose: str) -> None:
        kind, name = key
        desired = self._desired(kind, name, whose) if writes(self.gate) else None
        if desired is None:  # nothing wants it, or a waiting replica (the working one repairs)
            self._settle(key, whose)
            return
        if (wait := self._wait(key)) > 0:
            self._later(key, whose, wait)
            return
        obj, profiles = desired
        current = self.stores[kind].items.get(name)
        try:
            answer = await self._apply(key, whose, obj, current, profiles)
        except (KubeError, OSError) as e:
            log.warning("Repairing %s %s failed, retrying in %.0f s: %s", kind, name, RETRY_SECONDS, e)
            self._later(key, whose, RETRY_SECONDS)
            return
        if answer is None:
            return  # left to the applier that took its fields
        after = Owned.from_object(kind, answer)
        self.stores[kind].fold_quietly("APPLIED", after)
        if kind == "DaemonSet":
            self.watch.applied(AgentDaemonSet.from_object(answer))
        elif kind == "DeviceClass":
            self.classes.keep(profiles[0], answer)
        self._settle(key, whose)
        if not restored(current, after):
            return  # it was as rendered already (the operator's own apply was the change)
        self.repairs[kind] = self.repairs.get(kind, 0) + 1
        if current is None:
            reason, message = Reason.RECREATED, f"{kind} {name} was deleted; recreated"
        else:
            reason, message = Reason.RESTORED, f"{kind} {name} was edited; restored"
        log.info("%s", message)
        await self._post(profiles, Transition("Normal", reason.value, message))

    async def _apply(
        self, key: Key, whose: str, obj: dict[str, Any], current: Owned | None, profiles: list[Profile]
    ) -> dict[str, Any] | None:
        """Apply without force; on a conflict, force only over managers that edited by an update.
        None when the fields were left to an applier that took them."""
        try:
            answer: dict[str, Any] = await self.call(self.kube.apply, obj, False)
            return answer
        except KubeError as e:
            if e.status != 409:
                raise
            managers = conflict_managers(e.body)
        took = taken_over(managers, current)
        if not took:
            log.info("%s %s was edited by %s; applying it again", key[0], key[1], ", ".join(sorted(managers)))
            forced: dict[str, Any] = await self.call(self.kube.apply, obj, True)
            return forced
        by = ", ".join(sorted(took))
        fields = current.fields if current is not None else ""
        if self._taken.get(key, ("", "", ""))[1:] != (by, fields):  # one Warning per take-over
            self._taken[key] = (whose, by, fields)
            self.taken_over[key[0]] = self.taken_over.get(key[0], 0) + 1
            message = (
                f"{key[0]} {key[1]}: fields the operator manages were taken over by {by} "
                "(server-side apply with force); left as they are"
            )
            log.warning("%s", message)
            self.mark(self._profile_names(whose))
            await self._post(profiles, Transition("Warning", Reason.FIELDS_TAKEN_OVER.value, message))
        return None

    def _settle(self, key: Key, whose: str) -> None:
        """``key`` needs nothing more now: no longer missing, its fields the operator's again."""
        was_missing = self._missing.pop(key, None) is not None
        if self._taken.pop(key, None) is not None or was_missing:
            self.mark(self._profile_names(whose))

    async def _post(self, profiles: list[Profile], t: Transition) -> None:
        for profile in profiles:
            try:
                await self.call(self.kube.create_event, EVENT_NAMESPACE, event(profile, t))
            except (KubeError, OSError) as e:
                log.warning("Posting an Event on DevicePluginProfile %s failed: %s", profile.name, e)

    def _profile_names(self, whose: str) -> list[str]:
        if whose == SHARED_KEY:
            return [p.name for p in self.registry.shared_agent_profiles()]
        return [whose] if whose in self.registry else []

    async def close(self) -> None:
        await self._timers.close()
