"""The agent against the upstream kubelet's own device manager (k8s.io/kubernetes
pkg/kubelet/cm/devicemanager at the pinned release): what the kubelet sees is what counts.

Each test starts the real `patchbay-agent` process on a FAKE hardware tree and asks the kubelet
peer for capacity/allocatable (GetCapacity, as the node status loop does), runs fake pods through
its Allocate path (GetPreferredAllocation, Allocate, PreStartContainer as the kubelet calls them),
and restarts it the way a new kubelet starts (new manager, sockets wiped, kubelet.sock again).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from support.kubeletpeer import Harness, PeerError

SERIAL = "example.com/serial"


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_capacity_and_allocatable_with_sharing(harness: Harness) -> None:
    for n in range(3):
        harness.hw.add_dev(f"/dev/ttyUSB{n}")
    harness.start_agent(
        SERIAL,
        {
            "discovery": {
                "paths": {"globs": ["/dev/ttyUSB*"], "groups": [{"id": "pair", "paths": ["/dev/nope"]}]}
            },
            "sharing": {"replicas": 2},
        },
    )
    # 4 devices x 2 replicas; the group's file is missing, so its 2 replicas are Unhealthy.
    got = harness.kubelet.wait(SERIAL, capacity=8, allocatable=6)
    assert got["capacity"][SERIAL] == 8
    healthy = harness.kubelet.ok("devices")["healthy"][SERIAL]
    assert sorted(d["id"] for d in healthy) == [f"ttyUSB{n}::{r}" for n in range(3) for r in range(2)]


def test_device_nodes_appearing_and_vanishing_reach_the_kubelet(harness: Harness) -> None:
    harness.hw.add_dev("/dev/ttyUSB0")
    harness.start_agent(
        SERIAL, {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}, "health": {"periodSeconds": 300}}
    )
    harness.kubelet.wait(SERIAL, capacity=1, allocatable=1)
    # A 300 s period: only the inotify-driven rescan can explain updates within the wait.
    harness.hw.add_dev("/dev/ttyUSB1")
    harness.kubelet.wait(SERIAL, capacity=2, allocatable=2)
    # A vanished device stays counted but not allocatable (Unhealthy), until it comes back.
    harness.hw.remove_dev("/dev/ttyUSB0")
    harness.kubelet.wait(SERIAL, capacity=2, allocatable=1)
    harness.hw.add_dev("/dev/ttyUSB0")
    harness.kubelet.wait(SERIAL, capacity=2, allocatable=2)


def test_health_goes_unhealthy_after_threshold_and_recovers(harness: Harness) -> None:
    for n in range(2):
        harness.hw.add_dev(f"/dev/ttyUSB{n}")
    flag = harness.root / "broken"
    probe = _script(
        harness.root / "probe.sh",
        f'if [ -f {flag} ] && [ "$PATCHBAY_DEVICE_ID" = ttyUSB1 ]; then echo "no echo" >&2; exit 1; fi\n',
    )
    harness.start_agent(
        SERIAL,
        {
            "discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}},
            "health": {
                "periodSeconds": 1,
                "failureThreshold": 2,
                "successThreshold": 2,
                "recoveryHoldSeconds": 2,  # advertised Healthy 2 s after the 2 good rounds
                "exec": {"command": [probe], "timeoutSeconds": 5},
            },
        },
    )
    harness.kubelet.wait(SERIAL, capacity=2, allocatable=2)
    flag.touch()
    harness.kubelet.wait(SERIAL, capacity=2, allocatable=1)
    healthy = harness.kubelet.ok("devices")["healthy"][SERIAL]
    assert [d["id"] for d in healthy] == ["ttyUSB0"]
    # The kubelet will not allocate the unhealthy one: asking for 2 fails.
    err = harness.kubelet.op("allocate", pod="p1", container="c", resource=SERIAL, count=2)
    assert not err["ok"]
    assert "requested number of devices unavailable" in err["error"]
    flag.unlink()
    harness.kubelet.wait(SERIAL, capacity=2, allocatable=2)  # it RECOVERS


def test_allocate_for_fake_pods(harness: Harness) -> None:
    for n in range(3):
        harness.hw.add_dev(f"/dev/ttyUSB{n}")
    harness.start_agent(
        SERIAL,
        {
            "discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}},
            "allocation": {
                "permissions": "rw",
                "envs": {"BAUD": "115200"},
                "mounts": [
                    {"hostPath": "/opt/serial", "containerPath": "/usr/local/serial", "readOnly": True}
                ],
                "annotations": {"example.com/owner": "patchbay"},
                "cdi": {"kind": "example.com/serial"},
            },
        },
    )
    harness.kubelet.wait(SERIAL, capacity=3, allocatable=3)
    first = harness.kubelet.ok("allocate", pod="pod-a", container="app", resource=SERIAL, count=2)
    ids = first["device_ids"]
    assert len(ids) == 2
    assert set(first["envs"]) == {"BAUD", "PATCHBAY_DEVICES"}
    assert first["envs"]["BAUD"] == "115200"
    assert sorted(first["envs"]["PATCHBAY_DEVICES"].split(",")) == ids
    assert sorted(d["host_path"] for d in first["devices"]) == [f"/dev/{i}" for i in ids]
    assert all(d["permissions"] == "rw" and d["container_path"] == d["host_path"] for d in first["devices"])
    assert first["mounts"] == [
        {"container_path": "/usr/local/serial", "host_path": "/opt/serial", "read_only": True}
    ]
    assert first["annotations"] == {"example.com/owner": "patchbay"}
    assert sorted(first["cdi_devices"]) == [f"example.com/serial={i}" for i in ids]
    # ... and each of those names resolves in the CDI spec the agent wrote for the runtime.
    spec = json.loads((harness.hw.root / "var/run/cdi/patchbay_example.com_serial.json").read_text())
    assert spec["kind"] == "example.com/serial"
    assert set(ids) <= {d["name"] for d in spec["devices"]}

    second = harness.kubelet.ok("allocate", pod="pod-b", container="app", resource=SERIAL, count=1)
    assert set(second["device_ids"]).isdisjoint(ids)
    full = harness.kubelet.op("allocate", pod="pod-c", container="app", resource=SERIAL, count=1)
    assert not full["ok"]
    # pod-a goes away: its devices are free again for pod-d.
    harness.kubelet.ok("remove_pod", pod="pod-a")
    again = harness.kubelet.ok("allocate", pod="pod-d", container="app", resource=SERIAL, count=2)
    assert sorted(again["device_ids"]) == ids


@pytest.mark.parametrize(("policy", "numa_nodes_used"), [("Pack", 1), ("Spread", 2)])
def test_kubelet_follows_preferred_allocation(harness: Harness, policy: str, numa_nodes_used: int) -> None:
    hw = harness.hw
    layout = {"0000:01:00.0": 0, "0000:02:00.0": 0, "0000:81:00.0": 1, "0000:82:00.0": 1}
    for addr, numa in layout.items():
        hw.add_pci(addr, vendor="10de", device="2330", numa_node=numa)
    resource = "nvidia.com/gpu"
    harness.start_agent(
        resource, {"discovery": {"pci": {"vendor": "10de"}}, "preferredAllocation": {"policy": policy}}
    )
    harness.kubelet.wait(resource, capacity=4, allocatable=4)
    for pod in ("p1", "p2"):
        got = harness.kubelet.ok("allocate", pod=pod, container="c", resource=resource, count=2)
        assert len({layout[i] for i in got["device_ids"]}) == numa_nodes_used, got["device_ids"]


def test_pre_start_container_is_called_by_the_kubelet(harness: Harness) -> None:
    harness.hw.add_dev("/dev/ttyUSB0")
    seen = harness.root / "prestart.out"
    cmd = _script(harness.root / "reset.sh", f'echo "$PATCHBAY_DEVICE_IDS" >> {seen}\n')
    harness.start_agent(
        SERIAL, {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}, "preStart": {"command": [cmd]}}
    )
    harness.kubelet.wait(SERIAL, capacity=1, allocatable=1)
    harness.kubelet.ok("allocate", pod="p1", container="c", resource=SERIAL, count=1)
    assert seen.read_text() == "ttyUSB0\n"


def test_kubelet_restart_is_followed_by_reregistration(harness: Harness) -> None:
    for n in range(2):
        harness.hw.add_dev(f"/dev/ttyUSB{n}")
    harness.start_agent(SERIAL, {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}})
    harness.kubelet.wait(SERIAL, capacity=2, allocatable=2)
    before = harness.kubelet.ok("allocate", pod="p1", container="c", resource=SERIAL, count=1)
    (socket,) = harness.sockets(SERIAL)
    for _ in range(3):
        harness.kubelet.ok("restart")
        harness.kubelet.wait(SERIAL, capacity=2, allocatable=2)
        # The new kubelet wiped the directory; the same process serves the same name again.
        assert harness.sockets(SERIAL) == [socket]
        assert harness.kubelet.endpoints(SERIAL) == ([str(socket)], str(socket))
    # The new kubelet kept p1's device through its checkpoint; p2 gets the other one.
    after = harness.kubelet.ok("allocate", pod="p2", container="c", resource=SERIAL, count=1)
    assert after["device_ids"] != before["device_ids"]
    # A kubelet that is down for a while, then comes back.
    harness.kubelet.ok("stop")
    assert not (harness.plugin_dir / "kubelet.sock").exists()
    harness.kubelet.ok("start")
    harness.kubelet.wait(SERIAL, capacity=2, allocatable=2)


def test_agent_that_stops_leaves_the_kubelet_at_zero_allocatable(harness: Harness) -> None:
    harness.hw.add_dev("/dev/ttyUSB0")
    agent = harness.start_agent(SERIAL, {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}})
    harness.kubelet.wait(SERIAL, capacity=1, allocatable=1)
    (socket,) = harness.sockets(SERIAL)
    assert agent.stop() == 0
    # Upstream behaviour: the resource stays, every device Unhealthy, until the grace period ends.
    harness.kubelet.wait(SERIAL, capacity=1, allocatable=0)
    assert harness.sockets(SERIAL) == []
    assert harness.kubelet.endpoints(SERIAL) == ([], str(socket))  # the stopped endpoint, in its grace


def _pci_vfio(h: Harness) -> dict[str, Any]:
    h.hw.add_pci("0000:3b:00.0", vendor="10de", device="2330", numa_node=0, iommu_group=17)
    h.hw.add_pci("0000:3c:00.0", vendor="10de", device="2330", numa_node=1, iommu_group=18)
    h.hw.add_pci("0000:00:1f.6", vendor="8086", device="15bb", iommu_group=3)
    return {"pci": {"vendor": "10de", "vfio": True}}


def _usb(h: Harness) -> dict[str, Any]:
    h.hw.add_usb("1-1", vendor="1234", product="5678", bus=1, devnum=4)
    h.hw.add_usb("1-2", vendor="1234", product="5678", bus=1, devnum=5)
    h.hw.add_usb("1-3", vendor="dead", product="beef", bus=1, devnum=6)
    return {"usb": {"vendor": "1234", "product": "5678"}}


def _paths(h: Harness) -> dict[str, Any]:
    h.hw.add_dev("/dev/dri/card0")
    h.hw.add_dev("/dev/dri/renderD128")
    h.hw.add_dev("/dev/dri/card1")
    h.hw.add_dev("/dev/dri/renderD129")
    return {
        "paths": {
            "groups": [
                {"id": "card0", "paths": ["/dev/dri/card0", "/dev/dri/renderD128"]},
                {"id": "card1", "paths": ["/dev/dri/card1", "/dev/dri/renderD129"]},
            ]
        }
    }


def _virtual(h: Harness) -> dict[str, Any]:
    return {"virtual": {"count": 2}}


@pytest.mark.parametrize(
    ("backend", "make", "files"),
    [
        ("pci", _pci_vfio, [{"/dev/vfio/vfio", "/dev/vfio/17"}, {"/dev/vfio/vfio", "/dev/vfio/18"}]),
        ("usb", _usb, [{"/dev/bus/usb/001/004"}, {"/dev/bus/usb/001/005"}]),
        (
            "paths",
            _paths,
            [{"/dev/dri/card0", "/dev/dri/renderD128"}, {"/dev/dri/card1", "/dev/dri/renderD129"}],
        ),
        ("virtual", _virtual, [set(), set()]),
    ],
)
def test_every_discovery_backend_end_to_end(
    harness: Harness, backend: str, make: Any, files: list[set[str]]
) -> None:
    resource = f"example.com/{backend}"
    harness.start_agent(resource, {"discovery": make(harness)})
    harness.kubelet.wait(resource, capacity=2, allocatable=2)
    got = [
        {
            d["host_path"]
            for d in harness.kubelet.ok("allocate", pod=f"p{n}", container="c", resource=resource, count=1)[
                "devices"
            ]
            or []
        }
        for n in range(2)
    ]
    assert sorted(got, key=sorted) == sorted(files, key=sorted)


def test_a_bad_resource_name_never_reaches_the_kubelet(harness: Harness) -> None:
    agent = harness.start_agent("kubernetes.io/serial", {"discovery": {"virtual": {"count": 1}}})
    assert agent.proc.wait(30) == 2
    assert "resourceName" in agent.log_tail()
    with pytest.raises(PeerError):
        harness.kubelet.wait("kubernetes.io/serial", capacity=1, timeout_ms=500)
    assert not [n for n in os.listdir(harness.plugin_dir) if n.startswith("patchbay-")]
