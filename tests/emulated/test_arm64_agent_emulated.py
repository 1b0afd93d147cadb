"""The arm64 images, used: the agent image's program run under qemu-user emulation, as a node's
runtime runs it (the image's root filesystem unpacked, its entry point and Env, in a chroot with
/proc; ``podman run`` cannot set its rlimits on this machine), against the Python kubelet peer
(tests/support/pykubelet.py) on real Unix sockets, and both architectures pushed to a real OCI
registry (distribution's) as ONE image index, the release's push path (hack/release.py).

Checked: every ELF file of the arm64 agent image is an aarch64 one (an amd64 binary in it would
run natively and pass for emulated) and each running program is, on the host, the qemu emulator;
as a device plugin the agent registers, the kubelet lists its devices and Allocate answers; as a
DRA driver (a second process) it registers with the kubelet's plugin watcher, publishes its
ResourceSlice to a stand-in API server (the few calls a DRA driver makes, in this module: the
real API server's side is tests/integration/agent) and prepares a claim with CDI devices; both
stop on SIGTERM with status 0; the registry serves one index with linux/amd64 and linux/arm64
under the tag, and an archive labelled with the wrong architecture is refused.

Not in `make test`: this folder is not in pytest's testpaths, because the arm64 images take
minutes to build under emulation. `make test-arm64` builds them (cached: ~/.cache/patchbay/images)
and runs it; CI builds them in the background (nice 19) while `make test` runs, then runs this.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.agentrun import plugin_client
from support.clusters import wait_for
from support.draplugin import node_call, register
from support.fakehw import FakeHardware
from support.ociregistry import running_registry
from support.paths import short_dir
from support.pykubelet import PyKubelet
from support.scripts import load

from patchbay_agent.api import api_pb2, dra_v1_pb2
from patchbay_agent.dra.slices import device_name
from patchbay_bench.fakeapi import _Handler
from patchbay_devcluster import registry as oci
from patchbay_devcluster.imagebuild import BuiltImage, build_all
from patchbay_devcluster.releases import matrix

REPO = Path(__file__).resolve().parents[2]
RESOURCE = "example.com/serial"
DRIVER = "serial.patchbay.dev"
NODE = "arm-node-1"
EM_AARCH64 = 183  # e_machine of an aarch64 ELF file
SERIAL_PLUGIN = {
    "discovery": {"paths": {"globs": ["/dev/ttyUSB*"]}},
    "allocation": {"devicesEnvName": "SERIALS"},
}


@pytest.fixture(scope="module")
def arm64_images() -> dict[str, BuiltImage]:
    check = subprocess.run(
        [str(REPO / "hack" / "arm64-emulation.sh"), "--check"], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stderr  # make test-arm64 registers it
    return build_all(REPO, arch="arm64")


# --- what is in the image --------------------------------------------------------------------


def image_layers(archive: Path) -> Iterator[tuple[dict[str, Any], tarfile.TarFile]]:
    """``(the image's config, a layer as a streamed tar)`` for each layer of the image of an OCI
    archive, base first."""
    with tarfile.open(archive) as outer:

        def blob(digest: str) -> Any:
            f = outer.extractfile("blobs/" + digest.replace(":", "/"))
            assert f is not None, digest
            return f

        (entry,) = json.load(blob_index(outer))["manifests"]
        manifest = json.load(blob(entry["digest"]))
        config = json.load(blob(manifest["config"]["digest"]))
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=blob(layer["digest"]), mode="r|*") as tar:
                yield config, tar


def image_files(archive: Path) -> Iterator[tuple[str, bytes]]:
    """``(path, first 20 bytes)`` of every regular file of the image's layers, and its config's
    architecture as the path ``:architecture``."""
    for n, (config, tar) in enumerate(image_layers(archive)):
        if n == 0:
            yield ":architecture", str(config["architecture"]).encode()
        for m in tar:
            if m.isfile():
                f = tar.extractfile(m)
                assert f is not None
                yield m.name.lstrip("./"), f.read(20)


def blob_index(outer: tarfile.TarFile) -> Any:
    f = outer.extractfile("index.json")
    assert f is not None
    return f


def test_every_binary_of_the_arm64_agent_image_is_aarch64(arm64_images: dict[str, BuiltImage]) -> None:
    image = arm64_images["agent"]
    assert image.arch == "arm64" and "-arm64-" in image.ref, image
    machines: dict[str, int] = {}
    arch = b""
    for path, head in image_files(image.archive):
        if path == ":architecture":
            arch = head
        elif head[:4] == b"\x7fELF":
            machines[path] = int.from_bytes(head[18:20], "little")
    assert arch == b"arm64"
    # The interpreter, the C extension the agent's gRPC runs on, the C library.
    python = [p for p in machines if re.fullmatch(r"usr/bin/python3\.\d+", p)]
    cygrpc = [p for p in machines if "/grpc/_cython/cygrpc." in p]
    assert python and cygrpc and any("libc.so" in p for p in machines), sorted(machines)[:20]
    assert all(p.startswith("opt/patchbay/") for p in cygrpc), cygrpc
    foreign = {p: m for p, m in machines.items() if m != EM_AARCH64}
    assert foreign == {}, (
        f"{len(foreign)} of {len(machines)} ELF files are not aarch64: {sorted(foreign)[:10]}"
    )


# --- the program, run --------------------------------------------------------------------------


class FakeDraApi(http.server.ThreadingHTTPServer):
    """The API calls a DRA driver makes, answered from memory: GET its Node, server-side apply,
    dry-run create, list and delete of ResourceSlices, GET of a ResourceClaim and apply of its
    status. Any other PATCH is echoed; any other GET is a 404. On 127.0.0.1, plain HTTP."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _DraHandler)
        self.slices: dict[str, dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "uid": str(uuid.uuid4()), "labels": {"kubernetes.io/arch": "arm64"}},
            "status": {"nodeInfo": {"kubeletVersion": matrix()[-1], "architecture": "arm64"}},
        }

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


