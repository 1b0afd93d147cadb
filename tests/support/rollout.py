"""One agent rollout on the real node, watched closely: the e2e test asserts on it, bench/ prints it.

While a DevicePlugin profile's agent DaemonSet rolls (maxSurge 1, maxUnavailable 0), the node's
allocatable for the resource is sampled from both places that matter, every ``SAMPLE_EVERY``:

- the API server (``Node.status.allocatable``: what the scheduler uses);
- the kubelet's PodResources ``GetAllocatableResources`` (the device manager's own state, which
  moves at once, before the kubelet's next node status update);

and the kubelet's log lines about the resource are kept (registrations, connections,
disconnections), along with when the rollout started and completed.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from support.clusters import wait_for

from patchbay_agent.kubelet.podresources import get_allocatable_resources

SAMPLE_EVERY = 0.05
"""Seconds between samples: twice as often as the 100 ms the rollout test promises."""

REGISTRATION_LINE = "Got registration request from device plugin with resource"


@dataclass
class Sample:
    at: float  # monotonic
    api: int | None  # None: the resource is absent from the node's allocatable
    kubelet: int | None  # None: the PodResources call failed


class AllocatableSampler:
    """Samples one node's allocatable for one resource from the API server and the kubelet."""

    def __init__(
        self,
        api: client.ApiClient,
        node: str,
        resource: str,
        pod_resources: Path,
        every: float = SAMPLE_EVERY,
        with_api: bool = True,
    ) -> None:
        """``every``: seconds between samples; ``with_api=False`` samples the kubelet alone (the
        API server's value changes only at the kubelet's 10 s status syncs, and reading it costs
        a request per sample)."""
        self._every, self._with_api = every, with_api
        self._core = client.CoreV1Api(api)
        self._node, self._resource, self._socket = node, resource, pod_resources
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def _api_value(self) -> int | None:
        raw = self._core.read_node_status(self._node, _preload_content=False)
        value = (json.loads(raw.data)["status"].get("allocatable") or {}).get(self._resource)
        return None if value is None else int(value)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = time.monotonic()
        while not self._stop.is_set():
            at = time.monotonic()
            api_task = loop.run_in_executor(None, self._api_value) if self._with_api else None
            try:
                kubelet: int | None = (await get_allocatable_resources(self._socket, rpc_timeout=2.0)).count(
                    self._resource
                )
            except Exception:
                kubelet = None
            self.samples.append(Sample(at, None if api_task is None else await api_task, kubelet))
            next_at = max(next_at + self._every, time.monotonic())
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> AllocatableSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)


@dataclass
class Rollout:
    """What happened during one rollout."""

    samples: list[Sample]
    started: float
    completed: float
    after: float  # seconds sampled after completion
    old_pod: str
    new_pod: str
    mid_rollout_pod_started: bool
    kubelet_lines: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.completed - self.started

    @property
    def registrations(self) -> int:
        return sum(REGISTRATION_LINE in line for line in self.kubelet_lines)

    def minimum(self, source: str) -> int | None:
        values = [getattr(s, source) for s in self.samples]
        return None if None in values else min(values)

    def max_gap(self) -> float:
        at = [s.at for s in self.samples]
        return max((b - a for a, b in itertools.pairwise(at)), default=0.0)

    def figures(self) -> dict[str, Any]:
        return {
            "samples": len(self.samples),
            "maxSampleGapMs": round(self.max_gap() * 1000, 1),
            "minAllocatableApi": self.minimum("api"),
            "minAllocatableKubelet": self.minimum("kubelet"),
            "registrations": self.registrations,
            "rolloutSeconds": round(self.seconds, 2),
            "midRolloutPodStarted": self.mid_rollout_pod_started,
        }


def _log_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def run_rollout(
    *,
    api: client.ApiClient,
    namespace: str,
    daemonset: str,
    agent_pods: Callable[[], list[client.V1Pod]],
    change: Callable[[], None],
    node: str,
    resource: str,
    pod_resources: Path,
    kubelet_log: Path,
    workload: Callable[[], str] | None = None,
    workload_namespace: str = "",
    settle: float = 60.0,
) -> Rollout:
    """Apply ``change`` (a profile edit that rolls the agents) and watch the rollout to its end,
    then ``settle`` seconds more. ``workload`` creates a pod (returning its name) once both the
    old and the new agent pod exist; the result says whether that pod started."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    (old,) = [p for p in agent_pods() if not p.metadata.deletion_timestamp]
    log_from = _log_size(kubelet_log)
    with AllocatableSampler(api, node, resource, pod_resources) as sampler:
        time.sleep(1.0)  # a baseline before the change
        started = time.monotonic()
        change()
        mid_pod: str | None = None
        new: client.V1Pod | None = None
        deadline = started + 240
        while time.monotonic() < deadline:
            pods = [p for p in agent_pods() if not p.metadata.deletion_timestamp]
            if workload is not None and mid_pod is None and len(agent_pods()) >= 2:
                mid_pod = workload()
            ds = apps.read_namespaced_daemon_set_status(daemonset, namespace)
            st, gen = ds.status, ds.metadata.generation
            done = (
                (st.observed_generation or 0) >= gen
                and st.desired_number_scheduled == st.updated_number_scheduled == st.number_available
                and len(agent_pods()) == 1
                and pods[0].metadata.uid != old.metadata.uid
            )
            if done:
                new = pods[0]
                break
            time.sleep(0.1)
        assert new is not None, "the agent DaemonSet did not finish rolling within 240 s"
        completed = time.monotonic()
        mid_started = False
        if mid_pod is not None:

            def running() -> bool:
                phase = core.read_namespaced_pod(mid_pod, workload_namespace).status.phase
                assert phase not in ("Failed", "Succeeded"), phase
                return bool(phase == "Running")

            mid_started = bool(wait_for("the pod created mid-rollout Running", running, 120))
        time.sleep(max(0.0, settle - (time.monotonic() - completed)))
        after = time.monotonic() - completed
    with kubelet_log.open("rb") as f:
        f.seek(log_from)
        text = f.read().decode(errors="replace")
    names = (resource, "device plugin", "Deregistered client", "Registered client")
    lines = [line for line in text.splitlines() if any(n in line for n in names)]
    return Rollout(
        sampler.samples,
        started,
        completed,
        after,
        old.metadata.name,
        new.metadata.name,
        mid_started,
        lines,
    )


@dataclass(frozen=True)
class Dip:
    """A stretch of samples below the full count. The kubelet's view between two samples is
    unknown, so a dip lasted at least ``seen`` (first to last sample below) and at most ``bound``
    (last sample at full before it to first sample at full after it)."""

    samples: int
    lowest: int
    seen: float
    bound: float


def dips(samples: list[Sample], full: int, source: str = "kubelet") -> list[Dip]:
    """Every dip of ``source`` below ``full`` in ``samples`` (a failed read counts as 0)."""
    out: list[Dip] = []
    run: list[Sample] = []
    before: Sample | None = None
    for s in samples:
        value = getattr(s, source)
        value = 0 if value is None else value
        if value < full:
            run.append(s)
            continue
        if run:
            low = min(0 if getattr(x, source) is None else getattr(x, source) for x in run)
            start = before.at if before is not None else run[0].at
            out.append(Dip(len(run), low, run[-1].at - run[0].at, s.at - start))
            run = []
        before = s
    if run:
        low = min(0 if getattr(x, source) is None else getattr(x, source) for x in run)
        start = before.at if before is not None else run[0].at
        out.append(Dip(len(run), low, run[-1].at - run[0].at, run[-1].at - start))
    return out
