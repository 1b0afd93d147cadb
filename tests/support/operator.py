"""The operator as a subprocess (``patchbay-operator`` against a cluster), for the integration
tests and the benchmarks: tests can SIGKILL it, restart it and read its own counters, exactly as a
crash would look in a cluster. One operator runs at a time (it watches every profile and node
cluster-wide); tests isolate themselves with per-test name prefixes and node labels.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes.client.rest import ApiException
from support.clusters import NAMESPACE, REPO, Cluster, wait_for
from support.processes import http_ok

from patchbay_devcluster.procs import free_port


class Operator:
    """A ``patchbay-operator`` subprocess against the session's cluster."""

    TEST_ARGS = (
        "--status-debounce",
        "0.3",
        "--kubelet-behind-grace",
        "3",
        "--agent-image",
        "example.invalid/patchbay-agent:it",
    )
    """What the tests run with: a short debounce, and an agent image nobody can pull."""

    def __init__(
        self, kubeconfig: Path, log_dir: Path, args: tuple[str, ...] = TEST_ARGS, namespace: str = NAMESPACE
    ) -> None:
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        self.args = args
        self.namespace = namespace
        self.metrics_port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self.starts = 0
        self.extra_args: list[str] = []
        #: seconds from the last start to /healthz answering
        self.live_after = 0.0

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, *extra: str, timeout: float = 60.0) -> None:
        """Start it and wait up to `timeout` seconds for /healthz, which kopf serves only once
        the startup handler (the controller's first LISTs) is done; `live_after` says how long
        that took."""
        assert not self.running, "one operator at a time"
        self.starts += 1
        port = free_port()
        self.metrics_port = free_port()
        self.log_path = self.log_dir / f"operator-{self.starts}.log"
        argv = [
            sys.executable,
            "-m",
            "patchbay_operator.main",
            "--kubeconfig",
            str(self.kubeconfig),
            "--namespace",
            self.namespace,
            *self.args,
            "--liveness",
            f"http://127.0.0.1:{port}/healthz",
            "--metrics-address",
            f"127.0.0.1:{self.metrics_port}",
            *extra,
        ]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)

        def healthy() -> bool:
            if not self.running:
                raise AssertionError(f"operator exited early:\n{self.log()[-3000:]}")
            return http_ok(f"http://127.0.0.1:{port}/healthz", timeout=1)

        started = time.monotonic()
        try:
            wait_for("the operator's liveness endpoint", healthy, timeout=timeout)
        except BaseException:
            # Never left running for nobody to stop (a bench run once kept one for minutes).
            self.stop()
            raise
        self.live_after = time.monotonic() - started

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def ensure(self) -> None:
        if not self.running:
            self.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def settled_stats(self, quiet: float = 3.0, timeout: float = 600) -> dict[str, int]:
        """The operator's counters once its node patches have not moved, and nothing was queued,
        for ``quiet`` seconds."""
        last, since = -1, time.monotonic()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.stats()
            now = s.get("nodePatches", 0)
            if now != last or s.get("queued", 0):
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return s
            time.sleep(0.2)
        raise AssertionError(f"the operator kept patching nodes: {self.stats()}")

    def settled_patches(self, quiet: float = 3.0) -> int:
        """The operator's node-patch count once it has stopped moving for ``quiet`` seconds."""
        return self.settled_stats(quiet, timeout=60).get("nodePatches", 0)

    def cpu_seconds(self) -> float:
        """User + system CPU the operator process has used so far (from /proc/<pid>/stat)."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def peak_rss_mib(self) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stats(self) -> dict[str, Any]:
        """The operator's own counters, scraped from its /metrics ({} while it serves none)."""
        if self.metrics_port is None:
            return {}
        return scrape_stats(f"http://127.0.0.1:{self.metrics_port}/metrics")


def scrape_stats(url: str) -> dict[str, Any]:
    """The operator's /metrics as ``Controller.stats()`` keys (metrics.py's tables, read back):
    the tests and benchmarks compare the same numbers the operator exports."""
    from prometheus_client.parser import text_string_to_metric_families

    from patchbay_operator.metrics import COUNTERS, GAUGES, LABELLED, metric_name

    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    families = {f.name: f for f in text_string_to_metric_families(text)}
    out: dict[str, Any] = {}
    for key in [*COUNTERS, *GAUGES]:
        family = families.get(metric_name(key))
        if family is not None and family.samples:
            out[key] = int(family.samples[0].value)
    for key, (label, _, _) in LABELLED.items():
        family = families.get(metric_name(key))
        if family is not None:
            names = (label,) if isinstance(label, str) else label
            out[key] = {
                (s.labels[label] if isinstance(label, str) else tuple(s.labels[n] for n in names)): int(
                    s.value
                )
                for s in family.samples
                if not s.name.endswith("_created")
            }
    return out


def agent_object(cluster: Cluster, kind: str, profile: str) -> dict[str, Any] | None:
    """A profile's own agent ``DaemonSet`` or ``ConfigMap`` (``patchbay-<profile>`` in the
    operator's namespace) as plain JSON, or None where there is none."""
    read = {
        "DaemonSet": cluster.apps.read_namespaced_daemon_set,
        "ConfigMap": cluster.core.read_namespaced_config_map,
    }[kind]
    try:
        obj = read(f"patchbay-{profile}", NAMESPACE)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return dict(cluster.api.sanitize_for_serialization(obj))


def assert_applied_for(obj: dict[str, Any], profile: str, uid: str) -> None:
    """``obj`` is the operator's, for ``profile``: the profile (``uid``) is its controller owner and
    the operator wrote it by server-side apply."""
    (ref,) = obj["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
        "DevicePluginProfile",
        profile,
        uid,
        True,
    )
    managers = {(m["manager"], m["operation"]) for m in obj["metadata"]["managedFields"]}
    assert ("patchbay-operator", "Apply") in managers


def peered_pair(
    cluster: Cluster, session_operator: Operator, tmp_path: Path
) -> tuple[str, Operator, Operator]:
    """A peering name and two operators for it, not yet started (to start with priority 200 and
    100). The session's standalone operator is stopped: it would not take part in peering."""
    session_operator.stop()
    (tmp_path / "high").mkdir()
    (tmp_path / "low").mkdir()
    high = Operator(session_operator.kubeconfig, tmp_path / "high")
    low = Operator(session_operator.kubeconfig, tmp_path / "low")
    return f"{cluster.prefix}peering", high, low
