"""The DevicePluginProfile API as the real API server enforces it: no operator involved.

Bad input must be rejected at admission with a message naming the field, the examples must be
accepted (with the schema's defaults filled in), and `kubectl get` / `kubectl explain` must
show what DESIGN.md promises.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.clusters import GROUP, PLURAL, REPO, VERSION

STATIC: dict[str, Any] = {"resourceName": "example.com/dongle", "mode": "Static", "static": {"capacity": 2}}
PLUGIN: dict[str, Any] = {
    "resourceName": "example.com/serial",
    "mode": "DevicePlugin",
    "plugin": {"discovery": {"virtual": {"count": 2}}},
}
DRA: dict[str, Any] = {**PLUGIN, "mode": "DRA"}


def with_(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``base`` with the dotted ``path`` set (``None`` deletes it)."""
    out = copy.deepcopy(base)
    node = out
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    if value is None:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value
    return out


# (id, spec, text the API server's message must contain: the field it is about)
INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("resourceName missing", with_(STATIC, "resourceName", None), "spec.resourceName"),
    ("resourceName without domain", with_(STATIC, "resourceName", "dongle"), "spec.resourceName"),
    (
        "resourceName uppercase domain",
        with_(STATIC, "resourceName", "Example.com/dongle"),
        "spec.resourceName",
    ),
    (
        "resourceName kubernetes.io",
        with_(STATIC, "resourceName", "kubernetes.io/dongle"),
        "kubernetes.io domain",
    ),
    (
        "resourceName k8s subdomain",
        with_(STATIC, "resourceName", "x.kubernetes.io/dongle"),
        "kubernetes.io domain",
    ),
    ("resourceName name too long", with_(STATIC, "resourceName", "example.com/" + "a" * 64), "at most 63"),
    (
        "resourceName bad name chars",
        with_(STATIC, "resourceName", "example.com/-dongle"),
        "spec.resourceName",
    ),
    ("resourceName two slashes", with_(STATIC, "resourceName", "example.com/a/b"), "spec.resourceName"),
    ("mode unknown", with_(STATIC, "mode", "Magic"), "spec.mode"),
    ("mode missing", with_(STATIC, "mode", None), "spec.mode"),
    ("Static without static", with_(STATIC, "static", None), "spec.static"),
    ("Static with plugin", with_(STATIC, "plugin", PLUGIN["plugin"]), "spec.plugin"),
    ("Static with agent", with_(STATIC, "agent", {"image": "x"}), "spec.agent"),
    ("DevicePlugin without plugin", with_(PLUGIN, "plugin", None), "spec.plugin"),
    ("DevicePlugin with static", with_(PLUGIN, "static", {"capacity": 1}), "spec.static"),
    ("negative capacity", with_(STATIC, "static.capacity", -1), "spec.static.capacity"),
    ("capacity not integer", with_(STATIC, "static.capacity", "four"), "spec.static.capacity"),
    ("capacity missing", with_(STATIC, "static", {}), "spec.static.capacity"),
    (
        "selector In without values",
        with_(STATIC, "nodeSelector", {"matchExpressions": [{"key": "a", "operator": "In"}]}),
        "spec.nodeSelector.matchExpressions",
    ),
    (
        "selector Exists with values",
        with_(
            STATIC,
            "nodeSelector",
            {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
        ),
        "spec.nodeSelector.matchExpressions",
    ),
    (
        "selector operator Gt",
        with_(STATIC, "nodeSelector", {"matchExpressions": [{"key": "a", "operator": "Gt"}]}),
        "spec.nodeSelector.matchExpressions[0].operator",
    ),
    (
        "two discovery backends",
        with_(PLUGIN, "plugin.discovery.usb", {"vendor": "1234"}),
        "spec.plugin.discovery",
    ),
    ("no discovery backend", with_(PLUGIN, "plugin.discovery", {}), "spec.plugin.discovery"),
    (
        "pci vendor uppercase",
        with_(PLUGIN, "plugin.discovery", {"pci": {"vendor": "10DE"}}),
        "spec.plugin.discovery.pci.vendor",
    ),
    (
        "usb without vendor",
        with_(PLUGIN, "plugin.discovery", {"usb": {"product": "5678"}}),
        "spec.plugin.discovery.usb.vendor",
    ),
    (
        "paths without globs or groups",
        with_(PLUGIN, "plugin.discovery", {"paths": {}}),
        "spec.plugin.discovery.paths",
    ),
    (
        "glob outside /dev",
        with_(PLUGIN, "plugin.discovery", {"paths": {"globs": ["/etc/*"]}}),
        "spec.plugin.discovery.paths.globs",
    ),
    (
        "virtual count 0",
        with_(PLUGIN, "plugin.discovery.virtual.count", 0),
        "spec.plugin.discovery.virtual.count",
    ),
    ("replicas 0", with_(PLUGIN, "plugin.sharing", {"replicas": 0}), "spec.plugin.sharing.replicas"),
    (
        "health period 0",
        with_(PLUGIN, "plugin.health", {"periodSeconds": 0}),
        "spec.plugin.health.periodSeconds",
    ),
    (
        "health exec without command",
        with_(PLUGIN, "plugin.health", {"exec": {"command": []}}),
        "spec.plugin.health.exec.command",
    ),
    (
        "permissions outside rwm",
        with_(PLUGIN, "plugin.allocation", {"permissions": "rx"}),
        "spec.plugin.allocation.permissions",
    ),
    (
        "permissions repeated",
        with_(PLUGIN, "plugin.allocation", {"permissions": "rr"}),
        "spec.plugin.allocation.permissions",
    ),
    (
        "env name invalid",
        with_(PLUGIN, "plugin.allocation", {"envs": {"1BAD": "x"}}),
        "spec.plugin.allocation.envs",
    ),
    (
        "devicesEnvName invalid",
        with_(PLUGIN, "plugin.allocation", {"devicesEnvName": "A-B"}),
        "spec.plugin.allocation.devicesEnvName",
    ),
    (
        "mount hostPath relative",
        with_(PLUGIN, "plugin.allocation", {"mounts": [{"hostPath": "lib", "containerPath": "/l"}]}),
        "spec.plugin.allocation.mounts[0].hostPath",
    ),
    (
        "cdi kind invalid",
        with_(PLUGIN, "plugin.allocation", {"cdi": {"kind": "serial"}}),
        "spec.plugin.allocation.cdi.kind",
    ),
    (
        "policy unknown",
        with_(PLUGIN, "plugin.preferredAllocation", {"policy": "Random"}),
        "spec.plugin.preferredAllocation.policy",
    ),
    (
        "preStart timeout 0",
        with_(PLUGIN, "plugin.preStart", {"command": ["/x"], "timeoutSeconds": 0}),
        "spec.plugin.preStart.timeoutSeconds",
    ),
    (
        "surge and unavailable both 0",
        with_(PLUGIN, "agent", {"updateStrategy": {"maxSurge": 0, "maxUnavailable": 0}}),
        "spec.agent.updateStrategy",
    ),
    (
        "maxSurge not a percentage",
        with_(PLUGIN, "agent", {"updateStrategy": {"maxSurge": "lots"}}),
        "spec.agent.updateStrategy.maxSurge",
    ),
    (
        "pull policy unknown",
        with_(PLUGIN, "agent", {"imagePullPolicy": "Sometimes"}),
        "spec.agent.imagePullPolicy",
    ),
    (
        "toleration effect unknown",
        with_(PLUGIN, "agent", {"tolerations": [{"effect": "Sometimes"}]}),
        "spec.agent.tolerations[0].effect",
    ),
    (
        "rollout strategy unknown",
        with_(PLUGIN, "rollout", {"strategy": "AllAtOnce"}),
        "spec.rollout.strategy",
    ),
    (
        "rollout wave of 0 nodes",
        with_(PLUGIN, "rollout", {"maxNodesPerWave": 0}),
        "spec.rollout.maxNodesPerWave",
    ),
    (
        "rollout wave of 0%",
        with_(PLUGIN, "rollout", {"maxNodesPerWave": "0%"}),
        "spec.rollout.maxNodesPerWave",
    ),
    (
        "rollout wave over 100%",
        with_(PLUGIN, "rollout", {"maxNodesPerWave": "150%"}),
        "spec.rollout.maxNodesPerWave",
    ),
    (
        "rollout canary count and selector",
        with_(PLUGIN, "rollout", {"canary": {"nodes": 2, "nodeSelector": {"matchLabels": {"a": "b"}}}}),
        "spec.rollout.canary",
    ),
    (
        "rollout Immediate with a wave size",
        with_(PLUGIN, "rollout", {"strategy": "Immediate", "maxNodesPerWave": 3}),
        "spec.rollout",
    ),
    (
        "rollout onFailure unknown",
        with_(PLUGIN, "rollout", {"onFailure": "Ignore"}),
        "spec.rollout.onFailure",
    ),
    (
        "rollout minHealthyPercent over 100",
        with_(PLUGIN, "rollout", {"minHealthyPercent": 101}),
        "spec.rollout.minHealthyPercent",
    ),
    ("DRA without plugin", with_(DRA, "plugin", None), "spec.plugin is required when spec.mode is DRA"),
    ("DRA with static", with_(DRA, "static", {"capacity": 1}), "spec.static must not be set"),
    (
        "DRA with preferredAllocation",
        with_(DRA, "plugin.preferredAllocation", {"policy": "Pack"}),
        "spec.plugin.preferredAllocation",
    ),
    ("DRA with preStart", with_(DRA, "plugin.preStart", {"command": ["/x"]}), "spec.plugin.preStart"),
    (
        "DRA with allocation.cdi",
        with_(DRA, "plugin.allocation", {"cdi": {"kind": "example.com/serial"}}),
        "spec.plugin.allocation.cdi",
    ),
]


