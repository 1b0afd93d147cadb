"""DRA mode's pure parts: device names, ResourceSlice documents, claim allocations and CDI specs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from support.reports import node_owner

from patchbay_agent.config import Allocation, Mount
from patchbay_agent.core.health import DeviceHealthTracker
from patchbay_agent.core.inventory import Inventory
from patchbay_agent.discovery import PhysicalDevice
from patchbay_agent.dra.claims import (
    ClaimError,
    allocated_devices,
    check_claim_name,
    check_claim_uid,
    claim_spec_document,
    spec_file_name,
)
from patchbay_agent.dra.slices import (
    CHECKED_PREFIX,
    MAX_DEVICES_PER_SLICE,
    MAX_TAINTED_DEVICES_PER_SLICE,
    PoolDevices,
    SliceDevice,
    device_name,
    fault_taint_key,
    is_dns_subdomain,
    label_value,
    lost_taints,
    published,
    sharing_kept,
    slice_base_name,
    slice_devices,
    slice_documents,
    taint_probe_document,
    taints_kept,
    with_generation,
)
from patchbay_agent.kubelet.draplugin import registry_socket_name, service_dir

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DRIVER = "serial.patchbay.dev"


def test_device_names_are_dns_labels_and_unique() -> None:
    assert device_name("tty1") == "tty1"
    assert device_name("usb-1-1.2").startswith("usb-1-1-2-")
    names = {device_name(i) for i in ("ttyUSB0", "ttyusb0", "0000:3b:00.0", "0000-3b-00-0", "x" * 80)}
    assert len(names) == 5
    for name in names:
        assert DNS_LABEL.fullmatch(name) and len(name) <= 63, name
    assert device_name("ttyusb0") == "ttyusb0"  # already a label: kept as it is
    assert device_name("ttyUSB0") != "ttyusb0"


def test_slice_names_fit_the_api() -> None:
    assert slice_base_name("node-1", DRIVER) == f"node-1-{DRIVER}"
    long = slice_base_name("n" * 250, DRIVER)
    assert len(long) <= 248 and is_dns_subdomain(long)
    assert long != slice_base_name("n" * 249, DRIVER)
    # What the chart's slice policy checks of a shortened name: its first CHECKED_PREFIX characters.
    for node in ("n" * 250, "a." * 120 + "b", "x-" * 110 + "y" * 20):
        assert slice_base_name(node, DRIVER).startswith(f"{node}-{DRIVER}"[:CHECKED_PREFIX])
    policy = (Path(__file__).parents[3] / "charts/patchbay/templates/agents.yaml").read_text()
    assert f"substring(0, {CHECKED_PREFIX})" in policy and "> 248" in policy


def _devices(n: int, tainted: int = -1) -> list[SliceDevice]:
    return [
        SliceDevice(
            f"d{i}", f"D{i}", {"patchbay.dev/id": {"string": f"D{i}"}}, "Vanished" if i == tainted else None
        )
        for i in range(n)
    ]


def test_one_slice_up_to_128_devices_then_chunks() -> None:
    (only,) = slice_documents(DRIVER, "node-1", _devices(MAX_DEVICES_PER_SLICE), node_uid="uid-1")
    assert only["metadata"] == {
        "name": f"node-1-{DRIVER}",
        "ownerReferences": [node_owner("node-1", "uid-1")],
    }
    assert only["spec"]["pool"] == {"name": "node-1", "generation": 0, "resourceSliceCount": 1}
    assert only["spec"]["driver"] == DRIVER and only["spec"]["nodeName"] == "node-1"
    docs = slice_documents(DRIVER, "node-1", _devices(MAX_DEVICES_PER_SLICE + 1))
    assert [d["metadata"]["name"] for d in docs] == [f"node-1-{DRIVER}-0", f"node-1-{DRIVER}-1"]
    assert [len(d["spec"]["devices"]) for d in docs] == [128, 1]
    assert {d["spec"]["pool"]["resourceSliceCount"] for d in docs} == {2}
    assert "ownerReferences" not in docs[0]["metadata"]


def test_a_tainted_pool_is_cut_into_64_device_slices() -> None:
    docs = slice_documents(DRIVER, "node-1", _devices(100, tainted=70))
    assert [len(d["spec"]["devices"]) for d in docs] == [MAX_TAINTED_DEVICES_PER_SLICE, 36]
    tainted = [dev for d in docs for dev in d["spec"]["devices"] if "taints" in dev]
    assert tainted == [
        {
            "name": "d70",
            "attributes": {"patchbay.dev/id": {"string": "D70"}},
            "taints": [{"key": "patchbay.dev/vanished", "value": "Vanished", "effect": "NoSchedule"}],
        }
    ]


def test_no_device_is_one_empty_slice_and_generation_is_set_apart() -> None:
    docs = slice_documents(DRIVER, "node-1", [])
    assert len(docs) == 1 and docs[0]["spec"]["devices"] == []
    (with_gen,) = with_generation(docs, 1234)
    assert with_gen["spec"]["pool"]["generation"] == 1234
    assert docs[0]["spec"]["pool"]["generation"] == 0  # not changed in place


def test_the_taint_probe_and_what_its_answer_says() -> None:
    probe = taint_probe_document(DRIVER, "node-1")
    # Named with the node's own slice prefix (the admission policy checks it), never a chunk's name.
    assert probe["metadata"] == {"name": f"node-1-{DRIVER}-dry"}
    long_node = "n" * 240
    assert len(taint_probe_document(DRIVER, long_node)["metadata"]["name"]) <= 253
    spec = probe["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == (DRIVER, "node-1", "node-1")
    (device,) = spec["devices"]
    assert device["taints"] == [{"key": "patchbay.dev/probe", "value": "dry-run", "effect": "NoSchedule"}]
    assert taints_kept(probe)
    # What an API server with DRADeviceTaints off answers: the same slice without the taint.
    dropped = {**probe, "spec": {**spec, "devices": [{"name": "probe"}]}}
    assert not taints_kept(dropped)
    assert not taints_kept({})


def test_a_shared_device_allows_multiple_allocations_of_whole_shares() -> None:
    """sharing.replicas > 1 in DRA mode: the device may go to several claims, each taking one
    `patchbay.dev/shares` unless it asks for more, never more than all; the probe carries the
    same fields, and an API server that drops them (DRAConsumableCapacity off) is told apart."""
    (shared,) = slice_documents(DRIVER, "node-1", [SliceDevice("d0", "D0", {}, shares=4)])
    (device,) = shared["spec"]["devices"]
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"] == {
        "patchbay.dev/shares": {
            "value": "4",
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}},
        }
    }
    # Unshared (the default) and with a capacity of its own (a GPU's memory): no shares.
    (plain,) = slice_documents(DRIVER, "node-1", [SliceDevice("d0", "D0", {}, capacity={"memory": 8})])
    (device,) = plain["spec"]["devices"]
    assert "allowMultipleAllocations" not in device
    assert device["capacity"] == {"patchbay.dev/memory": {"value": "8"}}
    probe = taint_probe_document(DRIVER, "node-1")
    assert sharing_kept(probe)
    (probe_device,) = probe["spec"]["devices"]
    dropped = {k: v for k, v in probe_device.items() if k != "allowMultipleAllocations"}
    dropped["capacity"] = {"patchbay.dev/shares": {"value": "2"}}  # requestPolicy dropped too
    assert not sharing_kept({"spec": {"devices": [dropped]}})
    assert not sharing_kept({})


def test_allocated_devices_carry_the_share_of_a_shared_device() -> None:
    claim = _claim(
        "u1",
        [
            {"request": "a", "driver": DRIVER, "pool": "node-1", "device": "tty0", "shareID": "s-1"},
            {"request": "b", "driver": DRIVER, "pool": "node-1", "device": "tty0"},
        ],
    )
    got = allocated_devices(claim, "u1", DRIVER, "node-1", {"tty0": "ttyUSB0"})
    assert [(d.request, d.share_id) for d in got] == [("a", "s-1"), ("b", "")]


def test_lost_taints_names_the_devices_whose_taints_were_not_stored() -> None:
    (written,) = slice_documents(DRIVER, "node-1", _devices(3, tainted=1))
    assert lost_taints(written, written) == []
    stored = {"spec": {"devices": [{**d, "taints": []} for d in written["spec"]["devices"]]}}
    assert lost_taints(written, stored) == ["d1"]
    # Taints the server added (timeAdded) or kept in another order still count as kept.
    kept = {"spec": {"devices": [dict(d) for d in written["spec"]["devices"]]}}
    kept["spec"]["devices"][1]["taints"] = [{**written["spec"]["devices"][1]["taints"][0], "timeAdded": "x"}]
    assert lost_taints(written, kept) == []


def test_where_taints_are_dropped_the_devices_that_need_one_are_left_out() -> None:
    devices = _devices(4, tainted=1)
    held = SliceDevice("d3h", "D3H", {}, None, plugin_held=True)
    assert published([*devices, held], taints=True) == ([*devices, held], [])
    shown, left_out = published([*devices, held], taints=False)
    assert [d.name for d in shown] == ["d0", "d2", "d3"]
    assert left_out == ["D1", "D3H"]
    # Nothing tainted is left: one slice of up to 128 again.
    (doc,) = slice_documents(DRIVER, "node-1", shown)
    assert all("taints" not in d for d in doc["spec"]["devices"])


def test_label_values() -> None:
    assert label_value("Vanished") == "Vanished"
    assert label_value("no longer discovered (/dev/x)") == "no-longer-discovered---dev-x"
    assert len(label_value("x" * 100)) == 63
    assert label_value("((") == ""


def test_slice_devices_carry_attributes_numa_and_health() -> None:
    inv = Inventory(1, "rw")
    tracker = DeviceHealthTracker(1, 1)
    pci = PhysicalDevice(
        "0000:3b:00.0",
        ("/dev/vfio/vfio", "/dev/vfio/12"),
        numa_nodes=(1,),
        attributes=(
            ("pciVendor", "10de"),
            ("pciAddress", "0000:3b:00.0"),
            ("pcieRoot", "pci0000:3a"),
            ("bad-key", "x"),
        ),
    )
    tty = PhysicalDevice("ttyUSB0", ("/dev/ttyUSB0",))
    from patchbay_agent.core.health import CheckResult

    tracker.observe(
        {pci.id: CheckResult(True), tty.id: CheckResult(False, "gone", definite=True, code="Vanished")}
    )
    inv.update([pci, tty], tracker)

    devices = slice_devices(inv.current)
    by_id = {d.physical_id: d for d in devices}
    assert by_id[pci.id].attributes == {
        "patchbay.dev/id": {"string": "0000:3b:00.0"},
        "patchbay.dev/path": {"string": "/dev/vfio/vfio"},
        "patchbay.dev/pciVendor": {"string": "10de"},
        "patchbay.dev/pciAddress": {"string": "0000:3b:00.0"},
        "patchbay.dev/pcieRoot": {"string": "pci0000:3a"},
        # The standard names the scheduler and other drivers match on.
        "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:3a"},
        "resource.kubernetes.io/numaNode": {"int": 1},
    }
    assert by_id[pci.id].unhealthy is None
    assert by_id[tty.id].unhealthy == "Vanished"
    assert PoolDevices.of(inv.current).physical == {device_name(pci.id): pci.id, device_name(tty.id): tty.id}
    # A value not in the standard's form gets no standard attribute.
    odd = PhysicalDevice("odd", attributes=(("pciAddress", "3b:00.0"), ("pcieRoot", "root0")))
    other = Inventory(1, "rw")
    other.update([odd], tracker)
    (only,) = slice_devices(other.current)
    assert not [k for k in only.attributes if k.startswith("resource.kubernetes.io/")]


def test_devices_held_through_the_device_plugin_are_tainted_and_cut_the_pool_to_64() -> None:
    """A node moving from DevicePlugin to DRA: devices running pods still hold through the device
    plugin must not be allocated by DRA a second time."""
    inv = Inventory(1, "rw")
    tracker = DeviceHealthTracker(1, 1)
    devs = [PhysicalDevice(f"tty{i}", (f"/dev/tty{i}",)) for i in range(100)]
    from patchbay_agent.core.health import CheckResult

    tracker.observe({d.id: CheckResult(True) for d in devs})
    inv.update(devs, tracker)
    devices = slice_devices(inv.current, plugin_held={"tty7"})
    held = [d for d in devices if d.plugin_held]
    assert [d.physical_id for d in held] == ["tty7"]
    assert held[0].document()["taints"] == [
        {"key": "patchbay.dev/held-by-device-plugin", "value": "in-use", "effect": "NoSchedule"}
    ]
    assert all("taints" not in d.document() for d in devices if not d.plugin_held)
    docs = slice_documents(DRIVER, "node-1", devices)
    assert [len(d["spec"]["devices"]) for d in docs] == [64, 36]


def _claim(uid: str, results: list[dict[str, str]]) -> dict[str, Any]:
    return {"metadata": {"uid": uid}, "status": {"allocation": {"devices": {"results": results}}}}


def test_allocated_devices_take_our_driver_and_pool_only() -> None:
    names = {"tty0": "ttyUSB0", "tty1": "ttyUSB1"}
    claim = _claim(
        "u1",
        [
            {"request": "a", "driver": DRIVER, "pool": "node-1", "device": "tty1"},
            {"request": "b", "driver": "other.example.com", "pool": "node-1", "device": "tty0"},
            {"request": "c", "driver": DRIVER, "pool": "node-2", "device": "tty0"},
        ],
    )
    (only,) = allocated_devices(claim, "u1", DRIVER, "node-1", names)
    assert (only.request, only.device_name, only.physical_id) == ("a", "tty1", "ttyUSB1")
    with pytest.raises(ClaimError, match="not 'u2'"):
        allocated_devices(claim, "u2", DRIVER, "node-1", names)
    with pytest.raises(ClaimError, match="not allocated"):
        allocated_devices({"metadata": {"uid": "u1"}, "status": {}}, "u1", DRIVER, "node-1", names)
    bad = _claim("u1", [{"request": "a", "driver": DRIVER, "pool": "node-1", "device": "nope"}])
    with pytest.raises(ClaimError, match="'nope'"):
        allocated_devices(bad, "u1", DRIVER, "node-1", names)
    # Malformed answers are refused with the field named, never an exception of another kind.
    with pytest.raises(ClaimError, match="not a ResourceClaim"):
        allocated_devices(None, "u1", DRIVER, "node-1", names)  # type: ignore[arg-type]
    odd = {"metadata": {"uid": "u1"}, "status": {"allocation": {"devices": {"results": "x"}}}}
    with pytest.raises(ClaimError, match=r"results is str"):
        allocated_devices(odd, "u1", DRIVER, "node-1", names)
    odd["status"]["allocation"]["devices"]["results"] = [7]
    with pytest.raises(ClaimError, match=r"results\[0\] is int"):
        allocated_devices(odd, "u1", DRIVER, "node-1", names)


def test_claim_uids_that_could_name_another_file_are_refused() -> None:
    assert check_claim_uid("0b9e1f6c-5d1a-4c3e-9f1a-2b3c4d5e6f70") is None
    for bad in ("", "../x", "a/b", "a..b", "x\x00", "-a", "u" * 129):
        assert check_claim_uid(bad), bad


def test_claim_names_that_could_name_another_directory_are_refused_by_field() -> None:
    """Namespace and name make the directory of the claim's metadata files; a NUL in one (found
    by the fuzz test) or a `..` must be answered as that claim's error, naming the field."""
    assert check_claim_name("default", "my-claim.v1") is None
    longest = ".".join(["b" * 63] * 3 + ["b" * 61])  # 253: labels of at most 63
    assert check_claim_name("a" * 63, longest) is None
    assert check_claim_name("ns", longest + "b")
    for bad in ("", "../x", "a/b", "x\x00", "A", "-a", "a" * 64):
        assert (why := check_claim_name(bad, "c")) and why.startswith("claim namespace"), bad
    for bad in ("", "..", "../x", "a/b", "x\x00", "A", "a..b", "-a", "b" * 254):
        assert (why := check_claim_name("ns", bad)) and why.startswith("claim name"), bad