SLICES = re.compile(r"^/apis/resource\.k8s\.io/v1/resourceslices(?:/(?P<name>[^/]+))?$")
CLAIM = re.compile(r"^/apis/resource\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/resourceclaims/(?P<name>[^/]+)")


class _DraHandler(_Handler):
    """The bench's stand-in API's plumbing (JSON answers, keep-alive), DRA's paths."""

    server: FakeDraApi  # type: ignore[assignment]

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == f"/api/v1/nodes/{NODE}":
            return self._answer(200, self.server.node)
        if (m := SLICES.match(path)) and not m["name"]:
            return self._answer(200, {"items": list(self.server.slices.values())})
        if (m := CLAIM.match(path)) and (claim := self.server.claims.get((m["ns"], m["name"]))):
            return self._answer(200, claim)
        return self._not_found()

    def do_PATCH(self) -> None:
        body = self._body()
        if (m := SLICES.match(self.path.split("?", 1)[0])) and m["name"]:
            body.setdefault("metadata", {})["resourceVersion"] = str(len(self.server.slices) + 1)
            self.server.slices[m["name"]] = body
        self._answer(200, body)

    def do_POST(self) -> None:
        self._answer(201, self._body())  # a dry-run create: answered as it would be stored

    def do_DELETE(self) -> None:
        if (m := SLICES.match(self.path.split("?", 1)[0])) and m["name"]:
            self.server.slices.pop(m["name"], None)
        self._answer(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})


def unpack(archive: Path, root: Path) -> dict[str, Any]:
    """The image's root filesystem, its layers unpacked in order into ``root`` (whiteouts
    applied); returns its config (``Entrypoint``, ``Env``)."""
    image: dict[str, Any] = {}
    for config, tar in image_layers(archive):
        image = config
        for m in tar:
            head, _, base = m.name.lstrip("./").rpartition("/")
            if base == ".wh..wh..opq":
                shutil.rmtree(root / head, ignore_errors=True)
                (root / head).mkdir(parents=True, exist_ok=True)
            elif base.startswith(".wh."):
                gone = root / head / base[4:]
                if gone.is_dir() and not gone.is_symlink():
                    shutil.rmtree(gone)
                else:
                    gone.unlink(missing_ok=True)
            else:
                tar.extract(m, root, filter="fully_trusted")
    return dict(image["config"])


