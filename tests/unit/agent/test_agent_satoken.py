"""The service-account token: its claims (a fake, unsigned JWT built here) and re-reading it when
the kubelet rotates it."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest

from patchbay_agent.satoken import TokenFile, jwt_claims, node_identity


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def fake_jwt(claims: dict[str, Any]) -> str:
    """header.payload.signature, base64url without padding; the signature is junk (never checked)."""
    header = _b64(json.dumps({"alg": "RS256", "kid": "test"}).encode())
    return f"{header}.{_b64(json.dumps(claims).encode())}.{_b64(b'not-a-signature')}"


POD_BOUND = {
    "aud": ["https://kubernetes.default.svc"],
    "exp": 1_900_000_000,
    "iss": "https://kubernetes.default.svc",
    "sub": "system:serviceaccount:patchbay:patchbay-agent",
    "kubernetes.io": {
        "namespace": "patchbay",
        "node": {"name": "node-1", "uid": "8d0c5a3e-1111-2222-3333-444455556666"},
        "pod": {"name": "agent-x", "uid": "p-uid"},
        "serviceaccount": {"name": "patchbay-agent", "uid": "sa-uid"},
    },
}


def test_claims_of_a_pod_bound_token_name_the_node() -> None:
    claims = jwt_claims(fake_jwt(POD_BOUND))
    assert claims == POD_BOUND
    assert node_identity(claims) == ("node-1", "8d0c5a3e-1111-2222-3333-444455556666")


@pytest.mark.parametrize("length", [1, 2, 3, 4, 5])
def test_payloads_of_every_padding_length_decode(length: int) -> None:
    claims = {"x": "y" * length}
    assert jwt_claims(fake_jwt(claims) + "\n") == claims


def test_url_safe_characters_in_the_payload_decode() -> None:
    # Bytes that base64 encodes to '-' and '_' in the url-safe alphabet ('+' and '/' otherwise).
    claims = {"k": "\u00ff\u00fe>>>???"}
    token = fake_jwt(claims)
    assert "-" in token.split(".")[1] or "_" in token.split(".")[1]
    assert jwt_claims(token) == claims


def test_tokens_without_a_node_claim() -> None:
    legacy = {"iss": "kubernetes/serviceaccount", "kubernetes.io/serviceaccount/namespace": "ns"}
    assert node_identity(jwt_claims(fake_jwt(legacy))) is None
    assert node_identity({"kubernetes.io": {"node": {"name": "n"}}}) is None
    assert node_identity({"kubernetes.io": "nonsense"}) is None


@pytest.mark.parametrize(
    "token",
    ["", "abc", "a.b", "a.b.c.d", "a.!!!.c", f"a.{_b64(b'[1, 2]')}.c", f"a.{_b64(b'not json')}.c"],
)
def test_what_is_not_a_jwt_is_refused(token: str) -> None:
    with pytest.raises(ValueError, match="not a JWT"):
        jwt_claims(token)


def test_the_token_file_is_read_again_when_it_changed(tmp_path: Path) -> None:
    """What the kubelet does to a projected token: write a new file and swing a symlink to it."""
    data = tmp_path / "..data"
    first = tmp_path / "..2026_01_01"
    first.mkdir()
    (first / "token").write_text("token-1\n")
    data.symlink_to(first.name)
    (tmp_path / "token").symlink_to("..data/token")
    tokens = TokenFile(tmp_path / "token")
    assert tokens.read() == "token-1"
    assert tokens.read() == "token-1"
    assert tokens.reads == 1  # unchanged: one stat, no read

    second = tmp_path / "..2026_01_02"
    second.mkdir()
    (second / "token").write_text("token-2\n")
    tmp_link = tmp_path / "..data_tmp"
    tmp_link.symlink_to(second.name)
    os.replace(tmp_link, data)
    assert tokens.read() == "token-2"
    assert tokens.reads == 2

    # Rewritten in place with the same size: the modification time tells.
    target = second / "token"
    target.write_text("token-3\n")
    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert tokens.read() == "token-3"

    target.unlink()
    with pytest.raises(FileNotFoundError):
        tokens.read()
