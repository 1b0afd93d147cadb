"""The DevicePlugin v1beta1 gRPC service on a Unix socket (`grpc.aio`).

`grpc.aio`, not the sync server: a sync server holds one pool thread per open ListAndWatch stream,
and with a small pool Allocate hangs behind the streams (docs/facts.md#grpc-unix-sockets).
Everything here runs on the agent's event loop and reads the inventory's current snapshot; only
PreStartContainer runs a process, and only when the profile asks for one.

ListAndWatch sends the message `encoding.ListAndWatchEncoder` made of the newest snapshot, and
skips snapshots that change nothing the kubelet sees. The socket is bound by
`kubelet.pluginserver.PluginServer` (see `registration`).
"""

from __future__ import annotations

import logging
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
from patchbay_agent.deviceplugin.allocation import AllocationError, allocate, check_served, preferred
from patchbay_agent.deviceplugin.encoding import ListAndWatchEncoder
from patchbay_agent.deviceplugin.streams import StreamWatch
from patchbay_agent.kubelet.pluginserver import PluginServer
from patchbay_agent.metrics import Metrics

log = logging.getLogger(__name__)


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):
    def __init__(
        self,
        config: AgentConfig,
        inventory: Inventory,
        metrics: Metrics,
        cdi: CdiSpecs | None = None,
        *,
        on_allocated: Callable[[], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        """Installs its encoder as the inventory's guard: a list the kubelet would refuse is never
        published (`encoding`). `on_allocated`: called after every Allocate answered OK (the
        holders read PodResources again; it must not block: it runs before the answer goes).
        `on_failure`: called with the message of every Allocate or PreStartContainer answered
        with an error (the report's `allocationFailures`; it must not block either)."""
        self._config = config
        self._inventory = inventory
        self.encoder = ListAndWatchEncoder(config.replicas, on_size=metrics.list_bytes.set)
        inventory.admit(self.encoder.check)
        self._metrics = metrics
        #: The CDI spec file behind the CDI names Allocate returns (None: no `cdi.kind`).
        self._cdi = cdi
        #: our ListAndWatch streams as they open and end; the registrar built with this servicer
        #: judges its registrations by them (`streams.StreamWatch`)
        self.streams = StreamWatch()
        self._on_allocated = on_allocated
        self._on_failure = on_failure
        self._options = api_pb2.DevicePluginOptions(
            pre_start_required=config.pre_start is not None,
            get_preferred_allocation_available=config.preferred_policy is not PreferredPolicy.NONE,
        )

    def reconfigure(self, config: AgentConfig) -> None:
        """Answer Allocate, GetPreferredAllocation and PreStartContainer with `config` from now
        on. The caller (`frontend.DevicePluginFrontEnd.reconfigure`) has checked that nothing the
        kubelet was told at registration (the options above) or the device IDs (replicas) change."""
        self._config = config

    @property
    def open_streams(self) -> int:
        """ListAndWatch streams open right now (the kubelet keeps exactly one per registration)."""
        return self.streams.open

    @property
    def streams_opened(self) -> int:
        """ListAndWatch streams ever opened."""
        return self.streams.opened

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
        self._metrics.rpcs.labels("ListAndWatch", "OK").inc()
        log.info("ListAndWatch stream opened (%d devices)", self._inventory.current.advertised)
        self.streams.stream_opened()
        try:
            snap = self._inventory.current
            sent = self.encoder.response_for(snap)
            yield sent
            while True:
                nxt = await self._inventory.next_change(snap.version)
                if nxt is None:
                    return
                snap = nxt
                response = self.encoder.response_for(snap)
                if response is not sent:
                    sent = response
                    yield sent
        finally:
            self._metrics.streams.dec()
            log.info("ListAndWatch stream closed")
            self.streams.stream_closed()

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
            self._failed(f"Allocate: {e.message}")
            await context.abort(e.code, e.message)
        self._metrics.allocate_seconds.observe(time.perf_counter() - started)
        self._metrics.rpcs.labels("Allocate", "OK").inc()
        if self._on_allocated is not None:
            self._on_allocated()
        return response

    def _failed(self, message: str) -> None:
        if self._on_failure is not None:
            self._on_failure(message)

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

        The IDs are checked first: the command runs as root with them in its environment, so a
        call without IDs, or naming one the agent does not advertise, is refused
        (INVALID_ARGUMENT naming them) and runs nothing. (An ID with a NUL byte made the
        process's start raise, UNKNOWN; found by tests/fuzz/test_fuzz_deviceplugin.py.)

        Without a preStart section the options say pre_start_required=false and the kubelet never
        calls this; answering OK to a stray call is the harmless choice.
        """
        pre = self._config.pre_start
        if pre is None:
            self._metrics.rpcs.labels("PreStartContainer", "OK").inc()
            return api_pb2.PreStartContainerResponse()
        try:
            check_served(request.devices_ids, self._inventory.current)
        except AllocationError as e:
            self._metrics.rpcs.labels("PreStartContainer", e.code.name).inc()
            log.warning("Refused PreStartContainer: %s", e.message)
            self._failed(f"PreStartContainer: {e.message}")
            await context.abort(e.code, e.message)
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
            self._failed(f"PreStartContainer: {message}")
            await context.abort(code, message)
        log.info("PreStartContainer ran for %s", ids)
        return api_pb2.PreStartContainerResponse()


class DetachServicer(api_pb2_grpc.DevicePluginServicer):
    """Refuses the kubelet's dial-back: served on a throw-away socket whose registration must fail
    (see `Registrar`'s hand-over, docs/facts.md#kubelet-endpoints)."""

    async def GetDevicePluginOptions(  # noqa: N802 - the gRPC method name
        self,
        request: api_pb2.Empty,
        context: grpc.aio.ServicerContext[api_pb2.Empty, api_pb2.DevicePluginOptions],
    ) -> api_pb2.DevicePluginOptions:
        await context.abort(
            grpc.StatusCode.UNAVAILABLE, "patchbay: a hand-over registration, refused on purpose"
        )
        raise AssertionError("unreachable")  # abort raises


def detach_server(socket_path: Path) -> PluginServer:
    """A DevicePlugin service that refuses every kubelet on `socket_path`."""

    def add(server: grpc.aio.Server) -> None:
        api_pb2_grpc.add_DevicePluginServicer_to_server(DetachServicer(), server)  # type: ignore[no-untyped-call]

    return PluginServer(socket_path, add, "hand-over")


def device_plugin_server(servicer: DevicePluginServicer, socket_path: Path) -> PluginServer:
    """The DevicePlugin service of `servicer` on `socket_path`."""

    def add(server: grpc.aio.Server) -> None:
        api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]

    return PluginServer(socket_path, add, "DevicePlugin")