def test_a_request_name_that_is_not_one_is_the_claims_error() -> None:
    names = {"tty0": "ttyUSB0"}
    for good in ("a", "gpu/high-memory"):
        claim = _claim("u1", [{"request": good, "driver": DRIVER, "pool": "n", "device": "tty0"}])
        assert [d.request for d in allocated_devices(claim, "u1", DRIVER, "n", names)] == [good]
    for bad in ("", "../etc", "a/b/c", "a\x00", "A"):
        claim = _claim("u1", [{"request": bad, "driver": DRIVER, "pool": "n", "device": "tty0"}])
        with pytest.raises(ClaimError, match=r"results\[0\]\.request .* is not a request name"):
            allocated_devices(claim, "u1", DRIVER, "n", names)


def test_claim_spec_document() -> None:
    from patchbay_agent.api import api_pb2

    names = {"tty0": "ttyUSB0", "tok": "token-1"}
    claim = _claim(
        "u1",
        [
            {"request": "a", "driver": DRIVER, "pool": "n", "device": "tty0"},
            {"request": "a", "driver": DRIVER, "pool": "n", "device": "tok"},
        ],
    )
    devices = allocated_devices(claim, "u1", DRIVER, "n", names)
    specs = {
        "ttyUSB0": (
            api_pb2.DeviceSpec(container_path="/dev/ttyUSB0", host_path="/h/dev/ttyUSB0", permissions="rw"),
        )
    }
    allocation = Allocation(
        devices_env_name="SERIALS", envs={"A": "1"}, mounts=(Mount("/opt/x", "/x", read_only=True),)
    )
    doc = claim_spec_document(DRIVER, "u1", devices, specs, allocation)
    assert doc == {
        "cdiVersion": "0.5.0",
        "kind": f"{DRIVER}/device",
        "devices": [
            {
                "name": "u1-tty0",
                "containerEdits": {
                    "deviceNodes": [
                        {"path": "/dev/ttyUSB0", "hostPath": "/h/dev/ttyUSB0", "permissions": "rw"}
                    ]
                },
            },
            {"name": "u1-tok", "containerEdits": {"env": ["PATCHBAY_DEVICE_TOK=token-1"]}},
        ],
        "containerEdits": {
            "env": ["A=1", "SERIALS=ttyUSB0,token-1"],
            "mounts": [
                {"hostPath": "/opt/x", "containerPath": "/x", "type": "bind", "options": ["rbind", "ro"]}
            ],
        },
    }
    assert spec_file_name(DRIVER, "u1") == f"patchbay_{DRIVER}_u1.json"


