"""`kubectl patchbay` against the truth on the REAL node, with the chart's defaults.

A DevicePlugin and a DRA profile without agent settings of their own are served by the shared
node agent (one pod, labelled `patchbay.dev/agent=shared`); then the DevicePlugin profile gets an
agent of its own (its own DaemonSet, pods labelled with the profile) while the DRA profile stays
with the node agent; then its own agent rolls to an image the node does not have, so the node
holds two of its pods (the old one serving, the new one failing). In each state every view's rows
are checked against what the cluster itself says, read here with the official client:

* `nodes`: the agent pods on the node of the DaemonSet that serves the profile (the one whose pod
  the profile's DeviceReport names as its writer), REGISTERED `yes` exactly when one of them is
  Ready and the kubelet holds the registration (DevicePlugin: the kubelet's PodResources
  GetAllocatableResources and the Node's allocatable count the devices; DRA: the node's
  ResourceSlices of the driver list them), devices healthy/total as the kubelet and the report say;
  the same rows with `--node` and with `--profile` (other requests);
* `devices`: the DeviceReport's devices (DevicePlugin), the ResourceSlices' devices (DRA);
* `why`: the agent pods that serve the profile, Ready or not;
* `cordon`/`uncordon` (1.37 on; before, the refusal): the DRA profile's devices served by the
  node agent.

The objects each state was checked against are written, trimmed, under $PATCHBAY_KUBECTL_RECORD
when it is set (tests/data/kubectl holds a recording: the plugin's unit fixtures). Devices are
FAKE (character devices the fixture makes under /dev).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.dranode import dra_profile, slices_of
from support.kubectlviews import record
from support.realnode import (
    AGENT_SELECTOR,
    DEVICES,
    OWN_AGENT,
    SHARED_SELECTOR,
    Installed,
    OnNode,
    serial_profile,
    wait_for,
)
from support.releases import has

from patchbay_agent.kubelet.podresources import get_allocatable_resources
from patchbay_devcluster import DevCluster

REPO = Path(__file__).resolve().parents[2]
PLUGIN = Path(os.environ.get("VIRTUAL_ENV") or REPO / ".venv") / "bin" / "kubectl-patchbay"
GROUP, VERSION = "patchbay.dev", "v1beta1"
MISSING_IMAGE = "ghcr.io/kube-patchbay/patchbay-agent:0.0.0-missing"


def plugin(e2e_cluster: DevCluster, patchbay: Installed, *args: str) -> Any:
    """The plugin as a user runs it; its JSON answer."""
    res = subprocess.run(
        [str(PLUGIN), *args, "--kubeconfig", str(e2e_cluster.kubeconfig), "-n", patchbay.namespace],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res
    return json.loads(res.stdout) if "-o" in args else res.stdout


class Truth:
    """What the cluster says about the profiles on the real node, read once (one state)."""

    def __init__(self, on_node: OnNode, dp: tuple[str, str], dra: tuple[str, str, str]) -> None:
        patchbay, cluster, e2e_cluster, node, _, _ = on_node
        ns, core = patchbay.namespace, cluster.core
        self.node = node
        self.pods = raw(core.list_namespaced_pod, ns, label_selector=AGENT_SELECTOR)["items"]
        self.node_obj = raw(core.read_node, node)
        self.profiles = [p for p in (cluster.profile(dp[0]), cluster.profile(dra[0])) if p]
        reports = raw(cluster.custom.list_namespaced_custom_object, GROUP, VERSION, ns, "devicereports")
        self.reports = [r for r in reports["items"] if r["profile"] in (dp[0], dra[0])]
        self.slices = slices_of(cluster, dra[2], node)
        self.configmaps = raw(core.list_namespaced_config_map, ns, label_selector=SHARED_SELECTOR)["items"]
        socket = e2e_cluster.real_node().paths.pod_resources_socket
        self.kubelet_dp = asyncio.run(get_allocatable_resources(socket, rpc_timeout=10.0)).count(dp[1])
        self.dp, self.dra = dp, dra

    def profile(self, name: str) -> dict[str, Any]:
        return next(p for p in self.profiles if p and p["metadata"]["name"] == name)

    def report(self, profile: str) -> dict[str, Any] | None:
        return next((r for r in self.reports if r["profile"] == profile and r["nodeName"] == self.node), None)

    def agents(self, profile: str) -> list[dict[str, Any]]:
        """The node's pods of the DaemonSet that serves the profile: its own when it has agent
        settings, else the node agent's."""
        own = "agent" in self.profile(profile)["spec"]
        mine = [
            p
            for p in self.pods
            if p["spec"].get("nodeName") == self.node
            and (
                p["metadata"]["labels"].get("patchbay.dev/profile") == profile
                if own
                else p["metadata"]["labels"].get("patchbay.dev/agent") == "shared"
            )
        ]
        return sorted(mine, key=lambda p: p["metadata"]["name"])

    def kubelet_counts(self, profile: str) -> tuple[int, int]:
        """(healthy, total) as the kubelet holds them: the Node's allocatable and capacity, which
        the kubelet's PodResources must agree with (DevicePlugin); the devices of the node's
        ResourceSlices of the driver, untainted and all (DRA)."""
        if profile == self.dp[0]:
            st = self.node_obj["status"]
            alloc = int(st.get("allocatable", {}).get(self.dp[1], "0"))
            if alloc != self.kubelet_dp:  # the Node's status lags the kubelet by its sync period
                return -1, -1
            return alloc, int(st.get("capacity", {}).get(self.dp[1], "0"))
        devices = [d for s in self.slices for d in s["spec"].get("devices", [])]
        return sum(1 for d in devices if not d.get("taints")), len(devices)

    def settled(self, profile: str) -> bool:
        """The profile served on the node: its report written by one of the agents that should
        serve it, no agentError, one of them Ready, and the kubelet holds every device."""
        report, agents = self.report(profile), self.agents(profile)
        return (
            report is not None
            and report.get("agent") in [p["metadata"]["name"] for p in agents]
            and not report.get("agentError")
            and any(ready(p) for p in agents)
            and self.kubelet_counts(profile) == (DEVICES, DEVICES)
        )

    def expected_row(self, profile: str) -> dict[str, Any]:
        """The `nodes` row the cluster implies."""
        agents = self.agents(profile)
        report = self.report(profile) or {}
        healthy, total = self.kubelet_counts(profile)
        assert healthy >= 0, "the Node's allocatable and the kubelet's PodResources differ"
        assert (report["summary"]["healthy"], report["summary"]["total"]) == (healthy, total), report
        registered = not report.get("agentError") and any(ready(p) for p in agents) and healthy > 0
        return {
            "agents": [p["metadata"]["name"] for p in agents],
            "registered": "yes" if registered else "no",
            "healthy": healthy,
            "total": total,
        }

    def objects(self) -> dict[str, Any]:
        return {
            "profiles": self.profiles,
            "nodes": [self.node_obj],
            "pods": self.pods,
            "reports": self.reports,
            "slices": self.slices,
            "configmaps": self.configmaps,
        }


