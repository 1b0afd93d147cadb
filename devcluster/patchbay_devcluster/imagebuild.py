"""The project's images (operator, agent), built on this machine from their own Dockerfiles.

There is no Docker engine and no image registry here, so an image is made in four steps, each
with Debian's tools or the project's own metadata:

1. **Base.** ``mmdebstrap`` makes a Debian rootfs with python3 from Debian's packages; ``podman
   import`` names it ``localhost/patchbay-base:<recipe hash>``. The Dockerfiles take the base as
   the build argument ``BASE_IMAGE`` (upstream it is the official python image).
2. **Wheels, on the host.** ``pip wheel`` builds the program's own wheel from a copy of its
   folder (its ``pyproject.toml`` says what it is and what it needs; the copy holds exactly the
   hashed files, so setuptools' ``build/`` never lands in the checkout and nothing left over from
   an earlier build gets into the wheel), the wheel of the API package it shares with the other
   programs (``api/``, ``SHARED``) the same way, and downloads the wheel of every
   dependency, pinned to the versions installed in the development virtualenv, which are the
   versions the tests ran against. Only the program's own dependency closure goes in: the agent
   image holds no kopf and no official client, and the cluster tool is in no image.
3. **Build, offline.** ``podman build --network=none`` of ``<program>/Dockerfile`` in a context
   that holds only ``wheels/``: the Dockerfile installs them with ``pip --no-index``.
4. **Archive.** ``podman save --format oci-archive`` writes an OCI archive that the real node's
   containerd imports (``DevCluster.load_images``).

Every image is keyed by a content hash of its inputs (the program's folder and the shared API
package's, the pinned requirement list, the base recipe), which is in its tag,
``<release>-<hash>`` (the release from the ``VERSION`` file), so a warm run only hashes files and
a change anywhere in a program gives a new tag (and so a rollout). ``make release`` names the
same image ``<release>`` alone as well (hack/release.py), the tag the chart's defaults use.
Archives live in ``$PATCHBAY_CACHE/images`` (default ``~/.cache/patchbay/images``), outside the repository.
A build keeps the archives of its program and architecture used last and removes the rest
(``imagecache.prune``).

**Architectures.** Each image is built for one architecture, ``amd64`` (this machine's, what the
demo and the tests run) unless asked for another (``arch=``; ``ARCHITECTURES``). ``arm64`` is
built here under qemu-user emulation (Debian's qemu-user-static, registered with binfmt_misc:
hack/arm64-emulation.sh): mmdebstrap makes an arm64 base (its packages' scripts run emulated),
the pure-Python wheels are the ones amd64 takes (the programs' own among them), every other
dependency is PyPI's aarch64 wheel of the same pinned version (``pip download --platform
manylinux..._aarch64``; one without such a wheel is an error, never a build from source under
emulation), and ``podman build --platform linux/arm64`` runs the Dockerfile's steps emulated.
An arm64 image has ``-arm64`` in its tag and its archive's name, and an arm64 base rootfs is kept
in the cache (minutes to make again).
``make release`` puts the images of both architectures of a program into ONE OCI image index
(hack/release.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from patchbay_devcluster import imagecache

log = logging.getLogger(__name__)

REGISTRY = "ghcr.io/kube-patchbay"
"""Where released images live; local builds use the same names with a content-hash tag, so the
chart's and the operator's defaults need only a different tag."""

BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv")
BASE_MIRROR = "http://deb.debian.org/debian"
# Documentation, manual pages and translations are of no use in an image (copyright files stay).
BASE_DPKG_OPTIONS = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
)
BASE_EPOCH = "1700000000"
"""SOURCE_DATE_EPOCH for mmdebstrap: fixed file times, so the same packages give the same rootfs."""

NATIVE = "amd64"
"""The architecture of this machine, and of the images the demo, the tests and the bench run."""

#: Every architecture an image can be built for: Debian's name, and for a foreign one, its
#: binfmt_misc entry (the emulator that must be registered) and the platform tags of PyPI's
#: wheels that the image's glibc (bookworm: 2.36) runs.
ARCHITECTURES = ("amd64", "arm64")
EMULATOR = {"arm64": "qemu-aarch64"}
WHEEL_PLATFORMS = {
    "arm64": ("manylinux2014_aarch64", *(f"manylinux_2_{n}_aarch64" for n in range(17, 37))),
}
BINFMT = Path("/proc/sys/fs/binfmt_misc")

SKIP_PARTS = {"__pycache__", "build", "dist", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


class ImageBuildError(RuntimeError):
    """An image could not be built; the message names the step and the tool's own words."""


