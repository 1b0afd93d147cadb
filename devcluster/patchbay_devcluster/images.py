"""Container images for the real node, built locally as OCI image-layout tarballs.

There is no image registry here, so the node's images are made from files on this machine and
imported into containerd with ``ctr images import``:

- ``registry.k8s.io/pause:3.10``: the sandbox image, holding ``/pause`` compiled from
  ``pause.c`` beside this module (a static binary that sleeps until a signal ends it).
- ``docker.io/library/busybox:1.36``: Debian's static busybox (``busybox-static``) with the
  applet links the tests and the demo use.

Each layer is an uncompressed tar, so its digest is also its diff ID, and the output is
byte-for-byte reproducible (fixed mtimes, sorted entries): the same inputs give the same digests.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
BUSYBOX_IMAGE = "docker.io/library/busybox:1.36"
BUSYBOX_APPLETS = ("sh", "cat", "env", "ls", "sleep", "echo", "test", "stat", "true", "false", "wc")
PAUSE_SOURCE = Path(__file__).with_name("pause.c")


class ImageError(RuntimeError):
    """An image could not be built; the message names the missing tool or package."""


@dataclass(frozen=True)
class File:
    path: str  # inside the image, no leading slash
    data: bytes = b""
    mode: int = 0o755
    link: str | None = None  # a symlink target instead of data


def _layer(files: list[File]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(f.path).parent) for f in files} - {"."})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        for f in sorted(files, key=lambda f: f.path):
            info = tarfile.TarInfo(f.path)
            info.mode = f.mode
            if f.link is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = f.link
                tar.addfile(info)
            else:
                info.size = len(f.data)
                tar.addfile(info, io.BytesIO(f.data))
    return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def oci_archive(name: str, files: list[File], entrypoint: list[str], cmd: list[str] | None = None) -> bytes:
    """An OCI image layout (as a tar) that ``ctr images import`` names ``name``."""
    layer = _layer(files)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": entrypoint, "Cmd": cmd or [], "Env": ["PATH=/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
        },
        sort_keys=True,
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _digest(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": _digest(layer),
                    "size": len(layer),
                }
            ],
        },
        sort_keys=True,
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                    },
                }
            ],
        },
        sort_keys=True,
    ).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        entries = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": index}
        for blob in (config, manifest, layer):
            entries["blobs/sha256/" + hashlib.sha256(blob).hexdigest()] = blob
        for d in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        for path, data in entries.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def pause_binary(work: Path) -> bytes:
    """Compile ``pause.c`` statically (cached in ``work``)."""
    out = work / "pause"
    if not out.exists():
        cc = shutil.which("cc") or shutil.which("gcc")
        if not cc:
            raise ImageError("no C compiler (cc/gcc) to build the pause binary: apt-get install gcc")
        work.mkdir(parents=True, exist_ok=True)
        res = subprocess.run(
            [cc, "-static", "-O2", "-o", str(out), str(PAUSE_SOURCE)], capture_output=True, text=True
        )
        if res.returncode != 0:
            raise ImageError(f"building pause failed: {res.stderr.strip()}")
    return out.read_bytes()


def is_static_elf(data: bytes) -> bool:
    """True for a 64-bit ELF without a PT_INTERP header, i.e. one that needs no dynamic loader."""
    if data[:5] != b"\x7fELF\x02":
        return False
    phoff = int.from_bytes(data[0x20:0x28], "little")
    phentsize = int.from_bytes(data[0x36:0x38], "little")
    phnum = int.from_bytes(data[0x38:0x3A], "little")
    for i in range(phnum):
        off = phoff + i * phentsize
        if int.from_bytes(data[off : off + 4], "little") == 3:  # PT_INTERP
            return False
    return True


def busybox_binary() -> bytes:
    for candidate in ("/bin/busybox", "/usr/bin/busybox"):
        p = Path(candidate)
        if p.exists() and is_static_elf(data := p.read_bytes()):
            # A dynamically linked busybox would not run in an image that has no libc.
            return data
    raise ImageError("no static busybox: apt-get install busybox-static")


def build_images(work: Path) -> dict[str, Path]:
    """Write the node's image tarballs into ``work``; return {image name: tarball}."""
    work.mkdir(parents=True, exist_ok=True)
    busybox = busybox_binary()
    images = {
        PAUSE_IMAGE: oci_archive(PAUSE_IMAGE, [File("pause", pause_binary(work))], ["/pause"]),
        BUSYBOX_IMAGE: oci_archive(
            BUSYBOX_IMAGE,
            [File("bin/busybox", busybox)] + [File(f"bin/{a}", link="busybox") for a in BUSYBOX_APPLETS],
            [],
            ["sh"],
        ),
    }
    out = {}
    for name, data in images.items():
        path = work / (name.rsplit("/", 1)[1].replace(":", "_") + ".oci.tar")
        path.write_bytes(data)
        out[name] = path
    return out
