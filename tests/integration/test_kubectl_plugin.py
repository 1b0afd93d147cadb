"""``kubectl patchbay`` against the real control plane, run through the real kubectl.

kubectl finds ``kubectl-patchbay`` on PATH (the virtualenv's bin, where the package installs it),
so these tests also check the plugin's discovery and kubectl's completion protocol. The cluster
holds what the agents and the scheduler would write: the operator (real, the session's) makes the
profiles' agent DaemonSets, kwok runs their pods; this test writes the DeviceReports an agent
would write (no real device behind kwok nodes), and for the DRA profile a ResourceSlice with one
tainted device and a ResourceClaim allocated to another (as the DRA agent and the scheduler do).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.rest import ApiException
from support.clusters import NAMESPACE, TEST_LABEL, Cluster, wait_for
from support.operator import Operator

from patchbay_api.revisions import spec_revision
from patchbay_devcluster import DevCluster

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(os.environ.get("VIRTUAL_ENV") or REPO / ".venv") / "bin"
RES_GROUP, RES_VERSION = "resource.k8s.io", "v1"


def kubectl(
    devcluster: DevCluster, bin_dir: Path, *args: str, check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}:{bin_dir}:{os.environ['PATH']}",
        "KUBECONFIG": str(devcluster.kubeconfig),
    }
    proc = subprocess.run(
        [str(bin_dir / "kubectl"), *args], capture_output=True, text=True, env=env, timeout=60, input=stdin
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def plugin(
    devcluster: DevCluster, bin_dir: Path, *args: str, check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return kubectl(devcluster, bin_dir, "patchbay", *args, "-n", NAMESPACE, check=check, stdin=stdin)


def _table(devcluster: DevCluster, bin_dir: Path, columns: list[str], *args: str) -> list[str]:
    """The lines of the plugin's table (``args``: the view and its flags), whose header, kubectl's
    upper case, names ``columns``."""
    table = plugin(devcluster, bin_dir, *args).stdout.splitlines()
    assert table[0].split() == columns
    return table


def write_report(
    cluster: Cluster, profile: str, node: str, resource: str, devices: list[dict[str, Any]]
) -> None:
    """The DeviceReport the agent on ``node`` would write (server-side apply, as it does), naming
    the profile's agent pod there (kwok's), as the admission policy makes every agent do: the
    operator believes a report only from an agent pod of its profile on its node."""
    healthy = sum(1 for d in devices if d["health"] == "Healthy")
    pods = cluster.core.list_namespaced_pod(
        NAMESPACE, label_selector=f"patchbay.dev/profile={profile}", field_selector=f"spec.nodeName={node}"
    ).items
    assert len(pods) == 1, [p.metadata.name for p in pods]
    body = {
        "apiVersion": "patchbay.dev/v1beta1",
        "kind": "DeviceReport",
        "metadata": {
            "name": f"{profile}.{node}",
            "namespace": NAMESPACE,
            "labels": {"patchbay.dev/profile": profile},
        },
        "profile": profile,
        "nodeName": node,
        "agent": pods[0].metadata.name,
        "resourceName": resource,
        "observedAt": _ts(datetime.now(UTC)),
        "summary": {
            "total": len(devices),
            "healthy": healthy,
            "unhealthy": len(devices) - healthy,
            "allocated": sum(1 for d in devices if d.get("pods")),
        },
        "devices": devices,
    }
    cluster.custom.patch_namespaced_custom_object(
        "patchbay.dev",
        "v1beta1",
        NAMESPACE,
        "devicereports",
        body["metadata"]["name"],
        body,
        field_manager="patchbay-agent",
        force=True,
        _content_type="application/apply-patch+yaml",
    )


def _ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def profiles(cluster: Cluster, operator: Operator) -> dict[str, Any]:
    """Three profiles on the same two kwok nodes: DevicePlugin, Static and DRA."""
    nodes = cluster.add_nodes(2)
    dp, st, dra = f"{cluster.prefix}serial", f"{cluster.prefix}dongle", f"{cluster.prefix}sensor"
    cluster.create_profile(dp, cluster.agent_spec("serial", "DevicePlugin"))
    cluster.create_profile(
        st,
        {
            "resourceName": f"example.com/{cluster.prefix}dongle",
            "mode": "Static",
            "nodeSelector": {"matchLabels": {TEST_LABEL: cluster.tag}},
            "static": {"capacity": 3},
        },
    )
    cluster.create_profile(dra, cluster.agent_spec("sensor", "DRA"))
    return {"nodes": nodes, "dp": dp, "static": st, "dra": dra}


def test_devices_nodes_and_why_answer_from_the_cluster(
    cluster: Cluster, devcluster: DevCluster, bin_dir: Path, profiles: dict[str, Any]
) -> None:
    n1, n2 = profiles["nodes"]
    dp, st, dra = profiles["dp"], profiles["static"], profiles["dra"]
    res_dp = f"example.com/{cluster.prefix}serial"
    res_dra = f"example.com/{cluster.prefix}sensor"
    since = _ts(datetime.now(UTC) - timedelta(minutes=7))
    # Agents running on both nodes (kwok) before their reports, as in a cluster.
    wait_for(
        "agents 2/2", lambda: ((cluster.profile(dp) or {}).get("status") or {}).get("nodesReady") == "2/2"
    )
    write_report(
        cluster,
        dp,
        n1,
        res_dp,
        [
            {
                "id": "ttyUSB0",
                "health": "Healthy",
                "since": since,
                "pods": [{"namespace": "apps", "name": "modem", "container": "c"}],
            },
            {
                "id": "ttyUSB1",
                "health": "Unhealthy",
                "reason": "Vanished",
                "message": "/dev/ttyUSB1 is gone",
                "since": since,
            },
        ],
    )
    write_report(cluster, dp, n2, res_dp, [{"id": "ttyUSB0", "health": "Healthy", "since": since}])
    # What the kubelets would put in the nodes' status: n1 has 2 devices, 1 allocatable.
    cluster.set_status_value(n1, res_dp, "2")
    esc = res_dp.replace("/", "~1")
    cluster.core.patch_node_status(
        n1,
        [{"op": "replace", "path": f"/status/allocatable/{esc}", "value": "1"}],
        _content_type="application/json-patch+json",
    )
    cluster.set_status_value(n2, res_dp, "1")
    # The static capacity, written by the operator.
    wait_for(
        "static 2/2", lambda: ((cluster.profile(st) or {}).get("status") or {}).get("nodesReady") == "2/2"
    )

    # DRA: the slice the agent on n1 would publish, one device tainted, one claimed by a pod.
    driver = f"{dra}.patchbay.dev"
    node_uid = cluster.node(n1)["metadata"]["uid"]
    slice_name = f"{n1}-{driver}"
    cluster.custom.create_cluster_custom_object(
        RES_GROUP,
        RES_VERSION,
        "resourceslices",
        {
            "apiVersion": f"{RES_GROUP}/{RES_VERSION}",
            "kind": "ResourceSlice",
            "metadata": {
                "name": slice_name,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": n1, "uid": node_uid}],
            },
            "spec": {
                "driver": driver,
                "nodeName": n1,
                "pool": {"name": n1, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": "sensor0", "attributes": {"patchbay.dev/id": {"string": "sensor0"}}},
                    {
                        "name": "sensor1",
                        "attributes": {"patchbay.dev/id": {"string": "sensor1"}},
                        "taints": [
                            {"key": "patchbay.dev/unhealthy", "value": "OpenFailed", "effect": "NoSchedule"}
                        ],
                    },
                ],
            },
        },
    )
    # ...and its DeviceReport, which names the sick device on every release (where the API server
    # drops slice taints, before 1.36, the report is what says so).
    write_report(
        cluster,
        dra,
        n1,
        res_dra,
        [
            {"id": "sensor0", "health": "Healthy", "since": since},
            {
                "id": "sensor1",
                "health": "Unhealthy",
                "reason": "OpenFailed",
                "message": "open failed",
                "since": since,
            },
        ],
    )
    claim_ns = "default"
    claim_name = f"{cluster.prefix}claim"
    claim = cluster.custom.create_namespaced_custom_object(
        RES_GROUP,
        RES_VERSION,
        claim_ns,
        "resourceclaims",
        {
            "apiVersion": f"{RES_GROUP}/{RES_VERSION}",
            "kind": "ResourceClaim",
            "metadata": {"name": claim_name},
            "spec": {
                "devices": {"requests": [{"name": "one", "exactly": {"deviceClassName": driver, "count": 1}}]}
            },
        },
    )
    claim["status"] = {
        "allocation": {
            "devices": {"results": [{"request": "one", "driver": driver, "pool": n1, "device": "sensor0"}]},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n1]}]}
                ]
            },
        },
    }
    claim = cluster.custom.replace_namespaced_custom_object_status(
        RES_GROUP, RES_VERSION, claim_ns, "resourceclaims", claim_name, claim
    )
    # Then reserved for its pod, as the scheduler does in a second write (a real pod that uses the
    # claim: the claim controller drops reservations of pods that do not exist).
    pod = cluster.core.create_namespaced_pod(
        claim_ns,
        {
            "metadata": {"name": f"{cluster.prefix}reader"},
            "spec": {
                "nodeName": n1,
                "tolerations": [{"operator": "Exists"}],
                "resourceClaims": [{"name": "s", "resourceClaimName": claim_name}],
                "containers": [
                    {"name": "c", "image": "example.invalid/reader", "resources": {"claims": [{"name": "s"}]}}
                ],
            },
        },
    )
    reserved = [{"resource": "pods", "name": pod.metadata.name, "uid": pod.metadata.uid}]

    def reserve() -> bool:
        # The claim controller may touch the claim too: read it afresh, retry on a conflict.
        current = cluster.custom.get_namespaced_custom_object(
            RES_GROUP, RES_VERSION, claim_ns, "resourceclaims", claim_name
        )
        current["status"]["reservedFor"] = reserved
        try:
            cluster.custom.replace_namespaced_custom_object_status(
                RES_GROUP, RES_VERSION, claim_ns, "resourceclaims", claim_name, current
            )
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return True

    wait_for("the claim reserved for its pod", reserve)
    try:
        _check_devices(cluster, devcluster, bin_dir, profiles, res_dp)
        _check_nodes(devcluster, bin_dir, profiles)
        _check_why(cluster, devcluster, bin_dir, profiles)
        _check_completion(devcluster, bin_dir, profiles)
    finally:
        for delete in (
            lambda: cluster.core.delete_namespaced_pod(
                f"{cluster.prefix}reader", claim_ns, grace_period_seconds=0
            ),
            lambda: cluster.custom.delete_namespaced_custom_object(
                RES_GROUP, RES_VERSION, claim_ns, "resourceclaims", claim_name
            ),
            lambda: cluster.custom.delete_cluster_custom_object(
                RES_GROUP, RES_VERSION, "resourceslices", slice_name
            ),
        ):
            try:
                delete()
            except ApiException as e:
                if e.status != 404:
                    raise


def _check_devices(
    cluster: Cluster, devcluster: DevCluster, bin_dir: Path, p: dict[str, Any], res_dp: str
) -> None:
    n1, n2 = p["nodes"]
    out = plugin(devcluster, bin_dir, "devices", "--profile", p["dp"], "-o", "json").stdout
    rows = {(r["node"], r["device"]): r for r in json.loads(out)["items"]}
    assert set(rows) == {(n1, "ttyUSB0"), (n1, "ttyUSB1"), (n2, "ttyUSB0")}
    assert rows[(n1, "ttyUSB0")]["holders"] == ["apps/modem"] and rows[(n1, "ttyUSB0")]["health"] == "Healthy"
    sick = rows[(n1, "ttyUSB1")]
    assert (sick["health"], sick["reason"], sick["resource"], sick["mode"]) == (
        "Unhealthy",
        "Vanished",
        res_dp,
        "DevicePlugin",
    )

    # The table: kubectl's upper-case header, one line per device, the reason and the age.
    columns = ["NODE", "PROFILE", "RESOURCE", "DEVICE", "HEALTH", "REASON", "SINCE", "HOLDER"]
    table = _table(devcluster, bin_dir, columns, "devices", "--profile", p["dp"])
    line = next(x for x in table if "ttyUSB1" in x and n1 in x)
    assert line.split()[4:6] == ["Unhealthy", "Vanished"] and line.split()[6].startswith("7m")
    assert len(table) == 4

    # --unhealthy across every profile of this test: the DP device, the DRA taint; static rows are healthy.
    out = plugin(devcluster, bin_dir, "devices", "--unhealthy", "--node", n1, "-o", "yaml").stdout
    sick_rows = {
        (r["profile"], r["device"], r["reason"])
        for r in yaml.safe_load(out)["items"]
        if r["profile"].startswith(cluster.prefix)
    }
    assert sick_rows == {(p["dp"], "ttyUSB1", "Vanished"), (p["dra"], "sensor1", "OpenFailed")}

    # DRA: devices from the slice, the holder from the claim's reservation.
    out = plugin(devcluster, bin_dir, "devices", "--profile", p["dra"], "-o", "json").stdout
    dra = {r["device"]: r for r in json.loads(out)["items"]}
    assert set(dra) == {"sensor0", "sensor1"}
    assert (
        dra["sensor0"]["holders"] == [f"default/{cluster.prefix}reader"]
        and dra["sensor0"]["source"] == "ResourceSlice"
    )
    assert dra["sensor1"]["health"] == "Unhealthy"

    # Static: one row per selected node, healthy once the operator set the count.
    out = plugin(devcluster, bin_dir, "devices", "--profile", p["static"], "-o", "json").stdout
    st = json.loads(out)["items"]
    assert {(r["node"], r["device"], r["health"]) for r in st} == {
        (n1, "3 units", "Healthy"),
        (n2, "3 units", "Healthy"),
    }

    # -o wide adds mode, source and the message.
    wide = plugin(devcluster, bin_dir, "devices", "--profile", p["dp"], "-o", "wide").stdout
    assert "/dev/ttyUSB1 is gone" in wide and wide.splitlines()[0].split()[-3:] == [
        "MODE",
        "SOURCE",
        "MESSAGE",
    ]


def _check_nodes(devcluster: DevCluster, bin_dir: Path, p: dict[str, Any]) -> None:
    n1, n2 = p["nodes"]
    out = plugin(devcluster, bin_dir, "nodes", "--node", n1, "-o", "json").stdout
    rows = {r["profile"]: r for r in json.loads(out)["items"]}
    assert set(rows) == {p["dp"], p["static"], p["dra"]}
    assert rows[p["dp"]]["registered"] == "yes" and len(rows[p["dp"]]["agents"]) == 1
    assert (rows[p["dp"]]["healthy"], rows[p["dp"]]["total"]) == (1, 2)
    assert (rows[p["static"]]["healthy"], rows[p["static"]]["total"], rows[p["static"]]["agents"]) == (
        3,
        3,
        [],
    )
    # The DRA agent's report on n1 counts its two sensors, one sick.
    assert rows[p["dra"]]["agents"] and (rows[p["dra"]]["healthy"], rows[p["dra"]]["total"]) == (1, 2)
    columns = ["NODE", "PROFILE", "GROUP", "MODE", "AGENT", "REGISTERED", "DEVICES", "REVISION"]
    table = _table(devcluster, bin_dir, columns, "nodes", "--profile", p["dp"])
    cells = {x.split()[0]: x.split() for x in table[1:]}
    assert cells[n1][5:7] == ["yes", "1/2"] and cells[n2][5:7] == ["yes", "1/1"]
    assert cells[n1][2] == "-"  # no node groups


def _check_why(cluster: Cluster, devcluster: DevCluster, bin_dir: Path, p: dict[str, Any]) -> None:
    # The operator turns the report's unhealthy device into a problem and an Event.
    wait_for(
        "the Vanished problem in status",
        lambda: any(
            x.get("reason") == "Vanished"
            for x in ((cluster.profile(p["dp"]) or {}).get("status") or {}).get("problems") or []
        ),
    )
    wait_for(
        "why shows the Vanished Event",
        lambda: (
            "Vanished"
            in json.dumps(
                json.loads(plugin(devcluster, bin_dir, "why", p["dp"], "-o", "json").stdout)["events"]
            )
        ),
    )
    doc = json.loads(plugin(devcluster, bin_dir, "why", p["dp"], "-o", "json").stdout)
    assert {c["type"] for c in doc["conditions"]} == {"Ready", "Reconciling", "Stalled", "Degraded"}
    assert any(x["reason"] == "Vanished" and x["device"] == "ttyUSB1" for x in doc["problems"])
    assert doc["agentPods"]["total"] == 2 and doc["agentPods"]["notReady"] == 0
    assert any(h["reason"] == "Vanished" for h in doc["next"])
    text = plugin(devcluster, bin_dir, "why", p["dp"]).stdout
    for heading in (
        "Conditions:",
        "Problems (",
        "Agent pods: 2/2 ready",
        "Events (last):",
        "What to do next:",
    ):
        assert heading in text, text
    assert "ttyUSB1" in text and "the hardware: the device file is gone" in text

    # kubectl's exit codes: 1 for an error from the server, 2 for a usage error.
    missing = plugin(devcluster, bin_dir, "why", f"{cluster.prefix}nothing", check=False)
    assert missing.returncode == 1 and "NotFound" in missing.stderr
    usage = plugin(devcluster, bin_dir, "devices", "--bogus", check=False)
    assert usage.returncode == 2 and "unrecognized arguments: --bogus" in usage.stderr
    bad_context = plugin(devcluster, bin_dir, "nodes", "--context", "no-such-context", check=False)
    assert bad_context.returncode == 1 and "error: invalid kubeconfig" in bad_context.stderr


def _check_completion(devcluster: DevCluster, bin_dir: Path, p: dict[str, Any]) -> None:
    """kubectl's own __complete runs kubectl_complete-patchbay (kubectl >= 1.26)."""
    out = kubectl(devcluster, bin_dir, "__complete", "patchbay", "").stdout.splitlines()
    commands = ["cordon", "devices", "diff", "discover", "drain", "nodes", "rollout", "uncordon", "why"]
    assert out[:-1] == commands and out[-1].startswith(":")
    out = kubectl(devcluster, bin_dir, "__complete", "patchbay", "why", p["dp"][:7]).stdout.splitlines()
    assert p["dp"] in out and p["static"] in out
    out = kubectl(devcluster, bin_dir, "__complete", "patchbay", "devices", "--node", p["nodes"][0]).stdout
    assert p["nodes"][0] in out.splitlines()


