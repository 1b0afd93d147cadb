"""A Python peer that plays the kubelet's side of the device plugin protocol for the agent's
fast tests: it serves `v1beta1.Registration` on a real `kubelet.sock` and, inside Register, does
what the kubelet does (dial the plugin's socket back, GetDevicePluginOptions, then ListAndWatch in
the background), recording what it saw.

The authoritative peer is the upstream kubelet code itself (tests/conformance); this one exists so
registration edge cases (ordering, restarts, refusals) run in milliseconds and can be inspected
closely. It is a test peer, not a stand-in for agent code.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from patchbay_agent.api import api_pb2, api_pb2_grpc


@dataclass
class Registration:
    request: api_pb2.RegisterRequest
    options: api_pb2.DevicePluginOptions | None
    #: whether the plugin's socket answered GetDevicePluginOptions while Register was in flight
    plugin_was_serving: bool
    at: float = field(default_factory=time.monotonic)


async def unix_server(
    socket: Path, add: Callable[[Any, grpc.aio.Server], None], servicer: Any
) -> grpc.aio.Server:
    """A started gRPC server of ``servicer`` (``add`` is its generated add_*_to_server) on the
    Unix socket ``socket``, as the kubelet serves its own."""
    server = grpc.aio.server()
    add(servicer, server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    return server


class PyKubelet(api_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(
        self,
        plugin_dir: Path,
        *,
        refuse: int = 0,
        refuse_code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
        refuse_details: str = "not ready yet",
        one_client_per_resource: bool = False,
        drop_before_stream: int = 0,
        blocking_dial: float = 0.0,
    ) -> None:
        """``one_client_per_resource`` plays the device manager of kubelets BEFORE v1.37
        (``plugin/v1beta1/handler.go``: one client per resource name): when ANY stream of a
        resource ends, the client registered for that resource NOW is dropped (its channel
        closed) and the resource's devices count as unhealthy until a plugin sends a list again
        (docs/facts.md#kubelet-endpoints)."""
        #: dial the plugin back as the Go kubelet does (`dial` in plugin/v1beta1/client.go: gRPC's
        #: WithBlock, for up to this many seconds, retrying with gRPC's reconnect backoff while the
        #: socket is missing), and answer Register with an error when that fails; 0: one try
        self.blocking_dial = blocking_dial
        #: close the client of this many accepted registrations right after Register returns,
        #: before its ListAndWatch opens (what kubelets before v1.37 do when an older client's
        #: stream ends in that window; docs/facts.md#kubelet-endpoints). Settable while running.
        self.drop_before_stream = drop_before_stream
        self.dropped_before_stream = 0
        #: endpoints whose dial-back failed (one_client_per_resource): Register answered an error
        self.failed_connects: list[str] = []
        #: seconds Register waits before dialing the plugin back (a slow or busy kubelet).
        #: Settable while running.
        self.dial_delay = 0.0
        #: Register of an endpoint this picks waits before dialing the plugin back until
        #: `release_dials` (a busy kubelet, for exactly as long as a test wants); `held` lists
        #: the endpoints held so far. Settable while running.
        self.hold_dial: Callable[[str], bool] = lambda endpoint: False
        self.held: list[str] = []
        self._dials_released = asyncio.Event()
        self.plugin_dir = plugin_dir
        self.one_client_per_resource = one_client_per_resource
        #: the current client per resource (one_client_per_resource): its channel
        self.clients: dict[str, grpc.aio.Channel] = {}
        #: the device manager's endpoint per resource, where Allocate goes: the socket (file name)
        #: and stub of the resource's newest registration whose GetDevicePluginOptions answered
        #: (`PluginConnected` replaces it; a hand-over's failed connect and a client closed
        #: after its stream leave it in place). Only kubelets before v1.37 are played here:
        #: v1.37 promotes a remaining endpoint when one disconnects.
        self.endpoints: dict[str, tuple[str, api_pb2_grpc.DevicePluginStub]] = {}
        #: resources whose devices were all marked unhealthy by a drop, in order
        self.dropped: list[str] = []
        self.socket = plugin_dir / "kubelet.sock"
        self.registrations: list[Registration] = []
        #: the endpoint of every Register call, refused ones included
        self.attempts: list[str] = []
        #: ListAndWatch streams that the plugin's side ended (the peer's own cancels not
        #: counted), each counted once the kubelet has acted on its end (a drop, if any)
        self.streams_ended = 0
        #: the latest device list per resource (from ListAndWatch)
        self.devices: dict[str, list[api_pb2.Device]] = {}
        self.lists_received = 0
        #: every stream's FIRST list, in order: (resource, devices)
        self.first_lists: list[tuple[str, list[api_pb2.Device]]] = []
        #: refuse this many Register calls (with refuse_code and refuse_details, where "{path}"
        #: stands for the plugin's socket path) before accepting
        self.refuse = refuse
        self.refused = 0
        self._refuse_code = refuse_code
        self._refuse_details = refuse_details
        self._server: grpc.aio.Server | None = None
        self._streams: list[asyncio.Task[None]] = []
        self._channels: list[grpc.aio.Channel] = []
        self.changed = asyncio.Event()

    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.Empty:
        self.attempts.append(request.endpoint)
        if self.refused < self.refuse:
            self.refused += 1
            details = self._refuse_details.replace("{path}", str(self.plugin_dir / request.endpoint))
            await context.abort(self._refuse_code, details)
        if self.dial_delay > 0:
            await asyncio.sleep(self.dial_delay)
        if self.hold_dial(request.endpoint):
            self.held.append(request.endpoint)
            self._notify()
            await self._dials_released.wait()
        # Dial fresh, as the Go kubelet does: a shared subchannel to the same path may still be
        # backing off from the plugin's previous (deleted) socket.
        channel = grpc.aio.insecure_channel(
            f"unix://{self.plugin_dir / request.endpoint}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        self._channels.append(channel)
        stub = api_pb2_grpc.DevicePluginStub(channel)
        if self.one_client_per_resource:
            # registerClient BEFORE Connect: the new client replaces the current one at once.
            self.clients[request.resource_name] = channel
        try:
            if self.blocking_dial > 0:
                try:
                    await asyncio.wait_for(channel.channel_ready(), self.blocking_dial)
                except TimeoutError:
                    self.failed_connects.append(request.endpoint)
                    self._notify()
                    await context.abort(grpc.StatusCode.UNKNOWN, "failed to dial device plugin: timeout")
            options = await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=2)
            serving = True
            self.endpoints[request.resource_name] = (request.endpoint, stub)
        except grpc.aio.AioRpcError as e:
            options, serving = None, False
            if self.one_client_per_resource:
                # Connect failed: deregisterClient deletes the resource's entry (whoever's it
                # was by then) and Register answers the error.
                self.clients.pop(request.resource_name, None)
                self.failed_connects.append(request.endpoint)
                self._notify()
                await context.abort(
                    grpc.StatusCode.UNKNOWN, f"failed to get device plugin options: {e.details()}"
                )
        self.registrations.append(Registration(request, options, serving))
        if serving and self.drop_before_stream > 0:
            self.drop_before_stream -= 1
            self.dropped_before_stream += 1
            self.clients.pop(request.resource_name, None)
            # The Go kubelet closes the connection after Register has answered: do it next turn.
            self._streams.append(asyncio.create_task(self._close_soon(channel, request.resource_name)))
        elif serving:
            self.clients[request.resource_name] = channel
            self._streams.append(asyncio.create_task(self._watch(request.resource_name, stub)))
        self._notify()
        return api_pb2.Empty()

    async def _close_soon(self, channel: grpc.aio.Channel, resource: str) -> None:
        await asyncio.sleep(0)
        await channel.close()
        self._mark_unhealthy(resource)
        self._notify()

    async def _watch(self, resource: str, stub: api_pb2_grpc.DevicePluginStub) -> None:
        try:
            first = True
            async for response in stub.ListAndWatch(api_pb2.Empty()):
                if first:
                    self.first_lists.append((resource, list(response.devices)))
                    first = False
                self.devices[resource] = list(response.devices)
                self.lists_received += 1
                self._notify()
        except asyncio.CancelledError:
            return  # stop(), restart() or drop_streams(): the peer ended it
        except grpc.aio.AioRpcError:
            pass
        if self.one_client_per_resource:
            await self._drop_current_client(resource)
        self.streams_ended += 1
        self._notify()

    async def _drop_current_client(self, resource: str) -> None:
        """runClient -> getClient(name) -> disconnectClient: close whatever client is registered
        for the resource now, then mark every device of it unhealthy."""
        channel = self.clients.pop(resource, None)
        if channel is None:
            return
        await channel.close()
        self._mark_unhealthy(resource)
        self.dropped.append(resource)
        self._notify()

    def _mark_unhealthy(self, resource: str) -> None:
        """PluginDisconnected: every device of the resource counts as unhealthy."""
        self.devices[resource] = [
            api_pb2.Device(ID=d.ID, health="Unhealthy", topology=d.topology)
            for d in self.devices.get(resource, [])
        ]

    def endpoint(self, resource: str) -> str | None:
        """The socket (file name) the device manager sends the resource's Allocate to."""
        held = self.endpoints.get(resource)
        return None if held is None else held[0]

    async def allocate(self, resource: str, device_ids: list[str]) -> api_pb2.AllocateResponse:
        """One container's Allocate, sent where the device manager sends it (`endpoint`); raises
        grpc.aio.AioRpcError as the kubelet's admission would fail (e.g. the socket is gone)."""
        _, stub = self.endpoints[resource]
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=device_ids)]
        )
        response: api_pb2.AllocateResponse = await stub.Allocate(request, timeout=5)
        return response

    def healthy(self, resource: str) -> int:
        """Devices of the resource the kubelet would count allocatable now."""
        return sum(d.health == "Healthy" for d in self.devices.get(resource, []))

    def release_dials(self) -> None:
        """Let every held Register dial the plugin back; hold none from now on."""
        self.hold_dial = lambda endpoint: False
        self._dials_released.set()

    def _notify(self) -> None:
        old, self.changed = self.changed, asyncio.Event()
        old.set()

    async def wait_for(self, predicate: object, within: float = 10.0) -> None:
        """Wait until predicate() is true; bounded, raises TimeoutError with the state."""
        assert callable(predicate)
        deadline = time.monotonic() + within
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"condition not met: {len(self.registrations)} registrations, devices={self.devices}"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), timeout=min(remaining, 0.5))

    async def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self._server = await unix_server(self.socket, api_pb2_grpc.add_RegistrationServicer_to_server, self)

    async def _end_streams(self) -> None:
        """Every ListAndWatch stream ended and its channel closed."""
        for task in self._streams:
            task.cancel()
        await asyncio.gather(*self._streams, return_exceptions=True)
        self._streams.clear()
        for ch in self._channels:
            await ch.close()
        self._channels.clear()

    async def stop(self) -> None:
        """Like a kubelet going away: the registration socket closes and the streams drop."""
        await self._end_streams()
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()

    async def __aenter__(self) -> PyKubelet:
        """``async with PyKubelet(...) as kubelet``: started, and stopped at the end."""
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def drop_streams(self) -> None:
        """Like the kubelet's plugin client failing: the stream ends, the registration server
        stays. The kubelet then forgets the plugin silently."""
        await self._end_streams()
        self.devices.clear()

    async def crash(self) -> None:
        """Like a kubelet killed: its streams and server end at once, its socket FILE stays."""
        for task in self._streams:
            task.cancel()
        for ch in self._channels:
            await ch.close()
        self._channels.clear()
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        await asyncio.gather(*self._streams, return_exceptions=True)
        self._streams.clear()

    async def restart(self, *, crash: bool = False) -> None:
        """Like a new kubelet: stop (`crash`: killed, its socket file left), delete every socket in
        the directory, serve again (the device manager's Start: cleanup, then listen)."""
        if crash:
            await self.crash()
        else:
            await self.stop()
        for entry in self.plugin_dir.iterdir():
            if entry.is_socket():
                entry.unlink()
        self.devices.clear()
        await self.start()
