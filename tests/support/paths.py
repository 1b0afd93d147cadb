"""Short temporary directories for tests that make Unix sockets.

A socket's path must stay under 108 bytes (sockaddr_un), and pytest's ``tmp_path``
(``/tmp/pytest-of-<user>/pytest-<n>/<test name>0/``) leaves too little room for a socket named
after an extended resource, so these live directly under /tmp with a short random name.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def short_dir(prefix: str = "pb") -> Iterator[Path]:
    """A fresh directory ``/tmp/<prefix><random>``, removed with everything in it afterwards."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
