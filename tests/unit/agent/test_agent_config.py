"""The agent's config: what the operator renders parses; bad input names the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from patchbay_agent.config import (
    AgentConfig,
    ConfigError,
    NvmlDiscovery,
    PathGroup,
    PathsDiscovery,
    PciDiscovery,
    PreferredPolicy,
    UsbDiscovery,
    VirtualDiscovery,
    load,
    parse,
)

FULL = """
resourceName: example.com/serial
plugin:
  discovery:
    paths:
      globs: ["/dev/ttyUSB*"]
      groups:
        - id: card0
          paths: ["/dev/dri/card0", "/dev/dri/renderD128"]
  sharing: {replicas: 2}
  health:
    periodSeconds: 7
    failureThreshold: 4
    successThreshold: 2
    exec: {command: ["/bin/check", "-q"], timeoutSeconds: 3}
  allocation:
    permissions: "rwm"
    devicesEnvName: MY_DEVICES
    envs: {FOO: "bar"}
    mounts:
      - {hostPath: /opt/lib, containerPath: /usr/local/lib/dev, readOnly: true}
    annotations: {example.com/key: value}
    cdi: {kind: example.com/serial}
  preferredAllocation: {policy: Pack}
  preStart: {command: ["/bin/reset-device"], timeoutSeconds: 10}
