"""A profile's ControllerRevisions (revisions.py) with a fake API, and the shared ConfigMap's size
with two revisions per profile (render.over_limit, agents.py's refusal)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fakekube import FakeKube, started
from support.agentrun import until

from patchbay_api.revisions import spec_revision
from patchbay_operator import render
from patchbay_operator.capacity import NodeState
from patchbay_operator.config import Settings
from patchbay_operator.controller import Controller
from patchbay_operator.devicereports import Report
from patchbay_operator.evaluation import Inputs, evaluate
from patchbay_operator.informer import Event
from patchbay_operator.profiles import Profile
from patchbay_operator.revisions import Kept, to_prune

REPO = Path(__file__).resolve().parents[3]
NS = "patchbay-test"
SETTINGS = Settings(namespace=NS, agent_image="example.invalid/agent:1")
CR_PATH = f"/apis/apps/v1/namespaces/{NS}/controllerrevisions/"


def body(glob: str = "/dev/ttyUSB*", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "serial",
            "uid": "uid-serial",
            "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "resourceName": "example.com/serial",
            "mode": "DevicePlugin",
            "plugin": {"discovery": {"paths": {"globs": [glob]}}},
            **spec,
        },
    }


def revisions(kube: FakeKube) -> dict[str, dict[str, Any]]:
    return {p.rpartition("/")[2]: o for p, o in kube.objects.items() if p.startswith(CR_PATH)}


@pytest.fixture
async def ctl() -> Any:
    kube = FakeKube()
    kube.add_node("n0")
    async with started(Controller(SETTINGS, kube)) as c:  # type: ignore[arg-type]
        yield c, kube


async def test_each_change_is_one_revision_and_a_no_op_edit_none(ctl: Any) -> None:
    c, kube = ctl
    await c.reconcile(body())
    first = f"serial-{spec_revision(body()['spec'])}"
    (cr,) = revisions(kube).values()
    assert cr["metadata"]["name"] == first and cr["revision"] == 1
    assert cr["metadata"]["labels"]["patchbay.dev/profile"] == "serial"
    assert cr["metadata"]["labels"]["controller-revision-hash"] == first.rpartition("-")[2]
    assert cr["metadata"]["ownerReferences"][0]["uid"] == "uid-serial"
    assert cr["data"]["plugin"] == body()["spec"]["plugin"]
    # A label, an annotation: no revision, no write.
    edited = copy.deepcopy(body())
    edited["metadata"]["labels"] = {"team": "a"}
    applied = len(kube.applied)
    await c.reconcile(edited)
    assert [o["kind"] for o in kube.applied[applied:]].count("ControllerRevision") == 0
    await c.reconcile(body("/dev/ttyACM*"))
    second = revisions(kube)[f"serial-{spec_revision(body('/dev/ttyACM*')['spec'])}"]
    assert second["revision"] == 2
    # Back to the first spec: its revision comes back with the next number, as a DaemonSet's does.
    await c.reconcile(body())
    assert revisions(kube)[first]["revision"] == 3
    assert c.stats()["revisions"]["created"] == 3


async def test_history_is_pruned_to_the_limit_and_the_one_in_use_kept(ctl: Any) -> None:
    c, kube = ctl
    for i in range(5):
        await c.reconcile(body(f"/dev/tty{i}*", revisionHistoryLimit=2))
    kept = revisions(kube)
    # Revision 1 is the current one (no status loop here moves a wave: its nodes still serve it),
    # so it is in use too; two older ones are kept besides.
    assert sorted(o["revision"] for o in kept.values()) == [1, 3, 4, 5]
    assert f"serial-{spec_revision(body('/dev/tty4*', revisionHistoryLimit=2)['spec'])}" in kept
    await c.reconcile(body("/dev/tty9*", revisionHistoryLimit=0))
    assert sorted(o["revision"] for o in revisions(kube).values()) == [1, 6]


def test_prune_keeps_what_is_in_use_whatever_its_age() -> None:
    kept = [Kept(f"p-{i}", "p", str(i), i) for i in range(1, 6)]
    assert [k.name for k in to_prune(kept, {"p-1"}, 2)] == ["p-2", "p-3"]
    assert to_prune(kept, {"p-5"}, 10) == []


async def test_the_revision_in_use_is_written_again_when_deleted(ctl: Any) -> None:
    c, kube = ctl
    await c.reconcile(body())
    ((name, cr),) = revisions(kube).items()
    del kube.objects[CR_PATH + name]
    c.revisions.store.observe([Event("DELETED", Kept.from_object(cr))])
    # The repair counts itself after its write returns (the write runs in a thread): the stored
    # object can be seen a turn of the loop before the count, so the count is what is waited for.
    await until(lambda: c.stats()["revisions"]["recreated"] == 1)
    assert revisions(kube)[name]["revision"] == 1  # the only one: numbered after the newest kept
    # An old revision deleted is not written again.
    await c.reconcile(body("/dev/ttyACM*"))
    old = Kept.from_object(revisions(kube)[name])
    del kube.objects[CR_PATH + name]
    c.revisions.store.observe([Event("DELETED", old)])
    await c.revisions.close()
    assert name not in revisions(kube)


def test_the_status_names_the_revisions_and_counts_the_nodes_on_it() -> None:
    profile = Profile.from_body(body())
    digest = spec_revision(body()["spec"])
    nodes = [NodeState(n) for n in ("a", "b", "c")]
    reports = [
        Report("serial.a", "serial", "a", revision=digest),
        Report("serial.b", "serial", "b", revision="old"),
    ]
    status = evaluate(Inputs(profile, {}, "2026-01-01T00:00:00Z", nodes, reports=reports)).status
    assert status is not None
    assert (status["currentRevision"], status["updateRevision"]) == (f"serial-{digest}", f"serial-{digest}")
    assert (
        status["desiredNumberScheduled"],
        status["updatedNumberScheduled"],
        status["updatedNumberReady"],
    ) == (
        3,
        1,
        1,
    )


# --- the shared ConfigMap's size -----------------------------------------------------------------


def _biggest(schema: dict[str, Any], unbounded: list[str], path: str) -> Any:
    """The largest value the schema admits (strings and lists at their maxLength/maxItems; one
    with no bound is noted in `unbounded` and taken as empty/one item)."""
    if "enum" in schema:
        return max(schema["enum"], key=lambda v: len(json.dumps(v)))
    if schema.get("x-kubernetes-int-or-string"):
        return "100%"
    t = schema.get("type")
    if t == "string":
        if "maxLength" not in schema:
            unbounded.append(path)
        return "x" * int(schema.get("maxLength", 0))
    if t == "integer":
        return int(schema.get("maximum", 2**31 - 1))
    if t == "boolean":
        return False
    if t == "array":
        if "maxItems" not in schema:
            unbounded.append(path)
        return [
            _biggest(schema["items"], unbounded, f"{path}[]") for _ in range(int(schema.get("maxItems", 1)))
        ]
    if t == "object":
        props = schema.get("properties") or {}
        return {k: _biggest(v, unbounded, f"{path}.{k}") for k, v in props.items()}
    return None


def spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load((REPO / "crds" / "patchbay.dev_devicepluginprofiles.yaml").read_text())
    spec: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec


def example(name: str, glob: str) -> Profile:
    return Profile.from_body(
        {**body(glob), "metadata": {**body()["metadata"], "name": name, "uid": f"uid-{name}"}}
    )


def test_two_revisions_of_a_profile_at_the_crds_bounds_do_not_fit_and_are_refused() -> None:
    """At the CRD's bounds one profile's settings alone are far over 1 MiB (the API server would
    not even store such a profile: etcd's 1.5 MiB), so the bound that holds is the refusal."""
    unbounded: list[str] = []
    spec = _biggest(spec_schema(), unbounded, "spec")
    spec.update(resourceName="example.com/" + "x" * 40, mode="DevicePlugin")
    spec.pop("static", None)
    spec.pop("agent", None)
    big = Profile.from_body({"metadata": {"name": "big", "uid": "u"}, "spec": spec})
    older = Profile.from_body(
        {"metadata": {"name": "big", "uid": "u"}, "spec": {**spec, "resourceName": "example.com/" + "y" * 40}}
    )
    entry = render.node_entry(big, None, current=older)
    assert set(entry["revisions"]) == {spec_revision(older.spec)}
    assert entry["rollout"]["current"] != entry["rollout"]["update"]
    assert len(json.dumps(entry)) > 2 * render.CONFIGMAP_LIMIT
    small = example("a-small", "/dev/ttyUSB*")
    assert render.over_limit([(small, None), (big, None)]) == ["big"]


def test_how_many_typical_profiles_with_two_revisions_fit() -> None:
    """A profile like examples/ (a glob or two), with two revision bodies each: the number that
    fit in the shared ConfigMap is in the thousands, so the refusal is for outsized profiles."""
    one = render.node_entry(example("p", "/dev/ttyUSB*"), None, current=example("p", "/dev/ttyACM*"))
    per_profile = len(json.dumps({"profiles": [one]}, indent=2, sort_keys=True))
    assert 400 < per_profile < 2000, per_profile
    fit = render.CONFIGMAP_LIMIT // per_profile
    profiles = [(example(f"p{i:04d}", "/dev/ttyUSB*"), None) for i in range(fit // 2)]
    assert render.over_limit(profiles) == []


async def test_a_profile_that_does_not_fit_is_refused_and_the_configmap_left_as_it_is(ctl: Any) -> None:
    c, kube = ctl
    await c.reconcile(body())
    cm_path = f"/api/v1/namespaces/{NS}/configmaps/{render.SHARED_AGENT}"
    before = copy.deepcopy(kube.objects[cm_path])
    huge = copy.deepcopy(body())
    huge["metadata"] |= {"name": "huge", "uid": "uid-huge", "creationTimestamp": "2026-01-02T00:00:00Z"}
    huge["spec"]["resourceName"] = "example.com/huge"
    huge["spec"]["plugin"]["discovery"]["paths"]["globs"] = [f"/dev/{'x' * 200}{i}" for i in range(6000)]
    await c.reconcile(huge)
    assert kube.objects[cm_path] == before
    assert set(c.agents.refused) == {"huge"}
    (problem,) = c.agents.problems("huge")
    assert problem.reason == "AgentConfigTooLarge" and problem.stalled
    assert c.agents.problems("serial") == []
    await c.delete(huge, patience=1.0)
    assert c.agents.refused == {}


def test_the_size_counted_is_the_configmaps_exactly() -> None:
    profiles = [(example(f"p{i}", f"/dev/tty{i}*"), None) for i in range(7)]
    (cm, _) = render.shared_agent_objects(profiles, SETTINGS)
    sizes = render.entry_sizes(profiles)
    frame = len('{\n  "profiles": [\n') + len("\n  ]\n}\n") - len(",\n")
    assert len(render.NODE_CONFIG_KEY) + frame + sum(sizes.values()) == render.data_size(cm)


def test_the_node_config_is_json_that_a_yaml_reader_reads_the_same() -> None:
    """The operator writes the agents' config as JSON (they read it without PyYAML); agents of
    earlier versions read it with a YAML parser during an upgrade: both get the same document,
    and it is exactly what json.dumps(indent=2) writes (the sizes above count that text)."""
    profiles = [(example(f"p{i}", f"/dev/tty{i}*"), None) for i in range(3)]
    text = render.node_config(profiles)
    doc = json.loads(text)
    assert [e["profile"] for e in doc["profiles"]] == ["p0", "p1", "p2"]
    assert yaml.safe_load(text) == doc
    assert text == json.dumps(doc, indent=2, sort_keys=True) + "\n"
