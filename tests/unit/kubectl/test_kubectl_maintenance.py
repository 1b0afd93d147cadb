"""The DeviceTaintRules `kubectl patchbay cordon|drain|uncordon` write, and the input checks (pure)."""

from __future__ import annotations

import pytest

from patchbay_kubectl import maintenance as m
from patchbay_kubectl.views.devices import device_rows
from patchbay_kubectl.views.objects import Inputs


def test_the_rule_selects_the_profiles_pool_on_the_node_and_one_device_or_all() -> None:
    one = m.rule(
        "serial.node-1.ttyusb0", "serial.patchbay.dev", "node-1", "ttyusb0", effect="NoExecute", reason=""
    )
    assert one["spec"] == {
        "deviceSelector": {"driver": "serial.patchbay.dev", "pool": "node-1", "device": "ttyusb0"},
        "taint": {"key": "patchbay.dev/maintenance", "effect": "NoExecute"},
    }
    every = m.rule("serial.node-1", "serial.patchbay.dev", "node-1", None, effect="None", reason="firmware")
    assert every["spec"]["deviceSelector"] == {"driver": "serial.patchbay.dev", "pool": "node-1"}
    assert every["spec"]["taint"]["value"] == "firmware"
    assert m.same_target(one, one) and not m.same_target(one, every)


def test_names_are_readable_and_never_too_long() -> None:
    assert m.rule_name("serial", "node-1", None) == "serial.node-1"
    assert m.rule_name("serial", "node-1", "ttyusb0") == "serial.node-1.ttyusb0"
    long_node = "n" * 250
    name = m.rule_name("serial", long_node, "ttyusb0")
    assert len(name) <= 253 and name.startswith("serial.")
    assert name != m.rule_name("serial", long_node, "ttyusb1")


def test_bad_input_names_the_flag() -> None:
    slices = [
        {
            "spec": {
                "devices": [
                    {"name": "ttyusb0-1a2b", "attributes": {"patchbay.dev/id": {"string": "ttyUSB0"}}},
                    {"name": "ttyusb1-3c4d", "attributes": {"patchbay.dev/id": {"string": "ttyUSB1"}}},
                ]
            }
        }
    ]
    known = m.slice_devices(slices)
    assert known == {"ttyusb0-1a2b": "ttyUSB0", "ttyusb1-3c4d": "ttyUSB1"}
    # The ID `kubectl patchbay devices` shows, or the slice's name: both name the device.
    assert m.resolve_device("ttyUSB1", known, "serial", "node-1") == "ttyusb1-3c4d"
    assert m.resolve_device("ttyusb0-1a2b", known, "serial", "node-1") == "ttyusb0-1a2b"
    assert m.resolve_device(None, known, "serial", "node-1") is None
    with pytest.raises(
        m.InputError, match=r"--device tty9: no such device .* \(its devices: ttyUSB0, ttyUSB1;"
    ):
        m.resolve_device("tty9", known, "serial", "node-1")
    # A partitioned device is several slice devices: one of them by name, never a guess.
    parts = {"fpga0-s0-0": "fpga0", "fpga0-s0-1": "fpga0"}
    assert m.resolve_device("fpga0-s0-1", parts, "fpga", "node-1") == "fpga0-s0-1"
    with pytest.raises(m.InputError, match=r"--device fpga0: .* as 2 partitions \(fpga0-s0-0, fpga0-s0-1\)"):
        m.resolve_device("fpga0", parts, "fpga", "node-1")
    with pytest.raises(m.InputError, match="--reason"):
        m.check_reason("has spaces")
    with pytest.raises(m.InputError, match="--reason"):
        m.check_reason("x" * 64)
    m.check_reason("")
    m.check_reason("firmware-2.1")


def test_the_controllers_answer_counts_only_for_the_current_spec() -> None:
    obj = {
        "metadata": {"generation": 2},
        "status": {"conditions": [{"type": "EvictionInProgress", "observedGeneration": 1, "message": "old"}]},
    }
    assert m.eviction(obj) is None
    obj["status"]["conditions"][0]["observedGeneration"] = 2
    assert (m.eviction(obj) or {})["message"] == "old"
    assert m.served({"resources": [{"name": "devicetaintrules"}]})
    assert not m.served({"resources": [{"name": "resourceslices"}]}) and not m.served(None)


def test_a_cordoned_or_drained_device_shows_as_maintenance_in_devices() -> None:
    profile = {"metadata": {"name": "serial"}, "spec": {"mode": "DRA", "resourceName": "example.com/serial"}}
    slc = {
        "spec": {
            "driver": "serial.patchbay.dev",
            "nodeName": "n1",
            "pool": {"name": "n1"},
            "devices": [
                {"name": "tty0", "attributes": {"patchbay.dev/id": {"string": "ttyUSB0"}}},
                {"name": "tty1", "attributes": {"patchbay.dev/id": {"string": "ttyUSB1"}}},
                {
                    "name": "tty2",
                    "attributes": {"patchbay.dev/id": {"string": "ttyUSB2"}},
                    "taints": [{"key": "patchbay.dev/vanished", "value": "Vanished", "effect": "NoSchedule"}],
                },
            ],
        }
    }
    drain = m.rule("serial.n1", "serial.patchbay.dev", "n1", None, effect="NoExecute", reason="")
    preview = m.rule("serial.n1.tty1", "serial.patchbay.dev", "n1", "tty1", effect="None", reason="")
    other = m.rule("gpu.n1", "gpu.example.com", "n1", None, effect="NoExecute", reason="")
    rows = device_rows(Inputs(profiles=[profile], slices=[slc], rules=[preview, other]))
    assert [r.health for r in rows] == ["Healthy", "Healthy", "Unhealthy"]  # a preview changes nothing
    rows = device_rows(Inputs(profiles=[profile], slices=[slc], rules=[drain, preview]))
    assert [(r.device, r.health, r.reason) for r in rows] == [
        ("ttyUSB0", "Maintenance", "NoExecute"),
        ("ttyUSB1", "Maintenance", "NoExecute"),
        ("ttyUSB2", "Unhealthy", "Vanished"),  # sick first: its fault is what matters
    ]
    assert rows[0].message == "DeviceTaintRule serial.n1" and rows[0].source == "DeviceTaintRule"
    unhealthy = device_rows(Inputs(profiles=[profile], slices=[slc], rules=[drain]), unhealthy=True)
    assert len(unhealthy) == 3