def raw(call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """An official client call's answer as the API's JSON (what the plugin reads too)."""
    answer: dict[str, Any] = json.loads(call(*args, _preload_content=False, **kwargs).data)
    return answer


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def settle(
    on_node: OnNode, dp: tuple[str, str], dra: tuple[str, str, str], what: str, extra: Any = None
) -> Truth:
    """A reading of the cluster in which both profiles are served (and ``extra(truth)`` holds)."""

    def check() -> Truth | None:
        t = Truth(on_node, dp, dra)
        ok = t.settled(dp[0]) and t.settled(dra[0]) and (extra is None or extra(t))
        return t if ok else None

    truth: Truth = wait_for(what, check, 240)
    return truth


def pods_of(truth: Truth) -> dict[str, bool]:
    return {p["metadata"]["name"]: ready(p) for p in truth.pods}


def check_views(on_node: OnNode, truth: Truth, state: str) -> dict[str, Any]:
    """Every view against ``truth``, read again after the views ran (the same state: the pods
    and reports did not change meanwhile); returns the views' answers for the recording."""
    patchbay, _, e2e_cluster, node, _, _ = on_node
    dp, dra = truth.dp[0], truth.dra[0]

    def run(*args: str) -> Any:
        return plugin(e2e_cluster, patchbay, *args)

    answers: dict[str, Any] = {"nodes": run("nodes", "-o", "json")}
    answers["nodes --node"] = run("nodes", "--node", node, "-o", "json")
    for p in (dp, dra):
        answers[f"nodes --profile {p}"] = run("nodes", "--profile", p, "-o", "json")
        answers[f"devices --profile {p}"] = run("devices", "--profile", p, "-o", "json")
        answers[f"why {p}"] = run("why", p, "-o", "json")
    again = Truth(on_node, truth.dp, truth.dra)
    assert pods_of(again) == pods_of(truth), f"{state}: the agent pods changed while the views ran"

    for key in ("nodes", "nodes --node", f"nodes --profile {dp}", f"nodes --profile {dra}"):
        rows = {(r["node"], r["profile"]): r for r in answers[key]["items"]}
        for p in (dp, dra):
            if key.startswith("nodes --profile") and not key.endswith(p):
                continue
            row = rows[(node, p)]
            got = {k: row[k] for k in ("agents", "registered", "healthy", "total")}
            assert got == truth.expected_row(p), (state, key, p, row)

    # devices: the report's devices (DevicePlugin), the slices' (DRA), all Healthy.
    report_ids = sorted(d["id"] for d in (truth.report(dp) or {})["devices"])
    rows = answers[f"devices --profile {dp}"]["items"]
    assert sorted(r["device"] for r in rows) == report_ids and len(rows) == DEVICES, (state, rows)
    assert {(r["node"], r["health"], r["source"]) for r in rows} == {(node, "Healthy", "DeviceReport")}, rows
    slice_ids = sorted(
        d["attributes"]["patchbay.dev/id"]["string"] for s in truth.slices for d in s["spec"]["devices"]
    )
    rows = answers[f"devices --profile {dra}"]["items"]
    assert sorted(r["device"] for r in rows) == slice_ids and len(rows) == DEVICES, (state, rows)
    assert {(r["node"], r["health"], r["source"]) for r in rows} == {(node, "Healthy", "ResourceSlice")}, rows

    # why: the agent pods that serve the profile (on the node: the only node), Ready or not.
    for p in (dp, dra):
        pods = answers[f"why {p}"]["agentPods"]
        agents = truth.agents(p)
        assert pods["total"] == len(agents), (state, p, pods, [a["metadata"]["name"] for a in agents])
        assert pods["notReady"] == sum(1 for a in agents if not ready(a)), (state, p, pods)
    return answers


def check_maintenance(on_node: OnNode, truth: Truth, kube_release: str) -> None:
    """cordon then uncordon of the DRA profile's devices on the node (served by the node agent)."""
    patchbay, _, e2e_cluster, node, _, _ = on_node
    dra = truth.dra[0]
    args = ("--kubeconfig", str(e2e_cluster.kubeconfig), "-n", patchbay.namespace)

    def run(*words: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(PLUGIN), *words, *args], capture_output=True, text=True, timeout=120)

    res = run("cordon", dra, "--node", node, "--wait", "0")
    if not has("device-taint-rules", kube_release):
        assert res.returncode == 1 and "serves no DeviceTaintRules" in res.stderr, res
        return
    assert res.returncode == 0 and f"devicetaintrule/{dra}.{node}:" in res.stdout, res
    rows = plugin(e2e_cluster, patchbay, "devices", "--profile", dra, "-o", "json")["items"]
    assert {(r["health"], r["reason"]) for r in rows} == {("Maintenance", "NoSchedule")} and len(
        rows
    ) == DEVICES
    res = run("uncordon", dra, "--node", node)
    assert res.returncode == 0 and "in service again" in res.stdout, res
    rows = plugin(e2e_cluster, patchbay, "devices", "--profile", dra, "-o", "json")["items"]
    assert {r["health"] for r in rows} == {"Healthy"}, rows


