"""Unit tests of the dev cluster tool's parts that need no cluster: certificates, node objects,
PID checks, the real node's ownership record, the API client, the CLI."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from patchbay_devcluster import cli, controlplane, hostdirs, pki, relay
from patchbay_devcluster.cluster import (
    API_SERVER_IPS,
    BINARIES,
    RELAY,
    ClusterError,
    DevCluster,
    State,
    find_bin_dir,
)
from patchbay_devcluster.components import Kwok
from patchbay_devcluster.controlplane import kwok_node, write_credentials
from patchbay_devcluster.imagebuild import copy_sources, source_files
from patchbay_devcluster.node import (
    BRIDGE,
    NODE_IP,
    POD_SUBNET,
    NodeError,
    NodePaths,
    Owner,
    RealNode,
)
from patchbay_devcluster.podnetwork import cni_conflist
from patchbay_devcluster.poll import poll_until
from patchbay_devcluster.process import StateDir
from patchbay_devcluster.procs import PICK_FLOOR, Proc, ephemeral_range, free_port, pid_runs, spawn


def test_ca_signs_server_and_client_certificates(tmp_path: Path) -> None:
    ca = pki.CertificateAuthority(tmp_path)
    server = ca.issue("apiserver", "kube-apiserver", server=True)
    node = ca.issue("node", "system:node:n1", orgs=("system:nodes",), client=True)
    ca_cert = x509.load_pem_x509_certificate(ca.pair.cert.read_bytes())
    for pair in (server, node):
        cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
        cert.verify_directly_issued_by(ca_cert)
        assert oct(pair.key.stat().st_mode & 0o777) == "0o600"
    srv = x509.load_pem_x509_certificate(server.cert.read_bytes())
    sans = srv.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    cli_cert = x509.load_pem_x509_certificate(node.cert.read_bytes())
    assert cli_cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:nodes"
    eku = cli_cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_ca_and_certificates_are_reused(tmp_path: Path) -> None:
    """`up` after `down --keep-state` must not invalidate kubeconfigs handed out before."""
    first = pki.CertificateAuthority(tmp_path)
    a = first.issue("admin", "admin", client=True).cert.read_bytes()
    second = pki.CertificateAuthority(tmp_path)
    assert isinstance(second.key, ec.EllipticCurvePrivateKey)
    assert second.cert == first.cert
    assert second.issue("admin", "admin", client=True).cert.read_bytes() == a


def _sans(path: Path) -> list[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    return [str(n.value) for n in cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value]


def test_the_api_server_certificate_names_the_relays_address(tmp_path: Path) -> None:
    """Pods dial the relay on the bridge address and verify the API server's certificate for it."""
    assert API_SERVER_IPS == (NODE_IP,)
    pki_dir = tmp_path / "pki"
    write_credentials(tmp_path, pki_dir, tmp_path / "kubeconfig", 6443, api_ips=API_SERVER_IPS)
    assert _sans(pki_dir / "apiserver.crt") == ["localhost", "127.0.0.1", NODE_IP]


def test_a_kept_server_certificate_lacking_a_name_is_issued_again_with_its_key(tmp_path: Path) -> None:
    """A state directory of an earlier version: its API server certificate names only localhost
    and 127.0.0.1. It is issued again with the same key (nothing else changes: the CA, client
    certificates and kubeconfigs stay valid); one that names everything is kept as it is."""
    ca = pki.CertificateAuthority(tmp_path)
    old = ca.issue("apiserver", "kube-apiserver", server=True)
    admin = ca.issue("admin", "admin", client=True).cert.read_bytes()
    key, old_cert = old.key.read_bytes(), old.cert.read_bytes()
    assert _sans(old.cert) == ["localhost", "127.0.0.1"]

    again = pki.CertificateAuthority(tmp_path)
    new = again.issue("apiserver", "kube-apiserver", server=True, ips=(NODE_IP,))
    assert new == old
    assert _sans(new.cert) == ["localhost", "127.0.0.1", NODE_IP]
    assert new.key.read_bytes() == key
    cert = x509.load_pem_x509_certificate(new.cert.read_bytes())
    cert.verify_directly_issued_by(again.cert)
    assert cert.serial_number != x509.load_pem_x509_certificate(old_cert).serial_number
    assert not list(tmp_path.glob("*.tmp"))

    reissued = new.cert.read_bytes()
    assert (
        again.issue("apiserver", "kube-apiserver", server=True, ips=(NODE_IP,)).cert.read_bytes() == reissued
    )
    # Fewer names asked for than it has: kept too (a name more does no harm).
    assert again.issue("apiserver", "kube-apiserver", server=True).cert.read_bytes() == reissued
    assert again.issue("admin", "admin", client=True).cert.read_bytes() == admin


