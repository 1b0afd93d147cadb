"""The dev cluster's real node: the pinned kubelet runs real containers through containerd + runc,
on a private pod network from which nothing leaves the machine."""

from __future__ import annotations

import ipaddress
import subprocess
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from support.realnode import busybox_pod, wait_for

from patchbay_devcluster import DevCluster
from patchbay_devcluster.node import BRIDGE, NODE_IP, POD_SUBNET


def test_real_node_registers_with_its_own_identity(
    e2e_api: client.ApiClient, real_node: str, kube_release: str
) -> None:
    node = client.CoreV1Api(e2e_api).read_node(real_node)
    assert node.status.node_info.kubelet_version == kube_release
    assert node.status.node_info.container_runtime_version.startswith("containerd://")
    ready = [c for c in node.status.conditions if c.type == "Ready"]
    assert ready[0].status == "True", ready
    # The Node authorizer + NodeRestriction let it register itself; it is not kwok-managed.
    assert "kwok.x-k8s.io/node" not in (node.metadata.annotations or {})
    hostnames = [a.address for a in node.status.addresses if a.type == "Hostname"]
    assert hostnames == ["localhost"]


def test_pod_runs_in_a_real_container_and_logs_come_back_over_loopback(
    e2e_api: client.ApiClient, real_node: str, namespace: str
) -> None:
    core = client.CoreV1Api(e2e_api)
    core.create_namespaced_pod(
        namespace,
        # The API server turns "$$" into "$" in commands, so the shell sees "$$".
        busybox_pod("hello", real_node, "echo pid=$$$$ ; echo done", host_network=True),
    )

    def succeeded() -> bool:
        phase = core.read_namespaced_pod("hello", namespace).status.phase
        assert phase != "Failed"
        return phase == "Succeeded"

    wait_for("pod Succeeded", succeeded, 120)
    # kubectl-logs path: API server -> kubelet on localhost:<port> with the CA-signed serving cert.
    logs = core.read_namespaced_pod_log("hello", namespace)
    assert (
        logs.splitlines()[0] == "pid=1"
    )  # PID 1 of its own PID namespace: a real container, not a host process
    assert logs.strip().endswith("done")


def test_killed_kubelet_comes_back_and_running_pods_are_unaffected(
    e2e_api: client.ApiClient, e2e_cluster: DevCluster, real_node: str, namespace: str
) -> None:
    core = client.CoreV1Api(e2e_api)
    core.create_namespaced_pod(namespace, busybox_pod("sleeper", real_node, "sleep 3600"))

    def running() -> Any:
        pod = core.read_namespaced_pod("sleeper", namespace)
        return pod if pod.status.phase == "Running" else None

    before = wait_for("pod Running", running, 120).status.container_statuses[0]
    log = e2e_cluster.log_dir / "kubelet.log"
    e2e_cluster.stop_kubelet()  # SIGKILL: a crash
    offset = log.stat().st_size
    restarted = datetime.now(UTC).replace(microsecond=0)
    e2e_cluster.start_kubelet()

    def new_kubelet_has_the_pod() -> bool:
        """The NEW kubelet posted its node status and took up the pod (its volume manager logs
        the pod's volumes as it adopts it): the moment it would have (wrongly) restarted it."""
        node = core.read_node_status(real_node)
        ready = next(c for c in node.status.conditions if c.type == "Ready")
        if ready.status != "True" or ready.last_heartbeat_time < restarted:
            return False
        with log.open("rb") as f:
            f.seek(offset)
            return f'pod="{namespace}/sleeper"'.encode() in f.read()

    wait_for("the restarted kubelet to report the node and take up the pod", new_kubelet_has_the_pod, 120)
    after = running()
    assert after is not None
    status = after.status.container_statuses[0]
    assert status.restart_count == 0
    assert status.container_id == before.container_id
    assert status.state.running.started_at == before.state.running.started_at


def test_unschedulable_request_stays_pending_with_the_schedulers_reason(
    e2e_api: client.ApiClient, real_node: str, namespace: str
) -> None:
    """A pod asking for a resource the node lacks is rejected by the real scheduler, not run."""
    core = client.CoreV1Api(e2e_api)
    pod = busybox_pod("wants-dongle", real_node, "true")
    pod["spec"]["containers"][0]["resources"] = {
        "requests": {"example.com/nothing": "1"},
        "limits": {"example.com/nothing": "1"},
    }
    core.create_namespaced_pod(namespace, pod)

    def unschedulable() -> str | None:
        try:
            p = core.read_namespaced_pod("wants-dongle", namespace)
        except ApiException:
            return None
        for c in p.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                return str(c.message)
        return None

    message = wait_for("Unschedulable condition", unschedulable, 60)
    assert "Insufficient example.com/nothing" in message


def test_image_pulls_never_leave_the_machine(
    e2e_api: client.ApiClient, real_node: str, namespace: str
) -> None:
    """Every registry is mapped to a closed loopback port: a missing image fails fast, locally."""
    core = client.CoreV1Api(e2e_api)
    pod = busybox_pod("pull", real_node, "true")
    pod["spec"]["containers"][0]["image"] = "registry.example.com/nothing/here:1.0"
    pod["spec"]["containers"][0]["imagePullPolicy"] = "Always"
    core.create_namespaced_pod(namespace, pod)

    def pull_failed() -> str | None:
        for e in core.list_namespaced_event(namespace, field_selector="involvedObject.name=pull").items:
            if e.reason == "Failed" and "registry.example.com/nothing/here" in (e.message or ""):
                return str(e.message)
        return None

    message = wait_for("pull failure event", pull_failed, 90)
    assert "127.0.0.1:9" in message


