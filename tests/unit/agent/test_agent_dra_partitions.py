"""DRA partitions (`plugin.partitions`): the config, the slices' counter sets and partition
devices, the probe that tells an API server that drops them, and what prepare hands the container.
Pure parts only; the API server's own validation of these documents is
tests/integration/agent/test_agent_dra_on_the_api_server.py, the scheduler's use of them
tests/e2e/test_dra_partitions_on_real_node.py."""

from __future__ import annotations

import re
from typing import Any

import pytest

from patchbay_agent.config import Allocation, ConfigError, Partitions, parse
from patchbay_agent.dra.claims import PARTITIONS_ENV, allocated_devices, claim_spec_document
from patchbay_agent.dra.slices import (
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_TAINTED_DEVICES_PER_SLICE,
    SliceDevice,
    device_name,
    partition_device_name,
    partitioned,
    partitions_kept,
    slice_documents,
    taint_probe_document,
)

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DRIVER = "serial.patchbay.dev"
DISCOVERY = {"paths": {"globs": ["/dev/ttyUSB*"]}}


def _config(partitions: Any, **plugin: Any) -> Any:
    return parse(
        {
            "resourceName": "example.com/x",
            "plugin": {"discovery": DISCOVERY, "partitions": partitions, **plugin},
        }
    )


def test_sizes_default_to_every_divisor_and_bad_ones_are_refused_naming_the_field() -> None:
    assert _config({"slots": 4}).partitions == Partitions(4, (1, 2, 4))
    assert _config({"slots": 6, "sizes": [3, 1]}).partitions == Partitions(6, (1, 3))
    assert _config(None).partitions is None
    for bad, field in [
        ({"slots": 4, "sizes": [1, 3]}, "plugin.partitions.sizes[1]"),
        ({"slots": 4, "sizes": [2, 2]}, "plugin.partitions.sizes[1]"),
        ({"slots": 4, "sizes": []}, "plugin.partitions.sizes"),
        ({"slots": 1}, "plugin.partitions.slots"),
        ({"slots": 33}, "plugin.partitions.slots"),
        ({"sizes": [1]}, "plugin.partitions.slots"),
        ({"slots": 4, "shapes": [1]}, "plugin.partitions.shapes"),
    ]:
        with pytest.raises(ConfigError) as e:
            _config(bad)
        assert e.value.field == field, (bad, e.value)
    with pytest.raises(ConfigError) as e:
        _config({"slots": 4}, sharing={"replicas": 2})
    assert e.value.field == "plugin.partitions" and "sharing.replicas" in str(e.value)


def test_places_are_aligned_to_their_size() -> None:
    assert Partitions(4, (1, 2, 4)).places() == [(1, 0), (1, 1), (1, 2), (1, 3), (2, 0), (2, 2), (4, 0)]


def test_partition_names_are_unique_dns_labels() -> None:
    ids = ["ttyUSB0", "ttyusb0", "x" * 80, "y" * 55, "a", "a-s0"]
    cut = Partitions(32, (1, 2, 4, 8, 16, 32))
    names = [
        partition_device_name(device_name(pid), size, first) for pid in ids for size, first in cut.places()
    ]
    assert len(set(names)) == len(names)
    for name in names:
        assert DNS_LABEL.fullmatch(name) and len(name) <= 63, name
    assert partition_device_name("sensor0", 2, 2) == "sensor0-s2-3"


def _devices(n: int) -> list[SliceDevice]:
    return [
        SliceDevice(f"d{i}", f"D{i}", {"patchbay.dev/id": {"string": f"D{i}"}}, capacity={"memory": 1000})
        for i in range(n)
    ]