# --- rollout and diff (issue 45, steps 4-5) -----------------------------------------------------


def _counted(name: str, cluster: Cluster, n: int) -> list[int]:
    """The profile's ControllerRevisions' numbers, waited for until there are ``n``."""

    def found() -> list[int]:
        items = cluster.apps.list_namespaced_controller_revision(
            NAMESPACE, label_selector=f"patchbay.dev/profile={name}"
        ).items
        return sorted(int(r.revision) for r in items)

    wait_for(f"{n} revisions of {name}", lambda: len(found()) == n)
    return found()


def _virtual(cluster: Cluster, count: int) -> dict[str, Any]:
    return {
        "resourceName": f"example.com/{cluster.prefix}tokens",
        "mode": "DevicePlugin",
        "nodeSelector": {"matchLabels": {TEST_LABEL: cluster.tag}},
        "plugin": {"discovery": {"virtual": {"count": count}}},
    }


def _two_revisions(cluster: Cluster, name: str) -> None:
    """Profile ``name`` on a node of its own, created with 1 virtual device then changed to 2: two
    ControllerRevisions, waited for."""
    cluster.add_nodes(1)
    cluster.create_profile(name, _virtual(cluster, 1))
    _counted(name, cluster, 1)
    cluster.patch_spec(name, {"plugin": {"discovery": {"virtual": {"count": 2}}}})
    _counted(name, cluster, 2)


