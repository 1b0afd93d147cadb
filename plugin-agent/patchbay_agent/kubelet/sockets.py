"""The plugin socket's name, and removing sockets that dead agent processes left behind.

Every agent PROCESS serves its own socket, `patchbay-<resource slug>-<instance>.sock`, where the
instance is a short random token drawn at start (or `--instance`). During a DaemonSet rollout
with maxSurge the old and the new agent of one resource then run side by side, each registered
with the kubelet under its own socket path: the kubelet keeps one endpoint per socket path and
marks the resource unhealthy only when the LAST of them goes, so the node's allocatable never
drops while the old agent stops (docs/facts.md#kubelet-endpoints).

A socket path is never reused by another process: when a Register for a path the kubelet still
holds fails ("device plugin already connected"), the kubelet forgets its client for that path but
may keep the endpoint, which then blocks the path until the kubelet restarts.

The slug is the resource name with every character outside `[A-Za-z0-9_.-]` replaced by `_`
(`example.com/serial` -> `example.com_serial`), shortened with a hash when longer than
`MAX_SLUG_LENGTH`, so the whole path stays within sockaddr_un.sun_path for any resource name; it
depends on the resource name only. The instance never contains `-`, so `patchbay-<slug>-` followed
by an instance and `.sock` matches one resource's sockets and never another resource's. (The one
ambiguity is with the LEGACY name `patchbay-<slug>.sock` that agents used before per-process
sockets: resource `example.com/serial-abcd` had `patchbay-example.com_serial-abcd.sock`, which
reads as instance `abcd` of `example.com/serial`. Stale-socket removal only ever removes a socket
nobody serves, so at worst it tidies up such a dead file.)
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import secrets
import socket
import stat
from collections.abc import Callable
from pathlib import Path

from patchbay_agent.constants import INSTANCE_RE, MAX_INSTANCE_LENGTH

log = logging.getLogger(__name__)

#: sockaddr_un.sun_path is 108 bytes including the terminating NUL.
MAX_UNIX_SOCKET_PATH = 107
PREFIX = "patchbay-"
SUFFIX = ".sock"
#: Longest slug; with the longest instance a name is at most 71 bytes, which leaves 36 bytes for
#: the directory (the default /var/lib/kubelet/device-plugins/ is 32).
MAX_SLUG_LENGTH = 40
_HASH_LENGTH = 12


def new_instance() -> str:
    """A fresh instance token: 8 hex digits (32 random bits)."""
    return secrets.token_hex(4)


def check_instance(value: str) -> str:
    """`value` if it is a valid instance token, else ValueError saying what is allowed."""
    if not INSTANCE_RE.fullmatch(value):
        raise ValueError(f"instance {value!r} must be 1-{MAX_INSTANCE_LENGTH} lowercase letters or digits")
    return value


def _sanitized(resource_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", resource_name)


def resource_slug(resource_name: str) -> str:
    """The resource part of socket names: readable when it fits, else head + hash of the name."""
    plain = _sanitized(resource_name)
    if len(plain) <= MAX_SLUG_LENGTH:
        return plain
    digest = hashlib.sha256(resource_name.encode()).hexdigest()[:_HASH_LENGTH]
    return f"{plain[: MAX_SLUG_LENGTH - _HASH_LENGTH - 1]}-{digest}"


def socket_prefix(resource_name: str) -> str:
    """What every socket name of this resource starts with: `patchbay-<slug>-`."""
    return f"{PREFIX}{resource_slug(resource_name)}-"


def socket_name(resource_name: str, instance: str) -> str:
    """One agent process's socket file name: `patchbay-example.com_serial-1a2b3c4d.sock`."""
    return socket_prefix(resource_name) + check_instance(instance) + SUFFIX


def legacy_socket_name(resource_name: str) -> str:
    """The name agents before per-process sockets used: `patchbay-example.com_serial.sock`."""
    return PREFIX + _sanitized(resource_name) + SUFFIX


def check_path(path: Path) -> None:
    """ValueError when `path` does not fit sockaddr_un.sun_path."""
    if len(os.fsencode(path)) > MAX_UNIX_SOCKET_PATH:
        raise ValueError(f"socket path {path} is longer than {MAX_UNIX_SOCKET_PATH} bytes")


def is_same_resource(name: str, resource_name: str) -> bool:
    """Whether `name` is a socket name of this resource (any instance, or the legacy name)."""
    prefix = socket_prefix(resource_name)
    if name.startswith(prefix) and name.endswith(SUFFIX):
        return INSTANCE_RE.fullmatch(name[len(prefix) : -len(SUFFIX)]) is not None
    return name == legacy_socket_name(resource_name)


def probe(path: Path) -> int:
    """Try to connect to a Unix socket without waiting: 0 when something accepts the connection,
    else the errno (ECONNREFUSED: nobody listens, the socket file is stale)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.setblocking(False)
        try:
            s.connect(str(path))
        except OSError as e:
            return e.errno or errno.EIO
    return 0


def remove_stale_sockets(plugin_dir: Path, resource_name: str, keep: str) -> list[str]:
    """Remove this resource's sockets that nobody serves any more; returns the names removed.

    A candidate is a Unix socket file named like one of this resource's sockets (any instance, or
    the legacy name), other than `keep` (ours). It is removed only when connecting to it is
    REFUSED, which is what a socket whose process died answers; a live one (another agent of the
    same resource, e.g. the old one during a rollout) accepts, and one whose listen backlog is
    full answers EAGAIN: both stay. Other resources' sockets are never looked at.
    """
    return remove_stale(plugin_dir, lambda name: is_same_resource(name, resource_name), keep)


def remove_stale(directory: Path, matches: Callable[[str], bool], keep: str) -> list[str]:
    """Remove the Unix sockets in `directory` whose names `matches` accepts, other than `keep`,
    that nobody serves (connection REFUSED); returns the names removed. See
    `remove_stale_sockets`; DRA mode uses it for its own two socket directories."""
    removed: list[str] = []
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return removed
    for name in names:
        if name == keep or not matches(name):
            continue
        path = directory / name
        try:
            before = os.lstat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISSOCK(before.st_mode):
            continue
        if probe(path) != errno.ECONNREFUSED:
            continue
        with contextlib.suppress(FileNotFoundError):
            now = os.lstat(path)
            # Only the file we probed (a new file at that path would be another inode or ctime).
            if (now.st_ino, now.st_ctime_ns) == (before.st_ino, before.st_ctime_ns):
                path.unlink()
                removed.append(name)
                log.info("Removed stale socket %s (connection refused: its agent is gone)", path)
    return removed