def test_socket_names_fit_sockaddr_un(tmp_path: Any) -> None:
    from pathlib import Path

    root = Path("/var/lib/kubelet")
    assert registry_socket_name(DRIVER, "ab12", root / "plugins_registry") == f"{DRIVER}-ab12.sock"
    assert service_dir(root, DRIVER) == root / "plugins" / DRIVER
    long = "a" * 30 + "." + "b" * 32
    name = registry_socket_name(long, "0123456789abcdef", root / "plugins_registry")
    assert len(str(root / "plugins_registry" / name)) <= 107 and name.endswith("-0123456789abcdef.sock")
    assert len(str(service_dir(root, long) / "dra-0123456789abcdef.sock")) <= 107


@pytest.mark.parametrize("root", ["/var/lib/kubelet", "/tmp/patchbay-node-0123456789/kubelet"])
def test_the_node_agent_keeps_each_drivers_directory_in_its_own_directory(root: str) -> None:
    """The shared node agent's units: each driver's directory one level inside
    `<root>/plugins/patchbay_node-agent` (the only part of the kubelet's plugins directory its pod
    mounts), the driver's name where the socket path fits sockaddr_un, else the driver's hash;
    never the driver's own `<root>/plugins/<driver>`. The dev cluster's real node has a 37-byte
    root: there the hash must be short enough (`patchbay-<hash>` would not fit)."""
    import argparse
    import hashlib
    from pathlib import Path

    from patchbay_agent.options import driver_name, node_agent_plugins_dir

    base = node_agent_plugins_dir(Path(root))
    assert base == Path(root) / "plugins" / "patchbay_node-agent"
    # Not a DNS subdomain: no DRA driver's own directory can ever be the node agent's.
    with pytest.raises(argparse.ArgumentTypeError):
        driver_name(base.name)
    short, long = "s.patchbay.dev", "a-rather-long-profile-name-of-fifty-characters-xx.patchbay.dev"
    assert service_dir(Path(root), short, base) == base / short
    hashed = service_dir(Path(root), long, base)
    assert hashed == base / hashlib.sha256(long.encode()).hexdigest()[:12]
    assert len(str(hashed / "dra-0123456789abcdef.sock").encode()) <= 107
    for driver in (short, long):
        assert service_dir(Path(root), driver, base).parent == base
        assert service_dir(Path(root), driver, base) != service_dir(Path(root), driver)
    # An agent of its own keeps today's layout.
    assert service_dir(Path(root), short) == Path(root) / "plugins" / short


def test_one_taint_key_per_kind_of_fault_with_the_profiles_effect() -> None:
    assert fault_taint_key("Vanished") == "patchbay.dev/vanished"
    assert fault_taint_key("ProbeFailed") == "patchbay.dev/probe-failed"
    assert fault_taint_key("OpenFailed") == "patchbay.dev/open-failed"
    assert fault_taint_key("--") == "patchbay.dev/unhealthy"
    for effect in ("NoSchedule", "NoExecute", "None"):
        dev = SliceDevice("d0", "D0", {}, "ProbeFailed", effect=effect)
        assert dev.document()["taints"] == [
            {"key": "patchbay.dev/probe-failed", "value": "ProbeFailed", "effect": effect}
        ]
    # Where the API server drops taints, a device whose taint would keep claims off is left out;
    # an informational one (None) stays: it never kept anybody off.
    keep_off = SliceDevice("a", "A", {}, "Vanished")
    informs = SliceDevice("b", "B", {}, "Vanished", effect="None")
    healthy = SliceDevice("c", "C", {})
    assert published([keep_off, informs, healthy], taints=False) == ([informs, healthy], ["A"])
    assert published([keep_off, informs, healthy], taints=True) == ([keep_off, informs, healthy], [])
