"""Smoke tests of the local cluster: real etcd, API server, controller manager, scheduler and kwok,
and, one at a time per machine, the real node with the relay that lets its pods reach the API
server."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from kubernetes import client
from kubernetes.client.rest import ApiException
from support.clusters import running_devcluster, wait_for
from support.realnode import busybox_pod

from patchbay_devcluster import ClusterError, DevCluster, kubeapi, pki, relay
from patchbay_devcluster.cluster import RELAY
from patchbay_devcluster.controlplane import KWOK_TAINT_KEY
from patchbay_devcluster.node import NODE_IP, NODE_NAME, POD_SUBNET, Owner
from patchbay_devcluster.procs import pid_runs, stop_pid
from patchbay_devcluster.releases import matrix, minor

NODES = 50


def test_readyz_and_version(devcluster: DevCluster, kube_release: str) -> None:
    api = devcluster.api()
    status, body = kubeapi.get(api, "/readyz?verbose")
    assert status == 200, body
    assert "readyz check passed" in body
    version = client.VersionApi(api).get_code()
    # The real binaries carry their release's version (ldflags), not v0.0.0; the session's
    # release is read from the kube-apiserver binary itself, and must be one of the matrix.
    assert version.git_version == kube_release, version
    assert kube_release in matrix(), (kube_release, matrix())
    assert (int(version.major), int(version.minor)) == minor(kube_release)


def test_crd_applied_and_custom_resource_read_back(api: client.ApiClient, name_prefix: str) -> None:
    ext = client.ApiextensionsV1Api(api)
    custom = client.CustomObjectsApi(api)
    plural = name_prefix.replace("-", "") + "widgets"
    group = "smoke.patchbay.dev"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Cluster",
            "names": {"plural": plural, "singular": plural[:-1], "kind": plural[:-1].capitalize()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {"count": {"type": "integer", "minimum": 0}},
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    ext.create_custom_resource_definition(crd)
    try:

        def established() -> bool:
            got = ext.read_custom_resource_definition(f"{plural}.{group}")
            return any(c.type == "Established" and c.status == "True" for c in (got.status.conditions or []))

        wait_for("CRD Established", established, timeout=30)
        obj = {
            "apiVersion": f"{group}/v1",
            "kind": plural[:-1].capitalize(),
            "metadata": {"name": "one"},
            "spec": {"count": 3},
        }
        wait_for(
            "CR created",
            lambda: _try(lambda: custom.create_cluster_custom_object(group, "v1", plural, obj)),
            timeout=30,
        )
        got = custom.get_cluster_custom_object(group, "v1", plural, "one")
        assert got["spec"] == {"count": 3}
        # The schema is enforced by the real API server.
        bad = {**obj, "metadata": {"name": "two"}, "spec": {"count": -1}}
        with pytest.raises(ApiException) as err:
            custom.create_cluster_custom_object(group, "v1", plural, bad)
        assert err.value.status == 422
        assert "spec.count" in err.value.body
    finally:
        ext.delete_custom_resource_definition(f"{plural}.{group}")


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn() or True
    except ApiException as e:
        if e.status == 404:  # the new resource is not served yet
            return False
        raise


@pytest.fixture(scope="module")
def kwok_nodes(devcluster: DevCluster) -> tuple[str, list[str]]:
    """50 kwok nodes with a label of their own, shared by the tests of this module."""
    label = f"smoke-{os.getpid()}"
    names = devcluster.add_kwok_nodes(NODES, prefix=f"{label}-", labels={"patchbay.dev/smoke": label})
    return label, names


def test_kwok_nodes_become_ready(devcluster: DevCluster, kwok_nodes: tuple[str, list[str]]) -> None:
    label, names = kwok_nodes
    devcluster.wait_nodes_ready(NODES, label_selector=f"patchbay.dev/smoke={label}", timeout=120)
    assert devcluster.ready_nodes(f"patchbay.dev/smoke={label}") == set(names)


def test_daemonset_gets_one_pod_per_kwok_node(
    api: client.ApiClient, devcluster: DevCluster, kwok_nodes: tuple[str, list[str]], name_prefix: str
) -> None:
    """The real controller manager creates the pods and the real scheduler binds them."""
    label, names = kwok_nodes
    core = client.CoreV1Api(api)
    apps = client.AppsV1Api(api)
    ns = f"{name_prefix}ds"
    core.create_namespace({"metadata": {"name": ns}})
    try:
        wait_for(
            "default ServiceAccount",
            lambda: any(
                sa.metadata.name == "default" for sa in core.list_namespaced_service_account(ns).items
            ),
            timeout=60,
        )
        ds = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "smoke"},
            "spec": {
                "selector": {"matchLabels": {"app": "smoke"}},
                "template": {
                    "metadata": {"labels": {"app": "smoke"}},
                    "spec": {
                        "nodeSelector": {"patchbay.dev/smoke": label},
                        "tolerations": [{"key": KWOK_TAINT_KEY, "operator": "Exists"}],
                        "containers": [{"name": "c", "image": "docker.io/library/busybox:1.36"}],
                    },
                },
            },
        }
        apps.create_namespaced_daemon_set(ns, ds)

        def all_ready() -> bool:
            st = apps.read_namespaced_daemon_set_status("smoke", ns).status
            return st.desired_number_scheduled == NODES and (st.number_ready or 0) == NODES

        wait_for("DaemonSet ready on every kwok node", all_ready, timeout=180)
        pods = core.list_namespaced_pod(ns, label_selector="app=smoke").items
        assert len(pods) == NODES
        assert sorted(p.spec.node_name for p in pods) == sorted(names)  # exactly one per node
        for p in pods:
            scheduled = [c for c in p.status.conditions or [] if c.type == "PodScheduled"]
            assert scheduled and scheduled[0].status == "True", p.metadata.name
        events = core.list_namespaced_event(ns).items
        reasons = {(e.source.component if e.source else None, e.reason) for e in events}
        assert ("daemonset-controller", "SuccessfulCreate") in reasons, reasons

        # What the node lifecycle controller does to the pods of a node whose Lease lapsed: their
        # Ready condition set False (the pod still runs). A kubelet sets it back once its probes
        # pass; kwok, with no probes, must too, or the DaemonSet stays unavailable for good.
        victim = pods[0].metadata.name
        core.patch_namespaced_pod_status(
            victim,
            ns,
            {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "NodeNotReady"}]}},
        )

        def victim_ready() -> bool:
            conditions = core.read_namespaced_pod_status(victim, ns).status.conditions or []
            return any(c.type == "Ready" and c.status == "True" for c in conditions)

        wait_for("the pod marked not Ready is Ready again", victim_ready, timeout=60)
        wait_for("DaemonSet ready on every kwok node again", all_ready, timeout=60)
    finally:
        core.delete_namespace(ns)


def _listening_sockets(pid: int | None) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that ``pid`` holds (None: any process)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir() if pid is not None else ():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] != "0A" or (pid is not None and cols[9] not in inodes):  # 0A = LISTEN
                continue
            addr_hex, port_hex = cols[1].split(":")
            if v6:
                addr = "::1" if addr_hex == "0" * 24 + "01000000" else addr_hex
            else:
                addr = ".".join(str(int(addr_hex[i : i + 2], 16)) for i in (6, 4, 2, 0))
            found.append((addr, int(port_hex, 16)))
    return found


def test_everything_listens_on_loopback_only(devcluster: DevCluster) -> None:
    """The control plane and kwok: loopback only, every one of them."""
    procs = devcluster.running()
    assert {p.name for p in procs} >= {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
    }
    _assert_loopback_only_but_the_relay(devcluster)


def _assert_loopback_only_but_the_relay(cluster: DevCluster) -> None:
    """Every process of ``cluster`` listens on loopback only, with ONE exception: the relay, which
    listens on the pod network's bridge address only, on the one port ``pod_api_server`` names
    (and on nothing else: no loopback, no wildcard)."""
    for p in cluster.running():
        sockets = _listening_sockets(p.pid)
        assert sockets, f"{p.name} listens on nothing?"
        if p.name == RELAY:
            assert sockets == [cluster.pod_api_server] == [(NODE_IP, cluster.state().ports[RELAY])], sockets
            continue
        bad = [s for s in sockets if not (s[0].startswith("127.") or s[0] == "::1")]
        assert not bad, f"{p.name} listens on non-loopback {bad}"


# --- the real node and the relay for its pods ------------------------------------------------


def _other_real_node(cluster_dir: Path) -> Path | None:
    """The state directory of ANOTHER cluster whose real node holds this machine (one per
    machine), if one does; its processes are never touched here."""
    owner = Owner.read()
    if owner is None or owner.state_dir == cluster_dir.resolve():
        return None
    return owner.state_dir if DevCluster(owner.state_dir).running() else None


def _when_the_machine_has_no_real_node(cluster_dir: Path, start: Callable[[], str | None]) -> None:
    """Run ``start`` (it returns an error message, or None once the real node runs) when no other
    real node runs on this machine; while one does (another test session's), wait and try again."""

    def attempt() -> bool:
        if _other_real_node(cluster_dir) is not None:
            return False
        error = start()
        if error is None:
            return True
        if "another real node" in error:  # took the machine between our look and our claim
            return False
        raise AssertionError(error)

    wait_for("no other real node on this machine", attempt, timeout=360, every=5)


def _start_real_node(cluster: DevCluster) -> None:
    def start() -> str | None:
        try:
            cluster.start_real_node(timeout=180)
        except ClusterError as e:
            return str(e)
        return None

    _when_the_machine_has_no_real_node(cluster.dir, start)


def _served_certificate(host: str, port: int) -> x509.Certificate:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # only to read what is served; the tests verify separately
    with socket.create_connection((host, port), timeout=10) as raw, ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def _ip_sans(cert: x509.Certificate) -> list[str]:
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]


