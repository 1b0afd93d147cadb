"""Least host access for a DRA agent of its own: its DaemonSet mounts only its driver's directory
under the kubelet's plugins directory, the one the agent makes its socket in. The operator and the
agent compute that directory each on its own side; this keeps them equal (short and long driver
names, short and long kubelet root directories)."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchbay_agent.dra.plugin import service_dir
from patchbay_operator import render
from patchbay_operator.config import Settings
from patchbay_operator.profiles import Profile


@pytest.mark.parametrize("root", ["/var/lib/kubelet", "/var/lib/" + "k" * 40, "/x"])
@pytest.mark.parametrize(
    "driver", ["dra.patchbay.dev", "a-rather-long-profile-name-of-fifty-characters-xx.patchbay.dev"]
)
def test_the_operator_mounts_the_directory_the_agent_uses(root: str, driver: str) -> None:
    assert render.dra_service_dir(root, driver) == str(service_dir(Path(root), driver))


def _mounts(ds: dict[str, object]) -> dict[str, str]:
    pod = ds["spec"]["template"]["spec"]  # type: ignore[index]
    return {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}  # type: ignore[index]


def test_an_own_dra_agent_mounts_its_driver_directory_and_the_shared_one_all() -> None:
    body = {
        "apiVersion": "patchbay.dev/v1alpha1",
        "kind": "DevicePluginProfile",
        "metadata": {"name": "sensors", "uid": "u", "generation": 1},
        "spec": {
            "resourceName": "example.com/sensor",
            "mode": "DRA",
            "plugin": {"discovery": {"virtual": {"count": 1}}},
            "agent": {"resources": {"limits": {"memory": "64Mi"}}},
        },
    }
    settings = Settings()
    own = render.agent_objects(Profile.from_body(body), settings)[1]
    assert _mounts(own)["kubelet-plugins"] == "/var/lib/kubelet/plugins/sensors.patchbay.dev"
    shared_body = {**body, "spec": {k: v for k, v in body["spec"].items() if k != "agent"}}  # type: ignore[union-attr]
    shared = render.shared_agent_objects([(Profile.from_body(shared_body), None)], settings)[1]
    assert _mounts(shared)["kubelet-plugins"] == "/var/lib/kubelet/plugins"
