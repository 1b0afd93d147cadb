"""Allocate and GetPreferredAllocation as pure functions of (request, snapshot, config).

Kept free of gRPC server types so the policies are tested directly; `deviceplugin/server.py` turns
`AllocationError` into a gRPC status.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import grpc

from patchbay_agent.api import api_pb2
from patchbay_agent.config import Allocation, PreferredPolicy
from patchbay_agent.core.inventory import Snapshot
from patchbay_agent.deviceplugin.encoding import device_spec

NO_NUMA = -1


class AllocationError(Exception):
    """A request the agent refuses, with the gRPC code to refuse it with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


#: IDs an error message names at most, and characters of each: gRPC carries the message in a
#: header the client refuses past 16 KiB ("metadata size exceeds hard limit"), which would leave
#: the kubelet with no reason at all (found by tests/fuzz/test_fuzz_deviceplugin.py).
NAMED_IDS = 8
NAMED_ID_LENGTH = 80


def name_ids(ids: Sequence[str]) -> str:
    """`'a', 'b', ... and 12 more`: quoted (a newline or a control character in an ID stays
    visible and cannot forge a log line), each cut to `NAMED_ID_LENGTH`, at most `NAMED_IDS`."""
    shown = ", ".join(
        repr(i if len(i) <= NAMED_ID_LENGTH else i[:NAMED_ID_LENGTH] + "...") for i in ids[:NAMED_IDS]
    )
    more = len(ids) - NAMED_IDS
    return shown + (f" and {more} more" if more > 0 else "")


def check_served(ids: Sequence[str], snap: Snapshot) -> None:
    """Refuse (INVALID_ARGUMENT) a request without IDs, or with IDs the agent does not advertise,
    naming them."""
    if not ids:
        raise AllocationError(grpc.StatusCode.INVALID_ARGUMENT, "request without device IDs")
    unknown = [i for i in ids if i not in snap.replica_of]
    if unknown:
        raise AllocationError(grpc.StatusCode.INVALID_ARGUMENT, f"unknown device IDs: {name_ids(unknown)}")


def _physical_ids(ids: Sequence[str], snap: Snapshot) -> list[str]:
    """Map advertised IDs to physical IDs (first-seen order, no duplicates) or refuse."""
    check_served(ids, snap)
    unhealthy = [i for i in ids if i not in snap.healthy]
    if unhealthy:
        raise AllocationError(
            grpc.StatusCode.FAILED_PRECONDITION, f"unhealthy device IDs: {name_ids(unhealthy)}"
        )
    return list(dict.fromkeys(snap.replica_of[i] for i in ids))


