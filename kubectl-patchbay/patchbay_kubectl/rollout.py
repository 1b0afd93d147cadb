"""``kubectl patchbay rollout status|history|pause|resume|undo``: the pure parts, in kubectl's words.

A profile's change reaches the nodes as a DaemonSet's template does (docs/design/staged-rollouts.md):
its status says ``currentRevision`` / ``updateRevision`` (ControllerRevision names),
``desiredNumberScheduled``, ``updatedNumberScheduled``, ``updatedNumberReady`` and, for a staged
change, ``status.rollout`` (``phase`` Progressing|Paused|Halted|Complete, ``wave``, ``message``).
Revisions are ControllerRevisions ``<profile>-<hash>`` in the operator's namespace, ``data`` the
part of the spec agents and node capacity act on (``patchbay_api.revisions.revision_data``),
``revision`` the increasing number. Everything here reads those objects and returns text or
patches; cli.py does the requests.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from patchbay_api.revisions import LABEL_REVISION_HASH, spec_revision
from patchbay_kubectl.views.objects import Obj, condition, name_of, spec

KIND = "devicepluginprofile.patchbay.dev"
"""How kubectl names the object in its messages (``deployment.apps/nginx paused``)."""
RESOURCE = "devicepluginprofiles.patchbay.dev"
"""How kubectl names the resource in its errors (``deployments.apps "nginx" is already paused``)."""
CHANGE_CAUSE = "kubernetes.io/change-cause"
HALTED, PAUSED = "Halted", "Paused"
REVISION_FIELDS = ("resourceName", "mode", "plugin", "nodeGroups", "nodeSelector")
"""The spec fields a revision's ``data`` holds besides a Static profile's ``capacity``."""


class RolloutError(Exception):
    """The request cannot be done as asked; the message is what kubectl would print after ``error:``."""


@dataclass(frozen=True)
class Status:
    """One look at a profile's rollout: the line to print, whether it is finished, whether it
    failed (a halted rollout cannot finish without a change: ``kubectl rollout status`` exits 1
    on a Deployment past its progress deadline the same way)."""

    text: str
    done: bool = False
    failed: bool = False


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def paused(profile: Obj) -> bool:
    return bool((spec(profile).get("rollout") or {}).get("paused"))


def rollout_status(profile: Obj) -> Status:
    """``kubectl rollout status`` for a DaemonSet, read off a profile (pure)."""
    name = name_of(profile)
    meta = profile.get("metadata") or {}
    st = profile.get("status") or {}
    ro = st.get("rollout") or {}
    if _int(meta.get("generation")) > _int(st.get("observedGeneration")):
        return Status("Waiting for profile spec update to be observed...")
    desired = _int(st.get("desiredNumberScheduled"))
    updated = _int(st.get("updatedNumberScheduled"))
    ready = _int(st.get("updatedNumberReady"))
    same = st.get("currentRevision") == st.get("updateRevision")
    if same and updated >= desired and ready >= desired:
        return Status(f'profile "{name}" successfully rolled out', done=True)
    stalled = condition(profile, "Stalled") or {}
    if ro.get("phase") == HALTED or stalled.get("status") == "True":
        why = stalled.get("message") or ro.get("message") or stalled.get("reason") or "halted"
        return Status(f'profile "{name}" rollout halted: {why}', failed=True)
    wave = f" (wave {ro['wave']})" if _int(ro.get("wave")) else ""
    head = f'Waiting for profile "{name}" rollout to finish: '
    if ro.get("phase") == PAUSED or paused(profile):
        return Status(
            f"{head}rollout is paused, {updated} of {desired} nodes updated{wave} "
            f"(`kubectl patchbay rollout resume {name}` resumes it)..."
        )
    if updated < desired:
        return Status(f"{head}{updated} out of {desired} nodes have been updated{wave}...")
    if ready < desired:
        return Status(f"{head}{ready} of {desired} updated nodes are ready{wave}...")
    return Status(f"{head}every node updated, waiting for the operator to complete the revision{wave}...")


# --- pause and resume ---------------------------------------------------------------------------


def pause_patch(profile: Obj, pause: bool) -> Obj:
    """The merge patch that sets (or removes) ``spec.rollout.paused``; RolloutError when it is
    already so, as ``kubectl rollout pause|resume`` refuses."""
    if paused(profile) == pause:
        state = "already paused" if pause else "not paused"
        raise RolloutError(f'{RESOURCE} "{name_of(profile)}" is {state}')
    return {"spec": {"rollout": {"paused": True if pause else None}}}


# --- history ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Revision:
    """One ControllerRevision of a profile."""

    number: int
    name: str
    digest: str
    data: Obj
    cause: str

    @classmethod
    def of(cls, obj: Obj) -> Revision:
        meta = obj.get("metadata") or {}
        return cls(
            _int(obj.get("revision")),
            str(meta.get("name", "")),
            str((meta.get("labels") or {}).get(LABEL_REVISION_HASH, "")),
            dict(obj.get("data") or {}),
            str((meta.get("annotations") or {}).get(CHANGE_CAUSE, "")),
        )


def revisions(objects: Iterable[Obj], profile: Obj | None = None) -> list[Revision]:
    """The profile's revisions, oldest first; with ``profile``, only those it owns (a profile
    deleted and made again has a new uid: the old one's revisions are not its history)."""
    uid = ((profile or {}).get("metadata") or {}).get("uid")
    found = []
    for obj in objects:
        owners = (obj.get("metadata") or {}).get("ownerReferences") or []
        if uid and owners and not any(o.get("uid") == uid for o in owners):
            continue
        found.append(Revision.of(obj))
    return sorted(found, key=lambda r: (r.number, r.name))


