"""Allocate and GetPreferredAllocation as pure functions over a snapshot (no server)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from patchbay_agent.api import api_pb2
from patchbay_agent.config import Allocation, PreferredPolicy
from patchbay_agent.core.health import CheckResult, DeviceHealthTracker
from patchbay_agent.core.inventory import Inventory, Snapshot, replica_id
from patchbay_agent.deviceplugin.allocation import AllocationError, allocate, preferred
from patchbay_agent.deviceplugin.encoding import ListAndWatchEncoder, ListTooLargeError
from patchbay_agent.discovery import PhysicalDevice


def _snapshot(devices: list[PhysicalDevice], replicas: int = 1, unhealthy: tuple[str, ...] = ()) -> Snapshot:
    async def build() -> Snapshot:
        inv = Inventory(replicas, "rw")
        tracker = DeviceHealthTracker(1, 1)
        tracker.observe({d.id: CheckResult(d.id not in unhealthy) for d in devices})
        inv.update(devices, tracker)
        return inv.current

    return asyncio.run(build())


def _gpu(i: int, numa: int | None) -> PhysicalDevice:
    return PhysicalDevice(f"gpu{i}", (f"/dev/gpu{i}",), (f"/dev/gpu{i}",), () if numa is None else (numa,))


# 2 devices on NUMA 0, 3 on NUMA 1, 1 without NUMA.
MACHINE = [_gpu(0, 0), _gpu(1, 0), _gpu(2, 1), _gpu(3, 1), _gpu(4, 1), _gpu(5, None)]
ALL = [d.id for d in MACHINE]


def _numa(ids: list[str]) -> set[int]:
    by_id = {d.id: d for d in MACHINE}
    return {by_id[i].numa_nodes[0] if by_id[i].numa_nodes else -1 for i in ids}


def test_none_policy_keeps_the_kubelets_order() -> None:
    snap = _snapshot(MACHINE)
    assert preferred(ALL, ["gpu3"], 3, snap, PreferredPolicy.NONE) == ["gpu3", "gpu0", "gpu1"]


@pytest.mark.parametrize(
    ("size", "must", "nodes"),
    [
        (2, [], {0}),  # the smallest node that fits (best fit) keeps NUMA 1 whole
        (3, [], {1}),
        (4, [], {1, -1}),  # largest node first; a device without NUMA adds no node
        (2, ["gpu2"], {1}),  # stay on the node must_include already uses
        (3, ["gpu0"], {0, -1}),
        (5, [], {0, 1}),
    ],
)
def test_pack_uses_the_fewest_numa_nodes(size: int, must: list[str], nodes: set[int]) -> None:
    snap = _snapshot(MACHINE)
    got = preferred(ALL, must, size, snap, PreferredPolicy.PACK)
    assert len(got) == size
    assert got[: len(must)] == must
    assert _numa(got) == nodes


def test_spread_alternates_numa_nodes() -> None:
    snap = _snapshot(MACHINE)
    got = preferred(ALL, [], 3, snap, PreferredPolicy.SPREAD)
    assert _numa(got) == {0, 1, -1}
    got = preferred(ALL, ["gpu2"], 2, snap, PreferredPolicy.SPREAD)
    assert got[0] == "gpu2"
    assert _numa(got[1:]) != {1}


def test_pack_and_spread_with_replicas() -> None:
    devices = [_gpu(0, 0), _gpu(1, 0)]
    snap = _snapshot(devices, replicas=3)
    ids = sorted(snap.replica_of)
    packed = preferred(ids, [], 3, snap, PreferredPolicy.PACK)
    assert {snap.replica_of[i] for i in packed} == {"gpu0"}  # one device's replicas together
    spread = preferred(ids, [], 2, snap, PreferredPolicy.SPREAD)
    assert {snap.replica_of[i] for i in spread} == {"gpu0", "gpu1"}


def test_preferred_refuses_a_size_smaller_than_must_include() -> None:
    with pytest.raises(AllocationError) as err:
        preferred(ALL, ["gpu0", "gpu1"], 1, _snapshot(MACHINE), PreferredPolicy.PACK)
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT


def test_preferred_ignores_ids_it_does_not_know() -> None:
    got = preferred(["ghost", *ALL], [], 2, _snapshot(MACHINE), PreferredPolicy.NONE)
    assert got == ["gpu0", "gpu1"]


@pytest.mark.parametrize("policy", list(PreferredPolicy))
def test_preferred_answers_exactly_the_size_asked_unknown_ids_last(policy: PreferredPolicy) -> None:
    """The kubelet asks for `size` of what it offers; IDs the agent does not know (its list a
    moment older) fill what its own cannot (tests/fuzz/test_fuzz_deviceplugin.py found answers
    one short)."""
    got = preferred(["ghost", "gpu0", "gpu1"], ["gpu1"], 3, _snapshot(MACHINE), policy)
    assert sorted(got) == ["ghost", "gpu0", "gpu1"] and got[-1] == "ghost"


@pytest.mark.parametrize(
    ("available", "must", "size", "says"),
    [
        (["gpu0"], ["gpu1"], 1, "must_include IDs not in available_deviceIDs: 'gpu1'"),
        (["gpu0", "gpu0"], [], 2, "allocation_size 2 is more than the 1 available_deviceIDs"),
    ],
)
def test_preferred_refuses_what_cannot_be_answered(
    available: list[str], must: list[str], size: int, says: str
) -> None:
    with pytest.raises(AllocationError) as err:
        preferred(available, must, size, _snapshot(MACHINE), PreferredPolicy.PACK)
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT and says in err.value.message


def test_allocate_refuses_unknown_and_unhealthy() -> None:
    snap = _snapshot(MACHINE, unhealthy=("gpu1",))
    cfg = Allocation()
    ok = allocate(api_pb2.AllocateRequest(container_requests=[{"devices_ids": ["gpu0"]}]), snap, cfg)
    assert [d.host_path for d in ok.container_responses[0].devices] == ["/dev/gpu0"]
    with pytest.raises(AllocationError) as unknown:
        allocate(api_pb2.AllocateRequest(container_requests=[{"devices_ids": ["gpu0", "gpu9"]}]), snap, cfg)
    assert unknown.value.code is grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(AllocationError) as unhealthy:
        allocate(api_pb2.AllocateRequest(container_requests=[{"devices_ids": ["gpu1"]}]), snap, cfg)
    assert unhealthy.value.code is grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(AllocationError):
        allocate(api_pb2.AllocateRequest(container_requests=[{"devices_ids": []}]), snap, cfg)


def test_vfio_container_file_is_listed_once() -> None:
    devices = [
        PhysicalDevice("0000:01:00.0", ("/dev/vfio/vfio", "/dev/vfio/11")),
        PhysicalDevice("0000:02:00.0", ("/dev/vfio/vfio", "/dev/vfio/12")),
    ]
    snap = _snapshot(devices)
    resp = allocate(
        api_pb2.AllocateRequest(container_requests=[{"devices_ids": ["0000:01:00.0", "0000:02:00.0"]}]),
        snap,
        Allocation(),
    )
    assert [d.host_path for d in resp.container_responses[0].devices] == [
        "/dev/vfio/vfio",
        "/dev/vfio/11",
        "/dev/vfio/12",
    ]


def test_replica_ids_stay_within_63_characters_and_unique() -> None:
    long_id = "d" * 63
    ids = {replica_id(long_id, n, 12) for n in range(12)}
    assert len(ids) == 12
    assert all(len(i) <= 63 for i in ids)
    assert replica_id("tty0", 0, 1) == "tty0"
    assert replica_id("tty0", 3, 4) == "tty0::3"


def test_inventory_publishes_only_changes_and_refuses_oversized_lists() -> None:
    async def scenario() -> None:
        inv = Inventory(1, "rw")
        inv.admit(ListAndWatchEncoder(max_bytes=200).check)
        tracker = DeviceHealthTracker(1, 1)
        devs = [PhysicalDevice(f"d{i}") for i in range(3)]
        tracker.observe({d.id: CheckResult(True) for d in devs})
        assert inv.update(devs, tracker)
        assert not inv.update(devs, tracker)
        version = inv.current.version
        big = [PhysicalDevice(f"device-with-a-long-name-{i}") for i in range(20)]
        tracker.observe({d.id: CheckResult(True) for d in big})
        with pytest.raises(ListTooLargeError):
            inv.update(big, tracker)
        assert inv.current.version == version  # the previous list stays published

    asyncio.run(scenario())


def test_host_path_prefix_applies_to_host_paths_only() -> None:
    """A fake tree ON the node: the runtime must find /tmp/tree/dev/x, the container sees /dev/x."""

    async def build() -> Snapshot:
        inv = Inventory(1, "rw", host_path_prefix="/tmp/tree/")
        tracker = DeviceHealthTracker(1, 1)
        tracker.observe({"gpu0": CheckResult(True)})
        inv.update([_gpu(0, None)], tracker)
        return inv.current

    spec = asyncio.run(build()).specs["gpu0"][0]
    assert (spec.host_path, spec.container_path) == ("/tmp/tree/dev/gpu0", "/dev/gpu0")
    assert _snapshot([_gpu(0, None)]).specs["gpu0"][0].host_path == "/dev/gpu0"