def allocate(request: api_pb2.AllocateRequest, snap: Snapshot, cfg: Allocation) -> api_pb2.AllocateResponse:
    """One ContainerAllocateResponse per container request.

    Device files are deduplicated by host path: two replicas of one device, or VFIO devices that
    all need /dev/vfio/vfio, must not produce duplicate DeviceSpecs (the runtime would refuse).
    The devices env (`devicesEnvName`) names each PHYSICAL device once, in allocation order:
    replicas `<id>::<n>` appear as `<id>`, so the env is what a runtime hook that reads device
    IDs expects (`devicesEnvName: NVIDIA_VISIBLE_DEVICES` with NVIDIA's container toolkit). The
    replica IDs the kubelet allocated stay visible through the PodResources API. CDI names use the
    physical IDs too, which is what a CDI spec describes.
    """
    response = api_pb2.AllocateResponse()
    for creq in request.container_requests:
        ids = list(creq.devices_ids)
        if not ids:
            raise AllocationError(grpc.StatusCode.INVALID_ARGUMENT, "container request without device IDs")
        physical = _physical_ids(ids, snap)
        cresp = response.container_responses.add()
        cresp.envs.update(cfg.envs)
        cresp.envs[cfg.devices_env_name] = ",".join(physical)
        cresp.annotations.update(cfg.annotations)
        for m in cfg.mounts:
            cresp.mounts.add(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
        seen: set[str] = set()
        for pid in physical:
            for spec in snap.specs.get(pid, ()):
                if spec.host_path not in seen:
                    seen.add(spec.host_path)
                    cresp.devices.append(device_spec(spec))
        if cfg.cdi_kind:
            for pid in physical:
                cresp.cdi_devices.add(name=f"{cfg.cdi_kind}={pid}")
    return response


def _numa_key(pid: str, snap: Snapshot) -> int:
    dev = snap.physical.get(pid)
    return dev.numa_nodes[0] if dev is not None and dev.numa_nodes else NO_NUMA


def preferred(
    available: Sequence[str], must_include: Sequence[str], size: int, snap: Snapshot, policy: PreferredPolicy
) -> list[str]:
    """Choose `size` IDs from `available`, always including `must_include`.

    * None: must_include, then available in the kubelet's order.
    * Pack: fewest NUMA nodes: nodes already used by must_include first, then the smallest node
      that can hold the rest (best fit), else the largest node and repeat. Devices without NUMA
      information form their own group (they add no NUMA node). Within a node, replicas of the
      same physical device stay together.
    * Spread: round-robin over NUMA nodes, and over physical devices within a node, starting with
      the nodes and devices that must_include uses least.
    The answer is exactly `size` IDs out of `available`, must_include among them, as the kubelet
    asks (its available list holds must_include and at least `size` IDs); a request that cannot
    be answered so is refused. IDs the agent does not know come last (the kubelet's list may be
    a moment older; Allocate refuses them).
    """
    if size < len(must_include):
        raise AllocationError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"allocation_size {size} is smaller than must_include ({len(must_include)} devices)",
        )
    offered = list(dict.fromkeys(available))
    chosen = list(dict.fromkeys(must_include))
    if missing := [i for i in chosen if i not in set(offered)]:
        raise AllocationError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"must_include IDs not in available_deviceIDs: {name_ids(missing)}",
        )
    if size > len(offered):
        raise AllocationError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"allocation_size {size} is more than the {len(offered)} available_deviceIDs",
        )
    needed = size - len(chosen)
    pool = [i for i in offered if i not in set(chosen) and i in snap.replica_of]
    if needed <= 0:
        return chosen
    if policy is PreferredPolicy.NONE or needed >= len(pool):
        unknown = [i for i in offered if i not in set(chosen) and i not in snap.replica_of]
        return chosen + (pool + unknown)[:needed]

    by_node: dict[int, list[str]] = defaultdict(list)
    for i in sorted(pool, key=lambda x: (snap.replica_of[x], x)):
        by_node[_numa_key(snap.replica_of[i], snap)].append(i)
    used_nodes = {_numa_key(snap.replica_of[i], snap) for i in chosen if i in snap.replica_of}
    used_physical = [snap.replica_of[i] for i in chosen if i in snap.replica_of]

    if policy is PreferredPolicy.PACK:
        picked: list[str] = []

        def take(node: int, count: int) -> None:
            ids = by_node.pop(node)
            # Replicas of devices must_include already uses first, then whole devices together.
            ids.sort(key=lambda x: (snap.replica_of[x] not in used_physical, snap.replica_of[x], x))
            picked.extend(ids[:count])

        for node in sorted(n for n in by_node if n in used_nodes):
            if len(picked) < needed:
                take(node, needed - len(picked))
        while len(picked) < needed and by_node:
            rest = needed - len(picked)
            fits = [n for n in by_node if len(by_node[n]) >= rest]
            if fits:
                take(min(fits, key=lambda n: (len(by_node[n]), n)), rest)
            else:
                take(max(by_node, key=lambda n: (len(by_node[n]), -n)), rest)
        return chosen + picked[:needed]

    # Spread
    node_load: dict[int, int] = defaultdict(int)
    dev_load: dict[str, int] = defaultdict(int)
    for i in chosen:
        if i in snap.replica_of:
            node_load[_numa_key(snap.replica_of[i], snap)] += 1
            dev_load[snap.replica_of[i]] += 1
    remaining = {n: list(ids) for n, ids in by_node.items()}
    picked = []
    while len(picked) < needed:
        node = min(
            (n for n in remaining if remaining[n]),
            key=lambda n: (node_load[n], -len(remaining[n]), n),
        )
        ids = remaining[node]
        best = min(ids, key=lambda x: (dev_load[snap.replica_of[x]], snap.replica_of[x], x))
        ids.remove(best)
        picked.append(best)
        node_load[node] += 1
        dev_load[snap.replica_of[best]] += 1
    return chosen + picked
