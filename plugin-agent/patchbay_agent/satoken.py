"""The pod's service-account token: read again when the kubelet rotates it, and what it says about
the node.

A pod-bound (projected) service-account token expires; the kubelet writes a fresh one into the
same file well before that (atomically: the file name is a symlink it re-points). A client that
read the token once at start would be refused after the first expiry, so `TokenFile.read()`
compares the file's identity (inode, mtime, size) before every request and reads it again when it
changed. It costs one stat() per API write.

The payload of a pod-bound token names the node its pod runs on:
`{"kubernetes.io": {"node": {"name": ..., "uid": ...}, "pod": {...}, ...}}`. The agent learns its
Node's UID (the DeviceReport's owner) from there without an API call and without permission to
read nodes. It decodes the payload only and checks no signature: the token is its own, issued to
it by the API server, and a forged one would gain it nothing but a wrong owner reference.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from pathlib import Path
from typing import Any


class TokenFile:
    """A token file, read again whenever it changed on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._identity: tuple[int, int, int] | None = None
        self._token = ""
        #: how many times the file was (re)read
        self.reads = 0

    def read(self) -> str:
        """The current token (stripped); OSError when the file cannot be read."""
        st = os.stat(self.path)
        identity = (st.st_ino, st.st_mtime_ns, st.st_size)
        if identity != self._identity:
            self._token = self.path.read_text().strip()
            self._identity = identity
            self.reads += 1
        return self._token


def jwt_claims(token: str) -> dict[str, Any]:
    """The payload of a JWT (header.payload.signature), decoded, NOT verified. ValueError when the
    token is not a JWT or its payload is not a JSON object."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise ValueError("not a JWT: expected three dot-separated parts")
    payload = parts[1]
    try:
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        claims = json.loads(raw)
    except (binascii.Error, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not a JWT: payload does not decode ({e})") from None
    if not isinstance(claims, dict):
        raise ValueError("not a JWT: payload is not a JSON object")
    return claims


def node_identity(claims: dict[str, Any]) -> tuple[str, str] | None:
    """(node name, node UID) from a pod-bound token's claims; None when it names no node."""
    k8s = claims.get("kubernetes.io")
    node = k8s.get("node") if isinstance(k8s, dict) else None
    if not isinstance(node, dict):
        return None
    name, uid = node.get("name"), node.get("uid")
    if isinstance(name, str) and isinstance(uid, str) and name and uid:
        return name, uid
    return None