def test_rollout_history_undo_pause_resume_with_the_operators_revisions(
    cluster: Cluster, devcluster: DevCluster, bin_dir: Path, operator: Operator
) -> None:
    """The real operator makes the ControllerRevisions; the plugin reads and writes the spec."""
    name = f"{cluster.prefix}tokens"
    _two_revisions(cluster, name)
    cluster.patch_spec(
        name, {"plugin": {"discovery": {"virtual": {"count": 3}}, "health": {"periodSeconds": 7}}}
    )
    assert _counted(name, cluster, 3) == [1, 2, 3]

    out = plugin(devcluster, bin_dir, "rollout", "history", name).stdout.splitlines()
    assert out[0] == f"devicepluginprofile.patchbay.dev/{name}"
    assert out[1].split() == ["REVISION", "CHANGE-CAUSE"]
    assert out[2].startswith("1 ") and "created (DevicePlugin" in out[2]
    assert out[3].split(None, 1) == ["2", "plugin.discovery.virtual.count: 1 -> 2"]
    assert out[4].startswith("3 ") and "(+1 more: plugin.health.periodSeconds)" in out[4]
    one = plugin(devcluster, bin_dir, "rollout", "history", name, "--revision=1").stdout
    assert one.startswith(f"devicepluginprofile.patchbay.dev/{name} with revision #1 ")
    assert yaml.safe_load(one.split("\n", 1)[1])["plugin"]["discovery"] == {"virtual": {"count": 1}}

    def spec_now() -> dict[str, Any]:
        return dict((cluster.profile(name) or {})["spec"])

    def revision_of(number: int) -> str:
        items = cluster.apps.list_namespaced_controller_revision(
            NAMESPACE, label_selector=f"patchbay.dev/profile={name}"
        ).items
        return next(r.metadata.labels["controller-revision-hash"] for r in items if int(r.revision) == number)

    first, third = revision_of(1), revision_of(3)
    # A server dry run: the API server checks the patch, stores nothing.
    dry = plugin(devcluster, bin_dir, "rollout", "undo", name, "--to-revision=1", "--dry-run=server")
    assert (
        dry.stdout == f"devicepluginprofile.patchbay.dev/{name} rolled back to revision 1 (server dry run)\n"
    )
    assert spec_revision(spec_now()) == third
    missing = plugin(devcluster, bin_dir, "rollout", "undo", name, "--to-revision=9", check=False)
    assert (
        missing.returncode == 1
        and missing.stderr == "error: unable to find specified revision 9 in history\n"
    )
    # The undo: revision 1's settings back, whole (health.periodSeconds 7 gone), in one patch.
    plugin(devcluster, bin_dir, "rollout", "undo", name, "--to-revision=1")
    assert spec_revision(spec_now()) == first
    assert spec_now()["plugin"].get("health", {}).get("periodSeconds") != 7
    # The operator gives revision 1 the next number, as a DaemonSet does; "previous" is then 3.
    wait_for("revision 1 renumbered", lambda: revision_of(4) == first)
    plugin(devcluster, bin_dir, "rollout", "undo", name)
    assert spec_revision(spec_now()) == third

    # pause and resume: spec.rollout.paused, refused as kubectl refuses.
    out = plugin(devcluster, bin_dir, "rollout", "pause", name).stdout
    assert out == f"devicepluginprofile.patchbay.dev/{name} paused\n"
    assert spec_now()["rollout"]["paused"] is True
    again = plugin(devcluster, bin_dir, "rollout", "pause", name, check=False)
    assert again.returncode == 1
    assert again.stderr == f'error: devicepluginprofiles.patchbay.dev "{name}" is already paused\n'
    plugin(devcluster, bin_dir, "rollout", "resume", name)
    assert "paused" not in (spec_now().get("rollout") or {})
    assert plugin(devcluster, bin_dir, "rollout", "resume", name, check=False).returncode == 1


