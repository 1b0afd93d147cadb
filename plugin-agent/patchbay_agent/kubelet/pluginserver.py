"""One gRPC server (`grpc.aio`) bound to one Unix socket in a kubelet directory, and the identity
of that socket file, which tells "still ours" from "replaced".

A deleted socket cannot be re-bound by the same grpc server, so re-serving after the kubelet wiped
the directory means a new `PluginServer` around the same servicers. Both front-ends use it: the
Device Plugin socket, and DRA's registration and service sockets.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

import grpc

log = logging.getLogger(__name__)


def file_identity(path: Path) -> tuple[int, int] | None:
    """(inode, ctime in ns) of a file, or None when it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_ctime_ns


class PluginServer:
    """One grpc.aio server bound to `socket_path`; remembers the socket file's identity.

    Identity is (inode, ctime): a deleted socket's inode number is often reused at once by the
    next file created (that is what a kubelet restart does; docs/facts.md#plugin-sockets), so the
    inode alone cannot tell "still ours" from "replaced".
    """

    def __init__(
        self,
        socket_path: Path,
        add: Callable[[grpc.aio.Server], None],
        what: str,
        *,
        make_dir: bool = False,
    ) -> None:
        """`add` puts the services on a new server (the DevicePlugin one: `device_plugin_server`);
        `what` names them in the log; `make_dir`: create the socket's directory (a DRA driver's
        own directory) instead of expecting it (the kubelet's device-plugin directory)."""
        self.socket_path = socket_path
        self.identity: tuple[int, int] | None = None
        self._add = add
        self._what = what
        self._make_dir = make_dir
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        """Bind and serve. A stale socket file from an earlier run is removed first."""
        if self._make_dir:
            self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = grpc.aio.server()
        self._add(server)
        try:
            server.add_insecure_port(f"unix://{self.socket_path}")
            await server.start()
        except BaseException:
            await server.stop(None)
            raise
        self._server = server
        self.identity = file_identity(self.socket_path)
        log.info("Serving %s on %s", self._what, self.socket_path)

    @property
    def serving(self) -> bool:
        return self._server is not None

    def socket_intact(self) -> bool:
        """False when our socket file is gone or replaced (the kubelet wiped the directory)."""
        return self.identity is not None and file_identity(self.socket_path) == self.identity

    async def stop(self, grace: float | None, *, remove_socket: bool = True) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
        # Only remove the file if it is still OURS: after a kubelet restart another agent
        # generation (or nobody) may own that path.
        if remove_socket and self.socket_intact():
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
