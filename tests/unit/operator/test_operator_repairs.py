"""Repairs without a cluster: what an owned object is kept as (a hash of the operator's managed
fields, the other appliers), what a change of it was, whom a 409 names, and the controller's
repairs through ``fakekube.FakeKube``: a deleted object recreated with one Event, an edit by an
update restored by force, a take-over by server-side apply left alone with one Warning, nothing
recreated for a profile being deleted, the rate limit; and `kubectl patchbay why` naming a missing
ConfigMap as the cause. The real API server is in
tests/integration/operator/test_operator_repairs_on_the_api_server.py, the real node in
tests/e2e/test_operator_repairs_on_real_node.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fakekube import FakeKube
from support.agentrun import until

from patchbay_operator import render, repairs
from patchbay_operator.config import Settings
from patchbay_operator.constants import FIELD_MANAGER, SHARED_KEY
from patchbay_operator.controller import Controller
from patchbay_operator.kube import KubeError, ref_of
from patchbay_operator.owned import Change, Owned, change, conflict_managers, managed, restored, taken_over

SETTINGS = Settings(namespace="patchbay-test", agent_image="example.invalid/agent:1", status_debounce=0.01)


def entry(
    manager: str, operation: str = "Apply", fields: Any = None, subresource: str = ""
) -> dict[str, Any]:
    out = {"manager": manager, "operation": operation, "fieldsV1": fields or {"f:data": {}}}
    if subresource:
        out["subresource"] = subresource
    return out


def owned(fields: str = "h1", *appliers: str) -> Owned:
    return Owned("ConfigMap", "patchbay-node-agent", SHARED_KEY, fields, frozenset(appliers))


# --- pure ------------------------------------------------------------------------------------------


def test_managed_hashes_the_operators_apply_and_names_the_other_appliers() -> None:
    meta = {
        "managedFields": [
            entry(FIELD_MANAGER, fields={"f:data": {"f:node.yaml": {}}}),
            entry(FIELD_MANAGER, "Update", {"f:metadata": {}}),  # its annotate: not the apply
            entry("kube-controller-manager", "Update", {"f:status": {}}, "status"),
            entry("argocd", fields={"f:metadata": {"f:labels": {}}}),
            entry("kubectl-edit", "Update"),
        ]
    }
    fields, appliers = managed(meta)
    assert len(fields) == 16 and appliers == {"argocd"}
    # Another writer took a field: the operator's entry shrank, so the hash moved.
    taken = {"managedFields": [entry(FIELD_MANAGER, fields={"f:data": {}}), entry("kubectl-edit", "Update")]}
    assert managed(taken)[0] not in ("", fields)
    assert managed({}) == ("", frozenset())


def test_change_is_a_deletion_or_fields_taken_and_nothing_else() -> None:
    assert change(owned(), None) is Change.DELETED
    assert change(None, owned()) is None  # created (the operator's apply, or a repair)
    assert change(owned("h1"), owned("h2")) is Change.EDITED
    assert change(owned("h1"), owned("h1", "argocd")) is None  # a label of someone else's
    assert change(None, None) is None
    assert restored(None, owned()) and restored(owned("h0"), owned("h1"))
    assert not restored(owned("h1"), owned("h1"))


def test_a_conflict_names_its_managers_and_only_appliers_took_fields_over() -> None:
    body = json.dumps(
        {
            "kind": "Status",
            "message": "Apply failed with 2 conflicts: ...",
            "details": {
                "causes": [
                    {
                        "reason": "FieldManagerConflict",
                        "message": 'conflict with "kubectl-set" using apps/v1',
                    },
                    {"reason": "FieldManagerConflict", "message": 'conflict with "gitops" using apps/v1'},
                ]
            },
        }
    )
    assert conflict_managers(body) == {"kubectl-set", "gitops"}
    assert conflict_managers('Apply failed with 1 conflict: conflict with "x" using v1: .data') == {"x"}
    assert taken_over({"kubectl-set", "gitops"}, owned("h", "gitops")) == {"gitops"}
    assert taken_over({"kubectl-set"}, owned("h", "gitops")) == set()
    assert taken_over({"gitops"}, None) == set()


def test_repairs_of_one_object_are_rate_limited_not_refused() -> None:
    now = [0.0]
    r = Controller(SETTINGS, FakeKube()).repairs  # type: ignore[arg-type]
    r.clock = lambda: now[0]
    key = ("ConfigMap", "x")
    assert [r._wait(key) for _ in range(repairs.BURST)] == [0.0] * repairs.BURST
    wait = r._wait(key)
    assert 0 < wait <= repairs.EVERY
    now[0] += wait
    assert r._wait(key) == 0.0
    assert r._wait(("ConfigMap", "y")) == 0.0  # per object


# --- the controller --------------------------------------------------------------------------------


class ManagedKube(FakeKube):
    """Stores what is applied with the operator's managedFields entry, and answers a non-forced
    apply with the 409 of ``conflict`` (a manager name) once set."""

    conflict = ""

    def apply(self, obj: dict[str, Any], force: bool = True) -> dict[str, Any]:
        if self.conflict and not force:
            self._call("apply")
            causes = [{"message": f'conflict with "{self.conflict}" using v1'}]
            raise KubeError(409, "PATCH", ref_of(obj).path, json.dumps({"details": {"causes": causes}}))
        stored = super().apply(obj, force)
        path = ref_of(obj).path
        fields = {"f:data": {"f:node.yaml": {}}, "f:spec": {}}
        self.objects[path]["metadata"]["managedFields"] = [entry(FIELD_MANAGER, fields=fields)]
        stored["metadata"]["managedFields"] = [entry(FIELD_MANAGER, fields=fields)]
        return stored


def shared(name: str, mode: str = "DevicePlugin", uid: str = "") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": uid or f"uid-{name}",
            "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "resourceName": f"example.com/{name}",
            "mode": mode,
            "nodeSelector": {"matchLabels": {}},
            "plugin": {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}},
        },
    }


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(repairs, "REPAIR_DELAY", 0.01)


async def started(kube: FakeKube, *bodies: dict[str, Any]) -> Controller:
    c = Controller(SETTINGS, kube)  # type: ignore[arg-type]
    await c.start()
    for b in bodies:
        await c.reconcile(b)
    return c


def stored(kube: FakeKube, kind: str, name: str) -> dict[str, Any]:
    return next(o for o in kube.objects.values() if o["kind"] == kind and o["metadata"]["name"] == name)


def seen(c: Controller, kind: str, obj: dict[str, Any]) -> None:
    """The informer's event for ``obj`` as the API server has it now (or its deletion)."""
    c.repairs.stores[kind].fold("MODIFIED", Owned.from_object(kind, obj))