def test_rollout_undo_is_not_refused_by_writes_beside_the_spec_and_reads_a_changed_spec_again(
    cluster: Cluster, devcluster: DevCluster, operator: Operator
) -> None:
    """Mid-rollout the operator writes the profile's status all the time, and each write moves
    its resourceVersion: an undo whose patch tested the resourceVersion read with the spec was
    refused ("Error from server (Invalid)", seen in the e2e suite). The patch now tests the
    generation, which only a change of the spec moves; a spec changed between the undo's read
    and its patch is read again, and one that keeps changing ends in an error that says so.

    In-process, on the real API server: the plugin's `Kube`, whose next PATCHes are each
    preceded by a write of the test's (an annotation of the profile: metadata, like the status,
    outside the spec; or a change of the spec)."""
    from patchbay_kubectl.arguments import build_parser
    from patchbay_kubectl.cli import UNDO_TRIES, cmd_rollout_undo
    from patchbay_kubectl.kube import Kube, KubeError, Target

    name = f"{cluster.prefix}undo"
    _two_revisions(cluster, name)

    def spec_now() -> dict[str, Any]:
        return dict((cluster.profile(name) or {})["spec"])

    def numbers() -> dict[str, int]:
        """Revision hash -> its number now (the operator renumbers a revision the spec returns to)."""
        items = cluster.apps.list_namespaced_controller_revision(
            NAMESPACE, label_selector=f"patchbay.dev/profile={name}"
        ).items
        return {r.metadata.labels["controller-revision-hash"]: int(r.revision) for r in items}

    first = next(h for h, n in numbers().items() if n == 1)

    def settled() -> bool:
        """The spec's revision is the newest: the operator caught up with the last change."""
        now = numbers()
        return now.get(spec_revision(spec_now())) == max(now.values())

    annotations = iter(range(1000))

    def annotate() -> None:
        cluster.custom.patch_cluster_custom_object(
            "patchbay.dev",
            "v1beta1",
            "devicepluginprofiles",
            name,
            {"metadata": {"annotations": {"example.com/touched": str(next(annotations))}}},
        )

    def recount(count: int) -> Callable[[], None]:
        return lambda: cluster.patch_spec(name, {"plugin": {"discovery": {"virtual": {"count": count}}}})

    class Between(Kube):
        """The plugin's Kube; before each PATCH, the next of `writes` (none left: nothing)."""

        def __init__(self, writes: list[Callable[[], None]]) -> None:
            super().__init__(Target(str(devcluster.kubeconfig)))
            self.writes, self.patches = writes, 0

        def patch(self, path: str, body: Any, content_type: str, *, dry_run: bool = False) -> Any:
            self.patches += 1
            if self.writes:
                self.writes.pop(0)()
            return super().patch(path, body, content_type, dry_run=dry_run)

    def undo(k: Between) -> str:
        """`rollout undo --to-revision=N`, N the first revision's number once the operator settled;
        what it printed, checked to name N."""
        wait_for("the revisions settled", settled)
        number = numbers()[first]
        args = build_parser().parse_args(
            ["rollout", "undo", name, f"--to-revision={number}", "-n", NAMESPACE]
        )
        try:
            out = cmd_rollout_undo(k, args)
        finally:
            k.close()
        assert out == f"devicepluginprofile.patchbay.dev/{name} rolled back to revision {number}\n"
        return out

    # A write beside the spec between the read and the patch: one patch, through.
    k = Between([annotate])
    undo(k)
    assert k.patches == 1 and spec_revision(spec_now()) == first
    # The spec changed between the read and the patch: read again, then through.
    cluster.patch_spec(name, {"plugin": {"discovery": {"virtual": {"count": 2}}}})
    k = Between([recount(3)])
    undo(k)
    assert k.patches == 2 and spec_revision(spec_now()) == first
    # A spec that changes before every try: refused, saying so; the last change stands.
    cluster.patch_spec(name, {"plugin": {"discovery": {"virtual": {"count": 2}}}})
    k = Between([recount(4 + i) for i in range(UNDO_TRIES)])
    with pytest.raises(KubeError, match=f"changed while it was being rolled back, {UNDO_TRIES} times"):
        undo(k)
    assert k.patches == UNDO_TRIES
    assert spec_now()["plugin"]["discovery"]["virtual"]["count"] == 3 + UNDO_TRIES


