"""Rendered agent objects: the profile contract, the config hash, hardening and rollout safety."""

from __future__ import annotations

import copy
import re
from typing import Any

import jinja2
import pytest
import yaml

from patchbay_api.revisions import Rollout, spec_revision
from patchbay_operator import render
from patchbay_operator.config import Settings
from patchbay_operator.constants import CONFIG_HASH_ANNOTATION
from patchbay_operator.profiles import Profile

BODY: dict[str, Any] = {
    "metadata": {"name": "serial", "uid": "uid-1", "generation": 1},
    "spec": {
        "resourceName": "example.com/serial",
        "mode": "DevicePlugin",
        "nodeSelector": {"matchExpressions": [{"key": "serial", "operator": "Exists"}]},
        "plugin": {
            "discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}},
            "sharing": {"replicas": 1},
            "allocation": {"permissions": "rw", "envs": {"A": 'quote" and: colon'}},
        },
        "agent": {
            "tolerations": [{"operator": "Exists"}],
            "updateStrategy": {"maxSurge": 1, "maxUnavailable": 0},
        },
    },
}
SETTINGS = Settings(namespace="patchbay-test", agent_image="example.invalid/agent:1")


def objects(body: dict[str, Any] = BODY) -> tuple[dict[str, Any], dict[str, Any]]:
    cm, ds = render.agent_objects(Profile.from_body(body), SETTINGS)
    return cm, ds


def test_configmap_is_a_node_config_of_the_one_profile() -> None:
    """An agent of its own serves its profile as the shared node agent does: its ConfigMap is a
    node config with the profile's one entry, rendered by the same `node_entry` (rollout stanza
    included), and nothing else."""
    cm, _ = objects()
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["namespace"] == "patchbay-test"
    assert set(cm["data"]) == {"node.yaml"}
    (entry,) = yaml.safe_load(cm["data"]["node.yaml"])["profiles"]
    assert entry == render.node_entry(Profile.from_body(BODY))
    assert entry["plugin"] == BODY["spec"]["plugin"] and entry["resourceName"] == "example.com/serial"
    assert entry["rollout"]["current"] == entry["rollout"]["update"] == entry["revision"]


def test_configmap_carries_the_rollout_of_the_profile_mid_rollout() -> None:
    """Mid-rollout (`stage`: what staging.py says), the own ConfigMap holds both revisions and
    the stanza that says which node serves which, as the shared node agent's entry would."""
    old, new = Profile.from_body(BODY), Profile.from_body(copy.deepcopy(BODY))
    new.spec["plugin"]["sharing"]["replicas"] = 3  # type: ignore[index]
    stanza = Rollout(spec_revision(old.spec), spec_revision(new.spec), threshold=5)
    cm, _ = render.agent_objects(new, SETTINGS, None, lambda _p: (old, stanza))[:2]
    (entry,) = yaml.safe_load(cm["data"]["node.yaml"])["profiles"]
    assert entry == render.node_entry(new, None, old, stanza)
    assert entry["rollout"]["threshold"] == 5 and set(entry["revisions"]) == {stanza.current}


def test_owner_reference_points_at_the_profile() -> None:
    for obj in objects():
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref == {
            "apiVersion": "patchbay.dev/v1beta1",
            "kind": "DevicePluginProfile",
            "name": "serial",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }


def test_the_pod_template_depends_on_the_agent_settings_not_the_plugin() -> None:
    """A change of `spec.plugin` (or node groups) leaves the pod template as it is (the agents
    take it live, wave by wave); a change of `spec.agent` changes it (the DaemonSet rolls)."""
    _, ds = objects()
    changed = copy.deepcopy(BODY)
    changed["spec"]["plugin"]["sharing"]["replicas"] = 2
    changed["spec"]["nodeGroups"] = [
        {"name": "g", "nodeSelector": {"matchLabels": {"g": "1"}}, "plugin": {"health": {"interval": "5s"}}}
    ]
    cm2, ds2 = objects(changed)
    agent_only = copy.deepcopy(BODY)
    agent_only["spec"]["agent"]["priorityClassName"] = "system-node-critical"
    _, ds3 = objects(agent_only)
    assert ds2["spec"]["template"] == ds["spec"]["template"]
    assert cm2["data"] != objects()[0]["data"]
    assert CONFIG_HASH_ANNOTATION not in (ds["spec"]["template"]["metadata"].get("annotations") or {})
    assert ds3["spec"]["template"] != ds["spec"]["template"]
    assert ds3["spec"]["template"]["spec"]["priorityClassName"] == "system-node-critical"


