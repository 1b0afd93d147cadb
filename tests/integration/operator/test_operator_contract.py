"""The profile contract end to end: what the API server stores (defaults applied), rendered by the
operator into the agent's ConfigMap, must be accepted by the agent's own parser
(`patchbay_agent.config.parse`), for every discovery backend and every optional section."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from kubernetes import client
from support.clusters import GROUP, PLURAL, VERSION

from patchbay_agent.config import parse
from patchbay_operator.config import Settings
from patchbay_operator.profiles import Profile
from patchbay_operator.render import agent_objects

FULL_PLUGIN: dict[str, Any] = {
    "sharing": {"replicas": 3},
    "health": {
        "periodSeconds": 2,
        "failureThreshold": 2,
        "successThreshold": 2,
        "exec": {"command": ["/bin/check", "--fast"], "timeoutSeconds": 1},
    },
    "allocation": {
        "permissions": "rwm",
        "devicesEnvName": "MY_DEVICES",
        "envs": {"FOO": "bar"},
        "mounts": [{"hostPath": "/opt/lib", "containerPath": "/usr/local/lib/dev"}],
        "annotations": {"example.com/key": "value"},
        "cdi": {"kind": "example.com/serial"},
    },
    "preferredAllocation": {"policy": "Pack"},
    "preStart": {"command": ["/bin/reset-device"]},
}

DISCOVERY: dict[str, dict[str, Any]] = {
    "paths": {"paths": {"globs": ["/dev/ttyUSB*"], "groups": [{"id": "card0", "paths": ["/dev/dri/card0"]}]}},
    "pci": {"pci": {"vendor": "10de", "device": "2330", "class": "0x0302", "vfio": True}},
    "usb": {"usb": {"vendor": "1234", "product": "5678", "serial": "A1B2"}},
    "virtual": {"virtual": {"count": 8}},
    "nvml": {"nvml": {}},
}


@pytest.mark.parametrize("backend", sorted(DISCOVERY))
@pytest.mark.parametrize("full", [False, True], ids=["minimal", "every-section"])
def test_rendered_config_is_accepted_by_the_agent(
    api: client.ApiClient, crd: dict[str, Any], name_prefix: str, backend: str, full: bool
) -> None:
    plugin: dict[str, Any] = {"discovery": DISCOVERY[backend], **(FULL_PLUGIN if full else {})}
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DevicePluginProfile",
        "metadata": {"name": f"{name_prefix}{backend}"},
        "spec": {"resourceName": "example.com/dev", "mode": "DevicePlugin", "plugin": plugin},
    }
    stored = client.CustomObjectsApi(api).create_cluster_custom_object(
        GROUP, VERSION, PLURAL, body, dry_run="All"
    )
    configmap, _ = agent_objects(Profile.from_body(stored), Settings())
    (entry,) = yaml.safe_load(configmap["data"]["node.yaml"])["profiles"]
    config = parse({"resourceName": entry["resourceName"], "plugin": entry["plugin"]})
    assert config.resource_name == "example.com/dev"
    if full:
        assert config.replicas == 3
        assert config.pre_start is not None
        assert config.allocation.permissions == "rwm"
