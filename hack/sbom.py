"""An SPDX 2.3 SBOM (JSON) of an image's packages, read from its root filesystem: the Debian
packages of ``/var/lib/dpkg/status`` and the Python distributions of every ``*.dist-info/METADATA``
under a ``site-packages`` or ``dist-packages`` directory.

``make release`` (hack/release.py) writes one per image into ``dist/<version>/`` and, when it
pushes, attaches it to the image in the registry as a signed cosign attestation
(``cosign attest --type spdxjson``). The root filesystem is read from the image's OCI archive (the
one ``make images`` built): its layers applied in order, whiteouts (``.wh.<name>``,
``.wh..wh..opq``) honoured, only the files above kept. Pure Python, no podman or root needed.

Usage: hack/sbom.py ARCHIVE_OR_ROOTFS_DIR [--name NAME] [-o FILE]
"""

from __future__ import annotations

import argparse
import email.parser
import gzip
import hashlib
import io
import json
import os
import re
import sys
import tarfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple
from urllib.parse import quote

DPKG_STATUS = "var/lib/dpkg/status"
METADATA = re.compile(r"(^|/)(site|dist)-packages/[^/]+\.dist-info/METADATA$")
TOOL = "patchbay-sbom (hack/sbom.py)"


class Package(NamedTuple):
    kind: str  # deb | pypi
    name: str
    version: str
    arch: str = ""
    license: str = ""
    source: str = ""  # the Debian source package, where it differs

    @property
    def purl(self) -> str:
        if self.kind == "deb":
            q = [f"arch={self.arch}"] if self.arch else []
            if self.source and self.source != self.name:
                q.append(f"upstream={quote(self.source)}")
            qs = ("?" + "&".join(q)) if q else ""
            return f"pkg:deb/debian/{quote(self.name)}@{quote(self.version)}{qs}"
        return f"pkg:pypi/{quote(normalized(self.name))}@{quote(self.version)}"


def normalized(name: str) -> str:
    """PEP 503's name normalization (what purl's pypi type wants)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def dpkg_packages(status: str) -> list[Package]:
    """The installed packages of a dpkg status file (``Status: install ok installed``)."""
    out: list[Package] = []
    for stanza in re.split(r"\n\s*\n", status):
        fields: dict[str, str] = {}
        key = ""
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") and key:
                continue  # a continuation line (Description, Conffiles): not needed
            if ":" in line:
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
        if not fields.get("Package") or not fields.get("Status", "").endswith(" installed"):
            continue
        source = fields.get("Source", "").split(" ")[0]
        out.append(
            Package(
                "deb",
                fields["Package"],
                fields.get("Version", ""),
                fields.get("Architecture", ""),
                "",
                source,
            )
        )
    return sorted(out, key=lambda p: p.name)


def python_package(metadata: str) -> Package | None:
    msg = email.parser.HeaderParser().parsestr(metadata)
    name, version = msg.get("Name"), msg.get("Version")
    if not name or not version:
        return None
    lic = msg.get("License-Expression") or ""
    return Package("pypi", name, version, license=lic)


def _layers(archive: Path) -> Iterator[tarfile.TarFile]:
    """The layers of the (one) image of an OCI archive, base first, as open tar files."""
    with tarfile.open(archive) as outer:

        def blob(digest: str) -> bytes:
            f = outer.extractfile("blobs/" + digest.replace(":", "/"))
            if f is None:
                raise SystemExit(f"{archive}: no blob {digest}")
            return f.read()

        f = outer.extractfile("index.json")
        assert f is not None
        manifests = json.load(f).get("manifests") or []
        if len(manifests) != 1:
            raise SystemExit(f"{archive}: expected one image in index.json, found {len(manifests)}")
        manifest = json.loads(blob(manifests[0]["digest"]))
        for layer in manifest["layers"]:
            data = blob(layer["digest"])
            if data[:2] == b"\x1f\x8b":
                data = gzip.decompress(data)
            elif data[:4] == b"\x28\xb5\x2f\xfd":
                raise SystemExit(f"{archive}: zstd layers are not read here ({layer['digest']})")
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                yield tar


def image_created(archive: Path) -> float | None:
    """The image's creation time (its config's ``created``), so that the same image gives the
    same SBOM; None where the config has none."""
    with tarfile.open(archive) as outer:

        def blob(name: str) -> Any:
            f = outer.extractfile(name)
            assert f is not None, name
            return json.load(f)

        (entry,) = blob("index.json")["manifests"]
        manifest = blob("blobs/" + entry["digest"].replace(":", "/"))
        created = blob("blobs/" + manifest["config"]["digest"].replace(":", "/")).get("created")
    if not created:
        return None
    whole, _, rest = created.rstrip("Z").partition(".")  # RFC 3339; nanoseconds are dropped
    offset = rest.lstrip("0123456789") or "+00:00"
    return datetime.fromisoformat(whole + offset).timestamp()


def wanted(path: str) -> bool:
    return path == DPKG_STATUS or bool(METADATA.search(path))


def files_of_archive(archive: Path) -> dict[str, str]:
    """The wanted files of the image's final root filesystem: ``{path: text}``."""
    files: dict[str, str] = {}
    for tar in _layers(archive):
        for m in tar:
            path = str(PurePosixPath("/", m.name)).lstrip("/")
            head, _, base = path.rpartition("/")
            if base == ".wh..wh..opq":  # opaque directory: what lower layers had under it is gone
                files = {k: v for k, v in files.items() if not k.startswith(head + "/")}
                continue
            if base.startswith(".wh."):
                gone = f"{head}/{base[4:]}" if head else base[4:]
                files = {k: v for k, v in files.items() if k != gone and not k.startswith(gone + "/")}
                continue
            if m.isfile() and wanted(path):
                f = tar.extractfile(m)
                assert f is not None
                files[path] = f.read().decode("utf-8", "replace")
            elif path in files:  # replaced by something that is not a regular file
                del files[path]
    return files