@pytest.fixture(scope="class")
def relay_cluster(
    tmp_path_factory: pytest.TempPathFactory, bin_dir: Path
) -> Iterator[tuple[DevCluster, bytes]]:
    """A cluster with the real node, for ``TestTheRelayForPods`` (class-scoped: the machine holds
    one real node at a time, and the CLI test below starts its own). Its control plane first runs
    as one started by an earlier version of the tool would: with an API server certificate that
    names only localhost and 127.0.0.1. Starting the real node must then issue it again (same
    key), and the running API server serve the new one, so that clients dialling the relay
    verify it. Yields the cluster and that key."""
    cluster = DevCluster(tmp_path_factory.mktemp("relay-cluster"), bin_dir)
    cluster.up(timeout=120)
    try:
        pki_dir = cluster.pki_dir
        earlier = pki.CertificateAuthority(pki_dir).issue("apiserver-earlier", "kube-apiserver", server=True)
        shutil.copy(earlier.key, pki_dir / "apiserver.key")
        shutil.copy(earlier.cert, pki_dir / "apiserver.crt")
        cluster.restart_component("kube-apiserver")
        port = cluster.state().ports["apiserver"]
        assert _ip_sans(_served_certificate("127.0.0.1", port)) == ["127.0.0.1"]
        _start_real_node(cluster)
        yield cluster, earlier.key.read_bytes()
    finally:
        cluster.down(purge=False)


