"""The agent's successor hand-off on the REAL API server (plugin-agent's successor.py).

On SIGTERM an agent with --daemonset-selector lists the other pods of its DaemonSet on its node
and serves on until one of them is Ready. Here the pods are real Pod objects on a node name that
no kubelet (and no kwok) runs, so nothing but this test sets their Ready condition (through the
status subresource, as a kubelet would). Checked on the wait itself (`wait_for_successor` with the
agent's own client): no successor -> at once; a successor that turns Ready -> right after;
one that never does -> at the bound; a pod being deleted, a pod of another DaemonSet and a pod of
this one on another node are no successors; a successor deleted during the wait ends it. And on
the real `patchbay-agent` process, served by the Python kubelet peer: after SIGTERM it still
serves (its socket answers) while the successor is not Ready, and exits right after it is; and
one whose pod is being deleted when it starts (the SIGTERM a container's PID 1 drops before it has
a handler) leaves by itself, no signal sent (`deleted_already`).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.agentrun import HostAgent, agent_argv, write_agent_config
from support.clusters import wait_for
from support.fakehw import FakeHardware
from support.podresources_peer import ThreadedPeers
from support.pykubelet import PyKubelet

from patchbay_agent.kubeclient import KubeClient
from patchbay_agent.kubelet.sockets import probe
from patchbay_agent.successor import Identity, deleted_already, wait_for_successor
from patchbay_devcluster import DevCluster

SELECTOR = {"app.kubernetes.io/name": "patchbay-agent", "patchbay.dev/profile": "serial"}
SELECTOR_TEXT = ",".join(f"{k}={v}" for k, v in SELECTOR.items())
ME = "agent-old"
RESOURCE = "example.com/serial"


class Pods:
    """Pod objects on one node name that nothing runs: created, made Ready, deleted by the test."""

    def __init__(self, core: client.CoreV1Api, namespace: str, node: str) -> None:
        self.core, self.namespace, self.node = core, namespace, node

    def create(
        self, name: str, labels: dict[str, str] = SELECTOR, node: str | None = None, **meta: object
    ) -> None:
        body = {
            "metadata": {"name": name, "labels": labels, **meta},
            "spec": {
                "nodeName": node or self.node,
                "containers": [{"name": "agent", "image": "patchbay-agent:never-run"}],
            },
        }
        self.core.create_namespaced_pod(self.namespace, body)

    def ready(self, name: str) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.core.patch_namespaced_pod_status(
            name,
            self.namespace,
            {"status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]}},
        )

    def delete(self, name: str) -> None:
        self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)


@pytest.fixture
def pods(api: client.ApiClient, namespace: str, name_prefix: str) -> Iterator[Pods]:
    core = client.CoreV1Api(api)
    out = Pods(core, namespace, f"{name_prefix}nowhere")
    try:
        yield out
    finally:
        for p in core.list_namespaced_pod(namespace).items:
            with contextlib.suppress(ApiException):
                if p.metadata.finalizers:
                    core.patch_namespaced_pod(p.metadata.name, namespace, {"metadata": {"finalizers": None}})
                core.delete_namespaced_pod(p.metadata.name, namespace, grace_period_seconds=0)


def _identity(pods: Pods) -> Identity:
    return Identity(namespace=pods.namespace, pod_name=ME, node_name=pods.node, selector=SELECTOR_TEXT)


@contextlib.contextmanager
def _after(seconds: float, action: Callable[[], object]) -> Iterator[None]:
    """Run `action` in a thread `seconds` from now, while the block runs; joined at its end."""
    t = threading.Thread(target=lambda: (time.sleep(seconds), action()))
    t.start()
    try:
        yield
    finally:
        t.join()


def _wait(devcluster: DevCluster, pods: Pods, bound: float) -> tuple[str, float]:
    start = time.monotonic()
    said = asyncio.run(wait_for_successor(KubeClient(devcluster.kubeconfig), _identity(pods), bound))
    return said, time.monotonic() - start


def test_no_successor_means_no_wait(devcluster: DevCluster, pods: Pods, name_prefix: str) -> None:
    """Only pods that cannot take over: us, one being deleted, another DaemonSet's, ours on
    another node. The agent leaves at once."""
    pods.create(ME)
    pods.create("agent-leaving", finalizers=["patchbay.dev/test-hold"])
    pods.delete("agent-leaving")
    pods.create(
        "node-agent", labels={"app.kubernetes.io/name": "patchbay-agent", "patchbay.dev/shared-agent": "yes"}
    )
    pods.create("agent-elsewhere", node=f"{name_prefix}elsewhere")
    said, _ = _wait(devcluster, pods, bound=5.0)
    assert said == "no successor on this node: stopping now"


@pytest.mark.parametrize(
    ("change", "ending"),
    [(Pods.ready, "Ready after "), (Pods.delete, "gone after ")],
    ids=["ready", "deleted"],
)
def test_a_successor_that_turns_ready_or_is_deleted_during_the_wait_ends_it(
    devcluster: DevCluster, pods: Pods, change: Callable[[Pods, str], None], ending: str
) -> None:
    pods.create(ME)
    pods.create("agent-new")
    with _after(1.0, lambda: change(pods, "agent-new")):
        said, took = _wait(devcluster, pods, bound=10.0)
    assert said.startswith(f"successor agent-new {ending}"), said
    assert took >= 1.0  # it waited for the successor (the message says why it ended)


def test_a_successor_ready_already_ends_it_at_once(devcluster: DevCluster, pods: Pods) -> None:
    pods.create(ME)
    pods.create("agent-new")
    pods.ready("agent-new")
    said, _ = _wait(devcluster, pods, bound=10.0)
    assert said == "successor agent-new is Ready: stopping now"


def test_a_successor_never_ready_is_waited_for_until_the_bound(devcluster: DevCluster, pods: Pods) -> None:
    pods.create(ME)
    pods.create("agent-new")
    said, took = _wait(devcluster, pods, bound=1.5)
    assert said.startswith("successor agent-new not Ready after "), said
    assert took >= 1.5


class AgentRun(NamedTuple):
    agent: HostAgent
    plugin_dir: Path
    log: Path
    kubelet: PyKubelet


@contextlib.contextmanager
def _agent_process(devcluster: DevCluster, pods: Pods, workdir: Path) -> Iterator[AgentRun]:
    """The real `patchbay-agent` as pod ME of the DaemonSet (`--daemonset-selector`, 30 s
    `--successor-wait`) serving one fake serial device to the Python kubelet peer; stopped at the
    block's end."""
    hw = FakeHardware(workdir / "host")
    hw.add_dev("/dev/ttyUSB0")
    plugin_dir = workdir / "dp"
    config = write_agent_config(
        workdir / "agent.yaml", {"discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}}}, RESOURCE
    )
    log = workdir / "agent.log"
    with ThreadedPeers() as peers:
        kubelet = PyKubelet(plugin_dir)
        peers.call(kubelet.start())
        argv = agent_argv(
            config,
            pods.node,
            device_plugin_dir=plugin_dir,
            host_root=hw.root,
            http_address="off",
            kubeconfig=devcluster.kubeconfig,
            profile="serial",
            report_namespace=pods.namespace,
            pod_name=ME,
            daemonset_selector=SELECTOR_TEXT,
            successor_wait="30",
        )
        agent = HostAgent(argv, log)
        try:
            yield AgentRun(agent, plugin_dir, log, kubelet)
        finally:
            agent.stop()


def _agent_socket(plugin_dir: Path) -> Path:
    (sock,) = wait_for(
        "the agent's socket",
        lambda: [p for p in plugin_dir.glob("*.sock") if p.name != "kubelet.sock"] or None,
        timeout=30,
    )
    return sock


def test_the_agent_process_serves_on_after_sigterm_until_its_successor_is_ready(
    devcluster: DevCluster, pods: Pods, workdir: Path
) -> None:
    """The real process: SIGTERM with a successor not Ready -> still serving 2 s later (its socket
    answers, its log says whom it waits for); the successor Ready -> it exits, its socket
    removed, and its log says it left because the successor turned Ready."""
    pods.create(ME)
    pods.create("agent-new")
    with _agent_process(devcluster, pods, workdir) as (agent, plugin_dir, log, kubelet):
        proc = agent.proc
        sock = _agent_socket(plugin_dir)
        wait_for("the agent registered", lambda: "Registered" in log.read_text(errors="replace") or None, 30)
        proc.send_signal(signal.SIGTERM)
        wait_for(
            "the agent waits for its successor",
            lambda: "Serving on until successor agent-new is Ready" in log.read_text() or None,
            timeout=10,
        )
        time.sleep(2.0)
        assert proc.poll() is None, log.read_text()[-3000:]
        assert probe(sock) == 0
        assert kubelet.healthy(RESOURCE) == 1  # the kubelet still counts the device
        pods.ready("agent-new")
        proc.wait(15)  # well within its 30 s --successor-wait: the log below says why it left
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "Leaving: successor agent-new Ready after " in text, text[-3000:]
    assert not sock.exists()


def test_the_start_check_tells_a_pod_being_deleted(devcluster: DevCluster, pods: Pods) -> None:
    """`deleted_already` on the real API server: our pod held by a finalizer and deleted -> True;
    alive -> False; not among the DaemonSet's pods on this node -> False."""
    me = _identity(pods)
    client_ = KubeClient(devcluster.kubeconfig)
    assert asyncio.run(deleted_already(client_, me)) is False  # not there
    pods.create(ME, finalizers=["patchbay.dev/test-hold"])
    assert asyncio.run(deleted_already(client_, me)) is False
    pods.delete(ME)
    assert asyncio.run(deleted_already(client_, me)) is True


def test_an_agent_whose_pod_is_being_deleted_when_it_starts_leaves_without_a_signal(
    devcluster: DevCluster, pods: Pods, workdir: Path
) -> None:
    """In its container the agent is PID 1, which gets no SIGTERM sent before it has a handler
    (docs/facts.md#signals-at-start): an agent whose pod was deleted while it started served on
    until the kubelet killed it 30 s later, its socket left behind. Here the pod is being deleted
    (a finalizer holds it) before the real process starts, a successor is Ready, and no signal is
    ever sent: the agent leaves by itself, says why, exits 0 and removes its socket."""
    pods.create(ME, finalizers=["patchbay.dev/test-hold"])
    pods.delete(ME)
    pods.create("agent-new")
    pods.ready("agent-new")
    with _agent_process(devcluster, pods, workdir) as (agent, plugin_dir, log, _kubelet):
        agent.proc.wait(30)  # no signal: it leaves on its own (well before any bound of this test)
    text = log.read_text()
    assert agent.proc.returncode == 0, text[-3000:]
    assert "This agent's pod is being deleted, and no signal came" in text, text[-3000:]
    assert "Leaving: successor agent-new is Ready: stopping now" in text, text[-3000:]
    assert not [p for p in plugin_dir.glob("*.sock") if p.name != "kubelet.sock"]
