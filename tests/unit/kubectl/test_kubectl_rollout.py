"""``kubectl patchbay rollout``'s pure parts: the status line from a profile's status (as the
operator's waves write ``status.rollout``: written here by hand, from the CRD's contract), the
history's change summaries, which revision ``undo`` picks, and the patches it and pause write."""

from __future__ import annotations

from typing import Any

import pytest

from patchbay_api.revisions import revision_data, revision_hash, spec_revision
from patchbay_kubectl import rollout
from patchbay_kubectl.arguments import build_parser, duration
from patchbay_kubectl.completion import completions


def profile(
    status: dict[str, Any] | None = None,
    *,
    spec: dict[str, Any] | None = None,
    generation: int = 2,
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    st = {"observedGeneration": 2, **(status or {})}
    if conditions is not None:
        st["conditions"] = conditions
    return {
        "metadata": {"name": "serial", "generation": generation, "uid": "u1", "resourceVersion": "7"},
        "spec": spec or {"mode": "DevicePlugin", "resourceName": "example.com/serial"},
        "status": st,
    }


def counts(desired: int, updated: int, ready: int, same: bool = False) -> dict[str, Any]:
    return {
        "currentRevision": "serial-aaaa" if not same else "serial-bbbb",
        "updateRevision": "serial-bbbb",
        "desiredNumberScheduled": desired,
        "updatedNumberScheduled": updated,
        "updatedNumberReady": ready,
    }


def test_status_waits_like_kubectl_for_a_daemonset() -> None:
    st = rollout.rollout_status(profile({**counts(10, 3, 2), "rollout": {"phase": "Progressing", "wave": 2}}))
    assert st == rollout.Status(
        'Waiting for profile "serial" rollout to finish: 3 out of 10 nodes have been updated (wave 2)...'
    )
    st = rollout.rollout_status(
        profile({**counts(10, 10, 3), "rollout": {"phase": "Progressing", "wave": 4}})
    )
    assert st.text.endswith("3 of 10 updated nodes are ready (wave 4)...") and not st.done
    st = rollout.rollout_status(profile(counts(10, 10, 10)))
    assert not st.done and "waiting for the operator to complete the revision" in st.text


def test_status_done_only_when_the_revisions_agree_and_every_node_is_ready() -> None:
    st = rollout.rollout_status(profile(counts(10, 10, 10, same=True)))
    assert st == rollout.Status('profile "serial" successfully rolled out', done=True)
    # A status the operator has not written for this generation yet: not done, whatever it says.
    st = rollout.rollout_status(profile(counts(10, 10, 10, same=True), generation=3))
    assert st.text == "Waiting for profile spec update to be observed..." and not st.done


def test_status_of_a_halted_rollout_fails_with_the_stalled_message() -> None:
    stalled = [
        {"type": "Stalled", "status": "True", "reason": "RolloutHalted", "message": "node n1: 0 of 4 healthy"}
    ]
    st = rollout.rollout_status(
        profile({**counts(10, 1, 0), "rollout": {"phase": "Halted", "message": "m"}}, conditions=stalled)
    )
    assert st.failed and st.text == 'profile "serial" rollout halted: node n1: 0 of 4 healthy'
    # Halted without the condition (yet): the rollout's own message.
    st = rollout.rollout_status(profile({**counts(10, 1, 0), "rollout": {"phase": "Halted", "message": "m"}}))
    assert st.failed and st.text.endswith("halted: m")


def test_status_of_a_paused_rollout_says_so() -> None:
    paused = {**counts(10, 1, 1), "rollout": {"phase": "Paused", "wave": 1}}
    st = rollout.rollout_status(profile(paused))
    assert "rollout is paused, 1 of 10 nodes updated (wave 1)" in st.text
    assert not st.done and not st.failed
    # The user's field alone (the operator not at it yet) reads the same.
    spec = {"mode": "DevicePlugin", "rollout": {"paused": True}}
    assert "rollout is paused" in rollout.rollout_status(profile(counts(4, 0, 0), spec=spec)).text


def test_pause_and_resume_patches_refuse_as_kubectl_does() -> None:
    assert rollout.pause_patch(profile(), True) == {"spec": {"rollout": {"paused": True}}}
    paused = profile(spec={"rollout": {"paused": True}})
    assert rollout.pause_patch(paused, False) == {"spec": {"rollout": {"paused": None}}}
    with pytest.raises(
        rollout.RolloutError, match=r'devicepluginprofiles\.patchbay\.dev "serial" is already paused'
    ):
        rollout.pause_patch(paused, True)
    with pytest.raises(rollout.RolloutError, match="is not paused"):
        rollout.pause_patch(profile(), False)


def cr(number: int, spec: dict[str, Any], cause: str = "", uid: str = "u1") -> dict[str, Any]:
    """A ControllerRevision as the operator writes it (operator/patchbay_operator/revisions.py)."""
    data = revision_data(spec)
    digest = revision_hash(data)
    meta: dict[str, Any] = {
        "name": f"serial-{digest}",
        "labels": {"patchbay.dev/profile": "serial", "controller-revision-hash": digest},
        "ownerReferences": [{"uid": uid, "controller": True}],
    }
    if cause:
        meta["annotations"] = {"kubernetes.io/change-cause": cause}
    return {"metadata": meta, "data": data, "revision": number}


SPEC1 = {
    "resourceName": "example.com/serial",
    "mode": "DevicePlugin",
    "plugin": {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}, "health": {"periodSeconds": 5}},
}
SPEC2 = {**SPEC1, "plugin": {**SPEC1["plugin"], "discovery": {"paths": {"globs": ["/dev/ttyACM*"]}}}}
SPEC3 = {**SPEC2, "nodeSelector": {"matchLabels": {"zone": "a"}}, "plugin": {**SPEC2["plugin"], "health": {}}}


