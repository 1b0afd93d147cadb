"""The DevicePlugin v1beta1 gRPC service on a Unix socket (`grpc.aio`).

`grpc.aio`, not the sync server: a sync server holds one pool thread per open ListAndWatch stream,
and with a small pool Allocate hangs behind the streams (docs/facts.md#grpc-unix-sockets).
Everything here runs on the agent's event loop and reads the inventory's current snapshot; only
PreStartContainer runs a process, and only when the profile asks for one.

`PluginServer` owns one bound socket. A deleted socket cannot be re-bound by the same grpc server,
so re-serving after the kubelet wiped the directory means a new `PluginServer` around the same
servicer (see `registration`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc

from patchbay_agent.api import api_pb2, api_pb2_grpc
from patchbay_agent.cdi import CdiSpecs
from patchbay_agent.command import Outcome, run_command
from patchbay_agent.config import AgentConfig, PreferredPolicy
from patchbay_agent.constants import ENV_PRESTART_DEVICE_IDS
from patchbay_agent.core.inventory import Inventory, Snapshot
from patchbay_agent.deviceplugin.allocation import AllocationError, allocate, preferred
from patchbay_agent.metrics import Metrics

log = logging.getLogger(__name__)


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(
        self, config: AgentConfig, inventory: Inventory, metrics: Metrics, cdi: CdiSpecs | None = None
    ) -> None:
        self._config = config
        self._inventory = inventory
        self._metrics = metrics
        #: The CDI spec file behind the CDI names Allocate returns (None: no `cdi.kind`).
        self._cdi = cdi
        #: ListAndWatch streams open right now (the kubelet keeps exactly one per registration)
        self.open_streams = 0
        #: ListAndWatch streams ever opened (tells a stream of the newest registration from older)
        self.streams_opened = 0
        #: called when a stream ends; the registrar uses it to notice a kubelet that dropped us
        self.on_stream_closed: Callable[[], None] | None = None
        #: called after every Allocate answered OK (must not block: it runs before the answer goes)
        self.on_allocated: Callable[[], None] | None = None
        self._options = api_pb2.DevicePluginOptions(
            pre_start_required=config.pre_start is not None,
            get_preferred_allocation_available=config.preferred_policy is not PreferredPolicy.NONE,
        )

    @property
    def options(self) -> api_pb2.DevicePluginOptions:
        """The truth about the optional calls, also sent in RegisterRequest."""
        return self._options

    async def GetDevicePluginOptions(  # noqa: N802 - the gRPC method name
        self,
        request: api_pb2.Empty,
        context: grpc.aio.ServicerContext[api_pb2.Empty, api_pb2.DevicePluginOptions],
    ) -> api_pb2.DevicePluginOptions:
        self._metrics.rpcs.labels("GetDevicePluginOptions", "OK").inc()
        return self._options

    async def ListAndWatch(  # noqa: N802 - the gRPC method name
        self,
        request: api_pb2.Empty,
        context: grpc.aio.ServicerContext[api_pb2.Empty, api_pb2.ListAndWatchResponse],
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        """The full list now, then again on every change, until the client or the agent stops."""
        self._metrics.streams.inc()
        self.open_streams += 1
        self.streams_opened += 1
        self._metrics.rpcs.labels("ListAndWatch", "OK").inc()
        log.info("ListAndWatch stream opened (%d devices)", self._inventory.current.advertised)
        try:
            snap = self._inventory.current
            while True:
                yield snap.response
                nxt = await self._inventory.next_change(snap.version)
                if nxt is None:
                    return
                snap = nxt
        finally:
            self._metrics.streams.dec()
            self.open_streams -= 1
            log.info("ListAndWatch stream closed")
            if self.on_stream_closed is not None:
                self.on_stream_closed()

    async def GetPreferredAllocation(  # noqa: N802 - the gRPC method name
        self,
        request: api_pb2.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[
            api_pb2.PreferredAllocationRequest, api_pb2.PreferredAllocationResponse
        ],
    ) -> api_pb2.PreferredAllocationResponse:
        snap = self._inventory.current
        response = api_pb2.PreferredAllocationResponse()
        try:
            for creq in request.container_requests:
                ids = preferred(
                    list(creq.available_deviceIDs),
                    list(creq.must_include_deviceIDs),
                    creq.allocation_size,
                    snap,
                    self._config.preferred_policy,
                )
                response.container_responses.add(deviceIDs=ids)
        except AllocationError as e:
            self._metrics.rpcs.labels("GetPreferredAllocation", e.code.name).inc()
            await context.abort(e.code, e.message)
        self._metrics.rpcs.labels("GetPreferredAllocation", "OK").inc()
        return response

    async def Allocate(  # noqa: N802 - the gRPC method name
        self,
        request: api_pb2.AllocateRequest,
        context: grpc.aio.ServicerContext[api_pb2.AllocateRequest, api_pb2.AllocateResponse],
    ) -> api_pb2.AllocateResponse:
        started = time.perf_counter()
        snap = self._inventory.current
        try:
            response = allocate(request, snap, self._config.allocation)
            # Before answering: the kubelet hands these CDI names to the runtime next.
            self._write_cdi(snap)
        except AllocationError as e:
            self._metrics.rpcs.labels("Allocate", e.code.name).inc()
            log.warning("Refused Allocate: %s", e.message)
            await context.abort(e.code, e.message)
        self._metrics.allocate_seconds.observe(time.perf_counter() - started)
        self._metrics.rpcs.labels("Allocate", "OK").inc()
        if self.on_allocated is not None:
            self.on_allocated()
        return response

    def _write_cdi(self, snap: Snapshot) -> None:
        cdi = self._cdi
        if cdi is None:
            return
        try:
            cdi.ensure(snap)
        except OSError as e:
            # The runtime would fail the container on an unresolvable CDI name: fail here, saying why.
            raise AllocationError(
                grpc.StatusCode.INTERNAL, f"cannot write the CDI spec {cdi.path}: {e}"
            ) from None

    async def PreStartContainer(  # noqa: N802 - the gRPC method name
        self,
        request: api_pb2.PreStartContainerRequest,
        context: grpc.aio.ServicerContext[
            api_pb2.PreStartContainerRequest, api_pb2.PreStartContainerResponse
        ],
    ) -> api_pb2.PreStartContainerResponse:
        """Run the profile's preStart command with the device IDs; the kubelet waits for it.

        Without a preStart section the options say pre_start_required=false and the kubelet never
        calls this; answering OK to a stray call is the harmless choice.
        """
        pre = self._config.pre_start
        if pre is None:
            self._metrics.rpcs.labels("PreStartContainer", "OK").inc()
            return api_pb2.PreStartContainerResponse()
        ids = ",".join(request.devices_ids)
        result = await run_command(pre.command, {ENV_PRESTART_DEVICE_IDS: ids}, pre.timeout_seconds)
        code = {
            Outcome.OK: grpc.StatusCode.OK,
            Outcome.TIMED_OUT: grpc.StatusCode.DEADLINE_EXCEEDED,
        }.get(result.outcome, grpc.StatusCode.INTERNAL)
        message = f"preStart command {result.detail}"
        self._metrics.rpcs.labels("PreStartContainer", code.name).inc()
        if code is not grpc.StatusCode.OK:
            log.warning("PreStartContainer for %s failed: %s", ids, message)
            await context.abort(code, message)
        log.info("PreStartContainer ran for %s", ids)
        return api_pb2.PreStartContainerResponse()


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


def device_plugin_server(servicer: DevicePluginServicer, socket_path: Path) -> PluginServer:
    """The DevicePlugin service of `servicer` on `socket_path`."""

    def add(server: grpc.aio.Server) -> None:
        api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]

    return PluginServer(socket_path, add, "DevicePlugin")
