"""A DaemonSet rollout with maxSurge 1 against the upstream kubelet device manager: the new agent
process of a resource starts while the old one still runs, then the old one gets SIGTERM.

Each process serves its own socket, so the kubelet holds two endpoints for the resource during
the overlap and, when the old one goes, promotes the new one instead of marking the resource
unhealthy. What counts is what the kubelet reports: the peer samples GetCapacity (and its
endpoints) in the background every 200 us for the whole rollout, and this test also reads it over
the harness between steps, as often as the harness answers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.kubeletpeer import Harness, PeerError

from patchbay_agent.api import api_pb2, api_pb2_grpc

SERIAL = "example.com/serial"
DEVICES = 4
PLUGIN = {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}, "health": {"periodSeconds": 1}}


def _read_for(harness: Harness, seconds: float, seen: list[tuple[int, int]]) -> None:
    """Read capacity/allocatable over the harness, back to back, for `seconds`."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        got = harness.kubelet.ok("capacity")
        seen.append((got["capacity"].get(SERIAL, -1), got["allocatable"].get(SERIAL, -1)))


def _until_endpoints(
    harness: Harness, count: int, seen: list[tuple[int, int]], within: float = 30
) -> list[str]:
    end = time.monotonic() + within
    while time.monotonic() < end:
        sockets, _ = harness.kubelet.endpoints(SERIAL)
        if len(sockets) == count:
            return sockets
        _read_for(harness, 0.005, seen)
    raise PeerError(f"the kubelet never held {count} endpoints: {harness.kubelet.log_tail()}")


def _log_from(path: Path, offset: int) -> list[str]:
    return path.read_text(errors="replace")[offset:].splitlines()


def test_rollout_overlap_keeps_allocatable_and_the_new_agent_serving(harness: Harness) -> None:
    for n in range(DEVICES):
        harness.hw.add_dev(f"/dev/ttyUSB{n}")
    old = harness.start_agent(SERIAL, PLUGIN)
    harness.kubelet.wait(SERIAL, capacity=DEVICES, allocatable=DEVICES)
    (sock_a,) = harness.sockets(SERIAL)
    assert harness.kubelet.endpoints(SERIAL) == ([str(sock_a)], str(sock_a))

    log = harness.kubelet.log_path
    log_offset = len(log.read_text(errors="replace"))
    seen: list[tuple[int, int]] = []
    harness.kubelet.sample_start(SERIAL, interval_us=200)
    t0 = time.monotonic()
    try:
        # The new agent starts beside the old one (maxSurge 1).
        new = harness.start_agent(SERIAL, PLUGIN)
        both = _until_endpoints(harness, 2, seen)
        t_both = time.monotonic()
        socks_now = harness.sockets(SERIAL)
        assert len(socks_now) == 2, socks_now
        (sock_b,) = [s for s in socks_now if s != sock_a]
        assert sorted(both) == sorted([str(sock_a), str(sock_b)])
        assert sock_a.exists() and sock_b.exists()  # both at once
        _, primary = harness.kubelet.endpoints(SERIAL)
        assert primary == str(sock_b)  # Allocate goes to the newest registration
        _read_for(harness, 1.0, seen)
        # The old agent gets SIGTERM, as the DaemonSet controller sends it.
        t_term = time.monotonic()
        assert old.stop() == 0
        t_gone = time.monotonic()
        _until_endpoints(harness, 1, seen)
        _read_for(harness, 3.0, seen)
    finally:
        sampled = harness.kubelet.sample_stop()
    t_end = time.monotonic()

    # The kubelet never reported fewer devices than the healthy count, at any sample.
    assert sampled["samples"] > 0
    assert (sampled["min_capacity"], sampled["min_allocatable"]) == (DEVICES, DEVICES), sampled["changes"]
    assert (sampled["max_capacity"], sampled["max_allocatable"]) == (DEVICES, DEVICES)
    assert (sampled["min_endpoints"], sampled["max_endpoints"]) == (1, 2)
    assert seen and all(s == (DEVICES, DEVICES) for s in seen), sorted(set(seen))
    # Endpoints went 1 -> 2 -> 1: A, A+B, B.
    endpoint_sets = [tuple(c["endpoints"]) for c in sampled["changes"]]
    assert endpoint_sets == [(str(sock_a),), tuple(sorted([str(sock_a), str(sock_b)])), (str(sock_b),)]

    # Only the old agent's socket is gone; the kubelet holds just the new one.
    assert not sock_a.exists()
    assert harness.sockets(SERIAL) == [sock_b]
    assert harness.kubelet.endpoints(SERIAL) == ([str(sock_b)], str(sock_b))
    # The new agent still serves: a pod is admitted through the kubelet's Allocate path.
    got = harness.kubelet.ok("allocate", pod="after-rollout", container="c", resource=SERIAL, count=2)
    assert len(got["device_ids"]) == 2
    assert sorted(got["envs"]["PATCHBAY_DEVICES"].split(",")) == got["device_ids"]
    healthy = harness.kubelet.ok("devices")["healthy"][SERIAL]
    assert len(healthy) == DEVICES
    assert new.proc.poll() is None

    # The upstream device manager's own account of the overlap (klog -v 2).
    lines = _log_from(log, log_offset)
    assert not [ln for ln in lines if "Last device plugin for this resource disconnected" in ln], lines
    _report(harness, sampled, seen, lines, t0, t_both, t_term, t_gone, t_end)