def events(kube: FakeKube, reason: str) -> list[str]:
    return [e["message"] for e in kube.events if e["reason"] == reason]


async def test_a_deleted_object_is_recreated_once_with_an_event_and_the_status_says_so() -> None:
    kube = ManagedKube()
    c = await started(kube, shared("serial", "DRA"))
    try:
        for kind, name in (("ConfigMap", render.SHARED_AGENT), ("DeviceClass", "serial.patchbay.dev")):
            obj = stored(kube, kind, name)
            seen(c, kind, obj)
            applies = len(kube.applied)
            del kube.objects[ref_of({**obj, "apiVersion": obj["apiVersion"]}).path]
            c.repairs.stores[kind].fold("DELETED", Owned.from_object(kind, obj))
            # Missing meanwhile: the status says so, as the cause, not a wait.
            (problem,) = c.repairs.problems(["serial", SHARED_KEY])
            assert problem.reason == "OwnedObjectMissing" and name in problem.message
            status = c.statuses.compute("serial") or {}
            assert "OwnedObjectMissing" in [p["reason"] for p in status["problems"]], status
            await until(lambda: events(kube, "Recreated"))
            assert kube.applied[applies:] and kube.applied[-1]["kind"] == kind
            assert events(kube, "Recreated") == [f"{kind} {name} was deleted; recreated"]
            assert c.repairs.problems(["serial", SHARED_KEY]) == []
            kube.events.clear()
        assert c.stats()["repairs"] == {"ConfigMap": 1, "DeviceClass": 1}
    finally:
        await c.stop()


async def test_an_update_edit_is_restored_by_force_and_a_take_over_is_left_with_one_warning() -> None:
    kube = ManagedKube()
    c = await started(kube, shared("serial"))
    try:
        cm = stored(kube, "ConfigMap", render.SHARED_AGENT)
        seen(c, "ConfigMap", cm)
        # kubectl edit: the data field's ownership moved to kubectl-edit (an update).
        edited = {
            **cm,
            "metadata": {
                **cm["metadata"],
                "managedFields": [entry(FIELD_MANAGER), entry("kubectl-edit", "Update")],
            },
        }
        kube.conflict = "kubectl-edit"
        seen(c, "ConfigMap", edited)
        await until(lambda: events(kube, "Restored"))
        assert events(kube, "Restored") == [f"ConfigMap {render.SHARED_AGENT} was edited; restored"]
        assert kube.calls.count("apply") >= 2  # refused without force, then forced

        # server-side apply --force-conflicts by "gitops": left alone, one Warning, no loop.
        taken = {
            **cm,
            "metadata": {**cm["metadata"], "managedFields": [entry(FIELD_MANAGER), entry("gitops")]},
        }
        kube.conflict = "gitops"
        applies = len(kube.applied)
        seen(c, "ConfigMap", taken)
        await until(lambda: events(kube, "FieldsTakenOver"))
        (problem,) = c.repairs.problems([SHARED_KEY])
        assert problem.reason == "FieldsTakenOver" and "gitops" in problem.message
        seen(c, "ConfigMap", {**taken, "metadata": {**taken["metadata"], "labels": {"x": "y"}}})
        await c.repairs._repair(("ConfigMap", render.SHARED_AGENT), SHARED_KEY)
        assert len(events(kube, "FieldsTakenOver")) == 1 and len(kube.applied) == applies
        assert c.stats()["fieldsTakenOver"] == {"ConfigMap": 1}
    finally:
        await c.stop()


async def test_nothing_is_recreated_for_a_profile_being_deleted_or_gone() -> None:
    kube = ManagedKube()
    own = shared("own")
    own["spec"]["agent"] = {"tolerations": [{"operator": "Exists"}]}
    c = await started(kube, own)
    try:
        ds = stored(kube, "DaemonSet", "patchbay-own")
        seen(c, "DaemonSet", ds)
        applies = len(kube.applied)
        deleting = {**own, "metadata": {**own["metadata"], "deletionTimestamp": "2026-01-01T00:01:00Z"}}
        await c.delete(deleting, patience=1.0)
        c.repairs.stores["DaemonSet"].fold("DELETED", Owned.from_object("DaemonSet", ds))
        await c.repairs._repair(("DaemonSet", "patchbay-own"), "own")
        assert [o["kind"] for o in kube.applied[applies:]] == []
        assert events(kube, "Recreated") == [] and c.repairs.problems(["own"]) == []
    finally:
        await c.stop()