def _write_status(cluster: Cluster, name: str, status: dict[str, Any]) -> None:
    """What the operator's waves write (status.rollout and the counts, by the CRD's contract),
    written here through the status subresource: the operator is stopped, so it is the only
    writer, and the plugin is judged against the contract, not against one operator's timing."""
    obj = cluster.profile(name) or {}
    gen = obj["metadata"]["generation"]
    now = _ts(datetime.now(UTC))
    conds = [
        {"lastTransitionTime": now, "reason": "X", "message": "", **c} for c in status.pop("conditions", [])
    ]
    body = {"status": {"observedGeneration": gen, "conditions": conds, **status}}
    cluster.custom.patch_cluster_custom_object_status(
        "patchbay.dev", "v1beta1", "devicepluginprofiles", name, body
    )


def _counts(desired: int, updated: int, ready: int, done: bool = False) -> dict[str, Any]:
    return {
        "currentRevision": "p-bbbbbbbbbb" if done else "p-aaaaaaaaaa",
        "updateRevision": "p-bbbbbbbbbb",
        "desiredNumberScheduled": desired,
        "updatedNumberScheduled": updated,
        "updatedNumberReady": ready,
    }


def test_rollout_status_exits_as_kubectl_rollout_status_does(
    cluster: Cluster, devcluster: DevCluster, bin_dir: Path, operator_process: Operator
) -> None:
    operator_process.stop()  # the test writes the status itself (see _write_status)
    name = f"{cluster.prefix}waves"
    cluster.create_profile(name, _virtual(cluster, 1))
    wave2 = {"phase": "Progressing", "wave": 2, "message": "wave 2"}
    _write_status(cluster, name, {**_counts(10, 3, 3), "rollout": wave2})
    once = plugin(devcluster, bin_dir, "rollout", "status", name, "--watch=false")
    assert once.stdout == (
        f'Waiting for profile "{name}" rollout to finish: 3 out of 10 nodes have been updated (wave 2)...\n'
    )

    # Watching: a line per change, then done and exit 0.
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}:{bin_dir}:{os.environ['PATH']}",
        "KUBECONFIG": str(devcluster.kubeconfig),
    }
    cmd = [str(bin_dir / "kubectl"), "patchbay", "rollout", "status", name, "-n", NAMESPACE, "--timeout=60s"]
    watcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert watcher.stdout is not None
        first = watcher.stdout.readline()
        assert "3 out of 10 nodes have been updated (wave 2)" in first
        _write_status(cluster, name, {**_counts(10, 10, 4), "rollout": {**wave2, "wave": 3}})
        assert "4 of 10 updated nodes are ready (wave 3)" in watcher.stdout.readline()
        _write_status(cluster, name, {**_counts(10, 10, 10, done=True), "rollout": {"phase": "Complete"}})
        rest, err = watcher.communicate(timeout=30)
    finally:
        watcher.kill()
    assert watcher.returncode == 0, err
    assert rest == f'profile "{name}" successfully rolled out\n'

    # Paused: said, and waited for (as kubectl waits for a paused Deployment) until --timeout.
    _write_status(cluster, name, {**_counts(10, 1, 1), "rollout": {"phase": "Paused", "wave": 1}})
    paused = plugin(devcluster, bin_dir, "rollout", "status", name, "--timeout=2s", check=False)
    assert "rollout is paused, 1 of 10 nodes updated (wave 1)" in paused.stdout
    assert paused.returncode == 1 and paused.stderr == "error: timed out waiting for the condition\n"

    # Halted: exit 1 at once with the Stalled message.
    stalled = {
        "type": "Stalled",
        "status": "True",
        "reason": "RolloutHalted",
        "message": "node n1 lost 4 of 4",
    }
    _write_status(
        cluster,
        name,
        {**_counts(10, 1, 0), "rollout": {"phase": "Halted", "wave": 1}, "conditions": [stalled]},
    )
    halted = plugin(devcluster, bin_dir, "rollout", "status", name, "--timeout=60s", check=False)
    assert halted.returncode == 1
    assert halted.stdout == f'profile "{name}" rollout halted: node n1 lost 4 of 4\n'