def test_counter_sets_in_slices_of_their_own_and_partitions_that_consume_them() -> None:
    cut = Partitions(4, (1, 2, 4))
    docs = slice_documents(DRIVER, "node-1", partitioned(_devices(1), cut))
    counters, devices = docs
    # A slice has sharedCounters or devices, never both; the pool counts both.
    assert set(counters["spec"]) == {"driver", "nodeName", "pool", "sharedCounters"}
    assert set(devices["spec"]) == {"driver", "nodeName", "pool", "devices"}
    assert {d["spec"]["pool"]["resourceSliceCount"] for d in docs} == {2}
    assert counters["spec"]["sharedCounters"] == [
        {"name": "d0", "counters": {f"s{n}": {"value": "1"} for n in range(4)}}
    ]
    by_name = {d["name"]: d for d in devices["spec"]["devices"]}
    assert sorted(by_name) == sorted(
        ["d0-s0-0", "d0-s1-1", "d0-s2-2", "d0-s3-3", "d0-s0-1", "d0-s2-3", "d0-s0-3"]
    )
    half = by_name["d0-s2-3"]
    assert half["consumesCounters"] == [
        {"counterSet": "d0", "counters": {"s2": {"value": "1"}, "s3": {"value": "1"}}}
    ]
    assert half["attributes"]["patchbay.dev/slots"] == {"int": 2}
    assert half["attributes"]["patchbay.dev/firstSlot"] == {"int": 2}
    assert half["attributes"]["patchbay.dev/ofSlots"] == {"int": 4}
    assert half["attributes"]["patchbay.dev/parent"] == {"string": "d0"}
    assert half["attributes"]["patchbay.dev/id"] == {"string": "D0"}
    # Each capacity shared out by slots.
    assert half["capacity"] == {"patchbay.dev/memory": {"value": "500"}}
    assert by_name["d0-s0-3"]["capacity"] == {"patchbay.dev/memory": {"value": "1000"}}


def test_many_partitioned_devices_fill_8_counter_sets_and_64_devices_per_slice() -> None:
    docs = slice_documents(DRIVER, "node-1", partitioned(_devices(9), Partitions(4, (1, 2, 4))))
    sets = [len(d["spec"]["sharedCounters"]) for d in docs if "sharedCounters" in d["spec"]]
    assert sets == [MAX_COUNTER_SETS_PER_SLICE, 1]
    per_slice = [len(d["spec"]["devices"]) for d in docs if "devices" in d["spec"]]
    assert per_slice == [MAX_TAINTED_DEVICES_PER_SLICE] * (9 * 7 // 64) + [9 * 7 % 64]
    assert [d["metadata"]["name"] for d in docs] == [f"node-1-{DRIVER}-{n}" for n in range(len(docs))]


def test_the_probe_carries_a_counter_consumption_and_its_answer_is_read() -> None:
    probe = taint_probe_document(DRIVER, "node-1")
    assert partitions_kept(probe)
    (device,) = probe["spec"]["devices"]
    assert "sharedCounters" not in probe["spec"]  # never both in one slice
    dropped = {k: v for k, v in device.items() if k != "consumesCounters"}
    assert not partitions_kept({"spec": {"devices": [dropped]}})
    assert not partitions_kept({})


def test_prepare_names_the_partition_and_its_place_in_the_env() -> None:
    from patchbay_agent.core.inventory import Snapshot  # noqa: F401 - the type the maps come from
    from patchbay_agent.dra.slices import Place

    places = {"tty0-s2-3": Place(2, 2, 4, "tty0"), "tty0-s0-0": Place(1, 0, 4, "tty0")}
    names = {"tty0": "ttyUSB0", "tty0-s2-3": "ttyUSB0", "tty0-s0-0": "ttyUSB0"}
    claim = {
        "metadata": {"uid": "u1"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "a", "driver": DRIVER, "pool": "n", "device": "tty0-s2-3"},
                        {"request": "b", "driver": DRIVER, "pool": "n", "device": "tty0-s0-0"},
                    ]
                }
            }
        },
    }
    devices = allocated_devices(claim, "u1", DRIVER, "n", names, places=places)
    assert [(d.physical_id, d.place) for d in devices] == [
        ("ttyUSB0", places["tty0-s2-3"]),
        ("ttyUSB0", places["tty0-s0-0"]),
    ]
    doc = claim_spec_document(DRIVER, "u1", devices, {}, Allocation(devices_env_name="SERIALS"))
    assert doc["containerEdits"]["env"] == [
        "SERIALS=ttyUSB0",
        f"{PARTITIONS_ENV}=ttyUSB0:2-3/4,ttyUSB0:0-0/4",
    ]
    # A whole device (the API server dropped the counters) has no partition env.
    whole = {
        **claim,
        "status": {
            "allocation": {
                "devices": {"results": [{"request": "a", "driver": DRIVER, "pool": "n", "device": "tty0"}]}
            }
        },
    }
    doc = claim_spec_document(
        DRIVER, "u1", allocated_devices(whole, "u1", DRIVER, "n", names, places=places), {}, Allocation()
    )
    assert not any(e.startswith(PARTITIONS_ENV) for e in doc["containerEdits"]["env"])
