"""patchbay.dev served as v1beta1 (stored) and v1alpha1 (deprecated, the same schema, conversion
None), on a real API server and read back from its etcd (docs/api.md#versions):

- the CRDs of crds/ store v1beta1 and serve v1alpha1 with an identical schema, deprecated;
- an object written under either version reads back under the other, the same object but for its
  apiVersion, and is stored as v1beta1 (the key read from etcd itself); a client that uses
  v1alpha1 is warned;
- a dry-run create of a stored object is validated before its name clashes (409 valid, 422
  not), which the upgrade e2e test uses to show every stored object valid under v1beta1;
- a writer that server-side applied a report under v1alpha1 (an agent of 0.1.0) and applies it
  again under v1beta1 (the same agent, upgraded) owns the same fields: what it leaves out goes;
- a cluster upgraded from 0.1.0: objects stored as v1alpha1 under 0.1.0's CRD (v1alpha1 alone, the
  same schema: crds/ is unchanged since 0.1.0 but for the versions) read back under v1beta1 once
  the CRD is replaced, stay stored as v1alpha1 until written, and the storage migration of
  docs/api.md moves them, after which v1alpha1 may leave the CRD (refused before). That upgrade
  runs on a copy of the CRD in a group of the test's own, so the session's patchbay.dev is left
  as every other test expects it.
"""

from __future__ import annotations

import base64
import copy
import json
import subprocess
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client
from kubernetes.client import ApiException
from support.clusters import (
    CRD_FILE,
    GROUP,
    PLURAL,
    REPORT_CRD_FILE,
    Cluster,
    apply_crd_body,
    wait_for,
)

from patchbay_devcluster import DevCluster

OLD, NEW = "v1alpha1", "v1beta1"
REPORTS = "devicereports"


def stored(devcluster: DevCluster, key: str) -> dict[str, Any]:
    """The object as etcd holds it under ``key`` (custom resources are stored as JSON), read through
    etcd's own JSON gateway on the control plane's loopback port."""
    port = devcluster.state().ports["etcd"]
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v3/kv/range",
        data=json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        kvs = json.load(response).get("kvs") or []
    assert len(kvs) == 1, f"etcd has no {key}"
    obj: dict[str, Any] = json.loads(base64.b64decode(kvs[0]["value"]))
    return obj


def get(
    custom: client.CustomObjectsApi, group: str, version: str, plural: str, name: str, ns: str = ""
) -> dict[str, Any]:
    """The object as a dict (the client's custom-object calls are typed ``object``)."""
    if ns:
        return cast(dict[str, Any], custom.get_namespaced_custom_object(group, version, ns, plural, name))
    return cast(dict[str, Any], custom.get_cluster_custom_object(group, version, plural, name))


def items(custom: client.CustomObjectsApi, group: str, version: str, plural: str) -> list[dict[str, Any]]:
    return cast(
        list[dict[str, Any]],
        cast(dict[str, Any], custom.list_cluster_custom_object(group, version, plural))["items"],
    )


def but_api_version(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k != "apiVersion"}


def static_profile(name: str, tag: str, version: str) -> dict[str, Any]:
    """A Static profile that selects no node (the session's operator may be running)."""
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "DevicePluginProfile",
        "metadata": {"name": name},
        "spec": {
            "resourceName": f"example.com/{tag}-versions",
            "mode": "Static",
            "nodeSelector": {"matchLabels": {"patchbay.dev/test": f"{tag}-none"}},
            "static": {"capacity": 2},
        },
    }


def report(namespace: str, profile: str, node: str, version: str, devices: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "DeviceReport",
        "metadata": {"name": f"{profile}.{node}", "namespace": namespace},
        "profile": profile,
        "nodeName": node,
        "resourceName": "example.com/versions",
        "summary": {"total": len(devices), "healthy": len(devices), "unhealthy": 0, "allocated": 0},
        "devices": [{"id": d, "health": "Healthy"} for d in devices],
    }