def files_of_dir(root: Path) -> dict[str, str]:
    files: dict[str, str] = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            rel = (Path(dirpath) / n).relative_to(root).as_posix()
            if wanted(rel):
                files[rel] = (root / rel).read_text(encoding="utf-8", errors="replace")
    return files


def packages(files: dict[str, str]) -> list[Package]:
    debs = dpkg_packages(files.get(DPKG_STATUS, ""))
    py = [p for path, text in sorted(files.items()) if path != DPKG_STATUS if (p := python_package(text))]
    return debs + sorted(py, key=lambda p: normalized(p.name))


def spdx_id(pkg: Package) -> str:
    raw = f"{pkg.kind}-{pkg.name}-{pkg.version}-{pkg.arch}"
    return "SPDXRef-Package-" + re.sub(r"[^A-Za-z0-9.-]", "-", raw)


def document(name: str, pkgs: list[Package], namespace_seed: str, created: float | None = None) -> dict:
    """The SPDX 2.3 document: the image as the described package, CONTAINS each package."""
    when = created if created is not None else float(os.environ.get("SOURCE_DATE_EPOCH") or time.time())
    digest = hashlib.sha256((namespace_seed + "\n" + "\n".join(p.purl for p in pkgs)).encode()).hexdigest()
    root = "SPDXRef-Image"
    spdx_pkgs: list[dict] = [
        {
            "name": name,
            "SPDXID": root,
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": False,
            "primaryPackagePurpose": "CONTAINER",
        }
    ]
    seen: set[str] = {root}
    rels = [
        {"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES", "relatedSpdxElement": root}
    ]
    for p in pkgs:
        sid = spdx_id(p)
        if sid in seen:
            continue
        seen.add(sid)
        entry: dict = {
            "name": p.name,
            "SPDXID": sid,
            "versionInfo": p.version,
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": False,
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": p.license or "NOASSERTION",
            "copyrightText": "NOASSERTION",
            "externalRefs": [
                {"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": p.purl}
            ],
        }
        if p.kind == "deb" and p.source and p.source != p.name:
            entry["sourceInfo"] = f"built from the Debian source package {p.source}"
        spdx_pkgs.append(entry)
        rels.append({"spdxElementId": root, "relationshipType": "CONTAINS", "relatedSpdxElement": sid})
    return {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": name,
        "documentNamespace": f"https://kube-patchbay.dev/spdx/{quote(name, safe='')}-{digest[:16]}",
        "creationInfo": {
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)),
            "creators": [f"Tool: {TOOL}"],
        },
        "packages": spdx_pkgs,
        "relationships": rels,
    }


def sbom(source: Path, name: str, created: float | None = None) -> dict:
    """The SBOM of an OCI archive (a file) or of an unpacked root filesystem (a directory)."""
    files = files_of_dir(source) if source.is_dir() else files_of_archive(source)
    if DPKG_STATUS not in files:
        raise SystemExit(f"{source}: no /{DPKG_STATUS}: not a Debian-based root filesystem")
    if created is None and not source.is_dir() and not os.environ.get("SOURCE_DATE_EPOCH"):
        created = image_created(source)
    return document(name, packages(files), name, created)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="an OCI archive of one image, or a root filesystem")
    parser.add_argument("--name", default="", help="the image's name in the SBOM (default: the source's)")
    parser.add_argument("-o", "--output", type=Path, default=None)
    args = parser.parse_args(argv)
    doc = sbom(args.source, args.name or args.source.name)
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