# --- the pod network ------------------------------------------------------------------------

OUTSIDE = "203.0.113.7"  # TEST-NET-3: an address outside the machine that nothing here owns


def _pod_ready(core: client.CoreV1Api, ns: str, name: str) -> client.V1Pod | None:
    pod = core.read_namespaced_pod(name, ns)
    assert pod.status.phase not in ("Failed", "Succeeded"), pod.status
    ready = [c for c in pod.status.conditions or [] if c.type == "Ready"]
    return pod if ready and ready[0].status == "True" else None


def test_pods_get_a_private_address_the_node_reaches_and_no_way_out(
    e2e_api: client.ApiClient, real_node: str, namespace: str
) -> None:
    """A pod on the bridge: an address in the pod subnet, a readiness probe from the kubelet
    (the node) that reaches it over HTTP, only its subnet's route and no other way out."""
    core = client.CoreV1Api(e2e_api)
    script = (
        "busybox ip -4 route; "
        f"busybox nc -w 2 {OUTSIDE} 80 </dev/null 2>&1; echo nc-exit=$?; "
        "mkdir -p /tmp/www && echo ok > /tmp/www/ready && exec busybox httpd -f -p 8080 -h /tmp/www"
    )
    pod = busybox_pod("net", real_node, script)
    pod["spec"]["containers"][0]["readinessProbe"] = {
        "httpGet": {"path": "/ready", "port": 8080},
        "periodSeconds": 1,
    }
    core.create_namespaced_pod(namespace, pod)
    ready = wait_for("the pod Ready through its HTTP probe", lambda: _pod_ready(core, namespace, "net"), 120)
    assert ipaddress.ip_address(ready.status.pod_ip) in POD_SUBNET
    assert ready.status.pod_ip != NODE_IP
    logs = str(core.read_namespaced_pod_log("net", namespace))
    routes = [line for line in logs.splitlines() if " dev " in line]
    assert len(routes) == 1, logs
    assert routes[0].startswith(f"{POD_SUBNET} dev eth0"), logs
    assert "default" not in logs, logs
    assert "Network is unreachable" in logs, logs
    # And the node itself reaches the pod (as a scraper on the node would).
    with urllib.request.urlopen(f"http://{ready.status.pod_ip}:8080/ready", timeout=5) as r:
        assert r.read() == b"ok\n"


def _iptables(*args: str) -> str:
    res = subprocess.run(["iptables", *args], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return res.stdout


def _packets(table: str, chain: str, comment: str) -> int:
    for line in _iptables("-t", table, "-L", chain, "-v", "-x", "-n").splitlines():
        if comment in line:
            return int(line.split()[0])
    raise AssertionError(f"no rule {comment} in {table}/{chain}")


def test_nothing_a_pod_sends_leaves_the_machine(
    e2e_api: client.ApiClient, real_node: str, namespace: str, name_prefix: str
) -> None:
    """Even a privileged pod that adds a default route through the node gets nothing out: its
    packets reach the node's bridge (counted) and no packet to that address leaves any of the
    machine's interfaces (counted: zero), because the bridge does not forward and nothing
    masquerades."""
    assert Path(f"/proc/sys/net/ipv4/conf/{BRIDGE}/forwarding").read_text().strip() == "0"
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "0"
    assert "MASQUERADE" not in _iptables("-t", "nat", "-S")
    tag = f"patchbay-e2e-{name_prefix.rstrip('-')}"
    # Frames bridged between pods pass FORWARD too where the kernel hands bridged traffic to
    # iptables (bridge-nf-call-iptables): only what goes OUT of another interface counts as leaving.
    rules = [
        ("raw", "PREROUTING", ["-i", BRIDGE, "-d", OUTSIDE]),  # arrives from the pod network
        ("mangle", "FORWARD", ["-d", OUTSIDE, "!", "-o", BRIDGE]),  # routed towards another interface
        ("mangle", "POSTROUTING", ["-d", OUTSIDE, "!", "-o", BRIDGE]),  # leaving by any other interface
    ]
    for table, chain, match in rules:
        _iptables("-t", table, "-I", chain, *match, "-m", "comment", "--comment", tag, "-j", "ACCEPT")
    try:
        core = client.CoreV1Api(e2e_api)
        script = (
            f"busybox ip route add default via {NODE_IP} && echo route-added; "
            f"for i in 1 2 3; do busybox nc -w 2 {OUTSIDE} 80 </dev/null; echo nc-exit=$?; done"
        )
        pod = busybox_pod("escape", real_node, script)
        pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
        core.create_namespaced_pod(namespace, pod)

        def finished() -> bool:
            return bool(core.read_namespaced_pod("escape", namespace).status.phase in ("Succeeded", "Failed"))

        wait_for("the escape attempt to finish", finished, 120)
        logs = str(core.read_namespaced_pod_log("escape", namespace))
        assert "route-added" in logs, logs
        assert "nc-exit=0" not in logs, logs
        arrived = _packets("raw", "PREROUTING", tag)
        assert arrived >= 3, f"the pod's SYNs never reached the node ({arrived}): the test proves nothing"
        assert _packets("mangle", "FORWARD", tag) == 0
        assert _packets("mangle", "POSTROUTING", tag) == 0
    finally:
        for table, chain, match in rules:
            _iptables("-t", table, "-D", chain, *match, "-m", "comment", "--comment", tag, "-j", "ACCEPT")