"""


def test_full_contract_example_parses(tmp_path: Path) -> None:
    f = tmp_path / "config.yaml"
    f.write_text(FULL)
    cfg = load(f)
    assert cfg.resource_name == "example.com/serial"
    assert cfg.discovery == PathsDiscovery(
        globs=("/dev/ttyUSB*",), groups=(PathGroup("card0", ("/dev/dri/card0", "/dev/dri/renderD128")),)
    )
    assert cfg.replicas == 2
    assert (cfg.health.period_seconds, cfg.health.failure_threshold, cfg.health.success_threshold) == (
        7,
        4,
        2,
    )
    assert cfg.health.exec is not None
    assert cfg.health.exec.command == ("/bin/check", "-q")
    assert cfg.allocation.permissions == "rwm"
    assert cfg.allocation.devices_env_name == "MY_DEVICES"
    assert dict(cfg.allocation.envs) == {"FOO": "bar"}
    assert cfg.allocation.mounts[0].container_path == "/usr/local/lib/dev"
    assert cfg.allocation.cdi_kind == "example.com/serial"
    assert cfg.preferred_policy is PreferredPolicy.PACK
    assert cfg.pre_start is not None
    assert cfg.pre_start.timeout_seconds == 10


def test_defaults_when_sections_are_absent() -> None:
    cfg = parse({"resourceName": "example.com/token", "plugin": {"discovery": {"virtual": {"count": 4}}}})
    assert cfg == AgentConfig(resource_name="example.com/token", discovery=VirtualDiscovery(4))
    assert cfg.health.period_seconds == 5
    assert cfg.health.failure_threshold == 3
    assert cfg.health.success_threshold == 1
    assert cfg.allocation.permissions == "rw"
    assert cfg.allocation.devices_env_name == "PATCHBAY_DEVICES"
    assert cfg.preferred_policy is PreferredPolicy.NONE
    assert cfg.pre_start is None


@pytest.mark.parametrize(
    ("discovery", "expected"),
    [
        (
            {"pci": {"vendor": "10DE", "device": "2330", "class": "0x0302", "vfio": True}},
            PciDiscovery("10de", "2330", "0x0302", True),
        ),
        ({"usb": {"vendor": "1234", "product": "ABCD", "serial": "A1"}}, UsbDiscovery("1234", "abcd", "A1")),
        ({"nvml": {}}, NvmlDiscovery()),
    ],
)
def test_each_backend_parses(discovery: dict[str, Any], expected: object) -> None:
    cfg = parse({"resourceName": "example.com/x", "plugin": {"discovery": discovery}})
    assert cfg.discovery == expected


def _with(plugin: dict[str, Any], resource: str = "example.com/x") -> dict[str, Any]:
    base: dict[str, Any] = {"discovery": {"virtual": {"count": 1}}}
    base.update(plugin)
    return {"resourceName": resource, "plugin": base}


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"plugin": {"discovery": {"virtual": {"count": 1}}}}, "resourceName"),
        (_with({}, resource="dongle"), "resourceName"),
        (_with({}, resource="kubernetes.io/dongle"), "resourceName"),
        (_with({}, resource="Example.com/dongle"), "resourceName"),
        ({"resourceName": "example.com/x", "plugin": {}}, "plugin.discovery"),
        (_with({"discovery": {"virtual": {"count": 1}, "usb": {"vendor": "1234"}}}), "plugin.discovery"),
        (_with({"discovery": {"virtual": {"count": 0}}}), "plugin.discovery.virtual.count"),
        (_with({"discovery": {"virtual": {"count": True}}}), "plugin.discovery.virtual.count"),
        (_with({"discovery": {"pci": {"vendor": "10de0"}}}), "plugin.discovery.pci.vendor"),
        (_with({"discovery": {"pci": {"vendor": "10de", "vfio": "yes"}}}), "plugin.discovery.pci.vfio"),
        (_with({"discovery": {"usb": {}}}), "plugin.discovery.usb.vendor"),
        (_with({"discovery": {"paths": {}}}), "plugin.discovery.paths"),
        (_with({"discovery": {"paths": {"globs": ["/etc/passwd"]}}}), "plugin.discovery.paths.globs[0]"),
        (_with({"discovery": {"paths": {"globs": ["/dev/../etc/x"]}}}), "plugin.discovery.paths.globs[0]"),
        (
            _with({"discovery": {"paths": {"groups": [{"id": "a b", "paths": ["/dev/a"]}]}}}),
            "plugin.discovery.paths.groups[0].id",
        ),
        (
            _with({"discovery": {"paths": {"groups": [{"id": "a", "paths": []}]}}}),
            "plugin.discovery.paths.groups[0].paths",
        ),
        (
            _with(
                {
                    "discovery": {
                        "paths": {
                            "groups": [{"id": "a", "paths": ["/dev/a"]}, {"id": "a", "paths": ["/dev/b"]}]
                        }
                    }
                }
            ),
            "plugin.discovery.paths.groups[1].id",
        ),
        (_with({"sharing": {"replicas": 0}}), "plugin.sharing.replicas"),
        (_with({"health": {"periodSeconds": 0}}), "plugin.health.periodSeconds"),
        (_with({"health": {"failureThreshold": "3"}}), "plugin.health.failureThreshold"),
        (_with({"health": {"exec": {"command": []}}}), "plugin.health.exec.command"),
        (_with({"allocation": {"permissions": "rx"}}), "plugin.allocation.permissions"),
        (_with({"allocation": {"permissions": "rr"}}), "plugin.allocation.permissions"),
        (_with({"allocation": {"permissions": ""}}), "plugin.allocation.permissions"),
        (_with({"allocation": {"devicesEnvName": "1BAD"}}), "plugin.allocation.devicesEnvName"),
        (
            _with({"allocation": {"envs": {"PATCHBAY_DEVICES": "x"}}}),
            "plugin.allocation.envs.PATCHBAY_DEVICES",
        ),
        (_with({"allocation": {"envs": {"A": 1}}}), "plugin.allocation.envs.A"),
        (
            _with({"allocation": {"mounts": [{"hostPath": "rel", "containerPath": "/x"}]}}),
            "plugin.allocation.mounts[0].hostPath",
        ),
        (_with({"allocation": {"cdi": {"kind": "nokind"}}}), "plugin.allocation.cdi.kind"),
        (_with({"preferredAllocation": {"policy": "pack"}}), "plugin.preferredAllocation.policy"),
        (_with({"preStart": {"command": "/bin/x"}}), "plugin.preStart.command"),
        (_with({"unknownThing": 1}), "plugin.unknownThing"),
        # false or 0 is not an empty list (tests/fuzz/test_fuzz_config.py found them accepted)
        (_with({"allocation": {"mounts": False}}), "plugin.allocation.mounts"),
        (
            _with({"discovery": {"paths": {"globs": 0, "groups": [{"id": "a", "paths": ["/dev/a"]}]}}}),
            "plugin.discovery.paths.globs",
        ),
        (_with({"health": {"periodseconds": 5}}), "plugin.health.periodseconds"),
    ],
)
def test_bad_config_names_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse(raw)
    assert exc.value.field == field
    assert str(exc.value).startswith(field + ": ")


def test_a_json_config_is_read_without_yaml_and_a_yaml_one_the_same(tmp_path: Path) -> None:
    """What the operator writes (JSON) is read by `json` alone: PyYAML is not even imported (its
    import was a tenth of the agent's start). The same document as YAML, and a YAML flow mapping
    that looks like JSON but is not, give the same config."""
    doc = yaml.safe_load(FULL)
    (tmp_path / "agent.json").write_text(json.dumps(doc, indent=2))
    (tmp_path / "agent.yaml").write_text(FULL)
    flow = tmp_path / "flow.yaml"
    flow.write_text(
        "{resourceName: example.com/serial,\n plugin: {discovery: {paths: {globs: [/dev/ttyUSB*]}}}}\n"
    )
    probe = (
        "import sys; from patchbay_agent.config import load; "
        f"c = load({str(tmp_path / 'agent.json')!r}); "
        "print(c.resource_name, 'yaml' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["example.com/serial", "False"]
    assert load(tmp_path / "agent.json") == load(tmp_path / "agent.yaml")
    assert load(flow).discovery == PathsDiscovery(globs=("/dev/ttyUSB*",))


def test_unreadable_and_invalid_yaml_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("resourceName: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match="empty"):
        load(empty)


def test_contract_document_example_is_accepted() -> None:
    """The YAML block in docs/design/profile-contract.md (minus the one-backend rule) parses."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "design" / "profile-contract.md").read_text()
    block = doc.split("```yaml\nplugin:", 1)[1].split("```", 1)[0]
    plugin = yaml.safe_load("plugin:" + block)["plugin"]
    # The contract lists every backend to document them; a real profile has exactly one.
    for backend in ("pci", "usb", "virtual", "nvml"):
        plugin["discovery"].pop(backend)
    cfg = parse({"resourceName": "example.com/serial", "plugin": plugin})
    assert isinstance(cfg.discovery, PathsDiscovery)
    assert cfg.preferred_policy is PreferredPolicy.NONE


def test_the_taint_effect_is_one_of_the_apis_and_named_when_not() -> None:
    base = {"resourceName": "example.com/x", "plugin": {"discovery": {"virtual": {"count": 1}}}}
    assert parse(base).health.taint_effect == "NoSchedule"
    for effect in ("None", "NoSchedule", "NoExecute"):
        doc = {**base, "plugin": {**base["plugin"], "health": {"taintEffect": effect}}}
        assert parse(doc).health.taint_effect == effect
    bad = {**base, "plugin": {**base["plugin"], "health": {"taintEffect": "Evict"}}}
    with pytest.raises(ConfigError, match=r"plugin\.health\.taintEffect: 'Evict' must be one of"):
        parse(bad)


def test_the_recovery_hold_defaults_to_ten_seconds_and_a_bad_one_is_named() -> None:
    base = {"resourceName": "example.com/x", "plugin": {"discovery": {"virtual": {"count": 1}}}}
    assert parse(base).health.recovery_hold_seconds == 10
    for hold in (0, 45):
        doc = {**base, "plugin": {**base["plugin"], "health": {"recoveryHoldSeconds": hold}}}
        assert parse(doc).health.recovery_hold_seconds == hold
    for bad, words in ((-1, "must be >= 0, got -1"), ("10s", "must be an integer, got '10s'")):
        doc = {**base, "plugin": {**base["plugin"], "health": {"recoveryHoldSeconds": bad}}}
        with pytest.raises(ConfigError, match=rf"plugin\.health\.recoveryHoldSeconds: {words}"):
            parse(doc)
