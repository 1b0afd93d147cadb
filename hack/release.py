"""`make release`: this checkout's release, in ONE directory, ``dist/<version>/``.

- ``patchbay-<version>.tgz``: the Helm chart, as ``helm package`` makes it (what the e2e suite
  installs too);
- ``patchbay-operator-<version>.oci.tar``, ``patchbay-agent-<version>.oci.tar``: the images as OCI
  archives, each naming its image ``ghcr.io/kube-patchbay/patchbay-<program>:<version>``, the
  reference the chart's defaults use, so importing them into a node's containerd is all a cluster
  without a registry needs (docs/install.md). They are the images ``make images`` builds (cached
  by content: the same inputs give the same image, tagged ``<version>-<content hash>`` locally);
  only the name in the archive's index differs. With more than one platform (``--platforms``,
  default linux/amd64 and linux/arm64) the archive's one entry is an OCI image index listing each
  platform's image, so a node takes its own architecture's;
- ``patchbay-<program>-<version>.spdx.json``: each image's SBOM (SPDX 2.3 JSON, hack/sbom.py; the
  packages of every platform's image, each Debian package with its ``arch=``);
- ``SHA256SUMS``: the sha256 of every file above, in ``sha256sum --check`` format.

With ``--registry HOST/PATH`` (``make release REGISTRY=...``) the release is also pushed, as a user
fetches it: the images as ``HOST/PATH/patchbay-<program>:<version>`` (``podman push``; with more than one
platform, one image index under that reference, ``podman manifest push --all``) and the
chart to ``oci://HOST/PATH/charts`` (``helm push``); the digests are printed and written to
``dist/<version>.pushed.json`` (beside the directory, not in it: SHA256SUMS covers the directory).
Credentials are the user's own logins (``podman login``, ``helm registry login``); ``--ca-file``
names a private CA.

A pushed release is signed (``cosign``, built by hack/cosign-binary.sh) with the project's release
key: ``--cosign-key`` / ``$COSIGN_KEY`` (a cosign private key file, or any reference cosign takes:
``env://``, a KMS URI; its password in ``$COSIGN_PASSWORD``). Each image is signed BY DIGEST and
gets its SBOM (``patchbay-<program>-<version>.spdx.json``, SPDX 2.3, hack/sbom.py: its Debian and
Python packages; written into the directory for every release) as a signed attestation
(``cosign attest --type spdxjson``); the chart's OCI manifest is signed by digest too. The
signatures go to the registry beside the images (no transparency log: the release key's public
half, ``keys/patchbay-release.pub``, is what users verify with; docs/install.md). ``--unsigned``
pushes without signing (a registry of your own, a test).

The version is the ``VERSION`` file's; the generated files must be up to date (``make verify``).
Progress is printed step by step; a failure names the step.
"""

from __future__ import annotations

import argparse
import getpass
import hashlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, TypeVar

if TYPE_CHECKING:
    from patchbay_devcluster.imagebuild import BuiltImage

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")

#: Annotations of an OCI index entry that name the image: containerd's full name (`ctr images
#: import`, `kind load image-archive`, k3s's agent/images all read it), and the OCI tag.
CONTAINERD_NAME = "io.containerd.image.name"
OCI_REF_NAME = "org.opencontainers.image.ref.name"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"


def _archive_image(archive: Path) -> tuple[dict[str, object], str]:
    """The one image of an OCI archive: its index entry (mediaType, digest, size) and its
    config's architecture."""
    with tarfile.open(archive) as tar:

        def blob(name: str) -> dict[str, object]:
            f = tar.extractfile(name)
            if f is None:
                raise SystemExit(f"{archive}: no {name}")
            loaded: dict[str, object] = json.load(f)
            return loaded

        entries = blob("index.json").get("manifests")
        if not isinstance(entries, list) or len(entries) != 1:
            raise SystemExit(f"{archive}: expected one image in the archive's index.json")
        entry = entries[0]
        manifest = blob("blobs/" + str(entry["digest"]).replace(":", "/"))
        config = manifest["config"]
        assert isinstance(config, dict)
        arch = str(blob("blobs/" + str(config["digest"]).replace(":", "/")).get("architecture"))
    return {k: entry[k] for k in ("mediaType", "digest", "size")}, arch