@dataclass(frozen=True)
class Program:
    """One program of the repository that ships as an image."""

    name: str  # operator | agent
    folder: str  # its folder in the repository (holds pyproject.toml and Dockerfile)

    @property
    def distribution(self) -> str:
        return f"patchbay-{self.name}"

    @property
    def repository(self) -> str:
        return f"{REGISTRY}/patchbay-{self.name}"


PROGRAMS = (Program("operator", "operator"), Program("agent", "plugin-agent"))
SHARED = (Program("api", "api"),)
"""The repository's packages that programs depend on and that ship in no image of their own
(``patchbay-api``): where a program's closure holds one, its wheel is built from its folder, as
the program's own is, never downloaded, and its files are part of the image's content hash."""


@dataclass(frozen=True)
class BuiltImage:
    """An image in the cache: its name and the OCI archive to import."""

    program: str
    ref: str  # repository:tag
    archive: Path
    built: bool  # False when the cache already had it
    seconds: float
    arch: str = NATIVE  # linux/<arch>

    @property
    def repository(self) -> str:
        return self.ref.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.ref.rsplit(":", 1)[1]

    @property
    def size_bytes(self) -> int:
        return self.archive.stat().st_size


def find_repo(start: Path | None = None) -> Path:
    """The repository root: the nearest directory above ``start`` holding every program folder."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if all((d / p.folder / "Dockerfile").is_file() for p in PROGRAMS):
            return d
    raise ImageBuildError(f"no Patchbay checkout at or above {here} (looked for operator/Dockerfile)")


def _run(step: str, argv: Sequence[str], timeout: float, **kw: object) -> str:
    """Run one tool; on failure raise with the step's name and the tool's last output lines."""
    try:
        res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False, **kw)  # type: ignore[call-overload]
    except FileNotFoundError:
        raise ImageBuildError(f"{step}: {argv[0]} is not installed (make setup installs it)") from None
    except subprocess.TimeoutExpired:
        raise ImageBuildError(f"{step}: {argv[0]} did not finish within {timeout:.0f}s") from None
    if res.returncode != 0:
        tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-25:])
        raise ImageBuildError(f"{step}: {' '.join(argv[:3])} ... exited {res.returncode}\n{tail}")
    return str(res.stdout)


def _podman_has(ref: str) -> bool:
    return (
        subprocess.run(["podman", "image", "exists", ref], capture_output=True, check=False).returncode == 0
    )


# --- step 1: the base --------------------------------------------------------------------------


def base_recipe(arch: str = NATIVE) -> str:
    recipe: dict[str, object] = {
        "suite": BASE_SUITE,
        "variant": "minbase",
        "packages": BASE_PACKAGES,
        "mirror": BASE_MIRROR,
        "dpkg": BASE_DPKG_OPTIONS,
        "epoch": BASE_EPOCH,
    }
    if arch != NATIVE:  # the native recipe is as it always was: its cached base stays valid
        recipe["architecture"] = arch
    return json.dumps(recipe, sort_keys=True)


def _arch_part(arch: str) -> str:
    """What a tag or a file name of a foreign architecture's image has in it: ``arm64-``."""
    return "" if arch == NATIVE else f"{arch}-"


def emulation_ready(arch: str) -> None:
    """A foreign ``arch`` needs its qemu-user emulator registered and enabled with binfmt_misc;
    ImageBuildError, saying what to run, when it is not."""
    if arch not in ARCHITECTURES:
        raise ImageBuildError(f"no images for {arch!r}: the architectures are {', '.join(ARCHITECTURES)}")
    if arch == NATIVE:
        return
    entry = BINFMT / EMULATOR[arch]
    try:
        enabled = entry.read_text().splitlines()[0].strip() == "enabled"
    except (OSError, IndexError):
        enabled = False
    if not enabled:
        raise ImageBuildError(
            f"{arch} images are built under qemu-user emulation, and {entry} is not an enabled "
            "binfmt_misc entry: run hack/arm64-emulation.sh (make images-arm64 does), which installs "
            "qemu-user-static, binfmt-support and arch-test and registers it"
        )