def test_service_account_key_is_rsa(tmp_path: Path) -> None:
    pair = pki.service_account_keys(tmp_path)
    assert b"BEGIN PUBLIC KEY" in pair.cert.read_bytes()
    assert b"BEGIN PRIVATE KEY" in pair.key.read_bytes()


def test_kwok_node_is_managed_tainted_and_labelled() -> None:
    node = kwok_node("n1", {"zone": "a"})
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert node["metadata"]["labels"]["zone"] == "a"
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "n1"
    assert node["spec"]["taints"] == [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]


def _flag(argv: list[str], name: str) -> str | None:
    return next((a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")), None)


PORTS = {n: 1 for n in ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok")}


@pytest.mark.parametrize(
    ("fleet", "lease", "grace", "heartbeat_ms"),
    [
        (0, "240", "300s", 300000),
        (5000, "240", "300s", 300000),
        (5001, "480", "600s", 600000),
        (20000, "960", "1200s", 1200000),
    ],
)
def test_kwok_periods_stretch_past_5000_nodes_and_the_grace_keeps_five_renewals(
    tmp_path: Path, fleet: int, lease: str, grace: str, heartbeat_ms: int
) -> None:
    """Up to 5,000 nodes the settings every figure there was measured with; past it kwok's Lease
    and node-status periods and the controller's grace grow in proportion, and kwok logs only
    warnings, so its writes stay at their 5,000-node rate (83 renewals a second)."""
    kcm = controlplane.argv("kube-controller-manager", tmp_path, tmp_path, tmp_path, PORTS, fleet=fleet)
    assert _flag(kcm, "node-monitor-grace-period") == grace
    kwok = Kwok(StateDir(tmp_path), tmp_path, PORTS, fleet).argv()
    assert _flag(kwok, "node-lease-duration-seconds") == lease
    assert int(grace[:-1]) == 5 * int(lease) // 4  # five renewal periods (a quarter of the lease)
    assert ("--v=WARN" in kwok) == (fleet > 5000)
    stages = Path(_flag(kwok, "config") or "")
    assert stages.is_file()
    assert (stages == controlplane.KWOK_STAGES) == (fleet <= 5000)
    text = stages.read_text()
    assert f"durationMilliseconds: {heartbeat_ms}\n" in text
    # Only the delay changed: the same stages, in the same order.
    assert text.count("kind: Stage") == controlplane.KWOK_STAGES.read_text().count("kind: Stage")


def test_a_restart_keeps_the_fleet_the_control_plane_was_sized_for(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    State(ports={"apiserver": 1}, fleet=20000).save(path)
    assert State.load(path).fleet == 20000
    path.write_text(json.dumps({"ports": {"apiserver": 1}, "procs": []}))  # an earlier version's
    assert State.load(path).fleet == 0


def test_pid_runs_checks_the_binary() -> None:
    me = os.getpid()
    exe = Path(f"/proc/{me}/cmdline").read_bytes().split(b"\0")[0].decode()
    assert pid_runs(me, exe)
    assert not pid_runs(me, "/usr/bin/something-else")
    child = subprocess.Popen(["sleep", "0"])
    child.wait()
    assert not pid_runs(child.pid, "sleep")


def test_free_port_is_bindable_on_loopback() -> None:
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_free_ports_are_below_the_ephemeral_range_and_never_handed_out_twice() -> None:
    """An outgoing connection's automatic source port can never take a port picked below the
    kernel's ephemeral range (CI once lost a kubelet's healthz port that way)."""
    low, _high = ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(PICK_FLOOR <= p < low for p in ports), ports


def test_free_port_prefers_a_port_unless_something_listens_there() -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        other = free_port("127.0.0.1", preferred=port)
        assert other != port
    assert free_port("127.0.0.1", preferred=port) == port


def test_a_process_run_by_an_interpreter_is_known_by_its_marker_too(tmp_path: Path) -> None:
    """The relay's binary is Python, which any Python process runs: its record also names the
    module, so a recycled PID running some other Python program is never taken for it."""
    argv = [sys.executable, "-c", "import time; time.sleep(60)", "the-marker"]
    proc, child = spawn("sleeper", argv, tmp_path, tmp_path, marker="the-marker")
    try:
        assert proc.marker == "the-marker"
        # Popen may return before the kernel has set the new command line up (vfork + exec).
        poll_until("the sleeper's command line", proc.runs, timeout=10)
        assert not Proc("sleeper", child.pid, sys.executable, proc.log, marker="another").runs()
        assert pid_runs(child.pid, sys.executable)  # the binary alone would match
    finally:
        child.kill()
        child.wait()
    assert not proc.runs()
    with pytest.raises(ValueError, match="not an argument"):
        spawn("sleeper", [sys.executable, "-c", "pass"], tmp_path, tmp_path, marker=relay.MODULE)


def test_state_files_of_other_versions_read_and_plain_records_stay_as_they_were(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    old = {"name": "etcd", "pid": 1, "binary": "/bin/etcd", "log": "/l"}
    newer = {**old, "name": "kwok", "something": "new"}
    path.write_text(json.dumps({"ports": {"apiserver": 1}, "procs": [old, newer]}))
    st = State.load(path)
    assert st.procs == [Proc("etcd", 1, "/bin/etcd", "/l"), Proc("kwok", 1, "/bin/etcd", "/l")]
    st.procs.append(Proc(RELAY, 2, "/venv/bin/python", "/r", marker=relay.MODULE))
    st.save(path)
    saved = json.loads(path.read_text())["procs"]
    assert saved[0] == old  # no new field where it says nothing: earlier versions read it still
    assert saved[2]["marker"] == relay.MODULE
    assert State.load(path).procs == st.procs


def test_pods_have_no_api_server_address_until_the_relay_runs(tmp_path: Path) -> None:
    cluster = DevCluster(tmp_path)
    with pytest.raises(ClusterError, match="start the real node"):
        _ = cluster.pod_api_server
    tmp_path.mkdir(exist_ok=True)
    State(
        ports={RELAY: 6443}, procs=[Proc(RELAY, 2**22 + 1, sys.executable, "/r", marker=relay.MODULE)]
    ).save(cluster.state_file)
    with pytest.raises(ClusterError, match="no relay for pods runs"):
        _ = cluster.pod_api_server  # recorded, but that PID runs no relay
    assert "podServer" not in cluster.status()


def test_find_bin_dir_names_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PATCHBAY_KUBE_BIN", raising=False)
    with pytest.raises(ClusterError, match="--bin-dir"):
        find_bin_dir(None)
    (tmp_path / "etcd").write_text("")
    with pytest.raises(ClusterError, match="kube-apiserver"):
        find_bin_dir(tmp_path)
    for b in BINARIES:
        (tmp_path / b).write_text("")
    assert find_bin_dir(tmp_path) == tmp_path


def test_cli_without_a_cluster_fails_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--state-dir", str(tmp_path / "none"), "kubeconfig"]) == 1
    assert "run `patchbay-devcluster up`" in capsys.readouterr().err
    assert cli.main(["--state-dir", str(tmp_path / "none"), "down"]) == 0
    assert "nothing was running" in capsys.readouterr().out


def test_cli_help_documents_every_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "patchbay_devcluster.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for command in ("up", "add-nodes", "images", "down", "status", "kubeconfig", "PATCHBAY_KUBE_BIN"):
        assert command in out


def test_status_of_a_stopped_cluster(tmp_path: Path) -> None:
    st = DevCluster(tmp_path).status()
    assert st["processes"] == {}
    assert "readyz" not in st


def test_the_pod_network_has_no_way_out() -> None:
    """The CNI config: the tool's own bridge, never a gateway (the bridge plugin would switch on
    forwarding machine-wide), no masquerade, no routes but the subnet's own."""
    paths = NodePaths(Path("/tmp/patchbay-node-x"))
    conf = cni_conflist(paths)
    (plugin,) = conf["plugins"]
    assert plugin["type"] == "bridge"
    assert plugin["bridge"] == BRIDGE
    assert plugin["isGateway"] is False
    assert plugin["isDefaultGateway"] is False
    assert plugin["ipMasq"] is False
    ipam = plugin["ipam"]
    assert ipam["routes"] == []
    assert ipam["ranges"] == [[{"subnet": str(POD_SUBNET), "rangeStart": "10.244.0.128"}]]
    assert ipam["dataDir"].startswith(str(paths.root))  # leases go with the node


def test_the_kubernetes_service_is_the_bridge_address_and_no_pod_takes_a_service_address() -> None:
    """The API server gives the "kubernetes" Service the first address of its Service range: the
    bridge's own, where the relay answers on the Service's port. Pods get addresses above the
    range, so no pod ever holds an address the API server could give a Service."""
    from patchbay_devcluster.cluster import RELAY_PORT
    from patchbay_devcluster.controlplane import argv
    from patchbay_devcluster.node import KUBERNETES_SERVICE_PORT, POD_RANGE_START, SERVICE_SUBNET

    assert str(next(SERVICE_SUBNET.hosts())) == NODE_IP
    assert RELAY_PORT == KUBERNETES_SERVICE_PORT == 443
    assert SERVICE_SUBNET.subnet_of(POD_SUBNET)
    assert POD_RANGE_START not in SERVICE_SUBNET and POD_RANGE_START in POD_SUBNET
    ports = dict.fromkeys(("etcd", "etcd-peer", "apiserver"), 1)
    line = argv(
        "kube-apiserver", Path("/b"), Path("/s"), Path("/p"), ports, service_range=str(SERVICE_SUBNET)
    )
    assert f"--service-cluster-ip-range={SERVICE_SUBNET}" in line


def test_the_kubelet_runs_on_the_bridge_address(tmp_path: Path) -> None:
    node = RealNode(tmp_path, tmp_path / "pki", tmp_path / "bin")
    argv = node.kubelet.argv()
    assert f"--node-ip={NODE_IP}" in argv
    assert NODE_IP == "10.244.0.1"
    assert ipaddress.ip_address(NODE_IP) in POD_SUBNET


def _machine_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The machine-wide directories of the real node under tmp_path (never the machine's): the
    kubelet's root directory (returned) and the CDI directory (tmp_path/cdi)."""
    kubelet = tmp_path / "kubelet"
    monkeypatch.setattr(hostdirs, "KUBELET_ROOT", kubelet)
    monkeypatch.setattr(hostdirs, "OWNER_FILE", kubelet / "owner.json")
    monkeypatch.setattr(hostdirs, "DEVICE_PLUGIN_DIR", kubelet / "device-plugins")
    monkeypatch.setattr(hostdirs, "CDI_SPEC_DIR", tmp_path / "cdi")
    (kubelet / "device-plugins").mkdir(parents=True)
    return kubelet


def test_the_device_plugin_dir_is_refused_while_the_owners_kubelet_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One real node per machine: the owner file records the kubelet, and node.py alone decides
    whether that kubelet still runs (by PID and binary, so a recycled PID does not count)."""
    kubelet = _machine_dirs(tmp_path, monkeypatch)
    first = RealNode(tmp_path / "a", tmp_path / "a" / "pki", None)
    second = RealNode(tmp_path / "b", tmp_path / "b" / "pki", None)
    first.claim_device_plugin_dir()
    assert Owner.read() == Owner((tmp_path / "a").resolve())
    second.claim_device_plugin_dir()  # no kubelet recorded: nothing runs there
    first.claim_device_plugin_dir()

    me = os.getpid()
    exe = Path(f"/proc/{me}/cmdline").read_bytes().split(b"\0")[0].decode()
    second.record_kubelet(Proc("kubelet", me, exe, "/dev/null"))  # not the owner: ignored
    assert Owner.read() == Owner((tmp_path / "a").resolve())
    first.record_kubelet(Proc("kubelet", me, exe, "/dev/null"))
    with pytest.raises(NodeError, match=r"another real node \(state dir .*/a\) is running"):
        second.claim_device_plugin_dir()
    first.claim_device_plugin_dir()  # its own node again
    first.record_kubelet(Proc("kubelet", me, "/usr/bin/not-the-kubelet", "/dev/null"))
    second.claim_device_plugin_dir()
    assert Owner.read() == Owner((tmp_path / "b").resolve())

    (kubelet / "device-plugins" / "kubelet.sock").write_text("")
    first.release_device_plugin_dir()  # not the owner: keeps everything
    assert (kubelet / "owner.json").exists()
    assert (kubelet / "device-plugins" / "kubelet.sock").exists()
    (kubelet / "pods" / "uid").mkdir(parents=True)
    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / "patchbay_example.com_x.json").write_text("{}")
    (tmp_path / "cdi" / "vendor.com_gpu.json").write_text("{}")
    second.release_device_plugin_dir()
    assert not (kubelet / "owner.json").exists()
    assert not list((kubelet / "device-plugins").iterdir())
    assert not (kubelet / "pods").exists()  # the kubelet's state of the node that is gone
    # Only Patchbay's CDI specs go; another vendor's stay.
    assert sorted(p.name for p in (tmp_path / "cdi").iterdir()) == ["vendor.com_gpu.json"]


def test_a_kubelet_directory_with_another_kubelets_pods_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real node uses the machine's /var/lib/kubelet: never on a machine that is a node of
    some cluster already (pods there, and no claim of ours)."""
    kubelet = _machine_dirs(tmp_path, monkeypatch)
    (kubelet / "pods").mkdir()
    node = RealNode(tmp_path / "a", tmp_path / "a" / "pki", None)
    with pytest.raises(NodeError, match="holds another kubelet's state \\(pods\\)"):
        node.claim_device_plugin_dir()
    (kubelet / "pods").rmdir()
    node.claim_device_plugin_dir()
    (kubelet / "pods").mkdir()  # ours now (claimed): a node of ours may clear it
    node.claim_device_plugin_dir()


def test_an_owner_file_without_a_kubelet_reads_as_not_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner_file = tmp_path / "owner.json"
    monkeypatch.setattr(hostdirs, "OWNER_FILE", owner_file)
    owner_file.write_text(json.dumps({"stateDir": "/somewhere"}))
    owner = Owner.read()
    assert owner == Owner(Path("/somewhere"))
    assert not owner.kubelet_runs()
    owner_file.write_text("not json")
    assert Owner.read() is None


def test_the_api_client_is_kept_while_port_and_kubeconfig_stay(tmp_path: Path) -> None:
    cluster = DevCluster(tmp_path)
    with pytest.raises(ClusterError, match="run `patchbay-devcluster up`"):
        cluster.api()
    cluster.pki_dir.mkdir(parents=True)
    State(ports={"apiserver": 6443}).save(cluster.state_file)
    write_credentials(cluster.dir, cluster.pki_dir, cluster.kubeconfig, 6443)
    api = cluster.api()
    assert api.configuration.host == "https://127.0.0.1:6443"
    assert cluster.api() is api
    State(ports={"apiserver": 7443}).save(cluster.state_file)
    write_credentials(cluster.dir, cluster.pki_dir, cluster.kubeconfig, 7443)
    os.utime(cluster.kubeconfig, ns=(1, 1))  # a rewrite within the same clock tick still counts
    moved = cluster.api()
    assert moved is not api
    assert moved.configuration.host == "https://127.0.0.1:7443"


def test_status_says_not_ready_when_the_api_server_is_gone(tmp_path: Path) -> None:
    cluster = DevCluster(tmp_path)
    cluster.pki_dir.mkdir(parents=True)
    port = free_port()
    State(ports={"apiserver": port}).save(cluster.state_file)
    assert cluster.status()["readyz"] is False  # no kubeconfig yet
    write_credentials(cluster.dir, cluster.pki_dir, cluster.kubeconfig, port)
    assert cluster.status()["readyz"] is False  # nothing listens


def test_wheels_are_built_from_a_copy_of_the_hashed_files(tmp_path: Path) -> None:
    program = tmp_path / "prog"
    (program / "pkg").mkdir(parents=True)
    (program / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (program / "pkg" / "__init__.py").write_text("")
    for leftover in ("build/lib/pkg/gone.py", "pkg.egg-info/PKG-INFO", "pkg/__pycache__/x.pyc"):
        (program / leftover).parent.mkdir(parents=True, exist_ok=True)
        (program / leftover).write_text("")
    copy = copy_sources(program, tmp_path / "copy" / "prog")
    copied = sorted(str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file())
    assert copied == ["pkg/__init__.py", "pyproject.toml"]
    assert copied == [str(p.relative_to(program)) for p in source_files(program)]