def index_archive(sources: Mapping[str, Path], target: Path, ref: str) -> str:
    """One OCI archive at ``target`` holding every image of ``sources`` (``{arch: archive}``, one
    image each) behind ONE image index, named ``ref`` (repository:tag): the blobs are copied as
    they are. Each image's platform is its config's architecture, which must be the one it is
    given as (an amd64 image passed as arm64 is refused). Returns the index's digest."""
    descriptors = []
    for arch, source in sorted(sources.items()):
        entry, actual = _archive_image(source)
        if actual != arch:
            raise SystemExit(f"{source}: its image is {actual}, given as the {arch} image of {ref}")
        descriptors.append({**entry, "platform": {"architecture": arch, "os": "linux"}})
    index = json.dumps(
        {"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": descriptors}, sort_keys=True
    ).encode()
    digest = "sha256:" + hashlib.sha256(index).hexdigest()
    top = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": INDEX_MEDIA_TYPE,
                "digest": digest,
                "size": len(index),
                "annotations": {CONTAINERD_NAME: ref, OCI_REF_NAME: ref.rsplit(":", 1)[1]},
            }
        ],
    }
    tmp = target.with_suffix(".tmp")
    seen: set[str] = set()

    def add(out: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o644
        out.addfile(info, io.BytesIO(data))

    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as out:
        add(out, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        add(out, "index.json", json.dumps(top, sort_keys=True).encode())
        add(out, "blobs/" + digest.replace(":", "/"), index)
        seen.add(digest.replace(":", "/"))
        for source in sources.values():
            with tarfile.open(source) as src:
                for member in src:
                    name = member.name.lstrip("./")
                    if not name.startswith("blobs/") or not member.isfile() or name[6:] in seen:
                        continue
                    seen.add(name[6:])
                    member.name = name
                    out.addfile(member, src.extractfile(member))
    tmp.replace(target)
    return digest


def renamed_archive(source: Path, target: Path, ref: str) -> None:
    """Copy the OCI archive ``source`` to ``target`` with its image named ``ref`` (repository:tag):
    the blobs are copied as they are, only index.json changes."""
    tmp = target.with_suffix(".tmp")
    with tarfile.open(source) as src, tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as out:
        for member in src:
            if member.name.lstrip("./") == "index.json":
                f = src.extractfile(member)
                assert f is not None
                index = json.load(f)
                if len(index.get("manifests") or []) != 1:
                    raise SystemExit(f"{source}: expected one image in the archive's index.json")
                annotations = index["manifests"][0].setdefault("annotations", {})
                annotations[CONTAINERD_NAME] = ref
                annotations[OCI_REF_NAME] = ref.rsplit(":", 1)[1]
                data = json.dumps(index, sort_keys=True).encode()
                member.size = len(data)
                out.addfile(member, io.BytesIO(data))
            elif member.isfile():
                out.addfile(member, src.extractfile(member))
            else:
                out.addfile(member)
    tmp.replace(target)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def step(n: int, total: int, what: str, run: Callable[[], T]) -> T:
    print(f"==> [{n}/{total}] {what}", flush=True)
    t0 = time.monotonic()
    result = run()
    print(f"    done in {time.monotonic() - t0:.1f}s", flush=True)
    return result


def helm_binary() -> Path:
    """The pinned helm: in $PATCHBAY_KUBE_BIN (the Makefile sets it), else the build script's answer."""
    env = os.environ.get("PATCHBAY_KUBE_BIN")
    if env:
        return Path(env) / "helm"
    out = subprocess.run(
        [str(REPO / "hack" / "kube-binaries.sh"), "--print-bin-dir"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip()) / "helm"


def cosign_binary() -> Path:
    """The pinned cosign: ``$PATCHBAY_COSIGN_BIN``, else where hack/cosign-binary.sh builds it."""
    env = os.environ.get("PATCHBAY_COSIGN_BIN")
    if env:
        return Path(env)
    out = subprocess.run(
        [str(REPO / "hack" / "cosign-binary.sh"), "--print"], capture_output=True, text=True, check=True
    )
    path = Path(out.stdout.strip())
    if not path.is_file():
        raise SystemExit(
            f"cosign is not built ({path} is missing): run `make setup` (or hack/cosign-binary.sh)"
        )
    return path


def cosign(
    args: list[str], ca_file: Path | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``cosign <args>``; ``ca_file``: the registry's private CA (``--registry-cacert``). With
    ``check``, a failure raises SystemExit with cosign's own words."""
    cmd, rest = args[0], args[1:]
    ca = ["--registry-cacert", str(ca_file)] if ca_file is not None else []
    res = subprocess.run(
        [str(cosign_binary()), cmd, *ca, *rest],
        capture_output=True,
        text=True,
        check=False,
    )
    if check and res.returncode != 0:
        raise SystemExit(f"cosign {cmd} failed ({res.returncode}): {(res.stderr or res.stdout).strip()}")
    return res


#: What cosign is given to sign with a key and no Sigstore service: a signing config naming no
#: service (no transparency log, no timestamp authority) and a trusted root naming none (nothing
#: fetched from Sigstore's TUF repository). The signatures go to the registry beside the images.
SIGNING_CONFIG = {"mediaType": "application/vnd.dev.sigstore.signingconfig.v0.2+json"}
TRUSTED_ROOT = {"mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1"}


def offline_flags(directory: Path) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    config, root = directory / "signing-config.json", directory / "trusted-root.json"
    config.write_text(json.dumps(SIGNING_CONFIG))
    root.write_text(json.dumps(TRUSTED_ROOT))
    return ["--signing-config", str(config), "--trusted-root", str(root), "--yes"]


class Signing(NamedTuple):
    """How a pushed release is signed: cosign's ``--key`` (a file, ``env://VAR``, a KMS URI; the
    password in ``$COSIGN_PASSWORD``) and each image's SBOM file, attested by the same key."""

    key: str
    sboms: Mapping[str, Path]


def sign(
    reference: str, signing: Signing, ca_file: Path | None, offline: list[str], sbom: Path | None = None
) -> None:
    """Sign ``reference`` (``repository@sha256:...``) and, given one, attest its SBOM."""
    cosign(["sign", "--key", signing.key, *offline, reference], ca_file)
    if sbom is not None:
        args = ["attest", "--key", signing.key, "--type", "spdxjson", "--predicate", str(sbom)]
        cosign([*args, *offline, reference], ca_file)


def write_sboms(
    images: Mapping[str, BuiltImage],
    version: str,
    out: Path,
    others: Mapping[str, Sequence[BuiltImage]] | None = None,
) -> dict[str, Path]:
    """``out/patchbay-<program>-<version>.spdx.json`` for each image: its Debian and Python
    packages, read from its archive (hack/sbom.py); with ``others`` (each program's images of
    the other platforms), the packages of all of them in one document (a Debian package once
    per architecture, a pure-Python one once)."""
    sys.path.insert(0, str(REPO / "hack"))
    import sbom

    paths: dict[str, Path] = {}
    for program, image in images.items():
        name = f"{image.repository}:{version}"
        more = (others or {}).get(program) or ()
        if more:
            pkgs = [p for i in (image, *more) for p in sbom.packages(sbom.files_of_archive(i.archive))]
            doc = sbom.document(name, pkgs, name, sbom.image_created(image.archive))
        else:
            doc = sbom.sbom(image.archive, name)
        target = out / f"patchbay-{program}-{version}.spdx.json"
        target.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        paths[program] = target
    return paths


def push_index(target: str, images: Sequence[BuiltImage], digestfile: Path, cert: list[str]) -> None:
    """Push ``images`` (one per platform, from their OCI archives) as ONE image index under
    ``target`` (``podman manifest``: a local list made, pushed with every image, removed)."""
    listed = f"localhost/patchbay-release-index-{os.getpid()}:{target.rsplit(':', 1)[1]}"

    def podman(*args: str) -> None:
        res = subprocess.run(["podman", *args], capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise SystemExit(f"podman {' '.join(args[:2])} failed: {(res.stderr or res.stdout).strip()}")

    podman("manifest", "create", listed)
    try:
        for image in images:
            platform = ["--arch", image.arch, "--os", "linux"]
            podman("manifest", "add", *platform, listed, f"oci-archive:{image.archive}")
        push = ["--all", "--quiet", "--format", "oci", *cert, "--digestfile", str(digestfile)]
        podman("manifest", "push", *push, listed, f"docker://{target}")
    finally:
        subprocess.run(["podman", "manifest", "rm", listed], capture_output=True, check=False)


def push_release(
    registry: str,
    version: str,
    images: Mapping[str, BuiltImage],
    chart: Path,
    ca_file: Path | None = None,
    *,
    signing: Signing | None = None,
    others: Mapping[str, Sequence[BuiltImage]] | None = None,
) -> dict[str, str]:
    """Push the images and the chart to ``registry`` (``HOST[:PORT]/PATH``), and with ``signing``
    sign each by digest (the images' SBOMs attested); returns ``{reference: digest}`` for each (the
    chart's as ``oci://...:<version>``). ``others``: each program's images of the other platforms;
    a program with any is pushed as ONE image index of all its platforms (its digest the index's,
    which is what is signed and attested)."""
    pushed: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cert: list[str] = []
        helm_ca: list[str] = []
        if ca_file is not None:
            shutil.copyfile(ca_file, Path(tmp) / "ca.crt")  # podman: every *.crt of --cert-dir is a CA
            cert, helm_ca = ["--cert-dir", tmp], ["--ca-file", str(ca_file)]
        offline = offline_flags(Path(tmp) / "cosign") if signing is not None else []
        for program, image in images.items():
            target = f"{registry}/patchbay-{program}:{version}"
            digestfile = Path(tmp) / f"{program}.digest"
            more = (others or {}).get(program) or ()
            if more:
                push_index(target, [image, *more], digestfile, cert)
            else:
                argv = ["podman", "push", "--quiet", *cert, "--digestfile", str(digestfile), image.ref]
                subprocess.run([*argv, f"docker://{target}"], check=True, capture_output=True, text=True)
            pushed[target] = digest = digestfile.read_text().strip()
            if signing is not None:
                sbom = signing.sboms.get(program)
                sign(f"{registry}/patchbay-{program}@{digest}", signing, ca_file, offline, sbom)
        res = subprocess.run(
            [str(helm_binary()), "push", str(chart), f"oci://{registry}/charts", *helm_ca],
            check=True,
            capture_output=True,
            text=True,
        )
        digest = next(
            (ln.split()[-1] for ln in (res.stdout + res.stderr).splitlines() if ln.startswith("Digest:")), ""
        )
        pushed[f"oci://{registry}/charts/patchbay:{version}"] = digest
        if signing is not None:
            sign(f"{registry}/charts/patchbay@{digest}", signing, ca_file, offline)
    return pushed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dist", type=Path, default=REPO / "dist", help="where dist/<version>/ goes")
    parser.add_argument("--registry", default="", help="also push the images and the chart to HOST/PATH")
    parser.add_argument(
        "--ca-file", type=Path, default=None, help="the registry's CA, if it is not a public one"
    )
    parser.add_argument(
        "--cosign-key",
        default=os.environ.get("COSIGN_KEY", ""),
        help="the release key that signs what is pushed (cosign --key; default $COSIGN_KEY)",
    )
    parser.add_argument("--unsigned", action="store_true", help="push without signing")
    parser.add_argument(
        "--platforms",
        default="linux/amd64,linux/arm64",
        help="the images' platforms, comma-separated (default: %(default)s; arm64 is built under "
        "qemu-user emulation, hack/arm64-emulation.sh)",
    )
    args = parser.parse_args(argv)
    arches = [p.strip().removeprefix("linux/") for p in args.platforms.split(",") if p.strip()]
    if args.registry and not (args.cosign_key or args.unsigned):
        parser.error("pushing needs the release key: --cosign-key/COSIGN_KEY=..., or --unsigned")
    logging.basicConfig(level=logging.INFO, format="    %(message)s")

    sys.path.insert(0, str(REPO / "hack"))
    import generate

    from patchbay_devcluster.imagebuild import ARCHITECTURES, NATIVE, build_all
    from patchbay_devcluster.install import package_chart

    if NATIVE not in arches or set(arches) - set(ARCHITECTURES) or len(set(arches)) != len(arches):
        parser.error(f"--platforms: linux/{NATIVE} and any of {', '.join(ARCHITECTURES)}, each once")
    version, _ = generate.release_version()
    out: Path = Path(args.dist) / version
    total = 6
    print(f"Patchbay {version} -> {out}", flush=True)
    if step(1, total, "generated files up to date (make verify)", lambda: generate.main("check")) != 0:
        return 1
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if dirty:
        print("    note: the working tree has uncommitted changes; they are in this release", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)

    chart = step(
        2,
        total,
        "helm package charts/patchbay",
        lambda: package_chart(helm_binary(), REPO / "charts" / "patchbay", out),
    )
    print(f"    {chart.name}", flush=True)

    def build() -> tuple[dict[str, BuiltImage], dict[str, list[BuiltImage]]]:
        native = build_all(REPO)
        others: dict[str, list[BuiltImage]] = {program: [] for program in native}
        for arch in arches:
            if arch != NATIVE:
                for program, image in build_all(REPO, arch=arch).items():
                    others[program].append(image)
        return native, others

    what = "images for " + ", ".join(f"linux/{a}" for a in arches)
    images, others = step(3, total, f"{what} (podman; cached by content, minutes when built)", build)

    def archives() -> list[Path]:
        paths = []
        for program, image in images.items():
            ref = f"{image.repository}:{version}"
            target = out / f"patchbay-{program}-{version}.oci.tar"
            built_as = ", ".join(i.ref for i in (image, *others[program]))
            if others[program]:
                platforms = {i.arch: i.archive for i in (image, *others[program])}
                digest = index_archive(platforms, target, ref)
                built_as = f"an image index {digest[:19]} of {built_as}"
            else:
                renamed_archive(image.archive, target, ref)
            print(
                f"    {target.name}: {ref} ({built_as}), {target.stat().st_size / 1e6:.0f} MB",
                flush=True,
            )
            paths.append(target)
        return paths

    step(4, total, "image archives named for the chart's defaults", archives)

    def checksums() -> Path:
        files = sorted(p for p in out.iterdir() if p.is_file() and p.name != "SHA256SUMS")
        sums = out / "SHA256SUMS"
        sums.write_text("".join(f"{sha256(p)}  {p.name}\n" for p in files))
        return sums

    sboms = step(
        5,
        total,
        "SBOMs (SPDX 2.3: the Debian and Python packages)",
        lambda: write_sboms(images, version, out, others),
    )
    for path in sboms.values():
        print(f"    {path.name}", flush=True)
    sums = step(6, total, "SHA256SUMS", checksums)
    print(f"Release {version} in {out}:", flush=True)
    for line in sums.read_text().splitlines():
        print(f"    {line}", flush=True)
    print(f"Check with: (cd {out} && sha256sum --check SHA256SUMS); install: docs/install.md", flush=True)
    if args.registry:
        signing = None if args.unsigned else Signing(args.cosign_key, sboms)
        if signing is not None and Path(signing.key).is_file() and "COSIGN_PASSWORD" not in os.environ:
            # cosign's own prompt would be hidden (its output is captured): asked here, once.
            os.environ["COSIGN_PASSWORD"] = getpass.getpass(f"Password of {signing.key}: ")
        pushed = push_release(
            args.registry, version, images, chart, args.ca_file, signing=signing, others=others
        )
        (out.parent / f"{version}.pushed.json").write_text(json.dumps(pushed, indent=2) + "\n")
        what = "unsigned" if signing is None else "each signed by digest, the SBOMs attested"
        print(f"Pushed to {args.registry} ({what}):", flush=True)
        for ref, digest in pushed.items():
            print(f"    {ref}  {digest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
