"""Pods the API server refuses to create (Pod Security, a quota, a missing ServiceAccount, an
admission policy): the DaemonSet controller's FailedCreate event -> the profile's problem
(pure), and the controller's nudge that makes a fix show within seconds (FAKE KubeAPI:
fakekube.py; tests/integration/operator/test_operator_refusals.py runs it for real)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from fakekube import FakeKube
from support.converge import until

from patchbay_operator.agentpods import STALL_AFTER, Warning, refusal
from patchbay_operator.capacity import NodeState
from patchbay_operator.config import Settings, load
from patchbay_operator.controller import Controller
from patchbay_operator.evaluation import Inputs, evaluate
from patchbay_operator.profiles import Profile
from patchbay_operator.status.daemonset import AgentDaemonSet

T0 = datetime(2026, 11, 25, 12, 0, 0, tzinfo=UTC)
DS = "patchbay-serial"
PSA = (
    'Error creating: pods "patchbay-serial-x7k2p" is forbidden: violates PodSecurity "baseline:latest": '
    'privileged (container "agent" must not set securityContext.privileged=true), hostPath volumes '
    '(volumes "device-plugins", "host-dev")'
)
REFUSED = {"desiredNumberScheduled": 2, "currentNumberScheduled": 0, "updatedNumberScheduled": 0}
CREATED = {"desiredNumberScheduled": 2, "currentNumberScheduled": 2, "updatedNumberScheduled": 2}


def rfc(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def event(kind: str = "DaemonSet", name: str = DS, reason: str = "FailedCreate", uid: str = "u1") -> Warning:
    return Warning.from_object(
        {
            "metadata": {"name": f"{name}.1", "creationTimestamp": rfc(T0)},
            "involvedObject": {"kind": kind, "name": name, "uid": uid, "namespace": "patchbay-system"},
            "reason": reason,
            "message": PSA,
            "type": "Warning",
            "firstTimestamp": rfc(T0),
            "lastTimestamp": rfc(T0 + timedelta(seconds=30)),
            "count": 7,
        }
    )


def test_a_daemonsets_failed_create_is_kept_and_its_other_warnings_are_not() -> None:
    w = event()
    assert (w.key, w.daemonset, w.pod, w.uid, w.since, w.count) == (
        f"DaemonSet/{DS}",
        DS,
        "",
        "u1",
        rfc(T0),
        7,
    )
    assert w.message == PSA
    assert event(reason="FailedDaemonPod").key == ""  # it would hide the FailedCreate
    assert event(kind="Deployment").key == ""
    assert event(kind="Pod", name="patchbay-serial-abc", reason="FailedMount").key == "patchbay-serial-abc"


def test_a_refusal_names_the_daemonset_quotes_the_cluster_and_stalls_after_a_while() -> None:
    early = refusal(DS, "u1", REFUSED, event(), T0 + timedelta(seconds=5))
    assert early is not None and not early.stalled and early.recheck_at == T0 + STALL_AFTER
    assert (early.node, early.reason) == ("", "FailedCreate")
    assert early.message == f"DaemonSet {DS} cannot create its agent pods: {PSA}"
    late = refusal(DS, "u1", REFUSED, event(), T0 + STALL_AFTER)
    assert late is not None and late.stalled and late.recheck_at is None


def test_the_operators_stall_after_setting_is_how_long_a_refusal_lasts_before_it_stalls() -> None:
    # --stall-after 5: the refusal stalls 5 s after the event, not STALL_AFTER (60 s) after it.
    five = timedelta(seconds=5)
    early = refusal(DS, "u1", REFUSED, event(), T0 + timedelta(seconds=4), stall_after=five)
    assert early is not None and not early.stalled and early.recheck_at == T0 + five
    late = refusal(DS, "u1", REFUSED, event(), T0 + five, stall_after=five)
    assert late is not None and late.stalled
    ds = AgentDaemonSet("serial", 1, {**REFUSED, "observedGeneration": 1}, DS, "u1")
    inputs = Inputs(
        prof(), {}, rfc(T0 + five), [NodeState("a")], daemonset=ds, create_warning=event(), stall_after=5.0
    )
    result = evaluate(inputs)
    assert result.status is not None
    assert {c["type"]: c["status"] for c in result.status["conditions"]}["Stalled"] == "True"
    assert load(["--stall-after", "5"], env={}).stall_after == 5.0
    assert load([], env={"PATCHBAY_STALL_AFTER": "5"}).stall_after == 5.0
    assert load([], env={}).stall_after == STALL_AFTER.total_seconds()


def test_a_refusal_holds_only_while_the_daemonsets_pods_are_missing() -> None:
    late = T0 + STALL_AFTER
    assert refusal(DS, "u1", CREATED, event(), late) is None  # the old event outlives its cause
    rollout = {**CREATED, "updatedNumberScheduled": 1}  # new pods of a rollout refused
    assert refusal(DS, "u1", rollout, event(), late) is not None
    assert refusal(DS, "u1", {"desiredNumberScheduled": 0}, event(), late) is None
    assert refusal(DS, "u2", REFUSED, event(), late) is None  # about an earlier DaemonSet of that name
    assert refusal("patchbay-other", "u9", REFUSED, event(), late) is None
    assert refusal(DS, "u1", REFUSED, None, late) is None


def prof(name: str = "serial", agent: bool = True) -> Profile:
    spec: dict[str, Any] = {"resourceName": "example.com/serial", "mode": "DevicePlugin"}
    if agent:
        spec["agent"] = {"privileged": True}
    return Profile.from_body({"metadata": {"name": name, "generation": 1}, "spec": spec})


def test_the_profile_is_stalled_with_the_refusal_and_asks_for_a_nudge() -> None:
    ds = AgentDaemonSet("serial", 1, {**REFUSED, "observedGeneration": 1}, DS, "u1")
    nodes = [NodeState("a"), NodeState("b")]
    inputs = Inputs(prof(), {}, rfc(T0 + STALL_AFTER), nodes, daemonset=ds, create_warning=event())
    result = evaluate(inputs)
    assert result.retry_create == DS
    assert result.status is not None
    conds = {c["type"]: c for c in result.status["conditions"]}
    assert (conds["Stalled"]["status"], conds["Stalled"]["reason"]) == ("True", "FailedCreate")
    assert conds["Reconciling"]["status"] == "False"  # kstatus: Failed
    assert f"DaemonSet {DS} cannot create its agent pods" in conds["Stalled"]["message"]
    assert 'violates PodSecurity "baseline:latest"' in conds["Stalled"]["message"]
    assert result.status["problems"][0]["reason"] == "FailedCreate"

    early = evaluate(
        Inputs(prof(), {}, rfc(T0 + timedelta(seconds=1)), nodes, daemonset=ds, create_warning=event())
    )
    assert early.status is not None and early.recheck_at == T0 + STALL_AFTER
    assert {c["type"]: c["status"] for c in early.status["conditions"]}["Stalled"] == "False"

    ok = AgentDaemonSet("serial", 1, {**CREATED, "observedGeneration": 1}, DS, "u1")
    fixed = evaluate(Inputs(prof(), {}, rfc(T0 + STALL_AFTER), nodes, daemonset=ok, create_warning=event()))
    assert fixed.retry_create is None
    assert fixed.status is not None
    assert {c["type"]: c["status"] for c in fixed.status["conditions"]}["Stalled"] == "False"


def test_every_profile_of_the_refused_shared_agent_is_stalled() -> None:
    ds = AgentDaemonSet("*shared*", 1, REFUSED, "patchbay-node-agent", "u1")
    w = event(name="patchbay-node-agent")
    result = evaluate(
        Inputs(
            prof(agent=False),
            {},
            rfc(T0 + STALL_AFTER),
            [NodeState("a")],
            daemonset=ds,
            create_warning=w,
            shared_pods=[],
        )
    )
    assert result.retry_create == "patchbay-node-agent"
    assert result.status is not None
    assert {c["type"]: c["status"] for c in result.status["conditions"]}["Stalled"] == "True"


async def test_the_controller_nudges_a_refused_daemonset_until_its_pods_exist() -> None:
    """The nudge is an annotation on the DaemonSet (any update makes its controller sync it at
    once); it repeats while the refusal holds and stops when the pods exist."""
    kube = FakeKube()
    kube.add_node("a")
    ctl = Controller(Settings(concurrency=2, status_debounce=0.02), kube)  # type: ignore[arg-type]
    ctl.statuses.retry_create_every = 0.05
    await ctl.start()
    try:
        body = {
            "metadata": {"name": "serial", "uid": "uid-serial", "generation": 1},
            "spec": {
                "resourceName": "example.com/serial",
                "mode": "DevicePlugin",
                "agent": {"privileged": True},
            },
        }
        await ctl.reconcile(body)
        stored = kube.objects[next(p for p in kube.objects if p.endswith(f"/daemonsets/{DS}"))]
        uid = stored["metadata"]["uid"]
        a = ctl.watch
        a.daemonsets.fold("MODIFIED", AgentDaemonSet("serial", 1, REFUSED, DS, uid))
        a.warnings.fold("ADDED", event(uid=uid))
        await until(lambda: kube.calls.count("annotate") >= 2)
        assert "patchbay.dev/retry-create" in stored["metadata"]["annotations"]
        a.daemonsets.fold("MODIFIED", AgentDaemonSet("serial", 1, CREATED, DS, uid))
        await asyncio.sleep(0.2)
        count = kube.calls.count("annotate")
        await asyncio.sleep(0.2)
        assert kube.calls.count("annotate") == count
    finally:
        await ctl.stop()


async def test_an_apply_answer_after_the_watch_never_puts_an_older_status_back() -> None:
    """The apply's answer comes back through a worker thread; the watch may bring the DaemonSet,
    and the status its controller wrote right after (pods desired, none created), first. The
    answer must not put the status of the moment of the apply back: nothing changes the
    DaemonSet again, so the refusal would never be seen (the integration test, under load)."""
    from patchbay_operator.agentwatch import AgentWatch
    from patchbay_operator.profiles import Registry

    async def call(fn: Any, *args: Any) -> Any:
        return fn(*args)

    watch = AgentWatch(
        FakeKube(), call, Settings(namespace="patchbay-system"), registry=Registry(), mark=lambda _n: None
    )
    watch.daemonsets.fold("ADDED", AgentDaemonSet("serial", 1, {}, DS, "u1"))
    watch.daemonsets.fold("MODIFIED", AgentDaemonSet("serial", 1, REFUSED, DS, "u1"))
    watch.applied(AgentDaemonSet("serial", 1, {}, DS, "u1"))  # the answer, late
    assert watch.daemonsets.items["serial"].status == REFUSED
    # A new generation is the apply's news, folded at once; so is a DaemonSet of the name made anew.
    watch.applied(AgentDaemonSet("serial", 2, {}, DS, "u1"))
    assert watch.daemonsets.items["serial"].generation == 2
    watch.applied(AgentDaemonSet("serial", 1, {}, DS, "u2"))
    assert watch.daemonsets.items["serial"].uid == "u2"
    # Before any watch event, the answer is what there is.
    watch.applied(AgentDaemonSet("other", 1, {}, "patchbay-other", "u3"))
    assert watch.daemonsets.items["other"].uid == "u3"


def test_the_profiles_events_say_the_refusal_and_its_recovery_without_a_node() -> None:
    from patchbay_operator.events import transitions
    from patchbay_operator.status.conditions import Problem

    msg = f"DaemonSet {DS} cannot create its agent pods: {PSA}"
    p = Problem("", "", "FailedCreate", msg, stalled=True)
    (warning,) = transitions({}, [p])
    assert (warning.type, warning.reason, warning.message) == ("Warning", "FailedCreate", msg)
    (recovered,) = transitions({p.key: p}, [])
    assert (recovered.type, recovered.reason) == ("Normal", "Recovered")
    assert recovered.message == "agent DaemonSet: FailedCreate resolved"
