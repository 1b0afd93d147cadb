"""binary_provenance: a peer given by path is named in the record by its hash and build info."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from patchbay_bench.peers import binary_provenance


def test_a_go_binary_is_named_by_its_hash_release_and_module() -> None:
    # The go command is itself a Go binary with build info (the suite needs Go anyway: its peers).
    go = shutil.which("go")
    assert go is not None, "the suite needs Go on PATH (it builds its Go peers)"
    real = Path(go).resolve()
    said = binary_provenance(real)
    assert f"sha256 {hashlib.sha256(real.read_bytes()).hexdigest()}" in said
    assert "; go1." in said and "path cmd/go" in said


def test_a_file_that_is_not_a_go_binary_is_still_named_by_its_hash(tmp_path: Path) -> None:
    peer = tmp_path / "peer"
    peer.write_bytes(b"#!/bin/sh\nexit 0\n")
    said = binary_provenance(peer)
    digest = hashlib.sha256(peer.read_bytes()).hexdigest()
    assert said == f"{peer}: sha256 {digest} (not a Go binary, or no build info)"
