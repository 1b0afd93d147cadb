#!/usr/bin/env python3
"""What `make setup` checks first, before it installs or builds anything: a python3 new enough for
the virtualenv, root, and cgroups the real node can run on (v1 or v2, with a memory controller).
The first problem found stops setup with one line that says what to do; none prints one line of
what was found.

The machine's own python3 runs this, before the virtualenv exists (Python 3.7 syntax suffices to
report an old Python), and it decides about cgroups with the real node's own module,
devcluster/patchbay_devcluster/cgroups.py, loaded by path: that module needs only the standard
library, and the package's __init__ needs the virtualenv. The Debian packages (python3-venv among
them) are hack/host-packages.sh's, the Go toolchain hack/kube-binaries.sh's.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
CGROUPS = REPO / "devcluster" / "patchbay_devcluster" / "cgroups.py"
MIN_PYTHON = (3, 11)


def problem(python: tuple[int, int, int], euid: int, cgroups: str | None) -> str | None:
    """The first thing that stops setup, as one line that says what to do; None when none does.

    ``cgroups`` is the real node's own verdict on the host's cgroups (None: it can run).
    """
    if python[:2] < MIN_PYTHON:
        have = ".".join(map(str, python))
        want = ".".join(map(str, MIN_PYTHON))
        return f"python3 is {have}; Patchbay needs Python {want} or newer as python3 (Debian 12's is 3.11)"
    if euid != 0:
        return (
            "make setup needs root: it installs Debian packages, and the real node's containerd and "
            "kubelet manage cgroups, mounts and a bridge; run it as root (sudo make setup)"
        )
    if cgroups is not None:
        return f"the real node cannot run here: {cgroups}"
    return None


def load_cgroups() -> ModuleType:
    spec = importlib.util.spec_from_file_location("patchbay_host_cgroups", CGROUPS)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def main() -> int:
    python = (sys.version_info[0], sys.version_info[1], sys.version_info[2])
    # The cgroups module needs 3.7+; an older python3 is reported before it is loaded.
    host = load_cgroups().host_cgroups() if python[:2] >= MIN_PYTHON else None
    found = problem(python, os.geteuid(), host.problem() if host is not None else None)
    if found is not None:
        print(f"[host-check] {found}", file=sys.stderr)
        return 1
    assert host is not None
    print(f"[host-check] python3 {'.'.join(map(str, python))}, root, {host.describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
