"""Settings that change how the operator runs: JSON logs and kopf peering between replicas."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from optest import REPO, TEST_LABEL, Cluster, Operator, wait_for

R = "example.com/peered"
PEERING_CRD = REPO / "crds" / "kopf.dev_clusterkopfpeerings.yaml"


def test_json_log_format(operator_process: Operator) -> None:
    operator_process.stop()
    operator_process.start("--log-format", "json")
    try:
        wait_for("a Stats line", operator_process.stats)
        lines = [ln for ln in operator_process.log().splitlines() if ln.strip()]
        records = [json.loads(ln) for ln in lines]  # every line is one JSON object
        assert any("Loaded" in r["message"] for r in records)
        assert all({"message", "timestamp", "severity"} <= r.keys() for r in records), records[:3]
    finally:
        operator_process.stop()


def test_bad_setting_fails_fast_naming_it(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "patchbay_operator.main", "--log-format", "xml"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert "--log-format" in out.stderr


@pytest.fixture
def peering_crd(api: client.ApiClient) -> Iterator[None]:
    ext = client.ApiextensionsV1Api(api)
    body = yaml.safe_load(PEERING_CRD.read_text())
    try:
        ext.create_custom_resource_definition(body)
    except ApiException as e:
        if e.status != 409:
            raise
    wait_for(
        "peering CRD established",
        lambda: any(
            c.type == "Established" and c.status == "True"
            for c in ext.read_custom_resource_definition(body["metadata"]["name"]).status.conditions or []
        ),
    )
    return


def test_two_peered_replicas_only_the_higher_priority_one_works(
    cluster: Cluster, operator_process: Operator, peering_crd: None, tmp_path: Path
) -> None:
    operator_process.stop()  # the session's standalone operator would not take part in peering
    nodes = cluster.add_nodes(2)
    peering = f"{cluster.prefix}peering"
    high = Operator(operator_process.kubeconfig, tmp_path / "high")
    low = Operator(operator_process.kubeconfig, tmp_path / "low")
    (tmp_path / "high").mkdir()
    (tmp_path / "low").mkdir()
    spec: dict[str, Any] = {
        "resourceName": R,
        "mode": "Static",
        "nodeSelector": {"matchLabels": {TEST_LABEL: cluster.tag}},
        "static": {"capacity": 1},
    }
    try:
        high.start("--peering", peering, "--priority", "200")
        low.start("--peering", peering, "--priority", "100")
        # kopf starts every peered replica paused; only the highest-priority one resumes.
        wait_for("the high replica works", lambda: "Resuming operations" in high.log())
        name = f"{cluster.prefix}peered"
        cluster.create_profile(name, spec)
        wait_for("nodes patched", lambda: all(cluster.values(n, R) == ("1", "1") for n in nodes))
        wait_for("the high replica counted its patches", lambda: high.stats().get("nodePatches", 0) >= 2)
        assert low.stats().get("nodePatches", 0) == 0
        assert "Resuming operations" not in low.log()

        # The working replica goes away cleanly: the other one takes over.
        high.stop(signal.SIGTERM)
        wait_for("the low replica resumes", lambda: "Resuming operations" in low.log(), timeout=90)
        cluster.patch_spec(name, {"static": {"capacity": 3}})
        wait_for(
            "nodes updated by the other replica",
            lambda: all(cluster.values(n, R) == ("3", "3") for n in nodes),
        )
        cluster.delete_profile(name)
        wait_for("profile released", lambda: cluster.profile(name) is None)
    finally:
        high.stop()
        low.stop()
        client.CustomObjectsApi(cluster.api).delete_cluster_custom_object(
            "kopf.dev", "v1", "clusterkopfpeerings", peering
        )
