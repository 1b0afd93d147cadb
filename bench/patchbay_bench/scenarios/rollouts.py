"""Per Kubernetes release (the one ``PATCHBAY_KUBE_BIN`` holds; ``make`` sets it from
``K8S_VERSION``), on the real node with the chart: agent rollouts as the kubelet sees them, and two
latencies a user feels.

- ``kubectl apply`` of a DevicePlugin profile -> the kubelet counts its devices (PodResources);
- a device a running pod holds is removed -> the pod's ``allocatedResourcesStatus`` says
  Unhealthy (where the release has ResourceHealthStatus: docs/compatibility.md);
- ``rollouts`` profile changes: with ``agent=own`` (the profile has agent settings of its own)
  each rolls the profile's DaemonSet; with ``agent=node`` the shared node agent applies it in
  place (done when its log says so; the same pod, no restart). Meanwhile a pod asking for one
  device is created every ``burst_every`` seconds from the change to a second after it ended, and
  the kubelet's own allocatable is sampled every ``sample_every`` seconds: the lowest value, the
  longest dip, registrations per rollout, pods refused at admission (UnexpectedAdmissionError).

The sampled timeline also goes to ``bench/results/rollouts-<release>[-...].json`` for the plots
(``python -m patchbay_bench.plots``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import statistics
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from patchbay_agent.kubelet.podresources import get_allocatable_resources, list_pods
from patchbay_bench import RESULTS, kube
from patchbay_bench.harness import Run, Value, wait
from patchbay_bench.kube import PROFILES, Api, ApiError, ns_path
from patchbay_bench.peers import REGISTRATION_LINE, AllocatableSampler, busybox_pod, dips, limits
from patchbay_bench.setup import (
    AGENTS_NS,
    NODE,
    SESSION,
    fake_devices,
    kube_release,
    restore,
    vanish,
)
from patchbay_devcluster.releases import has

WORK, FAKE_DEV, DEVICES, LABEL = "rollbench", Path("/dev/patchbay-rollbench"), 4, "patchbay.dev/bench-roll"
REPLICAS = 16  # shared 16 ways: 64 allocatable, so the burst never waits for a free device
IN_PLACE_LINE = "Applied the profile change for"  # the node agent's log line (resourceagent.py)
PLUGIN = {"discovery": {"paths": {"globs": [f"{FAKE_DEV}/ttyR*"]}}, "health": {"periodSeconds": 1}}
PODS = ns_path(WORK, "pods")


def profile(name: str, resource: str, plugin: dict[str, Any]) -> dict[str, Any]:
    spec = {
        "resourceName": resource,
        "mode": "DevicePlugin",
        "nodeSelector": {"matchLabels": {LABEL: "yes"}},
        "plugin": plugin,
        # What is measured is the agent's side of a change (a rollout of its pods, or the shared
        # agent's live change), as before staged rollouts: every node at once.
        "rollout": {"strategy": "Immediate"},
    }
    return kube.profile(name, spec)


class Burst:
    """Creates a pod asking for one device every ``every`` seconds while ``on`` is set; reaps the
    pods that ended and counts those the kubelet refused at admission."""

    def __init__(self, api: Api, resource: str, every: float) -> None:
        self.api, self.resource, self.every = api, resource, every
        self.on, self.stop = threading.Event(), threading.Event()
        self.created = 0
        self.refused: list[str] = []
        self._seen: set[str] = set()
        self._threads = [threading.Thread(target=t, daemon=True) for t in (self._create, self._reap)]

    def __enter__(self) -> Burst:
        for t in self._threads:
            t.start()
        return self

    def drain(self) -> None:
        """Until every burst pod ended and was deleted (the node holds at most 50 pods)."""
        wait("every burst pod to end", lambda: self._reap_once() == 0, 300, 0.5)

    def __exit__(self, *_: object) -> None:
        self.on.clear()
        self.drain()
        self.stop.set()
        for t in self._threads:
            t.join(10)

    def _create(self) -> None:
        next_at = time.monotonic()
        while not self.stop.is_set():
            if self.on.is_set():
                pod = limits(busybox_pod(f"b{self.created:05d}", NODE, "true"), self.resource, 1)
                pod["metadata"]["labels"] = {"bench": "burst"}
                pod["spec"]["terminationGracePeriodSeconds"] = 0
                with contextlib.suppress(ApiError):
                    self.api.create(PODS, pod)
                    self.created += 1
            next_at = max(next_at + self.every, time.monotonic())
            time.sleep(max(0.0, next_at - time.monotonic()))

    def _reap_once(self) -> int:
        left = 0
        for p in self.api.items(PODS, labelSelector="bench=burst"):
            status, name = p.get("status") or {}, p["metadata"]["name"]
            if status.get("phase") in ("Succeeded", "Failed"):
                if name not in self._seen:
                    self._seen.add(name)
                    if status.get("reason") == "UnexpectedAdmissionError":
                        self.refused.append(f"{name}: {status.get('message')}")
                self.api.call("DELETE", f"{PODS}/{name}", {"gracePeriodSeconds": 0}, ok=(404,))
            else:
                left += 1
        return left

    def _reap(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(ApiError):
                self._reap_once()
            time.sleep(0.5)


KLOG_TIME = re.compile(r"^[IWE]\d{4} (\d\d):(\d\d):(\d\d\.\d+)")


def reregistration(text: str) -> float | None:
    """From the kubelet's log of one rollout: ms from its disconnect of the new agent to that
    agent's next registration request (the agent's part of a re-registration); None where the
    kubelet dropped nothing (v1.37)."""
    t_disc = None
    for line in text.splitlines():
        m = KLOG_TIME.match(line)
        if m is None:
            continue
        at = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
        if t_disc is None and "Device plugin disconnected" in line:
            t_disc = at
        elif t_disc is not None and REGISTRATION_LINE in line:
            return round((at - t_disc) * 1000, 1)
    return None


class Rollouts:
    def __init__(self, r: Run, api: Api, socket: Path) -> None:
        self.r, self.api, self.socket = r, api, socket

    def kubelet_count(self, resource: str) -> int:
        try:
            return asyncio.run(get_allocatable_resources(self.socket, rpc_timeout=2)).count(resource)
        except Exception:
            return -1

    def delete_profile(self, name: str) -> None:
        self.api.delete(f"{PROFILES}/{name}")
        wait(f"profile {name} deleted", lambda: self.api.get(f"{PROFILES}/{name}") is None, 180, 0.1)

    def apply_to_kubelet(self, i: int) -> float:
        resource = f"bench.patchbay.dev/apply{i}"
        t0 = time.monotonic()
        self.api.create(PROFILES, profile(f"bench-apply-{i}", resource, PLUGIN))
        wait("the kubelet to count the devices", lambda: self.kubelet_count(resource) == DEVICES)
        took = time.monotonic() - t0
        self.delete_profile(f"bench-apply-{i}")
        wait("the devices gone from the kubelet", lambda: self.kubelet_count(resource) <= 0, 180, 0.1)
        return took

    def vanish_to_pod_status(self, resource: str, runs: int) -> list[float]:
        pod = limits(busybox_pod("holder", NODE, "sleep 3600"), resource, 1)
        pod["spec"]["terminationGracePeriodSeconds"] = 0
        self.api.create(PODS, pod)
        wait(
            "the holder pod Running",
            lambda: ((self.api.get(f"{PODS}/holder") or {}).get("status") or {}).get("phase") == "Running",
        )

        def held() -> str | None:
            for p in asyncio.run(list_pods(self.socket)):
                if p.name == "holder" and p.namespace == WORK:
                    for c in p.containers:
                        if ids := c.device_ids(resource):
                            return ids[0]
            return None

        device_id: str = wait("PodResources to name the holder's device", held) or "?"
        # Device IDs are the path under /dev with "/" as "_" (a replica adds "::<n>").
        physical = device_id.split("::", maxsplit=1)[0]
        dev = next(p for p in FAKE_DEV.iterdir() if physical.endswith("_" + p.name))

        def health() -> str | None:
            st = (self.api.get(f"{PODS}/holder") or {}).get("status") or {}
            for cs in st.get("containerStatuses") or []:
                for res in cs.get("allocatedResourcesStatus") or []:
                    for x in res.get("resources") or [] if res.get("name") == resource else []:
                        if x.get("resourceID") == device_id:
                            return str(x.get("health"))
            return None

        out = []
        try:
            wait("the pod's status to show the device Healthy", lambda: health() == "Healthy", 120, 0.05)
            for _ in range(runs):
                t0 = time.monotonic()
                rdev = vanish(dev)
                wait(
                    "the pod's status to show the device Unhealthy",
                    lambda: health() == "Unhealthy",
                    120,
                    0.02,
                )
                out.append(time.monotonic() - t0)
                restore(dev, rdev)
                wait("the pod's status to show the device Healthy", lambda: health() == "Healthy", 120, 0.05)
        finally:
            self.api.call("DELETE", f"{PODS}/holder", {"gracePeriodSeconds": 0}, ok=(404,))
        return out

    def change(self, name: str, n: int) -> None:
        self.api.merge(
            f"{PROFILES}/{name}", {"spec": {"plugin": {"allocation": {"envs": {"ROLLOUT": str(n)}}}}}
        )

    def live_change(self, name: str, n: int, burst: threading.Event) -> tuple[float, float]:
        """One change applied in place by the shared node agent: (started, applied) monotonic."""
        (pod,) = agent_pods_of(self.api, "app.kubernetes.io/component=node-agent")
        log_path = f"{ns_path(AGENTS_NS, 'pods')}/{pod['metadata']['name']}/log"
        before = self.api.text(log_path).count(IN_PLACE_LINE)
        burst.set()
        started = time.monotonic()
        self.change(name, n)
        wait(
            "the node agent to apply the change in place",
            lambda: self.api.text(log_path).count(IN_PLACE_LINE) > before,
            120,
            0.05,
        )
        done = time.monotonic()
        now = self.api.get(f"{ns_path(AGENTS_NS, 'pods')}/{pod['metadata']['name']}") or {}
        restarts = sum(
            c.get("restartCount", 0) for c in (now.get("status") or {}).get("containerStatuses") or []
        )
        if now.get("metadata", {}).get("uid") != pod["metadata"]["uid"] or restarts:
            raise RuntimeError(f"the node agent pod was replaced or restarted ({restarts} restarts)")
        return started, done

    def rollout(self, name: str, n: int, overlap: threading.Event) -> tuple[float, float]:
        """One change -> the DaemonSet rolled: (started, completed) monotonic. Starts once the agent
        pod is Ready: a pod not yet available is replaced WITHOUT a surge (a pod start, not a
        rollout)."""
        selector = f"patchbay.dev/profile={name}"

        def ready() -> list[dict[str, Any]]:
            pods = agent_pods_of(self.api, selector)
            return [
                p
                for p in pods
                if len(pods) == 1
                and any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in (p.get("status") or {}).get("conditions") or []
                )
            ]

        (old,) = wait("the agent pod Ready", ready, 60, 0.1)
        started = time.monotonic()
        # A change of the agent's own settings rolls its DaemonSet; a plugin change no longer
        # does (an own agent follows its ConfigMap live, staged like the shared agent's).
        self.api.merge(
            f"{PROFILES}/{name}", {"spec": {"agent": {"resources": {"requests": {"cpu": f"{10 + n}m"}}}}}
        )

        def done() -> bool:
            ds = self.api.get(f"/apis/apps/v1/namespaces/{AGENTS_NS}/daemonsets/patchbay-{name}") or {}
            st = ds.get("status") or {}
            pods = self.api.items(ns_path(AGENTS_NS, "pods"), labelSelector=selector)
            if len(pods) >= 2 or any(p["metadata"].get("deletionTimestamp") for p in pods):
                overlap.set()
            return bool(
                st.get("observedGeneration", 0) >= ds.get("metadata", {}).get("generation", 0)
                and st.get("desiredNumberScheduled")
                == st.get("updatedNumberScheduled")
                == st.get("numberAvailable")
                and len(pods) == 1
                and pods[0]["metadata"]["uid"] != old["metadata"]["uid"]
            )

        wait("the agent DaemonSet to roll", done, 240, 0.1)
        return started, time.monotonic()


def agent_pods_of(api: Api, selector: str) -> list[dict[str, Any]]:
    pods = api.items(ns_path(AGENTS_NS, "pods"), labelSelector=selector)
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def run(r: Run) -> None:
    cluster = SESSION.chart_cluster(r)
    release, api = kube_release(), cluster.api
    b = Rollouts(r, api, cluster.dev.real_node().paths.pod_resources_socket)
    cluster.label_node(NODE, {LABEL: "yes"})
    cluster.namespace(WORK)
    name, resource, full = "bench-roll", "bench.patchbay.dev/roll", DEVICES * REPLICAS
    rounds = r.rounds()
    try:
        with fake_devices(FAKE_DEV, [f"ttyR{i}" for i in range(DEVICES)]):
            r.figure(
                f"{release}: apply -> the kubelet has the devices (PodResources)",
                "s",
                {"profile applied": [b.apply_to_kubelet(i) for i in range(rounds)]},
                headline=True,
            )
            body = profile(name, resource, {**PLUGIN, "sharing": {"replicas": REPLICAS}})
            if r.text("agent") == "own":
                surge = (
                    {"maxSurge": 1, "maxUnavailable": 0}
                    if r.text("strategy") == "surge"
                    else {"maxSurge": 0, "maxUnavailable": 1}
                )
                body["spec"]["agent"] = {"updateStrategy": surge}
            api.create(PROFILES, body)
            wait("the kubelet's full count", lambda: b.kubelet_count(resource) == full, 180, 0.1)
            if has("health-in-pod-status", release):
                r.figure(
                    f"{release}: a held device vanishes -> the pod's status says Unhealthy",
                    "s",
                    {"allocatedResourcesStatus": b.vanish_to_pod_status(resource, rounds)},
                    headline=True,
                )
            else:
                r.missing(
                    f"{release}: a held device vanishes -> the pod's status says Unhealthy",
                    "ResourceHealthStatus is off on this release",
                )
            wait("the kubelet's full count", lambda: b.kubelet_count(resource) == full, 60, 0.1)
            rows = rollouts(r, b, name, resource, full, cluster.dev.log_dir / "kubelet.log")
            b.delete_profile(name)
    finally:
        cluster.label_node(NODE, {LABEL: None})
        api.delete(f"/api/v1/namespaces/{WORK}")
    how = f"{r.integer('rollouts')} changes, agent={r.text('agent')}, strategy={r.text('strategy')}"
    r.figure(
        f"{release}: rollouts: the kubelet's lowest count (of {full})",
        "devices",
        {"per rollout": [x["min"] for x in rows]},
        headline=True,
        note=how,
    )
    r.figure(
        f"{release}: rollouts: registration requests",
        "count",
        {"per rollout": [x["registrations"] for x in rows]},
        note=how,
    )
    r.figure(
        f"{release}: rollouts: longest dip seen", "ms", {"per rollout": [x["dipMs"] for x in rows]}, note=how
    )
    r.figure(
        f"{release}: rollouts: seconds to complete",
        "s",
        {"per rollout": [x["seconds"] for x in rows]},
        note=how,
    )
    refused, created = rows[-1]["refusedTotal"], rows[-1]["burstPods"]
    r.figure(
        f"{release}: rollouts: burst pods refused at admission",
        "pods",
        {"refused": [refused], "created": [created]},
        ratio=False,
        headline=True,  # the rollouts' other half: no pod refused while they ran
        note=how,
    )


def rollouts(r: Run, b: Rollouts, name: str, resource: str, full: int, log: Path) -> list[dict[str, Any]]:
    sampler = AllocatableSampler(
        b.api.official(), NODE, resource, b.socket, every=r.number("sample_every"), with_api=False
    )
    rows: list[dict[str, Any]] = []
    with sampler, Burst(b.api, resource, r.number("burst_every")) as burst:
        time.sleep(1.0)
        for n in range(1, r.integer("rollouts") + 1):
            offset = log.stat().st_size
            if r.text("agent") == "node":
                started, completed = b.live_change(name, n, burst.on)
            else:
                started, completed = b.rollout(name, n, burst.on)
            time.sleep(1.0)
            burst.on.clear()
            burst.drain()
            with log.open("rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
            window = [s for s in sampler.samples if started <= s.at <= completed + 1.0]
            ds = dips(window, full)
            rows.append(
                {
                    "seconds": round(completed - started, 2),
                    "registrations": text.count(REGISTRATION_LINE),
                    "min": min((0 if s.kubelet is None else s.kubelet) for s in window) if window else -1,
                    "dipMs": round(max((d.seen for d in ds), default=0.0) * 1000, 1),
                    "dips": len(ds),
                    "reregistrationMs": reregistration(text),
                    "burstPods": burst.created,
                    "refusedTotal": len(burst.refused),
                    "load1m": round(os.getloadavg()[0], 1),
                }
            )
            r.log(f"rollout {n}: {rows[-1]}")
            time.sleep(2.0)
    samples = sampler.samples
    suffix = ("" if r.text("strategy") == "surge" else f"-{r.text('strategy')}") + (
        "" if r.text("agent") == "own" else "-live"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    timeline = {
        "release": kube_release(),
        "rollouts": rows,
        "burstPods": burst.created,
        "refusedAtAdmission": len(burst.refused),
        "longestDipSeenMs": max((x["dipMs"] for x in rows), default=0),
        "loadAverage1m": round(os.getloadavg()[0], 1),
        "sampleGapP50Ms": round(
            statistics.median([b2.at - a.at for a, b2 in itertools.pairwise(samples)]) * 1000, 2
        )
        if len(samples) > 1
        else None,
        "timeline": [(round(s.at - samples[0].at, 3), s.kubelet) for s in samples],
    }
    if not r.quick:
        (RESULTS / f"rollouts-{kube_release()}{suffix}.json").write_text(json.dumps(timeline, indent=1))
    return rows


def figures(params: Mapping[str, Value]) -> list[str]:
    """The figures a run records (catalogue.toml): named after the release it measures."""
    release = kube_release()
    return [
        f"{release}: {what}"
        for what in (
            "apply -> the kubelet has the devices (PodResources)",
            "rollouts: the kubelet's lowest count (of 64)",
            "rollouts: registration requests",
            "rollouts: burst pods refused at admission",
        )
    ]
