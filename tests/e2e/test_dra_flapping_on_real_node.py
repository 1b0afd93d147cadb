"""A device that comes and goes is ONE transition in the API, on the REAL node (issue: health as
taints with hysteresis).

The shared node agent serves a DRA profile over FAKE devices (mknod 1:3 under /dev). One device
file is removed and put back every 3 s for 30 s: 10 changes. The agent publishes the failure at
once, holds the recovery (`recoveryHoldSeconds`, 10 s by default) and, from the third change
within 30 s, holds the device Unhealthy as flapping until it has been quiet for 30 s. What the
scheduler sees (the device tainted in the ResourceSlice, or left out of it where the API server
drops device taints, before 1.36) and what the DeviceReport says must each change exactly twice:
unavailable once, available again once, after the flapping stopped.

Polled every 0.1 s: the agent coalesces slice writes for 0.5 s, and without the hold the states
would alternate every 3 s (three transitions, the old behaviour), which this sampling sees.

The 10 changes in 30 s are issue 21's, run on the newest release. On the older ones (CI's
test-oldest) 4 changes in 12 s: what differs by release is how the API server keeps a device's
taints (dropped before 1.36: the device left out of the slice instead), and 4 changes still take
the device through the rule whole: gone, back within its recovery hold, gone again (the third
change: flapping), back for good, then held for the 30 s quiet and one recovery.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from support.clusters import Cluster
from support.dranode import dra_profile, report_health, slice_devices
from support.realnode import DEVICES, Installed, add_fake_device, wait_for
from support.releases import has, newest

CHANGES, EVERY = 10, 3.0
CHANGES_OLDER = 4
"""The changes on the releases before the newest (module doc); even, so the device ends present."""


def test_a_device_that_comes_and_goes_is_one_transition_then_one_recovery(
    patchbay: Installed, cluster: Cluster, real_node: str, fake_dev: Path, kube_release: str
) -> None:
    name, _resource, driver = dra_profile(cluster, fake_dev, real_node, own_agent=False)
    taints_kept = has("dra-device-taints", kube_release)
    changes = CHANGES if newest(kube_release) else CHANGES_OLDER
    try:
        devices = wait_for(
            "the node's devices in a ResourceSlice",
            lambda: (d := slice_devices(cluster, driver, real_node)) and len(d) == DEVICES and d,
            120,
        )
        ids = {d["attributes"]["patchbay.dev/id"]["string"]: n for n, d in devices.items()}
        (flapper,) = [i for i in ids if i.endswith("ttyDRA1")]
        wait_for(
            "every device Healthy in the report",
            lambda: (
                (h := report_health(cluster, patchbay, name, real_node))
                and len(h) == DEVICES
                and set(h.values()) == {"Healthy"}
            ),
            60,
        )

        def available() -> tuple[bool, tuple[str, ...]]:
            """Whether the scheduler may allocate the device, and its taints' keys."""
            dev = slice_devices(cluster, driver, real_node).get(ids[flapper])
            if dev is None:
                return False, ()
            keys = tuple(sorted(t["key"] for t in dev.get("taints") or []))
            return not any(t["effect"] != "None" for t in dev.get("taints") or []), keys

        slice_states: list[bool] = []
        report_states: list[str] = []
        taint_keys: set[str] = set()

        def sample() -> None:
            ok, keys = available()
            taint_keys.update(keys)
            if not slice_states or slice_states[-1] != ok:
                slice_states.append(ok)
            health = report_health(cluster, patchbay, name, real_node).get(flapper, "")
            if health and (not report_states or report_states[-1] != health):
                report_states.append(health)

        sample()
        path = fake_dev / "ttyDRA1"
        start = time.monotonic()
        for i in range(changes):
            if i % 2 == 0:
                path.unlink()
            else:
                add_fake_device(fake_dev, "ttyDRA1")
            while time.monotonic() < start + (i + 1) * EVERY:
                sample()
                time.sleep(0.1)
        assert path.exists()  # the last change put it back: it stays
        # Quiet now: held as flapping for 30 s after its last change, then one recovery.
        deadline = time.monotonic() + 90
        while slice_states[-1] is not True or report_states[-1] != "Healthy":
            assert time.monotonic() < deadline, (slice_states, report_states)
            sample()
            time.sleep(0.1)
        recovered_after = time.monotonic() - start - (changes - 1) * EVERY

        assert slice_states == [True, False, True], slice_states
        assert report_states == ["Healthy", "Unhealthy", "Healthy"], report_states
        # Not a moment of the flapping let a claim onto it: it recovered only once quiet for 30 s.
        assert recovered_after >= 30, recovered_after
        if taints_kept:
            assert "patchbay.dev/flapping" in taint_keys, taint_keys
    finally:
        with contextlib.suppress(FileExistsError):
            add_fake_device(fake_dev, "ttyDRA1")
        cluster.delete_profile(name)
        cluster.set_labels(real_node, {"patchbay.dev/e2e-dra": None})