def test_diff_names_the_pods_a_change_would_strip_of_their_devices(
    cluster: Cluster, devcluster: DevCluster, bin_dir: Path, operator_process: Operator, tmp_path: Path
) -> None:
    """The reports are written as agents write them (the operator stopped: nothing else writes)."""
    operator_process.stop()
    n1, n2 = cluster.add_nodes(2)
    name = f"{cluster.prefix}serial"
    spec = cluster.agent_spec("serial", "DevicePlugin")
    cluster.create_profile(name, spec)
    for node, devices in ((n1, ["ttyUSB0", "ttyACM0"]), (n2, ["ttyACM1"])):
        body = {
            "apiVersion": "patchbay.dev/v1beta1",
            "kind": "DeviceReport",
            "metadata": {
                "name": f"{name}.{node}",
                "namespace": NAMESPACE,
                "labels": {"patchbay.dev/profile": name},
            },
            "profile": name,
            "nodeName": node,
            "agent": f"agent-{node}",
            "resourceName": spec["resourceName"],
            "observedAt": _ts(datetime.now(UTC)),
            "summary": {"total": len(devices), "healthy": len(devices), "unhealthy": 0, "allocated": 1},
            "devices": [
                {
                    "id": d,
                    "health": "Healthy",
                    "pods": [{"namespace": "apps", "name": f"holder-{d}", "container": "c"}],
                }
                for d in devices
            ],
        }
        cluster.custom.create_namespaced_custom_object(
            "patchbay.dev", "v1beta1", NAMESPACE, "devicereports", body
        )

    def doc(globs: list[str]) -> str:
        new = {**spec, "plugin": {"discovery": {"paths": {"globs": globs}}}}
        return yaml.safe_dump(
            {
                "apiVersion": "patchbay.dev/v1beta1",
                "kind": "DevicePluginProfile",
                "metadata": {"name": name},
                "spec": new,
            }
        )

    changed = tmp_path / "profile.yaml"
    changed.write_text(doc(["/dev/ttyACM*"]))
    out = plugin(devcluster, bin_dir, "diff", "-f", str(changed), check=False)
    assert out.returncode == 1, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(
        f"devicepluginprofile.patchbay.dev/{name}: configured (server dry run); 2 nodes"
    )
    assert "1 would lose devices, held by 1 pods" in lines[0]
    row = next(line.split() for line in lines if line.startswith(n1))
    assert row[:5] == [n1, "yes", "-", "ttyUSB0", "apps/holder-ttyUSB0"]
    # n2's device still matches; what else the new glob finds there only n2 can say.
    row = next(line.split(None, 5) for line in lines if line.startswith(n2))
    assert row[:5] == [n2, "yes", "-", "-", "-"] and "known once the node runs it" in row[5]
    # Nothing was written: a dry run.
    assert (cluster.profile(name) or {})["spec"]["plugin"]["discovery"]["paths"]["globs"] == ["/dev/ttyUSB*"]
    as_json = json.loads(
        plugin(devcluster, bin_dir, "diff", "-f", str(changed), "-o", "json", check=False).stdout
    )
    assert as_json["items"][0]["nodes"][0]["holders"] == ["apps/holder-ttyUSB0"]

    # A change that keeps every reported device: exit 0, and what only the node knows is said.
    kept = tmp_path / "kept.yaml"
    kept.write_text(doc(["/dev/ttyUSB*", "/dev/ttyACM*", "/dev/ttyS*"]))
    fine = plugin(devcluster, bin_dir, "diff", "-f", "-", check=False, stdin=kept.read_text())
    assert fine.returncode == 0, fine.stderr
    assert "0 would lose devices" in fine.stdout and "known once the node runs it" in fine.stdout

    # Admission refuses: the API server's words, exit 2 (kubectl diff's "an error").
    bad = tmp_path / "bad.yaml"
    bad.write_text(doc(["/dev/ttyUSB*"]).replace("DevicePlugin\n", "Sideways\n"))
    refused = plugin(devcluster, bin_dir, "diff", "-f", str(bad), check=False)
    assert refused.returncode == 2 and refused.stderr.startswith("Error from server (Invalid): "), (
        refused.stderr
    )
    assert "spec.mode" in refused.stderr