def base_image(arch: str = NATIVE) -> str:
    """``localhost/patchbay-base:<suite>-[<arch>-]<recipe hash>``, made once per machine (about 45 s
    cold; arm64, emulated, minutes: its rootfs tarball is kept in the cache and imported again
    when podman's storage lost the image)."""
    recipe = _digest([base_recipe(arch).encode()])[:12]
    ref = f"localhost/patchbay-base:{BASE_SUITE}-{_arch_part(arch)}{recipe}"
    if _podman_has(ref):
        return ref
    t0 = time.monotonic()
    work = imagecache.cache_dir() / "work"
    work.mkdir(parents=True, exist_ok=True)
    kept = imagecache.cache_dir() / f"base-rootfs-{ref.rsplit(':', 1)[1]}.tar"
    tarball = kept if arch != NATIVE else work / "base-rootfs.tar"
    if not kept.is_file() or arch == NATIVE:
        log.info(
            "Base image (%s): mmdebstrap %s with %s (Debian's packages; about a minute%s)",
            arch,
            BASE_SUITE,
            BASE_PACKAGES,
            "" if arch == NATIVE else ", a few under emulation",
        )
        partial = tarball.with_suffix(".partial.tar")
        argv = [
            "mmdebstrap",
            "--variant=minbase",
            "--mode=root",
            "--format=tar",
            f"--architectures={arch}",
            f"--include={','.join(BASE_PACKAGES)}",
            *(f"--dpkgopt={o}" for o in BASE_DPKG_OPTIONS),
            BASE_SUITE,
            str(partial),
            BASE_MIRROR,
        ]
        _run("base image (mmdebstrap)", argv, 1800, env={**os.environ, "SOURCE_DATE_EPOCH": BASE_EPOCH})
        partial.replace(tarball)
    _run(
        "base image (podman import)",
        [
            "podman",
            "import",
            "--arch",
            arch,
            "--os",
            "linux",
            "--change",
            "ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            str(tarball),
            ref,
        ],
        300,
    )
    if arch == NATIVE:
        tarball.unlink()
    log.info("Base image %s ready in %.0fs", ref, time.monotonic() - t0)
    return ref


# --- step 2: what goes in ----------------------------------------------------------------------


def pinned_closure(
    distribution: str, extras: Iterable[str] = (), requirements: Sequence[str] | None = None
) -> list[str]:
    """``name==version`` for every distribution ``distribution`` needs, transitively, as installed
    in THIS interpreter's environment (the development virtualenv the tests run in).

    ``requirements``: start from these (a checkout's declared dependencies) rather than from the
    installed ``distribution``'s metadata: another release's checkout declares its own.
    Environment markers are evaluated for this interpreter, which matches the image's (CPython
    3.11 on Linux x86_64). A dependency that is not installed here is an error: the image would
    otherwise get a version nobody tested.
    """
    pins: dict[str, str] = {}
    todo: list[tuple[str, frozenset[str]]] = [(distribution, frozenset(extras))]
    if requirements is not None:
        roots = [Requirement(r) for r in requirements]
        todo = [
            (r.name, frozenset(r.extras))
            for r in roots
            if r.marker is None or r.marker.evaluate({"extra": ""})
        ]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, wanted = todo.pop()
        if (name, wanted) in seen:
            continue
        seen.add((name, wanted))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise ImageBuildError(
                f"{name} is needed by {distribution} but not installed: run make venv"
            ) from None
        if name != distribution:
            pins[canonicalize_name(name)] = dist.version
        for raw in dist.requires or []:
            req = Requirement(raw)
            envs = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker is not None and not any(req.marker.evaluate(e) for e in envs):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return [f"{n}=={v}" for n, v in sorted(pins.items())]


