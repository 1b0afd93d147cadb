"""Per Kubernetes release: agent rollouts as the kubelet sees them, and two user-facing latencies.

Starts a cluster of its own on the release ``PATCHBAY_KUBE_BIN`` holds (``make`` sets it from
``K8S_VERSION``): control plane, the real node, the chart with the images built here. Then:

- ``kubectl apply`` of a DevicePlugin profile -> the kubelet counts its devices (PodResources
  ``GetAllocatableResources``), median of ``--runs``;
- a device a running pod holds is removed -> the pod's
  ``status.containerStatuses[].allocatedResourcesStatus`` says Unhealthy (only where the release
  has ResourceHealthStatus; docs/compatibility.md), median of ``--runs``;
- ``--rollouts`` profile changes. ``--agent own`` (the profile has agent settings of its own):
  each change rolls the profile's agent DaemonSet (maxSurge 1). ``--agent node`` (no agent
  settings: the shared node agent serves the profile): each change is applied by the running agent
  in place, no pod or process leaves; done when the agent's log says so. Meanwhile a pod asking for one device
  is created every ``--burst-every`` seconds from the moment the new agent pod exists beside the
  old one to a second after the rollout ended (the window where a dip can happen; pods are
  drained between rollouts, since the node takes 50 pods and 2 cores start few containers a
  second), the kubelet's
  own allocatable sampled every ``--sample-every`` seconds throughout: the lowest value, the
  longest dip (at least: first to last sample below full; at most: the samples at full around
  it), registrations per rollout, and pods the kubelet refused at admission
  (UnexpectedAdmissionError).

Figures only, no assertions; the results also go to bench/results/rollouts-<release>.json.

Run (root; one real node per machine):
    make kube-binaries K8S_VERSION=v1.34.4
    PATCHBAY_KUBE_BIN=$(K8S_VERSION=v1.34.4 hack/kube-binaries.sh --print-bin-dir) \\
        .venv/bin/python bench/rollouts.py
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests")]

from kubernetes import client, config  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402
from support.realnode import busybox_pod, limits  # noqa: E402
from support.rollout import REGISTRATION_LINE, AllocatableSampler, dips  # noqa: E402

from patchbay_agent.kubelet.podresources import get_allocatable_resources, list_pods  # noqa: E402
from patchbay_devcluster import DevCluster, find_bin_dir  # noqa: E402
from patchbay_devcluster.imagebuild import build_all  # noqa: E402
from patchbay_devcluster.install import helm_install  # noqa: E402
from patchbay_devcluster.node import NODE_NAME  # noqa: E402
from patchbay_devcluster.releases import has, release_of  # noqa: E402

GROUP, VERSION, PLURAL = "patchbay.dev", "v1beta1", "devicepluginprofiles"
AGENTS = "patchbay-system"
WORK = "rollbench"
FAKE_DEV = Path("/dev/patchbay-rollbench")
DEVICES = 4
REPLICAS = 16  # shared 16 ways: 64 allocatable, so the burst never waits for a free device
#: the node agent's log line for a change applied in place (patchbay_agent/resourceagent.py)
IN_PLACE_LINE = "Applied the profile change for"


def wait(what: str, check: Callable[[], Any], timeout: float = 180, every: float = 0.01) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every)
    raise SystemExit(f"bench: timed out waiting for {what}")


class Bench:
    def __init__(self, cluster: DevCluster, release: str) -> None:
        self.cluster, self.release = cluster, release
        self.api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.socket = cluster.real_node().paths.pod_resources_socket

    def kubelet_count(self, resource: str) -> int:
        try:
            return asyncio.run(get_allocatable_resources(self.socket, rpc_timeout=2)).count(resource)
        except Exception:
            return -1

    def profile(self, name: str, resource: str, plugin: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "DevicePluginProfile",
            "metadata": {"name": name},
            "spec": {
                "resourceName": resource,
                "mode": "DevicePlugin",
                "nodeSelector": {"matchLabels": {"patchbay.dev/bench": "yes"}},
                "plugin": plugin,
            },
        }

    def create_profile(self, body: dict[str, Any]) -> None:
        self.custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)

    def delete_profile(self, name: str) -> None:
        self.custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)

        def gone() -> bool:
            try:
                self.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
            except ApiException as e:
                return e.status == 404
            return False

        wait(f"profile {name} deleted", gone, every=0.1)

    # --- apply -> the kubelet has the devices ----------------------------------------------------

    def apply_to_kubelet(self, plugin: dict[str, Any], runs: int) -> list[float]:
        out = []
        for i in range(runs):
            resource = f"bench.patchbay.dev/apply{i}"
            t0 = time.monotonic()
            self.create_profile(self.profile(f"bench-apply-{i}", resource, plugin))
            wait("the kubelet to count the devices", lambda r=resource: self.kubelet_count(r) == DEVICES)
            out.append(time.monotonic() - t0)
            self.delete_profile(f"bench-apply-{i}")
            wait(
                "the devices gone from the kubelet", lambda r=resource: self.kubelet_count(r) <= 0, every=0.1
            )
        return out

    # --- a held device vanishes -> the pod's status says so --------------------------------------

    def vanish_to_pod_status(self, resource: str, runs: int) -> list[float]:
        pod = limits(busybox_pod("holder", NODE_NAME, "sleep 3600"), resource, 1)
        pod["spec"]["terminationGracePeriodSeconds"] = 0
        self.core.create_namespaced_pod(WORK, pod)
        wait(
            "the holder pod Running",
            lambda: self.core.read_namespaced_pod("holder", WORK).status.phase == "Running",
        )

        def held() -> str | None:
            for p in asyncio.run(list_pods(self.socket)):
                if p.name == "holder" and p.namespace == WORK:
                    for c in p.containers:
                        ids = c.device_ids(resource)
                        if ids:
                            return ids[0]
            return None

        device_id = wait("PodResources to name the holder's device", held)
        # Device IDs are the path under /dev with "/" as "_" (a replica adds "::<n>").
        physical = device_id.split("::")[0]
        dev = next(p for p in FAKE_DEV.iterdir() if physical.endswith("_" + p.name))

        def health() -> str | None:
            st = self.core.read_namespaced_pod("holder", WORK).status
            for cs in st.container_statuses or []:
                for r in cs.allocated_resources_status or []:
                    if r.name == resource:
                        for x in r.resources or []:
                            if x.resource_id == device_id:
                                return str(x.health)
            return None

        out = []
        try:
            wait("the pod's status to show the device Healthy", lambda: health() == "Healthy", 120, 0.05)
            for _ in range(runs):
                rdev = dev.stat().st_rdev
                t0 = time.monotonic()
                dev.unlink()
                wait(
                    "the pod's status to show the device Unhealthy",
                    lambda: health() == "Unhealthy",
                    120,
                    0.02,
                )
                out.append(time.monotonic() - t0)
                os.mknod(dev, 0o666 | 0o020000, rdev)
                wait("the pod's status to show the device Healthy", lambda: health() == "Healthy", 120, 0.05)
        finally:
            self.core.delete_namespaced_pod("holder", WORK, grace_period_seconds=0)
        return out

    # --- rollouts under a pod burst --------------------------------------------------------------

    def agent_pods(self, name: str) -> list[client.V1Pod]:
        pods = self.core.list_namespaced_pod(AGENTS, label_selector=f"patchbay.dev/profile={name}").items
        return [p for p in pods if not p.metadata.deletion_timestamp]

    def live_change(self, name: str, n: int, burst: threading.Event) -> tuple[float, float]:
        """One profile change applied in place by the shared node agent; returns (started,
        applied) monotonic. The burst runs from the patch to a second after."""
        pods = self.core.list_namespaced_pod(
            AGENTS, label_selector="app.kubernetes.io/component=node-agent"
        ).items
        (pod,) = [p for p in pods if not p.metadata.deletion_timestamp]

        def applied() -> int:
            text = self.core.read_namespaced_pod_log(pod.metadata.name, AGENTS)
            return str(text).count(IN_PLACE_LINE)

        before = applied()
        burst.set()
        started = time.monotonic()
        self.custom.patch_cluster_custom_object(
            GROUP, VERSION, PLURAL, name, {"spec": {"plugin": {"allocation": {"envs": {"ROLLOUT": str(n)}}}}}
        )
        wait("the node agent to apply the change in place", lambda: applied() > before, 120, 0.05)
        done = time.monotonic()
        pod_now = self.core.read_namespaced_pod(pod.metadata.name, AGENTS)
        restarts = sum(c.restart_count for c in pod_now.status.container_statuses or [])
        if pod_now.metadata.uid != pod.metadata.uid or restarts:
            raise SystemExit(f"the node agent pod was replaced or restarted ({restarts} restarts)")
        return started, done

    def rollout(self, name: str, n: int, overlap: threading.Event) -> tuple[float, float]:
        """One profile change -> the DaemonSet rolled; returns (started, completed) monotonic.
        ``overlap`` is set once the new agent pod exists beside the old one. Starts only once the
        agent pod is Ready: the DaemonSet controller replaces a pod that is not yet available
        WITHOUT a surge (deletes it at once), which measures a pod start, not a rollout."""

        def ready_agent() -> list[client.V1Pod]:
            pods = self.agent_pods(name)
            return [
                p
                for p in pods
                if len(pods) == 1
                and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
            ]

        (old,) = wait("the agent pod Ready", ready_agent, 60, 0.1)
        started = time.monotonic()
        self.custom.patch_cluster_custom_object(
            GROUP, VERSION, PLURAL, name, {"spec": {"plugin": {"allocation": {"envs": {"ROLLOUT": str(n)}}}}}
        )

        def done() -> bool:
            ds = self.apps.read_namespaced_daemon_set_status(f"patchbay-{name}", AGENTS)
            st = ds.status
            pods = self.core.list_namespaced_pod(AGENTS, label_selector=f"patchbay.dev/profile={name}").items
            if len(pods) >= 2 or any(p.metadata.deletion_timestamp for p in pods):
                overlap.set()
            return bool(
                (st.observed_generation or 0) >= ds.metadata.generation
                and st.desired_number_scheduled == st.updated_number_scheduled == st.number_available
                and len(pods) == 1
                and pods[0].metadata.uid != old.metadata.uid
            )

        wait("the agent DaemonSet to roll", done, 240, 0.1)
        return started, time.monotonic()


class Burst:
    """Creates a pod asking for one device every ``every`` seconds while ``on`` is set; reaps pods
    that ended and counts those the kubelet refused at admission."""

    def __init__(self, core: client.CoreV1Api, resource: str, every: float) -> None:
        self.core, self.resource, self.every = core, resource, every
        self.on = threading.Event()
        self.stop = threading.Event()
        self.created = 0
        self.refused: list[str] = []
        self.reasons: dict[str, int] = {}
        self._seen: set[str] = set()
        self._threads = [
            threading.Thread(target=self._create, daemon=True),
            threading.Thread(target=self._reap, daemon=True),
        ]

    def __enter__(self) -> Burst:
        for t in self._threads:
            t.start()
        return self

    def drain(self) -> None:
        """Wait until every burst pod ended (and was deleted): the node holds at most 50 pods."""
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
                pod = limits(busybox_pod(f"b{self.created:05d}", NODE_NAME, "true"), self.resource, 1)
                pod["metadata"]["labels"] = {"bench": "burst"}
                pod["spec"]["terminationGracePeriodSeconds"] = 0
                try:
                    self.core.create_namespaced_pod(WORK, pod)
                    self.created += 1
                except ApiException as e:
                    print(f"  burst: create failed: {e.status} {e.reason}")
            next_at = max(next_at + self.every, time.monotonic())
            time.sleep(max(0.0, next_at - time.monotonic()))

    def _reap_once(self) -> int:
        pods = self.core.list_namespaced_pod(WORK, label_selector="bench=burst").items
        left = 0
        for p in pods:
            phase, name = p.status.phase, p.metadata.name
            if phase in ("Succeeded", "Failed"):
                if name not in self._seen:
                    self._seen.add(name)
                    if phase == "Failed":
                        reason = p.status.reason or "Failed"
                        self.reasons[reason] = self.reasons.get(reason, 0) + 1
                        if reason == "UnexpectedAdmissionError":
                            self.refused.append(f"{name}: {p.status.message}")
                with contextlib.suppress(ApiException):
                    self.core.delete_namespaced_pod(name, WORK, grace_period_seconds=0)
            else:
                left += 1
        return left

    def _reap(self) -> None:
        while not self.stop.is_set():
            self._reap_once()
            time.sleep(0.5)


KLOG_TIME = re.compile(r"^[IWE]\d{4} (\d\d):(\d\d):(\d\d\.\d+)")


def _klog_seconds(line: str) -> float | None:
    m = KLOG_TIME.match(line)
    return None if m is None else int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))


def reregistration(text: str) -> dict[str, float] | None:
    """From the kubelet's log of one rollout: milliseconds from its disconnect of the new agent
    ("Device plugin disconnected") to that agent's next registration request (the agent's part:
    noticing, PodResources, Register) and from there to the device list pushed (the kubelet's
    part: dialing back, options, ListAndWatch). None where the kubelet dropped nothing (v1.37)."""
    t_disc = t_reg = t_push = None
    for line in text.splitlines():
        at = _klog_seconds(line)
        if at is None:
            continue
        if t_disc is None and "Device plugin disconnected" in line:
            t_disc = at
        elif t_disc is not None and t_reg is None and REGISTRATION_LINE in line:
            t_reg = at
        elif t_reg is not None and t_push is None and "State pushed for device plugin" in line:
            t_push = at
    if t_disc is None or t_reg is None or t_push is None:
        return None
    return {"agentMs": round((t_reg - t_disc) * 1000, 1), "kubeletMs": round((t_push - t_reg) * 1000, 1)}


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="runs of each latency (median printed)")
    ap.add_argument("--rollouts", type=int, default=5)
    ap.add_argument("--burst-every", type=float, default=0.1, help="seconds between burst pods")
    ap.add_argument("--sample-every", type=float, default=0.01, help="seconds between kubelet samples")
    ap.add_argument(
        "--strategy",
        choices=("surge", "unavailable"),
        default="surge",
        help="the agents' updateStrategy: surge (the default: maxSurge 1, maxUnavailable 0) or "
        "unavailable (maxSurge 0, maxUnavailable 1: the old agent stops before the new one starts)",
    )
    ap.add_argument(
        "--agent",
        choices=("own", "node"),
        default="own",
        help="own: the profile has agent settings of its own, a change rolls its DaemonSet; node: "
        "the shared node agent serves it and applies a change in place",
    )
    ap.add_argument("--skip-latencies", action="store_true", help="only the rollouts")
    args = ap.parse_args()
    # SIGTERM (a killed run) still stops the cluster: the finally below runs on SystemExit.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    bin_dir = find_bin_dir()
    release = release_of(bin_dir)
    print(f"== Kubernetes {release} ({bin_dir}) ==")
    images = build_all(REPO)
    results: dict[str, Any] = {"release": release, "at": time.strftime("%Y-%m-%d %H:%M:%S")}
    with tempfile.TemporaryDirectory(prefix="pb-rollbench-") as tmp:
        cluster = DevCluster(Path(tmp) / "c", bin_dir)
        cluster.up()
        try:
            cluster.start_real_node()
            helm_install(
                cluster, REPO / "charts" / "patchbay", images, {"operator": {"statusDebounceSeconds": 0.3}}
            )
            b = Bench(cluster, release)
            b.core.patch_node(NODE_NAME, {"metadata": {"labels": {"patchbay.dev/bench": "yes"}}})
            b.core.create_namespace({"metadata": {"name": WORK}})
            wait(
                "the default ServiceAccount",
                lambda: b.core.list_namespaced_service_account(WORK).items,
                60,
                0.2,
            )
            FAKE_DEV.mkdir(exist_ok=True)
            for i in range(DEVICES):
                os.mknod(FAKE_DEV / f"ttyR{i}", 0o666 | 0o020000, os.makedev(1, 3))
            plugin = {
                "discovery": {"paths": {"globs": [f"{FAKE_DEV}/ttyR*"]}},
                "health": {"periodSeconds": 1},
            }

            results["strategy"] = args.strategy
            results["agent"] = args.agent
            if not args.skip_latencies:
                apply = b.apply_to_kubelet(plugin, args.runs)
                results["applyToKubeletSeconds"] = apply
                print(
                    f"apply -> the kubelet has the devices: median {median(apply):.2f} s, "
                    f"runs {[round(x, 2) for x in apply]}"
                )

            name, resource = "bench-roll", "bench.patchbay.dev/roll"
            full = DEVICES * REPLICAS
            body = b.profile(name, resource, {**plugin, "sharing": {"replicas": REPLICAS}})
            if args.agent == "own":
                surge = {"maxSurge": 1, "maxUnavailable": 0}
                if args.strategy == "unavailable":
                    surge = {"maxSurge": 0, "maxUnavailable": 1}
                body["spec"]["agent"] = {"updateStrategy": surge}
            b.create_profile(body)
            wait("the kubelet's full count", lambda: b.kubelet_count(resource) == full, 180, 0.1)

            if args.skip_latencies:
                pass
            elif has("health-in-pod-status", release):
                vanish = b.vanish_to_pod_status(resource, args.runs)
                results["vanishToPodStatusSeconds"] = vanish
                print(
                    f"device vanish -> pod status Unhealthy: median {median(vanish):.2f} s, "
                    f"runs {[round(x, 2) for x in vanish]}"
                )
            else:
                results["vanishToPodStatusSeconds"] = None
                print("device vanish -> pod status: n/a (ResourceHealthStatus is off on this release)")
            wait("the kubelet's full count", lambda: b.kubelet_count(resource) == full, 60, 0.1)

            log = cluster.log_dir / "kubelet.log"
            per_rollout: list[dict[str, Any]] = []
            sampler = AllocatableSampler(
                b.api, NODE_NAME, resource, b.socket, every=args.sample_every, with_api=False
            )
            with sampler, Burst(b.core, resource, args.burst_every) as burst:
                time.sleep(1.0)
                for n in range(1, args.rollouts + 1):
                    offset = log.stat().st_size
                    if args.agent == "node":
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
                    row = {
                        "seconds": round(completed - started, 2),
                        "registrations": text.count(REGISTRATION_LINE),
                        "deregistered": text.count("Deregistered client"),
                        "min": min((0 if s.kubelet is None else s.kubelet) for s in window)
                        if window
                        else None,
                        "dips": len(ds),
                        "longestDipSeenMs": round(max((d.seen for d in ds), default=0.0) * 1000, 1),
                        "longestDipBoundMs": round(max((d.bound for d in ds), default=0.0) * 1000, 1),
                        "samples": len(window),
                        "reregistration": reregistration(text),
                        "loadAverage1m": round(os.getloadavg()[0], 1),
                    }
                    per_rollout.append(row)
                    print(f"rollout {n}: {row}")
                    time.sleep(2.0)
            samples = sampler.samples
            gaps = [b2.at - a.at for a, b2 in itertools.pairwise(samples)]
            all_dips = dips(samples, full)
            results.update(
                {
                    "rollouts": per_rollout,
                    "sampleEveryMs": args.sample_every * 1000,
                    "sampleGapP50Ms": round(statistics.median(gaps) * 1000, 2) if gaps else None,
                    "minKubelet": min((0 if s.kubelet is None else s.kubelet) for s in samples),
                    "longestDipSeenMs": round(max((d.seen for d in all_dips), default=0.0) * 1000, 1),
                    "longestDipBoundMs": round(max((d.bound for d in all_dips), default=0.0) * 1000, 1),
                    "burstPods": burst.created,
                    "refusedAtAdmission": len(burst.refused),
                    "failedReasons": burst.reasons,
                    "timeline": [(round(s.at - samples[0].at, 3), s.kubelet) for s in samples],
                }
            )
            results["loadAverage1m"] = round(os.getloadavg()[0], 1)
            print(
                f"SUMMARY {release} (load average {results['loadAverage1m']}): {args.rollouts} rollouts, "
                f"kubelet min {results['minKubelet']}/{full}, "
                f"longest dip {results['longestDipSeenMs']}-{results['longestDipBoundMs']} ms, "
                f"registrations {[r['registrations'] for r in per_rollout]}, "
                f"burst pods refused {len(burst.refused)}/{burst.created} "
                f"(sample gap p50 {results['sampleGapP50Ms']} ms)"
            )
            for line in burst.refused[:5]:
                print(f"  refused: {line}")
        finally:
            cluster.down()
            shutil.rmtree(FAKE_DEV, ignore_errors=True)
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.strategy == "surge" else f"-{args.strategy}"
    suffix += "" if args.agent == "own" else "-live"
    path = out / f"rollouts-{release}{suffix}.json"
    path.write_text(json.dumps(results, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