def test_diff_server_side_and_the_pods_over_a_lowered_static_capacity(
    cluster: Cluster, devcluster: DevCluster, bin_dir: Path, operator_process: Operator, tmp_path: Path
) -> None:
    """A Static profile applied server-side by a pipeline's field manager ("gitops"), then paused
    by someone else: ``diff --server-side`` as that manager keeps the pause (another manager's
    field) where a replace drops it; a manager that does not own ``capacity`` gets the server's
    conflict (exit 2) unless it forces; a lowered capacity names the pods over it."""
    operator_process.stop()
    n1, n2 = cluster.add_nodes(2)
    name = f"{cluster.prefix}dongles"
    resource = f"example.com/{cluster.prefix}dongle"
    selector = {"matchLabels": {TEST_LABEL: cluster.tag}}

    def write(capacity: int) -> Path:
        path = tmp_path / f"dongles-{capacity}.yaml"
        body = {
            "apiVersion": "patchbay.dev/v1beta1",
            "kind": "DevicePluginProfile",
            "metadata": {"name": name},
            "spec": {
                "resourceName": resource,
                "mode": "Static",
                "nodeSelector": selector,
                "static": {"capacity": capacity},
            },
        }
        path.write_text(yaml.safe_dump(body))
        return path

    cluster.profiles.append(name)
    kubectl(devcluster, bin_dir, "apply", "--server-side", "--field-manager=gitops", "-f", str(write(4)))
    kubectl(
        devcluster,
        bin_dir,
        "patch",
        "devicepluginprofile",
        name,
        "--type=merge",
        "-p",
        '{"spec":{"rollout":{"paused":true}}}',
    )
    holders = []
    for i, (node, count) in enumerate(((n1, 2), (n1, 1), (n2, 1))):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{cluster.prefix}uses-{i}", "namespace": NAMESPACE},
            "spec": {
                "nodeName": node,
                "tolerations": [{"operator": "Exists"}],
                "containers": [
                    {"name": "c", "image": "busybox", "resources": {"limits": {resource: str(count)}}}
                ],
            },
        }
        holders.append(cluster.core.create_namespaced_pod(NAMESPACE, pod).metadata.name)
    try:
        same = write(4)
        kept = plugin(
            devcluster,
            bin_dir,
            "diff",
            "--server-side",
            "--field-manager=gitops",
            "-f",
            str(same),
            check=False,
        )
        assert kept.returncode == 0 and ": unchanged (server dry run)" in kept.stdout, (
            kept.stdout + kept.stderr
        )
        dropped = plugin(devcluster, bin_dir, "diff", "-f", str(same), check=False)
        assert dropped.returncode == 0 and ": configured (server dry run)" in dropped.stdout, dropped.stdout

        lower = write(2)

        def as_other(*force: str) -> subprocess.CompletedProcess[str]:
            args = ("diff", "--server-side", "--field-manager=other", *force, "-f", str(lower))
            return plugin(devcluster, bin_dir, *args, check=False)

        conflict = as_other()
        assert conflict.returncode == 2, conflict.stdout + conflict.stderr
        assert conflict.stderr.startswith("Error from server (Conflict): ") and "gitops" in conflict.stderr
        out = as_other("--force-conflicts")
        assert out.returncode == 1, out.stdout + out.stderr
        row = next(line for line in out.stdout.splitlines() if line.startswith(n1))
        assert "capacity 4 -> 2" in row and "3 in use" in row, row
        assert f"{NAMESPACE}/{holders[0]},{NAMESPACE}/{holders[1]}" in row, row
        # n2 uses 1 of the new 2: it loses capacity, no pod is over it.
        row2 = next(line for line in out.stdout.splitlines() if line.startswith(n2))
        assert holders[2] not in row2 and "in use" not in row2, row2
        assert (cluster.profile(name) or {})["spec"]["static"]["capacity"] == 4  # a dry run
    finally:
        for pod_name in holders:
            cluster.core.delete_namespaced_pod(pod_name, NAMESPACE, grace_period_seconds=0)
