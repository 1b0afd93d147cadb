"""Helpers for the operator's integration tests: the operator as a subprocess, cluster assertions.

The operator runs as a real ``patchbay-operator`` process (not in-process) so tests can kill
it with SIGKILL, restart it, and read its logs, exactly as a crash would look in a cluster.
One operator runs at a time (it watches every profile and node cluster-wide); tests isolate
themselves with per-test name prefixes and node labels, and clean up what they create.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from kubetest import wait_for

from patchbay_devcluster import DevCluster
from patchbay_devcluster.cluster import free_port

REPO = Path(__file__).resolve().parents[1]
CRD_FILE = REPO / "crds" / "patchbay.dev_devicepluginprofiles.yaml"
GROUP, VERSION, PLURAL = "patchbay.dev", "v1alpha1", "devicepluginprofiles"
NAMESPACE = "patchbay-it"
TEST_LABEL = "patchbay.dev/test"


class Operator:
    """A ``patchbay-operator`` subprocess against the session's cluster."""

    def __init__(self, kubeconfig: Path, log_dir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self.starts = 0
        self.extra_args: list[str] = []

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, *extra: str) -> None:
        assert not self.running, "one operator at a time"
        self.starts += 1
        port = free_port()
        self.log_path = self.log_dir / f"operator-{self.starts}.log"
        argv = [
            sys.executable,
            "-m",
            "patchbay_operator.main",
            "--kubeconfig",
            str(self.kubeconfig),
            "--namespace",
            NAMESPACE,
            "--status-debounce",
            "0.3",
            "--agent-image",
            "example.invalid/patchbay-agent:it",
            "--liveness",
            f"http://127.0.0.1:{port}/healthz",
            *extra,
        ]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)

        def healthy() -> bool:
            if not self.running:
                raise AssertionError(f"operator exited early:\n{self.log()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_for("the operator's liveness endpoint", healthy, timeout=60)

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

    def settled_patches(self, quiet: float = 3.0) -> int:
        """The operator's node-patch count once it has stopped moving for ``quiet`` seconds."""
        last, since = -1, time.monotonic()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            s = self.stats()
            now = s.get("nodePatches", 0)
            if now != last or s.get("queued", 0):
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return now
            time.sleep(0.2)
        raise AssertionError(f"the operator kept patching nodes: {self.stats()}")

    def stats(self) -> dict[str, int]:
        """The last ``Stats`` line the operator logged (its own write counters)."""
        for line in reversed(self.log().splitlines()):
            if "Stats " in line:
                text = json.loads(line)["message"] if line.startswith("{") else line  # --log-format json
                return dict(json.loads(text.split("Stats ", 1)[1]))
        return {}


class Cluster:
    """Small helpers over the official client for the assertions tests make."""

    def __init__(self, api: client.ApiClient, devcluster: DevCluster, prefix: str) -> None:
        self.api = api
        self.devcluster = devcluster
        self.prefix = prefix
        self.tag = prefix.rstrip("-")  # label values must end alphanumeric
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.profiles: list[str] = []
        self.nodes: list[str] = []

    # profiles
    def create_profile(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "DevicePluginProfile",
            "metadata": {"name": name},
            "spec": spec,
        }
        self.profiles.append(name)
        obj: dict[str, Any] = self.custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
        return obj

    def profile(self, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return obj

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, {"spec": spec})

    def delete_profile(self, name: str) -> None:
        try:
            self.custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        except ApiException as e:
            if e.status != 404:
                raise

    def condition(self, name: str, type_: str) -> dict[str, Any] | None:
        obj = self.profile(name) or {}
        for c in (obj.get("status") or {}).get("conditions") or []:
            if c["type"] == type_:
                return dict(c)
        return None

    # nodes
    def add_nodes(self, count: int, labels: dict[str, str] | None = None, start: int = 0) -> list[str]:
        names = self.devcluster.add_kwok_nodes(
            count, prefix=f"{self.prefix}n", labels={TEST_LABEL: self.tag, **(labels or {})}, start=start
        )
        self.nodes.extend(names)
        return names

    def node(self, name: str) -> dict[str, Any]:
        raw = self.core.read_node(name, _preload_content=False)
        return dict(json.loads(raw.data))

    def values(self, name: str, resource: str) -> tuple[str | None, str | None]:
        st = self.node(name).get("status") or {}
        return (st.get("capacity") or {}).get(resource), (st.get("allocatable") or {}).get(resource)

    def annotations(self, name: str) -> dict[str, str]:
        return dict(self.node(name)["metadata"].get("annotations") or {})

    def set_labels(self, name: str, labels: dict[str, str | None]) -> None:
        self.core.patch_node(name, {"metadata": {"labels": labels}})

    def set_status_value(self, name: str, resource: str, value: str | None) -> None:
        """What a kubelet (or a person) would do: change the advertised value behind our back."""
        esc = resource.replace("~", "~0").replace("/", "~1")
        if value is None:
            ops = [
                {"op": "remove", "path": f"/status/capacity/{esc}"},
                {"op": "remove", "path": f"/status/allocatable/{esc}"},
            ]
        else:
            ops = [
                {"op": "add", "path": f"/status/capacity/{esc}", "value": value},
                {"op": "add", "path": f"/status/allocatable/{esc}", "value": value},
            ]
        self.core.patch_node_status(name, ops, _content_type="application/json-patch+json")

    def cleanup(self) -> None:
        for p in self.profiles:
            self.delete_profile(p)
        for p in self.profiles:
            try:
                wait_for(f"profile {p} to go", lambda p=p: self.profile(p) is None, timeout=60)
            except AssertionError:
                # The operator is not running (a test stopped it): do not leave a stuck finalizer.
                self.custom.patch_cluster_custom_object(
                    GROUP, VERSION, PLURAL, p, {"metadata": {"finalizers": None}}
                )
        for n in self.nodes:
            try:
                self.core.delete_node(n)
            except ApiException as e:
                if e.status != 404:
                    raise