def _digest(chunks: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(len(c).to_bytes(8, "little"))
        h.update(c)
    return h.hexdigest()


def source_files(folder: Path) -> list[Path]:
    """Every file of a program's folder that can change the image (caches and builds skipped)."""
    out = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        skipped = SKIP_PARTS & set(rel.parts) or rel.parts[0].endswith(".egg-info") or path.suffix == ".pyc"
        if path.is_file() and not skipped:
            out.append(path)
    return out


def copy_sources(folder: Path, dest: Path) -> Path:
    """Copy the files of ``folder`` that make the image (``source_files``) to ``dest``."""
    shutil.rmtree(dest, ignore_errors=True)
    for path in source_files(folder):
        target = dest / path.relative_to(folder)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    return dest


def shared_in(repo: Path, pins: Sequence[str]) -> list[Program]:
    """The packages of ``SHARED`` among ``pins`` that this checkout holds (an older release's
    checkout may hold none)."""
    names = {canonicalize_name(Requirement(p).name) for p in pins}
    return [s for s in SHARED if canonicalize_name(s.distribution) in names and (repo / s.folder).is_dir()]


def input_hash(repo: Path, program: Program, pins: Sequence[str], base: str) -> str:
    chunks: list[bytes] = [base.encode(), "\n".join(pins).encode()]
    for part in (program, *shared_in(repo, pins)):
        folder = repo / part.folder
        for path in source_files(folder):
            chunks += [f"{part.folder}/{path.relative_to(folder)}".encode(), path.read_bytes()]
    return _digest(chunks)


def version_of(repo: Path, program: Program) -> str:
    """The release the image belongs to: the checkout's ``VERSION`` file (SemVer, what the chart's
    appVersion says), or, in a checkout from before that file (0.1.0), the program's own version.
    The program's pyproject.toml is generated from ``VERSION``, so the content hash changes with it.
    """
    release = repo / "VERSION"
    if release.is_file():
        return release.read_text().strip()
    meta = tomllib.loads((repo / program.folder / "pyproject.toml").read_text())
    return str(meta["project"]["version"])


# --- steps 3 and 4 -----------------------------------------------------------------------------


def check_installed(repo: Path, program: Program) -> None:
    """The virtualenv's metadata of ``program`` must list what its pyproject.toml lists: the pins
    come from the installed metadata, so a stale install would leave a dependency out."""
    meta = tomllib.loads((repo / program.folder / "pyproject.toml").read_text())
    declared = meta["project"]["dependencies"]
    try:
        installed = metadata.requires(program.distribution) or []
    except metadata.PackageNotFoundError:
        raise ImageBuildError(f"{program.distribution} is not installed: run make venv") from None
    wanted = {canonicalize_name(Requirement(d).name) for d in declared}
    have = {canonicalize_name(Requirement(r).name) for r in installed if "extra ==" not in r}
    if wanted != have:
        raise ImageBuildError(
            f"{program.distribution}: the installed metadata is stale ({program.folder}/pyproject.toml "
            f"changed: {sorted(wanted ^ have)}): run make venv"
        )


def installed_from(repo: Path, program: Program) -> bool:
    """Whether this virtualenv's ``program`` is the one in ``repo`` (its editable install), as
    opposed to another checkout, such as the previous release the upgrade test builds."""
    try:
        raw = metadata.distribution(program.distribution).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return True  # check_installed says what to do
    url = str(json.loads(raw or "{}").get("url", ""))
    return url.removeprefix("file://") == str((repo / program.folder).resolve())


def dependency_wheels(step: str, pins: Sequence[str], wheels: Path, arch: str, cwd: Path) -> None:
    """The wheels of the pinned dependencies, into ``wheels``: ``pip wheel`` (a wheel from PyPI, or
    one built from an sdist here). For another architecture than this machine's, every wheel of
    those that is not pure Python (``*-none-any``) is then replaced by PyPI's wheel of the same
    version for that architecture and the image's CPython (``pip download --platform``, binary
    wheels only: nothing is compiled under emulation, and a dependency without such a wheel is an
    error)."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _run(step, [*pip, "wheel", "--no-deps", "--wheel-dir", str(wheels), *pins], 900, cwd=cwd)
    if arch == NATIVE:
        return
    native = {canonicalize_name(w.name.split("-")[0]): w for w in wheels.glob("*.whl")}
    native = {name: w for name, w in native.items() if not w.name.endswith("-none-any.whl")}
    binary = [p for p in pins if canonicalize_name(Requirement(p).name) in native]
    if not binary:
        return
    for w in native.values():
        w.unlink()
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    argv = [
        *pip,
        "download",
        "--no-deps",
        "--only-binary=:all:",
        f"--python-version={python}",
        "--implementation=cp",
        f"--abi=cp{python.replace('.', '')}",
        *(f"--platform={tag}" for tag in WHEEL_PLATFORMS[arch]),
        "--dest",
        str(wheels),
        *binary,
    ]
    _run(f"{step}: PyPI's {arch} wheels of {', '.join(binary)}", argv, 900, cwd=cwd)


def build_program(
    repo: Path, program: Program, base: str, *, force: bool = False, arch: str = NATIVE
) -> BuiltImage:
    """One image, from the cache when its inputs did not change. The dependencies are pinned to
    this virtualenv's versions: for this checkout, its installed metadata (which must match its
    pyproject.toml); for another (an older release), the dependencies ITS pyproject.toml
    declares, which the virtualenv must hold too (the dev extras keep those the tree dropped).
    ``arch``: the image's architecture (``base`` must be that architecture's)."""
    t0 = time.monotonic()
    if installed_from(repo, program):
        check_installed(repo, program)
        pins = pinned_closure(program.distribution)
    else:
        declared = tomllib.loads((repo / program.folder / "pyproject.toml").read_text())
        pins = pinned_closure(program.distribution, requirements=declared["project"]["dependencies"])
    digest = input_hash(repo, program, pins, base)
    ref = f"{program.repository}:{version_of(repo, program)}-{_arch_part(arch)}{digest[:12]}"
    archive = imagecache.cache_dir() / f"patchbay-{program.name}-{_arch_part(arch)}{digest[:12]}.oci.tar"
    if archive.is_file() and not force:
        imagecache.used(archive)
        return BuiltImage(program.name, ref, archive, built=False, seconds=time.monotonic() - t0, arch=arch)
    context = imagecache.cache_dir() / "work" / f"{program.name}-{_arch_part(arch)}{digest[:12]}"
    context.parent.mkdir(parents=True, exist_ok=True)
    # Two builds of one image at once (two checkouts' test sessions, CI's background build beside
    # a test's) share its work folder: the second waits for the first and takes its archive.
    with open(context.with_name(f"{context.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if archive.is_file() and not force:
            imagecache.used(archive)
            seconds = time.monotonic() - t0
            return BuiltImage(program.name, ref, archive, built=False, seconds=seconds, arch=arch)
        built = _build(repo, program, base, pins, context=context, ref=ref, archive=archive, arch=arch, t0=t0)
    imagecache.prune(program.name, _arch_part(arch))
    return built


def _build(
    repo: Path,
    program: Program,
    base: str,
    pins: Sequence[str],
    *,
    context: Path,
    ref: str,
    archive: Path,
    arch: str,
    t0: float,
) -> BuiltImage:
    """`build_program`'s build, its work folder locked."""
    log.info("Building %s", ref)
    shutil.rmtree(context, ignore_errors=True)
    wheels = context / "wheels"
    wheels.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    shared = shared_in(repo, pins)
    for part in (program, *shared):
        # Outside the podman build context, which holds only wheels/.
        source = copy_sources(repo / part.folder, context.with_name(f"{context.name}-src") / part.folder)
        try:
            _run(
                f"{program.name}: the wheel of {part.distribution}",
                [*pip, "wheel", "--no-deps", "--wheel-dir", str(wheels), str(source)],
                600,
                cwd=context,
            )
        finally:
            shutil.rmtree(source.parent, ignore_errors=True)
    local = {canonicalize_name(s.distribution) for s in shared}
    downloaded = [p for p in pins if canonicalize_name(Requirement(p).name) not in local]
    if downloaded:
        dependency_wheels(
            f"{program.name}: dependency wheels ({len(downloaded)} pinned)", downloaded, wheels, arch, context
        )
    log.info("  %d wheels for %s: %s", len(pins) + 1, program.distribution, ", ".join(pins))
    _run(
        f"{program.name}: podman build",
        [
            "podman",
            "build",
            "--network=none",
            "--pull=never",
            # No intermediate images: every build's context is new (its wheels), so podman's layer
            # cache never hit, and each build left its build stage behind (220-400 MB each).
            "--layers=false",
            f"--platform=linux/{arch}",
            "--build-arg",
            f"BASE_IMAGE={base}",
            "--build-arg",
            f"VERSION={version_of(repo, program)}",
            "--file",
            str(repo / program.folder / "Dockerfile"),
            "--tag",
            ref,
            str(context),
        ],
        900,
    )
    tmp = archive.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    _run(
        f"{program.name}: podman save",
        ["podman", "save", "--format", "oci-archive", "-o", str(tmp), ref],
        300,
    )
    tmp.replace(archive)
    shutil.rmtree(context, ignore_errors=True)
    seconds = time.monotonic() - t0
    log.info("  %s: %.0f MB archive in %.0fs", ref, archive.stat().st_size / 1e6, seconds)
    return BuiltImage(program.name, ref, archive, built=True, seconds=seconds, arch=arch)


def build_all(repo: Path | None = None, *, force: bool = False, arch: str = NATIVE) -> dict[str, BuiltImage]:
    """Every program's image (operator, agent) for ``arch``, built or taken from the cache."""
    root = find_repo(repo)
    for tool in ("podman", "mmdebstrap"):
        if not shutil.which(tool):
            raise ImageBuildError(f"{tool} is not installed: make setup installs it (apt-get install {tool})")
    emulation_ready(arch)
    base = base_image(arch)
    return {p.name: build_program(root, p, base, force=force, arch=arch) for p in PROGRAMS}
