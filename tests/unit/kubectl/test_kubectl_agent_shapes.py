"""`kubectl patchbay` on objects recorded on the real node (tests/data/kubectl, written by
tests/e2e/test_kubectl_views_on_real_node.py with $PATCHBAY_KUBECTL_RECORD): a DevicePlugin and a
DRA profile served by the shared node agent (`shared`), the DevicePlugin one then by an agent of
its own (`own`), whose rollout to a missing image left two of its pods on the node (`rollout`).
The views must give, from those objects, the rows the plugin printed there (which the e2e test
checked against the cluster), and the right rows for what the recording did not catch: a rollout
of the shared node agent, a profile the node agent cannot serve (`agentError`), a profile its
config leaves out on the node, a profile that has just moved to an agent of its own, and a node
agent config that cannot be read."""

from __future__ import annotations

import argparse
import copy
import json
from typing import Any

import pytest
import yaml
from support.kubectlviews import load

from patchbay_kubectl import agentpods, cli, kube, output
from patchbay_kubectl.views.devices import device_rows
from patchbay_kubectl.views.nodes import node_rows, profile_agents
from patchbay_kubectl.views.objects import Inputs

STATES = ("shared", "own", "rollout")
Obj = dict[str, Any]


def inputs(objects: Obj, config: bool = True) -> Inputs:
    return Inputs(
        profiles=objects["profiles"],
        nodes=objects["nodes"],
        pods=objects["pods"],
        reports=objects["reports"],
        slices=objects["slices"],
        node_config=agentpods.node_config(objects["configmaps"]) if config else None,
    )


def by_mode(objects: Obj) -> tuple[Obj, Obj]:
    """(the DevicePlugin profile, the DRA profile)."""
    (dp,) = [p for p in objects["profiles"] if p["spec"]["mode"] == "DevicePlugin"]
    (dra,) = [p for p in objects["profiles"] if p["spec"]["mode"] == "DRA"]
    return dp, dra


def rows(data: Inputs, **filters: Any) -> dict[str, Obj]:
    """profile -> its row on the (one) node, as `-o json` prints it."""
    doc = json.loads(output.nodes(node_rows(data, **filters), "json"))
    return {r["profile"]: r for r in doc["items"]}


def pods_named(objects: Obj, **labels: str) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in objects["pods"]
        if all(p["metadata"]["labels"].get(k) == v for k, v in labels.items())
    )


@pytest.mark.parametrize("state", STATES)
def test_the_views_give_the_rows_printed_on_the_real_node(state: str) -> None:
    rec = load(state)
    objects, answers = rec["objects"], rec["answers"]
    data = inputs(objects)
    assert rows(data) == {r["profile"]: r for r in answers["nodes"]["items"]}
    (node,) = [n["metadata"]["name"] for n in objects["nodes"]]
    for p in objects["profiles"]:
        name = p["metadata"]["name"]
        (printed,) = answers[f"nodes --profile {name}"]["items"]
        assert rows(data, profile=name, node=node) == {name: printed}
        devices = device_rows(data, profile=name)
        assert [d.as_dict() for d in devices] == answers[f"devices --profile {name}"]["items"]
        agents = profile_agents(p, data)
        assert len(agents) == answers[f"why {name}"]["agentPods"]["total"], state
    # Without the node agent's config (not readable): the profiles' own selection stands in.
    assert rows(inputs(objects, config=False)) == rows(data)


def test_the_node_agent_serves_both_shared_profiles_and_is_registered() -> None:
    objects = load("shared")["objects"]
    dp, dra = by_mode(objects)
    shared = pods_named(objects, **{agentpods.LABEL_SHARED: "shared"})
    assert len(shared) == 1
    got = rows(inputs(objects))
    for p in (dp, dra):
        row = got[p["metadata"]["name"]]
        assert (row["agents"], row["registered"], row["agentError"]) == (shared, "yes", ""), row
    assert "<none>" not in output.nodes(node_rows(inputs(objects)), None)