def create(
    api: client.ApiClient, name: str, spec: dict[str, Any] | None, dry_run: bool = True
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DevicePluginProfile",
        "metadata": {"name": name},
    }
    if spec is not None:
        body["spec"] = spec
    kwargs = {"dry_run": "All"} if dry_run else {}
    obj: dict[str, Any] = client.CustomObjectsApi(api).create_cluster_custom_object(
        GROUP, VERSION, PLURAL, body, **kwargs
    )
    return obj


def rejection(api: client.ApiClient, name: str, spec: dict[str, Any] | None) -> str:
    with pytest.raises(ApiException) as info:
        create(api, name, spec)
    assert info.value.status == 422, info.value.body
    return str(json.loads(info.value.body)["message"])


def test_at_least_twenty_distinct_invalid_cases() -> None:
    assert len({case[0] for case in INVALID}) >= 20
    assert len({json.dumps(case[1], sort_keys=True) for case in INVALID}) == len(INVALID)


@pytest.mark.parametrize(("spec", "field"), [(c[1], c[2]) for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_profile_is_rejected_naming_the_field(
    api: client.ApiClient, crd: dict[str, Any], name_prefix: str, spec: dict[str, Any], field: str
) -> None:
    message = rejection(api, f"{name_prefix}bad", spec)
    assert field in message, message


@pytest.mark.parametrize(
    "rollout",
    [
        {},
        {"strategy": "Immediate"},
        {"strategy": "Immediate", "paused": True},
        {"canary": {"nodes": 0}, "maxNodesPerWave": "10%", "healthySeconds": 0},
        {"canary": {"nodeSelector": {"matchLabels": {"canary": "true"}}}, "maxNodesPerWave": 50},
        {
            "maxNodesPerWave": "100%",
            "minHealthyPercent": 50,
            "progressDeadlineSeconds": 60,
            "onFailure": "Pause",
        },
    ],
    ids=["empty", "immediate", "immediate-paused", "no-canary", "canary-selector", "pause-on-failure"],
)
def test_rollout_settings_are_accepted_as_written(
    api: client.ApiClient, crd: dict[str, Any], name_prefix: str, rollout: dict[str, Any]
) -> None:
    """No default is written into spec.rollout: absent fields mean the documented defaults, so a
    GitOps tool comparing its manifest with the object sees no drift."""
    obj = create(api, f"{name_prefix}rollout", with_(PLUGIN, "rollout", rollout))
    assert obj["spec"]["rollout"] == rollout


def test_spec_is_required(api: client.ApiClient, crd: dict[str, Any], name_prefix: str) -> None:
    assert "spec" in rejection(api, f"{name_prefix}nospec", None)


def test_long_profile_name_is_rejected(api: client.ApiClient, crd: dict[str, Any]) -> None:
    assert "metadata.name" in rejection(api, "a" * 53, STATIC)


def test_the_shared_node_agents_name_is_reserved(api: client.ApiClient, crd: dict[str, Any]) -> None:
    """A profile's own agent objects are patchbay-<name>: `node-agent` would be the shared agent's."""
    message = rejection(api, "node-agent", PLUGIN)
    assert "metadata.name node-agent is reserved" in message, message
    create(api, "node-agent2", PLUGIN)


def test_a_dra_profile_name_leaves_room_for_the_driver_suffix(
    api: client.ApiClient, crd: dict[str, Any]
) -> None:
    """The driver and DeviceClass are <name>.patchbay.dev, at most 63 characters."""
    message = rejection(api, "a" * 51, DRA)
    assert "metadata.name must be at most 50 characters when spec.mode is DRA" in message, message
    create(api, "a" * 50, DRA)
    create(api, "a" * 51, PLUGIN)  # other modes keep 52


def test_dra_profile_is_accepted_with_the_plugin_defaults(
    api: client.ApiClient, crd: dict[str, Any], name_prefix: str
) -> None:
    obj = create(api, f"{name_prefix}dra", with_(DRA, "agent", {"tolerations": [{"operator": "Exists"}]}))
    assert obj["spec"]["mode"] == "DRA"
    # The defaults the schema fills in (replicas 1, policy None) are what DRA mode allows.
    assert obj["spec"]["plugin"]["sharing"] == {"replicas": 1}
    assert obj["spec"]["plugin"]["preferredAllocation"] == {"policy": "None"}
    # Sharing in DRA mode is consumable capacity: any count the schema allows.
    shared = create(api, f"{name_prefix}dra-shared", with_(DRA, "plugin.sharing", {"replicas": 4}))
    assert shared["spec"]["plugin"]["sharing"] == {"replicas": 4}


@pytest.mark.parametrize("example", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_accepted_with_defaults(
    api: client.ApiClient, crd: dict[str, Any], example: Path
) -> None:
    doc = yaml.safe_load(example.read_text())
    obj = create(api, doc["metadata"]["name"], doc["spec"])
    spec = obj["spec"]
    if spec["mode"] == "DevicePlugin":
        plugin = spec["plugin"]
        assert plugin["health"]["periodSeconds"] == 5
        assert plugin["allocation"]["devicesEnvName"] == "PATCHBAY_DEVICES"
        if "agent" in doc["spec"]:
            assert spec["agent"]["privileged"] is False
        else:  # served by the shared node agent: no agent section is made up for it
            assert "agent" not in spec


def test_plugin_defaults_follow_the_contract(
    api: client.ApiClient, crd: dict[str, Any], name_prefix: str
) -> None:
    obj = create(api, f"{name_prefix}defaults", PLUGIN)
    assert obj["spec"]["plugin"] == {
        "discovery": {"virtual": {"count": 2}},
        "sharing": {"replicas": 1},
        "health": {"periodSeconds": 5, "failureThreshold": 3, "successThreshold": 1},
        "allocation": {"permissions": "rw", "devicesEnvName": "PATCHBAY_DEVICES"},
        "preferredAllocation": {"policy": "None"},
    }


def test_resource_name_is_immutable(api: client.ApiClient, crd: dict[str, Any], name_prefix: str) -> None:
    name = f"{name_prefix}immutable"
    custom = client.CustomObjectsApi(api)
    create(api, name, STATIC, dry_run=False)
    try:
        with pytest.raises(ApiException) as info:
            custom.patch_cluster_custom_object(
                GROUP, VERSION, PLURAL, name, {"spec": {"resourceName": "example.com/other"}}
            )
        assert info.value.status == 422
        assert "spec.resourceName is immutable" in info.value.body
        # Other fields stay editable.
        custom.patch_cluster_custom_object(
            GROUP, VERSION, PLURAL, name, {"spec": {"static": {"capacity": 3}}}
        )
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)


def test_printer_columns_as_kubectl_sees_them(
    api: client.ApiClient, crd: dict[str, Any], name_prefix: str
) -> None:
    name = f"{name_prefix}columns"
    create(api, name, STATIC, dry_run=False)
    try:
        raw = client.CustomObjectsApi(api).get_cluster_custom_object(
            GROUP,
            VERSION,
            PLURAL,
            name,
            _headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
            _preload_content=False,
        )
        table = json.loads(raw.data)
    finally:
        client.CustomObjectsApi(api).delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    columns = [c["name"] for c in table["columnDefinitions"] if c["priority"] == 0]
    assert columns == ["Name", "Mode", "Resource", "Nodes", "Devices", "Ready", "Age"]
    assert table["rows"][0]["cells"][1:3] == ["Static", "example.com/dongle"]


def test_kubectl_explain_teaches_the_api(bin_dir: Path, devcluster: Any, crd: dict[str, Any]) -> None:
    def explain(path: str) -> str:
        out = subprocess.run(
            [str(bin_dir / "kubectl"), "--kubeconfig", str(devcluster.kubeconfig), "explain", path],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return out.stdout

    assert "Static mode: a fixed count per node" in explain("dpp.spec.static")
    assert "advertised this many times" in " ".join(
        explain("devicepluginprofiles.spec.plugin.sharing.replicas").split()
    )
    assert "consumable capacity" in " ".join(
        explain("devicepluginprofiles.spec.plugin.sharing.replicas").split()
    )
    assert "exactly one backend" in explain("dpp.spec.plugin.discovery")


def test_every_schema_field_has_a_description(crd: dict[str, Any]) -> None:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    missing: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        for key, sub in (node.get("properties") or {}).items():
            here = f"{path}.{key}"
            if key != "metadata" and not sub.get("description"):
                missing.append(here)
            walk(sub, here)
        if "items" in node:
            walk(node["items"], path + "[]")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], path + "{}")

    walk(schema, "")
    assert not missing, missing