def test_the_crds_store_v1beta1_and_serve_v1alpha1_deprecated_with_the_same_schema(
    api: client.ApiClient, crd: dict[str, Any]
) -> None:
    ext = client.ApiextensionsV1Api(api)
    for name in (f"{PLURAL}.{GROUP}", f"{REPORTS}.{GROUP}"):
        got = cast(dict[str, Any], api.sanitize_for_serialization(ext.read_custom_resource_definition(name)))  # type: ignore[no-untyped-call]
        versions = {v["name"]: v for v in got["spec"]["versions"]}
        assert sorted(versions) == [OLD, NEW], name
        assert (versions[NEW]["storage"], versions[NEW]["served"]) == (True, True)
        assert (versions[OLD]["storage"], versions[OLD]["served"]) == (False, True)
        assert (
            versions[OLD].get("deprecated") is True
            and f"use {GROUP}/{NEW}" in versions[OLD]["deprecationWarning"]
        )
        assert not versions[NEW].get("deprecated")
        for key in ("schema", "subresources", "additionalPrinterColumns"):
            assert versions[OLD].get(key) == versions[NEW].get(key), (name, key)
        assert got["spec"]["conversion"]["strategy"] == "None"
        assert NEW in got["status"]["storedVersions"]


def test_a_profile_written_under_either_version_reads_back_under_the_other_stored_as_v1beta1(
    api: client.ApiClient,
    crd: dict[str, Any],
    cluster: Cluster,
    devcluster: DevCluster,
    bin_dir: Path,
) -> None:
    custom = cluster.custom
    old_name, new_name = f"{cluster.prefix}as-alpha", f"{cluster.prefix}as-beta"
    cluster.profiles += [old_name, new_name]
    custom.create_cluster_custom_object(GROUP, OLD, PLURAL, static_profile(old_name, cluster.tag, OLD))
    custom.create_cluster_custom_object(GROUP, NEW, PLURAL, static_profile(new_name, cluster.tag, NEW))
    # The status too (a subresource of both versions), written under the old version.
    custom.patch_cluster_custom_object_status(
        GROUP, OLD, PLURAL, old_name, {"status": {"observedGeneration": 1, "problemCount": 0}}
    )

    def both(name: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The object read under each version, at the same resourceVersion (the session's
        operator may write its status in between)."""
        as_old = get(custom, GROUP, OLD, PLURAL, name)
        as_new = get(custom, GROUP, NEW, PLURAL, name)
        same = as_old["metadata"]["resourceVersion"] == as_new["metadata"]["resourceVersion"]
        return (as_old, as_new) if same else None

    for name in (old_name, new_name):
        as_old, as_new = wait_for(f"{name} read twice at one resourceVersion", partial(both, name))
        assert (as_old["apiVersion"], as_new["apiVersion"]) == (f"{GROUP}/{OLD}", f"{GROUP}/{NEW}")
        assert but_api_version(as_old) == but_api_version(as_new)
        assert as_new["spec"] == static_profile(name, cluster.tag, NEW)["spec"]
        assert stored(devcluster, f"/registry/{GROUP}/{PLURAL}/{name}")["apiVersion"] == f"{GROUP}/{NEW}"
    assert get(custom, GROUP, NEW, PLURAL, old_name)["status"]["observedGeneration"] == 1
    # Both versions list every object.
    for version in (OLD, NEW):
        names = {o["metadata"]["name"] for o in items(custom, GROUP, version, PLURAL)}
        assert {old_name, new_name} <= names, version
    # kubectl says the old version is deprecated, and what to use instead.
    res = subprocess.run(
        [
            str(bin_dir / "kubectl"),
            "--kubeconfig",
            str(devcluster.kubeconfig),
            "get",
            f"{PLURAL}.{OLD}.{GROUP}",
            old_name,
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(res.stdout)["apiVersion"] == f"{GROUP}/{OLD}"
    assert f"{GROUP}/{OLD} DevicePluginProfile is deprecated; use {GROUP}/{NEW}" in res.stderr, res.stderr


def test_a_dry_run_create_of_a_stored_object_is_validated_before_its_name_clashes(
    api: client.ApiClient, crd: dict[str, Any], cluster: Cluster
) -> None:
    """What the upgrade e2e test relies on to show that a stored object is valid under v1beta1:
    the API server validates a create (schema, CEL rules) before it finds the name taken, so a
    dry-run create of the stored object answers 409 when it is valid and 422 when it is not."""
    custom = cluster.custom
    name = f"{cluster.prefix}dry"
    cluster.profiles.append(name)
    body = static_profile(name, cluster.tag, NEW)
    custom.create_cluster_custom_object(GROUP, NEW, PLURAL, body)
    with pytest.raises(ApiException) as valid:
        custom.create_cluster_custom_object(GROUP, NEW, PLURAL, body, dry_run="All")
    assert valid.value.status == 409, valid.value.body
    invalid_body = copy.deepcopy(body)
    del invalid_body["spec"]["static"]
    with pytest.raises(ApiException) as invalid:
        custom.create_cluster_custom_object(GROUP, NEW, PLURAL, invalid_body, dry_run="All")
    assert invalid.value.status == 422, invalid.value.body
    assert "spec.static is required" in str(invalid.value.body)


def test_an_agent_that_applied_its_report_under_v1alpha1_owns_the_same_fields_under_v1beta1(
    api: client.ApiClient,
    crd: dict[str, Any],
    operator_namespace: str,
    name_prefix: str,
    devcluster: DevCluster,
) -> None:
    """The field manager of the agents (patchbay-agent) across the upgrade: 0.1.0's agent applied
    the report under v1alpha1; 0.2.0's applies it under v1beta1. Server-side apply must treat both
    as the same manager's, so a device the new agent no longer lists is removed, not left behind
    as owned by the old version's entry."""
    custom = client.CustomObjectsApi(api)
    profile, node = f"{name_prefix}p", f"{name_prefix}n"
    name = f"{profile}.{node}"

    def apply(version: str, devices: list[str]) -> None:
        custom.patch_namespaced_custom_object(
            GROUP,
            version,
            operator_namespace,
            REPORTS,
            name,
            report(operator_namespace, profile, node, version, devices),
            field_manager="patchbay-agent",
            force=True,
            _content_type="application/apply-patch+yaml",
        )

    try:
        apply(OLD, ["ttyUSB0", "ttyUSB1"])
        key = f"/registry/{GROUP}/{REPORTS}/{operator_namespace}/{name}"
        assert stored(devcluster, key)["apiVersion"] == f"{GROUP}/{NEW}"
        got = get(custom, GROUP, NEW, REPORTS, name, operator_namespace)
        assert [d["id"] for d in got["devices"]] == ["ttyUSB0", "ttyUSB1"]
        apply(NEW, ["ttyUSB1"])
        got = get(custom, GROUP, OLD, REPORTS, name, operator_namespace)
        assert [d["id"] for d in got["devices"]] == ["ttyUSB1"]
        assert got["summary"]["total"] == 1
        managers = [(m["manager"], m["operation"], m["apiVersion"]) for m in got["metadata"]["managedFields"]]
        assert managers == [("patchbay-agent", "Apply", f"{GROUP}/{NEW}")], managers
    finally:
        custom.delete_namespaced_custom_object(GROUP, NEW, operator_namespace, REPORTS, name)


# --- a cluster upgraded from 0.1.0, on a copy of the CRDs in a group of the test's own ---------------


def in_group(path: Path, group: str) -> dict[str, Any]:
    """The CRD of ``path`` in ``group``, without short names and categories (they would clash
    with patchbay.dev's in `kubectl get`)."""
    body: dict[str, Any] = yaml.safe_load(path.read_text())
    names = body["spec"]["names"]
    names.pop("shortNames", None)
    names.pop("categories", None)
    body["spec"]["group"] = group
    body["metadata"] = {"name": f"{names['plural']}.{group}"}
    return body


def as_in_0_1_0(body: dict[str, Any]) -> dict[str, Any]:
    """The CRD as 0.1.0 installed it: v1alpha1 alone, stored, with the same schema."""
    old = copy.deepcopy(body)
    (alpha,) = [v for v in old["spec"]["versions"] if v["name"] == OLD]
    alpha.pop("deprecated")
    alpha.pop("deprecationWarning")
    alpha["storage"] = True
    old["spec"]["versions"] = [alpha]
    old["spec"].pop("conversion")
    return old


def without_v1alpha1(body: dict[str, Any]) -> dict[str, Any]:
    new = copy.deepcopy(body)
    new["spec"]["versions"] = [v for v in new["spec"]["versions"] if v["name"] != OLD]
    return new


@pytest.fixture
def own_group(api: client.ApiClient, name_prefix: str) -> Iterator[str]:
    """A group of the test's own for copies of the CRDs; the CRDs (and their objects) go after."""
    group = f"{name_prefix.rstrip('-')}.{GROUP}"
    yield group
    ext = client.ApiextensionsV1Api(api)
    for plural in (PLURAL, REPORTS):
        try:
            ext.delete_custom_resource_definition(f"{plural}.{group}")
        except ApiException as e:
            if e.status != 404:
                raise


def served(custom: client.CustomObjectsApi, group: str, version: str, plural: str) -> bool:
    try:
        custom.list_cluster_custom_object(group, version, plural)
    except ApiException:
        return False
    return True


def test_objects_stored_by_0_1_0_read_as_v1beta1_and_the_storage_migration_lets_v1alpha1_go(
    api: client.ApiClient, devcluster: DevCluster, operator_namespace: str, own_group: str
) -> None:
    custom, ext = client.CustomObjectsApi(api), client.ApiextensionsV1Api(api)
    group, tag = own_group, own_group.split(".", 1)[0]
    current = {PLURAL: in_group(CRD_FILE, group), REPORTS: in_group(REPORT_CRD_FILE, group)}
    profile_name, node = f"{tag}-serial", f"{tag}-node"
    report_name = f"{profile_name}.{node}"
    keys = {
        PLURAL: f"/registry/{group}/{PLURAL}/{profile_name}",
        REPORTS: f"/registry/{group}/{REPORTS}/{operator_namespace}/{report_name}",
    }

    # 0.1.0: the CRDs with v1alpha1 alone; a profile and a report written under it.
    for plural, body in current.items():
        apply_crd_body(api, as_in_0_1_0(body))
        wait_for(f"{plural}.{group} served", partial(served, custom, group, OLD, plural))
    profile = static_profile(profile_name, tag, OLD)
    profile["apiVersion"] = f"{group}/{OLD}"
    custom.create_cluster_custom_object(group, OLD, PLURAL, profile)
    old_report = report(operator_namespace, profile_name, node, OLD, ["ttyUSB0", "ttyUSB1"])
    old_report["apiVersion"] = f"{group}/{OLD}"
    custom.create_namespaced_custom_object(group, OLD, operator_namespace, REPORTS, old_report)
    for key in keys.values():
        assert stored(devcluster, key)["apiVersion"] == f"{group}/{OLD}"
    before = {
        PLURAL: get(custom, group, OLD, PLURAL, profile_name),
        REPORTS: get(custom, group, OLD, REPORTS, report_name, operator_namespace),
    }

    # 0.2.0's CRDs replace them (what `helm upgrade` does): both read under v1beta1, unchanged,
    # while etcd still holds them as v1alpha1 and the CRDs list both as stored.
    for plural, body in current.items():
        apply_crd_body(api, body)
        wait_for(f"{plural}.{group} served as {NEW}", partial(served, custom, group, NEW, plural))
    after = {
        PLURAL: get(custom, group, NEW, PLURAL, profile_name),
        REPORTS: get(custom, group, NEW, REPORTS, report_name, operator_namespace),
    }
    for plural in current:
        assert after[plural]["apiVersion"] == f"{group}/{NEW}"
        assert but_api_version(after[plural]) == but_api_version(before[plural]), plural
        assert stored(devcluster, keys[plural])["apiVersion"] == f"{group}/{OLD}"
        crd = ext.read_custom_resource_definition(f"{plural}.{group}")
        assert crd.status is not None and sorted(crd.status.stored_versions or []) == [OLD, NEW]
    # v1alpha1 cannot leave the CRD while it is listed as stored.
    with pytest.raises(ApiException) as refused:
        apply_crd_body(api, without_v1alpha1(current[PLURAL]))
    assert refused.value.status == 422 and "storedVersions" in str(refused.value.body), refused.value.body

    # The storage migration of docs/api.md: every object written again, then storedVersions.
    for plural, body in current.items():
        listed = items(custom, group, NEW, plural)
        for obj in listed:
            meta = obj["metadata"]
            if meta.get("namespace"):
                custom.replace_namespaced_custom_object(
                    group, NEW, meta["namespace"], plural, meta["name"], obj
                )
            else:
                custom.replace_cluster_custom_object(group, NEW, plural, meta["name"], obj)
        assert stored(devcluster, keys[plural])["apiVersion"] == f"{group}/{NEW}"
        ext.patch_custom_resource_definition_status(
            f"{plural}.{group}", {"status": {"storedVersions": [NEW]}}
        )
        apply_crd_body(api, without_v1alpha1(body))
    # Without v1alpha1 in the CRDs every object is still there, as it was.
    got = get(custom, group, NEW, PLURAL, profile_name)
    assert got["spec"] == before[PLURAL]["spec"]
    got = get(custom, group, NEW, REPORTS, report_name, operator_namespace)
    assert [d["id"] for d in got["devices"]] == ["ttyUSB0", "ttyUSB1"]
    wait_for(f"{group}/{OLD} no longer served", lambda: not served(custom, group, OLD, PLURAL))