def test_every_view_says_what_the_cluster_says_for_both_agent_shapes(
    on_node: OnNode, kube_release: str
) -> None:
    patchbay, cluster, e2e_cluster, node, _, fake_dev = on_node
    recording = os.environ.get("PATCHBAY_KUBECTL_RECORD")
    dp = serial_profile(cluster, fake_dev, node, agent=None)
    dra = dra_profile(cluster, fake_dev, node, own_agent=False)
    try:
        # 1. Both served by the shared node agent (the chart's default path).
        truth = settle(on_node, dp, dra, "both profiles served by the node agent")
        assert [p["metadata"]["labels"].get("patchbay.dev/agent") for p in truth.agents(dp[0])] == ["shared"]
        answers = check_views(on_node, truth, "shared")
        print(plugin(e2e_cluster, patchbay, "nodes"))
        check_maintenance(on_node, truth, kube_release)
        if recording:
            record(Path(recording), "shared", truth.objects(), answers)

        # 2. The DevicePlugin profile gets an agent of its own; the DRA one stays with the node agent.
        cluster.patch_spec(dp[0], {"agent": OWN_AGENT})

        def moved(t: Truth) -> bool:
            """Its own agent serves it, and the node agent's config no longer lists it."""
            own = [p["metadata"]["labels"].get("patchbay.dev/profile") for p in t.agents(dp[0])]
            return own == [dp[0]] and dp[0] not in json.dumps([c.get("data") for c in t.configmaps])

        truth = settle(on_node, dp, dra, "the DevicePlugin profile served by its own agent", moved)
        answers = check_views(on_node, truth, "own")
        print(plugin(e2e_cluster, patchbay, "nodes"))
        if recording:
            record(Path(recording), "own", truth.objects(), answers)

        # 3. Its own agent rolls to an image the node lacks: two of its pods on the node, the old
        # one serving (maxSurge), the new one failing.
        cluster.patch_spec(dp[0], {"agent": {"image": MISSING_IMAGE, "imagePullPolicy": "Never"}})

        def two_pods(t: Truth) -> bool:
            agents = t.agents(dp[0])
            waiting = [
                (c.get("state") or {}).get("waiting", {}).get("reason")
                for p in agents
                for c in p["status"].get("containerStatuses") or []
            ]
            return len(agents) == 2 and "ErrImageNeverPull" in waiting

        truth = settle(on_node, dp, dra, "two agent pods of the DevicePlugin profile", two_pods)
        answers = check_views(on_node, truth, "rollout")
        trouble = answers[f"why {dp[0]}"]["agentPods"]["trouble"]
        assert [t["reason"] for t in trouble] == ["ErrImageNeverPull"], trouble
        print(plugin(e2e_cluster, patchbay, "nodes"))
        if recording:
            record(Path(recording), "rollout", truth.objects(), answers)
    finally:
        for name in (dp[0], dra[0]):
            cluster.delete_profile(name)
        cluster.set_labels(node, {"patchbay.dev/e2e-plugin": None, "patchbay.dev/e2e-dra": None})