def test_daemonset_is_hardened_and_surges() -> None:
    _, ds = objects()
    spec = ds["spec"]
    assert spec["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert c["image"] == "example.invalid/agent:1"
    assert c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert c["command"] == [
        "patchbay-agent",
        "--watch-config",
        "patchbay-serial",
        "--node-config",
        "/etc/patchbay/node.yaml",
        "--node-name",
        "$(NODE_NAME)",
        "--device-plugin-dir",
        "/var/lib/kubelet/device-plugins",
        "--host-root",
        "/host",
        "--inventory-rescan",
        "0",
        "--report-namespace",
        "$(POD_NAMESPACE)",
        "--pod-name",
        "$(POD_NAME)",
        "--pod-resources-socket",
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        "--http-address",
        "0.0.0.0:9464",
    ]
    # The agent's own ServiceAccount, with the kubelet's pod-bound token (it names the node).
    assert pod["serviceAccountName"] == "patchbay-agent"
    assert pod["automountServiceAccountToken"] is True
    assert {e["name"] for e in c["env"]} == {
        "NODE_NAME",
        "POD_NAME",
        "POD_NAMESPACE",
        "PATCHBAY_DAEMONSET_SELECTOR",
    }
    # Probes on the agent's own endpoint: ready means registered with the kubelet.
    assert c["ports"] == [{"name": "metrics", "containerPort": 9464, "protocol": "TCP"}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in c["volumeMounts"]}
    assert mounts["/var/lib/kubelet/device-plugins"] is False
    assert mounts["/host/dev"] is True and mounts["/host/sys"] is True and mounts["/etc/patchbay"] is True
    host_paths = sorted(v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v)
    assert host_paths == ["/dev", "/sys", "/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [{"matchExpressions": [{"key": "serial", "operator": "Exists"}]}]
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()


def test_privileged_only_when_asked() -> None:
    body = copy.deepcopy(BODY)
    body["spec"]["agent"]["privileged"] = True
    _, ds = objects(body)
    assert ds["spec"]["template"]["spec"]["containers"][0]["securityContext"] == {"privileged": True}


def test_defaults_without_agent_section() -> None:
    body = copy.deepcopy(BODY)
    del body["spec"]["agent"]
    body["spec"].pop("nodeSelector")
    _, ds = objects(body)
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert "affinity" not in ds["spec"]["template"]["spec"]
    assert ds["spec"]["template"]["spec"]["containers"][0]["resources"] == render.DEFAULT_RESOURCES


def test_templates_are_strict() -> None:
    with pytest.raises(jinja2.UndefinedError):
        render._env().get_template("configmap.yaml.j2").render(name="x")


def test_daemonset_command_is_one_the_agent_accepts() -> None:
    """The contract in the other direction: the agent's own parser accepts the rendered command."""
    from patchbay_agent.options import build_parser

    _, ds = objects()
    command = ds["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[0] == "patchbay-agent"
    # The kubelet expands $(VAR) from the container's env; do what it would do with these.
    env = {"NODE_NAME": "node-1", "POD_NAME": "agent-abcde", "POD_NAMESPACE": "patchbay-system"}
    expanded = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in command[1:]]
    args = build_parser().parse_args(expanded)
    assert args.http_address == ("0.0.0.0", 9464)
    assert str(args.device_plugin_dir) == "/var/lib/kubelet/device-plugins"


def test_the_agent_finds_its_successor_by_exactly_its_daemonsets_selector() -> None:
    """The agent reads its DaemonSet's selector from PATCHBAY_DAEMONSET_SELECTOR (its successor on
    the node is another pod it selects: plugin-agent's successor.py); both agents' selectors, as
    the agent's own parser reads them, are the DaemonSets' matchLabels, and they select no pod of
    the other DaemonSet."""
    from patchbay_agent.options import build_parser, label_selector

    def selector(ds: dict[str, object]) -> dict[str, str]:
        (c,) = ds["spec"]["template"]["spec"]["containers"]  # type: ignore[index]
        text = {e["name"]: e.get("value") for e in c["env"]}["PATCHBAY_DAEMONSET_SELECTOR"]
        return dict(term.split("=", 1) for term in label_selector(text).split(","))

    _, own = objects()
    _, shared = render.shared_agent_objects([(Profile.from_body(BODY), None)], Settings())
    for ds in (own, shared):
        assert selector(ds) == ds["spec"]["selector"]["matchLabels"]
    assert not selector(own).items() <= shared["spec"]["template"]["metadata"]["labels"].items()
    assert not selector(shared).items() <= own["spec"]["template"]["metadata"]["labels"].items()
    assert build_parser().parse_args(["--config", "c", "--node-name", "n"]).successor_wait == 10.0


def test_agents_reach_the_api_server_and_the_kubelet_where_the_settings_say() -> None:
    settings = Settings(agent_api_server=("10.244.0.1", 6443), kubelet_root_dir="/var/snap/k8s/kubelet")
    _, ds = render.agent_objects(Profile.from_body(BODY), settings)
    pod = ds["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("10.244.0.1", "6443")
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths["pod-resources"] == "/var/snap/k8s/kubelet/pod-resources"


def test_the_cdi_spec_directory_is_mounted_only_for_profiles_with_a_cdi_kind() -> None:
    """With allocation.cdi the agent writes the spec behind its CDI names into the runtime's
    directory (settings: cdi_spec_dir), seen at /var/run/cdi in the pod; without it, no mount."""
    from patchbay_agent.options import build_parser

    body = copy.deepcopy(BODY)
    body["spec"]["plugin"]["allocation"]["cdi"] = {"kind": "example.com/serial"}
    settings = Settings(cdi_spec_dir="/run/containerd-cdi")
    _, ds = render.agent_objects(Profile.from_body(body), settings)
    pod = ds["spec"]["template"]["spec"]
    host_paths = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths["cdi-specs"] == {"path": "/run/containerd-cdi", "type": "DirectoryOrCreate"}
    (container,) = pod["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["cdi-specs"] == {"name": "cdi-specs", "mountPath": "/var/run/cdi"}
    env = {"NODE_NAME": "n", "POD_NAME": "p", "POD_NAMESPACE": "ns"}
    args = build_parser().parse_args(
        [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["command"][1:]]
    )
    assert str(args.cdi_spec_dir) == "/var/run/cdi"

    _, plain = render.agent_objects(Profile.from_body(BODY), settings)
    plain_pod = plain["spec"]["template"]["spec"]
    assert "cdi-specs" not in {v["name"] for v in plain_pod["volumes"]}
    assert "--cdi-spec-dir" not in plain_pod["containers"][0]["command"]