class TestTheRelayForPods:
    """The relay on the real node's bridge address, and the certificate that names it (``relay_cluster``)."""

    def test_the_api_server_certificate_was_issued_again_with_its_key(
        self, relay_cluster: tuple[DevCluster, bytes]
    ) -> None:
        cluster, earlier_key = relay_cluster
        served = _served_certificate(*cluster.pod_api_server)
        assert _ip_sans(served) == ["127.0.0.1", NODE_IP]
        assert (cluster.pki_dir / "apiserver.key").read_bytes() == earlier_key
        on_file = x509.load_pem_x509_certificate((cluster.pki_dir / "apiserver.crt").read_bytes())
        assert served == on_file  # what the running API server serves: reloaded, not restarted

    def test_an_admin_kubeconfig_through_the_relay_verifies_tls(
        self, relay_cluster: tuple[DevCluster, bytes], tmp_path: Path
    ) -> None:
        cluster, _ = relay_cluster
        host, port = cluster.pod_api_server
        assert (host, port) == (NODE_IP, cluster.state().ports[RELAY])
        kubeconfig = tmp_path / "via-relay.kubeconfig"
        admin = pki.CertPair(cluster.pki_dir / "admin.crt", cluster.pki_dir / "admin.key")
        pki.write_kubeconfig(kubeconfig, f"https://{host}:{port}", cluster.pki_dir / "ca.crt", admin)
        api = kubeapi.connect(kubeconfig)
        try:
            assert api.configuration.host == f"https://{NODE_IP}:{port}"
            assert api.configuration.verify_ssl is True
            assert api.configuration.ssl_ca_cert  # the cluster's CA, and nothing but it
            assert kubeapi.get(api, "/readyz")[0] == 200
            assert NODE_NAME in kubeapi.ready_nodes(api)
            names = [n.metadata.name for n in client.CoreV1Api(api).list_node().items]
            assert NODE_NAME in names
        finally:
            kubeapi.close(api)
        # Verification is real: the same certificate does not pass for another address...
        ctx = ssl.create_default_context(cafile=str(cluster.pki_dir / "ca.crt"))
        with (
            socket.create_connection((host, port), timeout=10) as raw,
            pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"),
        ):
            ctx.wrap_socket(raw, server_hostname="10.244.0.2")
        # ...and without a client certificate the API server itself refuses the request (the
        # relay passes TLS through; it authenticates no one).
        anonymous = ssl.create_default_context(cafile=str(cluster.pki_dir / "ca.crt"))
        with (
            socket.create_connection((host, port), timeout=10) as raw,
            anonymous.wrap_socket(raw, server_hostname=host) as tls,
        ):
            tls.sendall(f"GET /api/v1/nodes HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            status = tls.recv(64).split(b"\r\n", 1)[0]
        assert status in (b"HTTP/1.1 401 Unauthorized", b"HTTP/1.1 403 Forbidden"), status

    def test_a_pod_on_the_pod_network_reaches_the_api_server_through_the_relay(
        self, relay_cluster: tuple[DevCluster, bytes]
    ) -> None:
        """busybox has no TLS client: the pod sends plain HTTP to the relay's port, and the API
        server's own answer to that (a TLS server's 400) proves the bytes got there and back."""
        cluster, _ = relay_cluster
        host, port = cluster.pod_api_server
        api = cluster.api()
        core = client.CoreV1Api(api)
        ns = "relay-test"
        core.create_namespace({"metadata": {"name": ns}})
        wait_for("default ServiceAccount", lambda: core.list_namespaced_service_account(ns).items, 60)
        script = (
            "busybox ip -4 -o addr show eth0; "
            f"busybox printf 'GET / HTTP/1.0\\r\\n\\r\\n' | busybox nc -w 5 {host} {port}; "
            "echo nc-exit=$?"
        )
        core.create_namespaced_pod(ns, busybox_pod("via-relay", NODE_NAME, script))

        def finished() -> bool:
            return bool(core.read_namespaced_pod("via-relay", ns).status.phase in ("Succeeded", "Failed"))

        wait_for("the pod to finish", finished, 120)
        pod = core.read_namespaced_pod("via-relay", ns)
        logs = str(core.read_namespaced_pod_log("via-relay", ns))
        assert pod.status.phase == "Succeeded", logs
        assert pod.spec.host_network is not True
        assert ipaddress.ip_address(pod.status.pod_ip) in POD_SUBNET and pod.status.pod_ip != NODE_IP
        assert f"inet {pod.status.pod_ip}/" in logs, logs
        assert "Client sent an HTTP request to an HTTPS server." in logs, logs
        assert "nc-exit=0" in logs, logs
        relay_log = (cluster.log_dir / "relay.log").read_text()
        assert f"{pod.status.pod_ip}:" in relay_log and "connected to 127.0.0.1:" in relay_log, relay_log

    def test_everything_listens_on_loopback_only_but_the_relay_on_the_bridge(
        self, relay_cluster: tuple[DevCluster, bytes]
    ) -> None:
        """Every process of a cluster with the real node, the relay included."""
        cluster, _ = relay_cluster
        names = {p.name for p in cluster.running()}
        assert names == {
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
            RELAY,
            "containerd",
            "kubelet",
        }
        _assert_loopback_only_but_the_relay(cluster)


def test_a_component_that_exits_while_the_api_server_is_away_is_started_again(
    tmp_path: Path, bin_dir: Path
) -> None:
    """The controller-manager exits when the API server refuses it while it still builds its
    controllers (its first seconds, after its /healthz already answers), so a restart of the API
    server then lost it for good. Stopping it by PID stands in for that exit, without the race.
    The restart must start it again, on its ports, and leave what still runs alone."""
    with running_devcluster(tmp_path / "revive-cluster", bin_dir) as cluster:
        before = {p.name: p for p in cluster.state().procs}
        gone = before["kube-controller-manager"]
        assert stop_pid(gone, grace=5)
        assert not cluster.is_up()
        cluster.restart_component("kube-apiserver")
        after = {p.name: p for p in cluster.state().procs}
        assert after["kube-controller-manager"].pid != gone.pid
        assert after["kube-scheduler"].pid == before["kube-scheduler"].pid
        assert after["kwok"].pid == before["kwok"].pid
        assert cluster.is_up()
        # The new controller-manager works: its service-account controller fills a new namespace.
        core = client.CoreV1Api(cluster.api())
        core.create_namespace({"metadata": {"name": "revived"}})
        wait_for(
            "the default ServiceAccount from the restarted controller-manager",
            lambda: core.list_namespaced_service_account("revived").items,
            60,
        )


def test_cli_up_kubeconfig_down_leaves_nothing(tmp_path: Path, bin_dir: Path) -> None:
    """The CLI on its own state directory: up with kwok nodes, kubectl works, down stops every PID."""
    state = tmp_path / "cli-cluster"
    env = {**os.environ, "PATCHBAY_KUBE_BIN": str(bin_dir)}
    cli = [sys.executable, "-m", "patchbay_devcluster.cli", "--state-dir", str(state)]

    def up() -> str | None:
        res = subprocess.run(
            [*cli, "up", "--nodes", "3", "--real-node"], env=env, capture_output=True, text=True, timeout=300
        )
        return None if res.returncode == 0 else res.stderr

    try:
        _when_the_machine_has_no_real_node(state, up)
        kubeconfig = (
            subprocess.run([*cli, "kubeconfig"], env=env, capture_output=True, text=True, check=True)
            .stdout.strip()
            .splitlines()[-1]
        )

        def kubectl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
            """kubectl on the cluster, its output captured."""
            argv = [str(bin_dir / "kubectl"), "--kubeconfig", kubeconfig, *args]
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)

        got = kubectl("get", "nodes", "-o", "name")
        assert got.returncode == 0, got.stderr
        nodes = got.stdout.split()
        assert nodes == [f"node/kwok-node-{i}" for i in range(3)] + ["node/localhost"]
        # A running container on the real node: `down` must stop it and undo its mounts.
        on_real_node = {
            "spec": {"hostNetwork": True, "nodeSelector": {"kubernetes.io/hostname": "localhost"}}
        }
        run = kubectl(
            "run",
            "sleeper",
            "--image=docker.io/library/busybox:1.36",
            "--restart=Never",
            "--overrides=" + json.dumps(on_real_node),
            "--command",
            "--",
            "sleep",
            "3600",
        )
        assert run.returncode == 0, run.stderr
        wait = kubectl(
            "wait", "--for=jsonpath={.status.phase}=Running", "pod/sleeper", "--timeout=120s", timeout=150
        )
        assert wait.returncode == 0, wait.stderr
        node_dir = str((state / "node").resolve())
        mounts_before = [m for m in Path("/proc/self/mountinfo").read_text().splitlines() if node_dir in m]
        assert mounts_before  # the pod's volumes and rootfs are mounted under the state directory
        status = json.loads(subprocess.run([*cli, "status"], env=env, capture_output=True, text=True).stdout)
        assert status["readyz"] is True
        pids = [p["pid"] for p in status["processes"].values()]
        assert len(pids) == 8  # control plane, kwok, relay, containerd, kubelet
        assert all(p["running"] for p in status["processes"].values())
        binaries = {int(p): Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0].decode() for p in pids}
        relay_pid, relay_port = status["processes"][RELAY]["pid"], status["ports"][RELAY]
        assert status["podServer"] == f"https://{NODE_IP}:{relay_port}"
        assert (NODE_IP, relay_port) in _listening_sockets(relay_pid)
    finally:
        down = subprocess.run([*cli, "down"], env=env, capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert "relay" in down.stdout, down.stdout
    assert not any(pid_runs(pid, binary) for pid, binary in binaries.items())
    # No relay is left: not ours by PID, none of any PID on its address, nothing listening there.
    assert not pid_runs(relay_pid, binaries[relay_pid], relay.MODULE)
    relays = [
        proc.name
        for proc in Path("/proc").iterdir()
        if proc.name.isdigit() and _cmdline_has(proc, relay.MODULE, f"{NODE_IP}:{relay_port}")
    ]
    assert not relays
    # Looked up, never dialled: with the bridge gone, that address would route off the machine.
    assert (NODE_IP, relay_port) not in _listening_sockets(None)
    # No process anywhere still refers to the state directory.
    leftovers = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes()
                if str(state).encode() in cmdline or node_dir.encode() in cmdline:
                    leftovers.append(proc.name)
            except OSError:
                pass
    assert not leftovers
    assert not state.exists()
    assert not [m for m in Path("/proc/self/mountinfo").read_text().splitlines() if node_dir in m]
    assert not Path(node_dir).exists()


def _cmdline_has(proc: Path, *args: str) -> bool:
    try:
        cmdline = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return all(a.encode() in cmdline for a in args)