def _report(
    harness: Harness,
    sampled: dict[str, Any],
    seen: list[tuple[int, int]],
    lines: list[str],
    t0: float,
    t_both: float,
    t_term: float,
    t_gone: float,
    t_end: float,
) -> None:
    """Figures for a human (`pytest -s`); nothing here is asserted."""
    span_s = (
        (sampled["changes"][-1]["t_ns"] - sampled["changes"][0]["t_ns"]) / 1e9 if sampled["changes"] else 0
    )
    print(f"\nrollout overlap: {t_end - t0:.2f}s sampled")
    print(
        f"  peer background samples: {sampled['samples']} "
        f"(every 200us + GetCapacity cost; {sampled['samples'] / (t_end - t0):.0f}/s)"
    )
    print(f"  harness reads: {len(seen)} ({len(seen) / (t_end - t0):.0f}/s)")
    print(f"  B registered {t_both - t0:.3f}s after B's start; A stopped in {t_gone - t_term:.3f}s")
    print(f"  endpoint changes over {span_s:.3f}s:")
    for c in sampled["changes"]:
        names = [Path(e).name for e in c["endpoints"]]
        print(
            f"    t={c['t_ns'] / 1e9:.6f}s cap={c['capacity']} alloc={c['allocatable']} "
            f"endpoints={names} primary={Path(c['primary']).name}"
        )
    print("  kubelet log during the overlap:")
    for ln in lines:
        print("    " + ln)


def test_a_socket_path_the_kubelet_holds_stale_is_given_up_for_a_new_one(harness: Harness) -> None:
    """The upstream corner case: a Register for a path the kubelet still holds fails with "device
    plugin already connected", and the kubelet then drops its client for that path but keeps the
    endpoint, so that path can never register again while this kubelet runs. Here a stray
    Register (as a second process claiming the agent's path would send) causes it; then the
    agent's socket is deleted, it serves that name again, is refused, and moves to a new name."""
    for n in range(2):
        harness.hw.add_dev(f"/dev/ttyUSB{n}")
    agent = harness.start_agent(SERIAL, PLUGIN)
    harness.kubelet.wait(SERIAL, capacity=2, allocatable=2)
    (first,) = harness.sockets(SERIAL)

    with grpc.insecure_channel(f"unix://{harness.plugin_dir / 'kubelet.sock'}") as channel:
        stub = api_pb2_grpc.RegistrationStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Register(
                api_pb2.RegisterRequest(version="v1beta1", endpoint=first.name, resource_name=SERIAL),
                timeout=10,
            )
    assert "device plugin already connected" in (refused.value.details() or "")
    # The kubelet still holds the agent's endpoint, now without a client behind it.
    assert harness.kubelet.endpoints(SERIAL) == ([str(first)], str(first))

    first.unlink()
    end = time.monotonic() + 30
    while time.monotonic() < end:
        sockets, primary = harness.kubelet.endpoints(SERIAL)
        if len(sockets) == 2 and primary != str(first):
            break
        time.sleep(0.01)
    (second,) = harness.sockets(SERIAL)
    assert second != first
    # The stale endpoint stays in the kubelet (upstream); the new one is primary and streams.
    assert harness.kubelet.endpoints(SERIAL) == (sorted([str(first), str(second)]), str(second))
    harness.kubelet.wait(SERIAL, capacity=2, allocatable=2)
    harness.hw.remove_dev("/dev/ttyUSB1")
    harness.kubelet.wait(SERIAL, capacity=2, allocatable=1)  # health flows through the new stream
    got = harness.kubelet.ok("allocate", pod="p1", container="c", resource=SERIAL, count=1)
    assert got["device_ids"] == ["ttyUSB0"]
    assert "moving to a new socket" in agent.log_tail(20000)