class Emulated:
    """The image's program (its entry point, with ``args``) run as a node's runtime runs it: in a
    chroot of the image's root filesystem, with its Env, as root, /proc mounted in a mount
    namespace of its own; the kernel hands each aarch64 program to qemu (binfmt_misc). Paths in
    ``args`` are inside the root; its output goes to ``log``."""

    def __init__(self, root: Path, config: dict[str, Any], log: Path, *args: str) -> None:
        self.log = log
        self._out = log.open("wb")
        inner = ["/usr/bin/env", "-i", *config.get("Env", []), *config["Entrypoint"], *args]
        script = 'mount -t proc proc "$0/proc" && exec chroot "$0" "$@"'
        argv = ["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c", script, str(root)]
        self.proc = subprocess.Popen([*argv, *inner], stdout=self._out, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def program_pid(self) -> int | None:
        """The program's process on the host (unshare's child)."""
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def stop(self) -> int:
        """SIGTERM to the program (SIGKILL 30 s later); its exit status."""
        pid = self.program_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        finally:
            self._out.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def agent_root(arm64_images: dict[str, BuiltImage]) -> Iterator[tuple[Path, dict[str, Any]]]:
    """The arm64 agent image's root filesystem, unpacked in a short directory (socket paths
    under it stay short), and its config."""
    with short_dir("pba") as d:
        config = unpack(arm64_images["agent"].archive, d / "r")
        yield d / "r", config


def test_the_arm64_agent_serves_the_kubelet_under_emulation(agent_root: tuple[Path, dict[str, Any]]) -> None:
    root, config = agent_root
    inside = Path("/w")  # the test's directory as the program sees it
    work = root / "w"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    hw = FakeHardware(work / "host")
    hw.add_serials(2)
    (work / "agent.yaml").write_text(yaml.safe_dump({"resourceName": RESOURCE, "plugin": SERIAL_PLUGIN}))
    api = FakeDraApi()
    threading.Thread(target=api.serve_forever, daemon=True).start()
    kubeconfig = work / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": api.url}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    common = [
        "--config",
        str(inside / "agent.yaml"),
        "--node-name",
        NODE,
        "--host-root",
        str(inside / "host"),
    ]
    common += ["--http-address", "off", "--log-format", "json"]
    plugin_dir, kubelet_root = work / "dp", work / "k"
    containers: list[Emulated] = []
    try:

        async def scenario() -> None:
            async with PyKubelet(plugin_dir) as kubelet:
                dp = ("--device-plugin-dir", str(inside / "dp"))
                containers.append(Emulated(root, config, work / "dp.log", *common, *dp))
                dra = ("--dra-driver", DRIVER, "--kubelet-root-dir", str(inside / "k"))
                dra += ("--cdi-spec-dir", str(inside / "cdi"), "--kubeconfig", str(inside / "kubeconfig"))
                containers.append(Emulated(root, config, work / "dra.log", *common, *dra))
                # Emulated, the program starts in seconds, not milliseconds: the bound is wide.
                await kubelet.wait_for(lambda: len(kubelet.devices.get(RESOURCE, [])) == 2, within=240)
                assert sorted(d.ID for d in kubelet.devices[RESOURCE]) == ["ttyUSB0", "ttyUSB1"]
                assert all(d.health == "Healthy" for d in kubelet.devices[RESOURCE])
                (registration,) = kubelet.registrations
                assert registration.request.resource_name == RESOURCE
                async with plugin_client(plugin_dir / registration.request.endpoint) as stub:
                    request = api_pb2.ContainerAllocateRequest(devices_ids=["ttyUSB1"])
                    answer = await stub.Allocate(
                        api_pb2.AllocateRequest(container_requests=[request]), timeout=30
                    )
                (allocated,) = answer.container_responses
                assert allocated.envs["SERIALS"] == "ttyUSB1", allocated
                assert [d.host_path for d in allocated.devices] == ["/dev/ttyUSB1"], allocated

                registry = kubelet_root / "plugins_registry"
                await asyncio.to_thread(
                    wait_for, "the DRA registration socket", lambda: list(registry.glob("*.sock")), 240
                )
                (socket,) = registry.glob("*.sock")
                info = await register(socket, seconds=60)
                assert (info.type, info.name) == ("DRAPlugin", DRIVER)
                names = [device_name("ttyUSB0"), device_name("ttyUSB1")]

                def published() -> bool:
                    devices = [d["name"] for s in api.slices.values() for d in s["spec"]["devices"]]
                    return devices == names

                await asyncio.to_thread(wait_for, "the ResourceSlice", published, 120)
                uid = str(uuid.uuid4())
                result = {"request": "one", "driver": DRIVER, "pool": NODE, "device": names[0]}
                api.claims[("default", "serial")] = {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": "serial", "namespace": "default", "uid": uid, "generation": 1},
                    "status": {"allocation": {"devices": {"results": [result]}}},
                }
                claim = dra_v1_pb2.Claim(namespace="default", uid=uid, name="serial")
                endpoint = str(root / info.endpoint.lstrip("/"))  # the program's path, seen from here
                prepared = (await node_call(endpoint, "NodePrepareResources", claim)).claims[uid]
                assert prepared.error == "", prepared.error
                assert [(d.device_name, d.pool_name) for d in prepared.devices] == [(names[0], NODE)]
                assert f"{DRIVER}/device={uid}-{names[0]}" in prepared.devices[0].cdi_device_ids
                spec = json.loads((work / "cdi" / f"patchbay_{DRIVER}_{uid}.json").read_text())
                assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] == "/dev/ttyUSB0"

                # The programs answering are emulated ones: on the host, each is qemu's.
                for container in containers:
                    pid = container.program_pid()
                    assert pid is not None, container.text()
                    exe = os.readlink(f"/proc/{pid}/exe")
                    assert "qemu" in exe or "aarch64" in exe, (exe, container.text()[-2000:])

        asyncio.run(scenario())
        for container in containers:
            status = container.stop()
            assert status == 0, container.text()[-3000:]
            assert '"msg": "Stopped"' in container.text(), container.text()[-3000:]
    finally:
        for container in containers:
            if container.proc.returncode is None:
                container.stop()
        api.shutdown()
        api.server_close()
        shutil.rmtree(work, ignore_errors=True)


