"""`kubectl patchbay diff` and `rollout` on the REAL node (issue 45, steps 4-5): a DevicePlugin
profile served by the shared node agent over FAKE devices, a pod holding one of them. `diff` of a
glob that matches nothing exits 1 naming that pod (and writes nothing), and says from the node's
NodeInventory that the glob matches nothing there; a change that keeps every device exits 0 and
names the device files its globs match there (issue 46). Then the bad change applied as a user
would: the node's allocatable drops to 0, `rollout undo` puts the previous revision's settings
back in one patch, the devices come back, the holder never restarted, and `rollout status` says
the profile rolled out. Every node moves at once here (`rollout.strategy: Immediate`): this
proves the verbs on the real agent, not the waves."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.rest import ApiException
from support.realnode import (
    DEVICES,
    OnNode,
    busybox_pod,
    kubectl_patchbay,
    limits,
    pod_log,
    serial_profile,
    served,
    wait_for,
)

from patchbay_api.revisions import spec_revision

INVENTORIES = ("patchbay.dev", "v1beta1", "nodeinventories")


def run(on_node: OnNode, *args: str) -> subprocess.CompletedProcess[str]:
    """The plugin as a user runs it."""
    patchbay, _, e2e_cluster, *_ = on_node
    return kubectl_patchbay(e2e_cluster.kubeconfig, patchbay.namespace, *args)


def test_diff_names_the_holder_a_bad_glob_would_strip_and_undo_puts_it_back(
    on_node: OnNode, tmp_path: Path
) -> None:
    patchbay, cluster, _, real_node, namespace, fake_dev = on_node
    core, ns = cluster.core, patchbay.namespace
    name, resource = serial_profile(cluster, fake_dev, real_node, agent=None)
    # Every node at once: a staged rollout would halt the bad change and put the node back by
    # itself (tests/e2e/test_staged_rollouts_on_real_node.py); this test is about the verbs.
    cluster.patch_spec(name, {"rollout": {"strategy": "Immediate"}})
    full = (str(DEVICES), str(DEVICES))
    wait_for(f"{DEVICES} devices on the node", lambda: cluster.values(real_node, resource) == full, 180)
    holder = "diff-holder"
    core.create_namespaced_pod(
        namespace, limits(busybox_pod(holder, real_node, "echo held; sleep 3600"), resource, 1)
    )
    wait_for("the holder running", lambda: pod_log(core, namespace, holder, "held"), 120)
    uid = core.read_namespaced_pod(holder, namespace).metadata.uid

    def reported_holders() -> list[str]:
        try:
            rep = cluster.custom.get_namespaced_custom_object(
                "patchbay.dev", "v1beta1", ns, "devicereports", f"{name}.{real_node}"
            )
        except ApiException as e:
            if e.status == 404:  # not written yet
                return []
            raise
        return [p["name"] for d in rep.get("devices") or [] for p in d.get("pods") or []]

    wait_for("the report naming the holder", lambda: holder in reported_holders(), 120)

    live = cluster.profile(name) or {}
    glob = live["spec"]["plugin"]["discovery"]["paths"]["globs"][0]

    def profile_file(file: str, globs: list[str]) -> Path:
        spec: dict[str, Any] = yaml.safe_load(yaml.safe_dump(live["spec"]))
        spec["plugin"]["discovery"]["paths"]["globs"] = globs
        doc = {
            "apiVersion": "patchbay.dev/v1beta1",
            "kind": "DevicePluginProfile",
            "metadata": {"name": name},
        }
        path = tmp_path / file
        path.write_text(yaml.safe_dump({**doc, "spec": spec}))
        return path

    files = [f"{fake_dev}/ttyE2E{i}" for i in range(DEVICES)]

    def inventory_lists_them() -> bool:
        try:
            obj = cluster.custom.get_cluster_custom_object(*INVENTORIES, real_node)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return set(files) <= {c.get("path") for c in obj.get("char") or []}

    wait_for("the node's inventory listing the served files", inventory_lists_them, 60)

    def inventory_line(out: str) -> str:
        """What the new discovery matches on the real node, from its NodeInventory (issue 46)."""
        head = f"  {real_node}: from the node's inventory (written at "
        return next(line for line in out.splitlines() if line.startswith(head))

    bad = profile_file("bad.yaml", [f"{fake_dev}/nothing*"])
    plan = run(on_node, "diff", "-f", str(bad))
    print(plan.stdout)
    assert plan.returncode == 1, plan
    row = next(line.split() for line in plan.stdout.splitlines() if line.startswith(real_node))
    assert row[1] == "yes" and row[3].count("ttyE2E") == DEVICES and f"{namespace}/{holder}" in row[4]
    line = inventory_line(plan.stdout)
    assert f"MATCHES NOTHING: the glob {fake_dev}/nothing* matches nothing" in line, line
    assert f"it serves {DEVICES} devices now ({', '.join(files)})" in line, line
    assert (cluster.profile(name) or {})["spec"]["plugin"]["discovery"]["paths"]["globs"] == [glob]
    good = run(on_node, "diff", "-f", str(profile_file("good.yaml", [glob, f"{fake_dev}/ttyS*"])))
    print(good.stdout)
    assert good.returncode == 0, good
    line = inventory_line(good.stdout)
    assert (
        f"matches {', '.join(files)}; gains nothing; loses nothing; the glob {fake_dev}/ttyS* matches" in line
    )
    assert cluster.values(real_node, resource) == full  # a dry run: nothing moved

    # The bad change, applied as a user would; then undo.
    before = spec_revision(live["spec"])
    cluster.patch_spec(name, {"plugin": {"discovery": {"paths": {"globs": [f"{fake_dev}/nothing*"]}}}})
    wait_for("the devices gone", lambda: cluster.values(real_node, resource)[1] == "0", 120)
    history = run(on_node, "rollout", "history", name)
    assert history.returncode == 0, history
    print(history.stdout)
    assert [line.split()[0] for line in history.stdout.splitlines()[2:]] == ["1", "2"]
    assert "plugin.discovery.paths.globs" in history.stdout.splitlines()[3]
    undo = run(on_node, "rollout", "undo", name)
    assert undo.returncode == 0 and undo.stdout.endswith("rolled back to revision 1\n"), undo
    assert spec_revision((cluster.profile(name) or {})["spec"]) == before
    wait_for(f"{DEVICES} devices back", lambda: cluster.values(real_node, resource) == full, 120)
    status = run(on_node, "rollout", "status", name, "--timeout=120s")
    print(status.stdout)
    assert status.returncode == 0 and status.stdout.endswith(f'profile "{name}" successfully rolled out\n'), (
        status,
        f"the node's report serves {served(cluster, ns, name, real_node)!r}",
        (cluster.profile(name) or {}).get("status"),
    )
    pod = core.read_namespaced_pod(holder, namespace)
    assert pod.metadata.uid == uid and pod.status.phase == "Running"
    assert all(c.restart_count == 0 for c in pod.status.container_statuses)