def test_a_profile_with_an_agent_of_its_own_is_served_by_its_pods_only() -> None:
    objects = load("own")["objects"]
    dp, dra = by_mode(objects)
    own = pods_named(objects, **{agentpods.LABEL_PROFILE: dp["metadata"]["name"]})
    shared = pods_named(objects, **{agentpods.LABEL_SHARED: "shared"})
    got = rows(inputs(objects))
    assert (got[dp["metadata"]["name"]]["agents"], got[dp["metadata"]["name"]]["registered"]) == (own, "yes")
    assert (got[dra["metadata"]["name"]]["agents"], got[dra["metadata"]["name"]]["registered"]) == (
        shared,
        "yes",
    )


def test_during_a_rollout_of_its_own_agent_both_pods_serve_and_the_old_one_is_registered() -> None:
    objects = load("rollout")["objects"]
    dp, _ = by_mode(objects)
    name = dp["metadata"]["name"]
    own = [p for p in objects["pods"] if p["metadata"]["labels"].get(agentpods.LABEL_PROFILE) == name]
    assert len(own) == 2 and sorted(agentpods.is_ready(p) for p in own) == [False, True]
    row = rows(inputs(objects))[name]
    assert (row["agents"], row["registered"]) == (sorted(p["metadata"]["name"] for p in own), "yes")
    # The old pod gone before the new one is Ready: not registered.
    objects["pods"] = [p for p in objects["pods"] if p not in own or not agentpods.is_ready(p)]
    assert rows(inputs(objects))[name]["registered"] == "no"