# --- both architectures, as one reference -------------------------------------------------------


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[oci.Registry]:
    with running_registry(tmp_path_factory.mktemp("registry"), "arm64") as reg:
        yield reg


def served_index(registry: oci.Registry, repository: str, tag: str) -> dict[str, Any]:
    import http.client

    conn = http.client.HTTPSConnection(oci.HOST, registry.port, context=registry.context(), timeout=10)
    try:
        path = f"/v2/{repository.removeprefix(registry.host + '/')}/manifests/{tag}"
        conn.request("GET", path, headers={"Accept": "application/vnd.oci.image.index.v1+json"})
        res = conn.getresponse()
        body = res.read()
        assert res.status == 200, (res.status, body[:300])
        assert res.getheader("Content-Type") == "application/vnd.oci.image.index.v1+json", res.getheaders()
        loaded: dict[str, Any] = json.loads(body)
        return loaded
    finally:
        conn.close()


def test_both_architectures_are_one_reference(
    arm64_images: dict[str, BuiltImage], registry: oci.Registry, tmp_path: Path
) -> None:
    release = load("release")
    native = build_all(REPO)["agent"]
    arm64 = arm64_images["agent"]
    target = f"{registry.host}/patchbay/patchbay-agent:0.0.0-test"
    digestfile = tmp_path / "digest"
    release.push_index(target, [native, arm64], digestfile, ["--cert-dir", str(registry.cert_dir)])
    digest = digestfile.read_text().strip()
    repository = target.rsplit(":", 1)[0]
    assert registry.manifest_digest(repository, "0.0.0-test") == digest
    index = served_index(registry, repository, "0.0.0-test")
    platforms = {(m["platform"]["os"], m["platform"]["architecture"]) for m in index["manifests"]}
    assert platforms == {("linux", "amd64"), ("linux", "arm64")}, index

    # The release directory's archive: one entry, an index of both; an image given as another
    # architecture than its own is refused.
    archive = tmp_path / "agent.oci.tar"
    release.index_archive({"amd64": native.archive, "arm64": arm64.archive}, archive, "example.com/agent:1")
    with tarfile.open(archive) as tar:
        (entry,) = json.load(blob_index(tar))["manifests"]
        f = tar.extractfile("blobs/" + entry["digest"].replace(":", "/"))
        assert f is not None
        listed = json.load(f)["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "example.com/agent:1"
    assert sorted(m["platform"]["architecture"] for m in listed) == ["amd64", "arm64"]
    with pytest.raises(SystemExit, match="its image is amd64, given as the arm64 image"):
        release.index_archive({"arm64": native.archive}, tmp_path / "wrong.oci.tar", "example.com/agent:1")