def test_history_rows_say_what_each_revision_changed() -> None:
    objs = [cr(2, SPEC2), cr(1, SPEC1), cr(3, SPEC3, cause="kubectl apply: zone a only")]
    objs.append(cr(4, SPEC1, uid="another-profile-of-the-same-name"))
    revs = rollout.revisions(objs, profile())
    assert [r.number for r in revs] == [1, 2, 3]
    rows = rollout.history_rows(
        revs, profile({"currentRevision": revs[0].name, "updateRevision": revs[2].name})
    )
    assert rows[0].change_cause == "created (DevicePlugin example.com/serial)"
    assert rows[1].change_cause == 'plugin.discovery.paths.globs: ["/dev/ttyUSB*"] -> ["/dev/ttyACM*"]'
    assert rows[2].change_cause == "kubectl apply: zone a only"
    assert [r.served for r in rows] == ["current", "-", "update"]
    two = rollout.change_summary(revision_data(SPEC2), revision_data(SPEC3))
    assert two.startswith('nodeSelector.matchLabels.zone: <none> -> "a" (+2 more: ')


def test_undo_picks_the_previous_revision_or_the_one_asked() -> None:
    revs = rollout.revisions([cr(1, SPEC1), cr(2, SPEC2), cr(3, SPEC3)])
    now = profile(spec=SPEC3)
    assert rollout.undo_target(revs, now, 0).number == 2
    assert rollout.undo_target(revs, now, 1).number == 1
    with pytest.raises(rollout.RolloutError, match="unable to find specified revision 9 in history"):
        rollout.undo_target(revs, now, 9)
    # After an undo to 1 the spec is revision 1's again: "previous" is the newest other one.
    assert rollout.undo_target(revs, profile(spec=SPEC1), 0).number == 3
    with pytest.raises(rollout.RolloutError, match="no rollout history"):
        rollout.undo_target(rollout.revisions([cr(1, SPEC1)]), profile(spec=SPEC1), 0)


def apply_json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """Enough of RFC 6902 (add, remove, test) on paths of object keys."""
    for op in ops:
        *parents, last = op["path"].strip("/").split("/")
        node = doc
        for p in parents:
            node = node[p]
        if op["op"] == "add":
            node[last] = op["value"]
        elif op["op"] == "remove":
            del node[last]
    return doc


def test_undo_patch_puts_the_revision_back_whole_and_leaves_the_rest() -> None:
    now = {**SPEC3, "agent": {"image": "x"}, "rollout": {"paused": True}, "nodeGroups": [{"name": "g"}]}
    ops = rollout.undo_patch({"spec": now}, revision_data(SPEC1))
    after = apply_json_patch({"spec": dict(now)}, ops)["spec"]
    assert spec_revision(after) == spec_revision(SPEC1)
    # health.periodSeconds is back: the plugin was replaced whole, not merged.
    assert after["plugin"] == SPEC1["plugin"] and "nodeSelector" not in after and "nodeGroups" not in after
    assert after["agent"] == {"image": "x"} and after["rollout"] == {"paused": True}


def test_undo_patch_of_a_static_profile_writes_its_capacity() -> None:
    old = {"resourceName": "example.com/d", "mode": "Static", "static": {"capacityFromLabel": "k"}}
    new = {"resourceName": "example.com/d", "mode": "Static", "static": {"capacity": 3}}
    after = apply_json_patch(
        {"spec": {**new, "static": dict(new["static"])}},
        rollout.undo_patch({"spec": new}, revision_data(old)),
    )
    assert after["spec"]["static"] == {"capacityFromLabel": "k"}
    assert spec_revision(after["spec"]) == spec_revision(old)


def test_rollout_parser_durations_and_completion() -> None:
    args = build_parser().parse_args(["rollout", "status", "p", "--watch=false", "--timeout=1m30s"])
    assert (args.verb, args.watch, args.timeout) == ("status", False, 90.0)
    assert duration("45") == 45.0 and duration("2h") == 7200.0
    with pytest.raises(Exception, match="invalid duration"):
        duration("5 minutes")
    args = build_parser().parse_args(["rollout", "undo", "p", "--to-revision=3", "--dry-run=server"])
    assert (args.to_revision, args.dry_run) == (3, "server")
    assert completions(["rollout", ""], lambda kind: []) == ["history", "pause", "resume", "status", "undo"]
    assert completions(["rollout", "undo", "s"], lambda kind: ["serial", "x"]) == ["serial"]
    assert "--to-revision" in completions(["rollout", "undo", "--"], lambda kind: [])
    assert "diff" in completions([""], lambda kind: [])


def test_diff_completes_file_names_after_f(capsys: pytest.CaptureFixture[str]) -> None:
    from patchbay_kubectl.completion import complete_main

    complete_main(["diff", "-f", "prof"])
    assert capsys.readouterr().out.splitlines()[-1] == ":0"
    complete_main(["diff", ""])
    assert capsys.readouterr().out.splitlines()[-1] == ":4"
