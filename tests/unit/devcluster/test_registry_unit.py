"""The dev cluster's OCI registry, without running it: its configuration, containerd's hosts file,
the htpasswd line, and the chart values that take images by digest."""

from __future__ import annotations

import ctypes
import ctypes.util
import io
import json
import tarfile
from pathlib import Path

import pytest

from patchbay_devcluster import registry as oci
from patchbay_devcluster.install import Published, chart_file, registry_values, takes_digest

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "patchbay"
DIGEST = "sha256:" + "0" * 64


def _registry(credentials: oci.Credentials | None = None) -> oci.Registry:
    return oci.Registry("registry", 5123, Path("/state/pki/ca.crt"), Path("/state/certs.d"), credentials)


def test_config_listens_on_loopback_with_tls_and_auth_only_when_asked() -> None:
    plain = oci.config(Path("/s/storage"), 5123, Path("/p/r.crt"), Path("/p/r.key"))
    assert plain["http"]["addr"] == "127.0.0.1:5123"
    assert plain["http"]["tls"] == {"certificate": "/p/r.crt", "key": "/p/r.key"}
    assert plain["storage"]["filesystem"] == {"rootdirectory": "/s/storage"}
    assert "auth" not in plain
    auth = oci.config(Path("/s"), 5123, Path("/c"), Path("/k"), htpasswd=Path("/s/htpasswd"))
    assert auth["auth"]["htpasswd"]["path"] == "/s/htpasswd"


def test_hosts_file_names_the_registry_and_the_cluster_ca() -> None:
    text = oci.hosts_toml(_registry())
    assert text.splitlines()[0] == 'server = "https://127.0.0.1:5123"'
    assert '[host."https://127.0.0.1:5123"]' in text
    assert 'ca = "/state/pki/ca.crt"' in text
    assert 'capabilities = ["pull", "resolve"]' in text


def test_htpasswd_line_is_a_bcrypt_hash_of_the_password() -> None:
    line = oci.htpasswd_line(oci.Credentials("patchbay", "s3cret"))
    user, hashed = line.rstrip("\n").split(":", 1)
    assert user == "patchbay" and hashed.startswith("$2b$10$"), line
    lib = ctypes.CDLL(ctypes.util.find_library("crypt"))
    lib.crypt.restype = ctypes.c_char_p
    lib.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    assert lib.crypt(b"s3cret", hashed.encode()) == hashed.encode()
    assert lib.crypt(b"wrong", hashed.encode()) != hashed.encode()


def test_pull_secret_content_is_a_docker_config_for_the_registry() -> None:
    creds = oci.Credentials("u", "p")
    doc = creds.docker_config(_registry(creds).host)
    assert doc == {"auths": {"127.0.0.1:5123": {"username": "u", "password": "p", "auth": "dTpw"}}}


def test_records_round_trip(tmp_path: Path) -> None:
    reg = _registry(oci.Credentials("u", "p"))
    oci.save_record(tmp_path / "r.json", reg)
    assert oci.load_record(tmp_path / "r.json") == reg
    assert oci.load_record(tmp_path / "missing.json") is None


def test_values_take_images_by_digest() -> None:
    reg = _registry()
    published = {
        p: Published(p, reg.repository(p), "0.2.0-abc", DIGEST.replace("0", str(i)))
        for i, p in enumerate(("operator", "agent"), start=1)
    }
    values = registry_values(published)
    assert values == {
        "image": {
            "repository": "127.0.0.1:5123/kube-patchbay/patchbay-operator",
            "digest": "sha256:" + "1" * 64,
        },
        "agent": {"image": "127.0.0.1:5123/kube-patchbay/patchbay-agent@sha256:" + "2" * 64},
    }
    older = registry_values(published, digest_key=False)
    assert older["image"]["tag"] == "0.2.0-abc@sha256:" + "1" * 64 and "digest" not in older["image"]


def _archive(tmp_path: Path, schema: dict[str, object] | None) -> Path:
    path = tmp_path / "patchbay-0.1.0.tgz"
    with tarfile.open(path, "w:gz") as tar:
        files = {"patchbay/Chart.yaml": b"name: patchbay\nversion: 0.1.0\n"}
        if schema is not None:
            files["patchbay/values.schema.json"] = json.dumps(schema).encode()
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (None, False),
        ({"properties": {"image": {"properties": {"tag": {}}}}}, False),
        ({"properties": {"image": {"properties": {"tag": {}, "digest": {}}}}}, True),
    ],
)
def test_which_charts_take_image_digest(
    tmp_path: Path, schema: dict[str, object] | None, expected: bool
) -> None:
    archive = _archive(tmp_path, schema)
    assert takes_digest(archive) is expected
    assert "version: 0.1.0" in (chart_file(archive, "Chart.yaml") or "")


def test_this_chart_takes_image_digest() -> None:
    assert takes_digest(CHART)


@pytest.mark.parametrize(
    ("raw", "default", "on"),
    [
        (None, False, False),  # the suite: off unless asked
        (None, True, True),  # make demo: on unless told not to
        ("", True, True),
        ("1", False, True),
        ("yes", False, True),
        ("0", True, False),
        ("false", True, False),
        (" No ", True, False),
    ],
)
def test_patchbay_registry_turns_the_registry_on_or_off_over_each_default(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, default: bool, on: bool
) -> None:
    if raw is None:
        monkeypatch.delenv(oci.ENABLE_ENV, raising=False)
    else:
        monkeypatch.setenv(oci.ENABLE_ENV, raw)
    assert oci.enabled(default=default) is on
