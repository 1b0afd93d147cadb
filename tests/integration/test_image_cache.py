"""The image cache is pruned: a build keeps the archives of its program and architecture used
last, with podman's images of them, and removes the rest (``imagecache.prune``). Real files in a
cache folder of the test's own and real podman images (a tiny rootfs imported under a program
name no build uses); the archives' contents do not matter to the prune, only their names and
times."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from patchbay_devcluster import imagecache

pytestmark = pytest.mark.release_independent

PROGRAM = "prunetest"
REPOSITORY = f"localhost/kube-patchbay/patchbay-{PROGRAM}"


def _hash(n: int) -> str:
    return f"{n:012x}"


def _tags() -> set[str]:
    out = subprocess.run(
        ["podman", "images", "--format", "{{.Repository}}:{{.Tag}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {ref for ref in out.split() if ref.startswith(REPOSITORY + ":")}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("PATCHBAY_CACHE", str(tmp_path))
    images = tmp_path / "images"
    (images / "work").mkdir(parents=True)
    rootfs = tmp_path / "rootfs.tar"
    with tarfile.open(rootfs, "w") as tar:
        data = b"prune test\n"
        info = tarfile.TarInfo("hello")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    try:
        yield images
    finally:
        if left := _tags():
            subprocess.run(["podman", "rmi", "--force", *left], capture_output=True, check=False)


def _archive(images: Path, n: int, age_s: float, part: str = "") -> Path:
    path = images / f"patchbay-{PROGRAM}-{part}{_hash(n)}.oci.tar"
    path.write_bytes(b"not read by the prune")
    os.utime(path, (path.stat().st_atime, path.stat().st_mtime - age_s))
    return path


def _image(images: Path, tag: str) -> None:
    rootfs = images.parent / "rootfs.tar"
    subprocess.run(
        ["podman", "import", "--quiet", str(rootfs), f"{REPOSITORY}:{tag}"], check=True, capture_output=True
    )


def test_a_build_keeps_the_archives_used_last_and_removes_the_rest_with_their_images(cache: Path) -> None:
    # Eight native archives, n=0 the oldest, and two arm64 ones older than all of them.
    native = [_archive(cache, n, age_s=1000 - n * 10) for n in range(8)]
    arm64 = [_archive(cache, 100 + n, age_s=5000 - n * 10, part="arm64-") for n in range(2)]
    work = cache / "work" / f"{PROGRAM}-{_hash(1)}"
    work.mkdir()
    (work / "wheels").mkdir()
    lock = work.with_name(f"{work.name}.lock")
    lock.touch()
    # podman's images: the oldest two (one with a test's own suffix), and a kept one.
    for tag in (f"0.2.0-{_hash(1)}", f"0.2.0-{_hash(1)}-upgrade", f"0.1.0-{_hash(2)}", f"0.2.0-{_hash(7)}"):
        _image(cache, tag)
    # The oldest archive is used again (a cache hit): it is kept, and the next two go instead.
    imagecache.used(native[0])

    removed = imagecache.prune(PROGRAM, "", keep=6)

    assert sorted(removed) == sorted([native[1], native[2]])
    assert sorted(p for p in cache.glob("*.oci.tar") if p in native) == [native[0], *native[3:]]
    assert all(p.is_file() for p in arm64), "another architecture's archives are its own to prune"
    assert not work.exists() and not lock.exists()
    assert _tags() == {f"{REPOSITORY}:0.2.0-{_hash(7)}"}

    # The same for arm64: its own archives, the native ones untouched.
    assert imagecache.prune(PROGRAM, "arm64-", keep=1) == [arm64[0]]
    assert arm64[1].is_file()
    assert [p for p in native if p.is_file()] == [native[0], *native[3:]]