def _leaves(value: Any, path: str = "") -> dict[str, Any]:
    """Every leaf of a JSON value by its dotted path (lists are leaves: they replace whole)."""
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{path}.{k}" if path else str(k)))
        return out
    return {path: value}


def _short(value: Any, limit: int = 40) -> str:
    text = "<none>" if value is None else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def change_summary(before: Obj | None, after: Obj) -> str:
    """One line saying what ``after`` changed against ``before`` (revisions' data): the changed
    fields by path, the first with its values."""
    if before is None:
        what = " ".join(str(after.get(k)) for k in ("mode", "resourceName") if after.get(k))
        return f"created ({what})" if what else "created"
    old, new = _leaves(before), _leaves(after)
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k, None) != new.get(k, None))
    if not changed:
        return "no change"
    first = changed[0]
    text = f"{first}: {_short(old.get(first))} -> {_short(new.get(first))}"
    if len(changed) > 1:
        text += f" (+{len(changed) - 1} more: {', '.join(changed[1:3])}{', ...' if len(changed) > 3 else ''})"
    return text


@dataclass(frozen=True)
class HistoryRow:
    revision: int
    change_cause: str
    name: str
    served: str

    def as_dict(self) -> dict[str, Any]:
        return {"revision": self.revision, "changeCause": self.change_cause, "name": self.name}


def history_rows(revs: Sequence[Revision], profile: Obj | None = None) -> list[HistoryRow]:
    """REVISION and CHANGE-CAUSE (the ``kubernetes.io/change-cause`` annotation, else what changed
    against the revision before) and, for ``-o wide``, the ControllerRevision and which of the
    status's revisions it is."""
    st = (profile or {}).get("status") or {}
    rows = []
    for i, r in enumerate(revs):
        cause = r.cause or change_summary(revs[i - 1].data if i else None, r.data)
        served = [
            label
            for label, key in (("current", "currentRevision"), ("update", "updateRevision"))
            if st.get(key) == r.name
        ]
        rows.append(HistoryRow(r.number, cause, r.name, ",".join(served) or "-"))
    return rows


def find(revs: Sequence[Revision], number: int) -> Revision:
    for r in revs:
        if r.number == number:
            return r
    raise RolloutError(f"unable to find specified revision {number} in history")


# --- undo ---------------------------------------------------------------------------------------


def undo_target(revs: Sequence[Revision], profile: Obj, to_revision: int) -> Revision:
    """Revision ``to_revision``, or (0) the newest one before the revision the spec makes now,
    as ``kubectl rollout undo`` picks the previous template."""
    if to_revision:
        return find(revs, to_revision)
    now = spec_revision(spec(profile))
    older = [r for r in revs if r.digest != now]
    current = [r.number for r in revs if r.digest == now]
    if current:
        older = [r for r in older if r.number < max(current)] or older
    if not older:
        raise RolloutError("no rollout history found: no earlier revision to go back to")
    return older[-1]


def undo_patch(profile: Obj, data: Mapping[str, Any]) -> list[Obj]:
    """The JSON patch (RFC 6902) that puts revision ``data`` back into the spec: each field the
    revision holds replaced whole, each it lacks removed (a merge patch would merge ``plugin``
    key by key and keep keys the revision does not have). A Static revision's ``capacity`` is
    ``spec.static``'s ``capacity`` and ``capacityFromLabel``. The rest of the spec (``agent``,
    ``rollout``, ``revisionHistoryLimit``) is not touched."""
    sp = spec(profile)
    ops: list[Obj] = []
    for key in REVISION_FIELDS:
        if key in data:
            ops.append({"op": "add", "path": f"/spec/{key}", "value": data[key]})
        elif key in sp:
            ops.append({"op": "remove", "path": f"/spec/{key}"})
    cap = data.get("capacity")
    if isinstance(cap, Mapping):
        static = sp.get("static")
        if not isinstance(static, Mapping):
            ops.append({"op": "add", "path": "/spec/static", "value": dict(cap)})
        else:
            for key in ("capacity", "capacityFromLabel"):
                if key in cap:
                    ops.append({"op": "add", "path": f"/spec/static/{key}", "value": cap[key]})
                elif key in static:
                    ops.append({"op": "remove", "path": f"/spec/static/{key}"})
    return ops