def test_during_a_rollout_of_the_node_agent_both_its_pods_serve_each_profile() -> None:
    objects = load("shared")["objects"]
    (old,) = [p for p in objects["pods"] if p["metadata"]["labels"].get(agentpods.LABEL_SHARED) == "shared"]
    new = copy.deepcopy(old)
    new["metadata"]["name"] = old["metadata"]["name"][:-5] + "zzzzz"
    new["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    objects["pods"].append(new)
    names = sorted([old["metadata"]["name"], new["metadata"]["name"]])
    for row in rows(inputs(objects)).values():
        assert (row["agents"], row["registered"]) == (names, "yes"), row
    objects["pods"].remove(old)
    assert {r["registered"] for r in rows(inputs(objects)).values()} == {"no"}


def test_a_profile_the_node_agent_cannot_serve_is_not_registered_and_says_why() -> None:
    objects = load("shared")["objects"]
    dp, dra = by_mode(objects)
    (report,) = [r for r in objects["reports"] if r["profile"] == dp["metadata"]["name"]]
    report["agentError"] = {"reason": "AgentFailed", "message": "discovery failed"}
    got = rows(inputs(objects))
    assert (got[dp["metadata"]["name"]]["registered"], got[dp["metadata"]["name"]]["agentError"]) == (
        "no",
        "AgentFailed",
    )
    assert got[dra["metadata"]["name"]]["registered"] == "yes"  # the node agent's other profile serves on
    wide = output.nodes(node_rows(inputs(objects)), "wide").splitlines()
    assert wide[0].split()[-1] == "AGENT-ERROR" and "AgentFailed" in " ".join(wide[1:])


def test_a_profile_the_node_agents_config_leaves_out_on_the_node_has_no_agent_there() -> None:
    """As the operator renders it for a DRA profile whose DevicePlugin twin serves the node
    (KEP-5004), the entry's terms do not select the node: the node agent does not serve it."""
    objects = load("shared")["objects"]
    _, dra = by_mode(objects)
    name = dra["metadata"]["name"]
    (cm,) = objects["configmaps"]
    doc = yaml.safe_load(cm["data"][agentpods.NODE_CONFIG_KEY])
    for entry in doc["profiles"]:
        if entry["profile"] == name:
            entry["nodeSelectorTerms"] = [[{"key": "kubernetes.io/hostname", "operator": "DoesNotExist"}]]
    cm["data"][agentpods.NODE_CONFIG_KEY] = yaml.safe_dump(doc)
    objects["reports"] = [r for r in objects["reports"] if r["profile"] != name]
    row = rows(inputs(objects))[name]
    assert (row["agents"], row["registered"]) == ([], "no"), row
    # Without the config (not readable), the profile's selector stands in: the node agent's pod,
    # Ready, is shown, but without the profile's report it is not registered for it.
    row = rows(inputs(objects, config=False))[name]
    assert (row["agents"], row["registered"]) == (
        pods_named(objects, **{agentpods.LABEL_SHARED: "shared"}),
        "no",
    )


def test_a_profile_that_just_left_the_node_agent_is_served_by_the_pod_its_report_names() -> None:
    """The `own` recording a moment earlier: its report still written by the node agent's pod."""
    objects = load("own")["objects"]
    dp, _ = by_mode(objects)
    name = dp["metadata"]["name"]
    shared = pods_named(objects, **{agentpods.LABEL_SHARED: "shared"})
    own = pods_named(objects, **{agentpods.LABEL_PROFILE: name})
    (report,) = [r for r in objects["reports"] if r["profile"] == name]
    report["agent"] = shared[0]
    assert rows(inputs(objects))[name]["agents"] == sorted(own + shared)


class Recorded:
    """The API as the recording answers it (the LISTs and GETs the plugin makes)."""

    def __init__(self, objects: Obj, ns: str) -> None:
        self.objects, self.ns = objects, ns

    def _kind(self, path: str) -> str:
        for kind, marker in (
            ("profiles", "devicepluginprofiles"),
            ("reports", "devicereports"),
            ("configmaps", "configmaps"),
            ("pods", "/pods"),
            ("nodes", "/nodes"),
            ("slices", "resourceslices"),
        ):
            if marker in path:
                return kind
        return ""

    def get(self, path: str) -> Obj | None:
        kind, name = self._kind(path), path.rsplit("/", 1)[-1]
        found = [o for o in self.objects.get(kind, []) if o["metadata"]["name"] == name]
        return found[0] if found else None

    def list(self, path: str, label_selector: str = "", field_selector: str = "") -> list[Obj]:
        wanted = dict(t.split("=", 1) for t in label_selector.split(",") if t)
        fields = dict(t.split("=", 1) for t in field_selector.split(",") if t)
        out = []
        for o in self.objects.get(self._kind(path), []):
            labels = o["metadata"].get("labels") or {}
            if all(labels.get(k) == v for k, v in wanted.items()) and all(
                str((o.get("spec") or {}).get(k.split(".", 1)[1])) == v for k, v in fields.items()
            ):
                out.append(o)
        return out


@pytest.mark.parametrize("state", STATES)
def test_the_commands_ask_for_what_they_need_and_print_the_recorded_answers(state: str) -> None:
    rec = load(state)
    objects, answers = rec["objects"], rec["answers"]
    ns = objects["pods"][0]["metadata"]["namespace"]
    api = Recorded(objects, ns)
    (node,) = [n["metadata"]["name"] for n in objects["nodes"]]

    def args(**kw: Any) -> argparse.Namespace:
        base = {"output": "json", "namespace": ns, "all_namespaces": False, "node": None, "profile": None}
        return argparse.Namespace(**{**base, **kw})

    assert json.loads(cli.cmd_nodes(api, args())) == answers["nodes"]  # type: ignore[arg-type]
    assert json.loads(cli.cmd_nodes(api, args(node=node))) == answers["nodes --node"]  # type: ignore[arg-type]
    for p in objects["profiles"]:
        name = p["metadata"]["name"]
        got = json.loads(cli.cmd_nodes(api, args(profile=name)))  # type: ignore[arg-type]
        assert got == answers[f"nodes --profile {name}"]
        why = json.loads(cli.cmd_why(api, args(profile=name)))["agentPods"]  # type: ignore[arg-type]
        printed = answers[f"why {name}"]["agentPods"]
        assert (why["total"], why["notReady"]) == (printed["total"], printed["notReady"])
        assert [t["reason"] for t in why["trouble"]] == [t["reason"] for t in printed["trouble"]]
    assert kube.configmaps_path(ns).endswith(f"/namespaces/{ns}/configmaps")
