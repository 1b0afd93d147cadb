"""Registration with the kubelet, and staying registered across kubelet restarts.

Rules this module keeps:

* register only while serving: the kubelet dials the plugin back INSIDE its Register handler
  (GetDevicePluginOptions, then ListAndWatch), so the socket must answer before Register is sent
  (docs/facts.md#device-plugin-api);
* a new kubelet deletes every socket in the plugin directory, then creates `kubelet.sock`
  (docs/facts.md#device-plugin-api). Either event means "serve on a fresh socket and register
  again". Both are seen through inotify on the plugin directory (sub-millisecond,
  docs/facts.md#inotify), not a poll;
* a slow poll (default 10 s) compares the identity (inode + ctime: inode numbers are reused at
  once, see `server.PluginServer`) of `kubelet.sock` and of our socket with the ones we registered
  against. It is only a backstop for lost events (inotify queue overflow, a directory that was
  itself replaced) and re-adds the watch;
* while `kubelet.sock` exists but Register fails, retry with capped exponential backoff and jitter;
  while there is no `kubelet.sock` at all, wait for it to appear instead of knocking;
* the kubelet keeps one ListAndWatch stream per registration and, when that stream fails, forgets
  the plugin without telling it. So when our last stream ends while the same kubelet is still
  there, register again: AT ONCE when the kubelet had opened the stream of our newest
  registration (it dropped us: kubelets before v1.37 drop the newest client of a resource when
  ANY client's stream of it ends, e.g. when the previous agent of a maxSurge rollout leaves, and
  mark all its devices unhealthy until a plugin registers again, so every millisecond counts);
  after a short grace when that stream was never opened (it may still be on its way). Before
  registering after a drop, wait (briefly, bounded) until the kubelet's PodResources shows that
  it has finished dropping us, so the drop cannot land on the new registration
  (docs/facts.md#kubelet-endpoints);
* every registration must be followed by its stream: those kubelets can also drop a client
  BEFORE its stream opens (the previous client's stream ends between our Register and the
  kubelet's ListAndWatch), and then nothing of ours ends to tell us. So a registration whose
  stream has not opened within a grace (1 s; 100 ms, doubling, once this kubelet has dropped us)
  is made again; and the agent counts as ready only once the kubelet holds the stream of its
  newest registration, so a rollout removes the previous agent only after the kubelet is really
  connected to the new one;
* on a kubelet that keeps ONE client per resource (before 1.37: learned from the Node's
  kubeletVersion, or from a drop), a new agent that finds another agent of its resource serving
  HANDS OVER once the kubelet holds its stream, before it counts as ready: it registers a
  throw-away socket that refuses the kubelet's dial-back. The kubelet registers that client in
  place of ours, fails to connect it and deletes its client entry, while our stream (and the
  device manager's endpoint for it) stays. When the previous agent then exits, the kubelet finds
  no client of the resource to close: no drop, no dip. An agent that goes with no successor
  registers its own socket again first, so that its exit makes the kubelet mark the resource
  unhealthy as before (docs/facts.md#kubelet-endpoints);
* those kubelets send Allocate to the endpoint of the resource's LAST registration, and a
  hand-over leaves it in place: when another agent of our resource that may have registered
  after our newest registration leaves (ours was not handed over, or its socket appeared after
  ours began), register again, or every Allocate dials its removed socket while our stream keeps
  the devices counted (`handover.HandOver.may_hold_the_endpoint`);
* the kubelet keeps one endpoint per socket PATH. When it refuses Register with "device plugin
  already connected", it has just dropped its client for that path but may keep the endpoint,
  which then blocks the path until it restarts: serve on a NEW socket name and register that
  (docs/facts.md#kubelet-endpoints);
* a stream that ends while `kubelet.sock` refuses connections ended because the kubelet itself
  went (a restart): that is not a drop. Nothing is registered with that socket file again (it
  stays until the next kubelet replaces it); the next kubelet's socket is waited for;
* the kubelet dials our socket back INSIDE its Register handler and retries for up to 10 s until
  it answers. When a kubelet restart wipes our socket while our Register is in flight, we serve it
  again at once (that very dial then finds us); when a new kubelet socket appears meanwhile, the
  call is abandoned and made with the new kubelet. Each registration's first list is then whole,
  however the restarts fall (a Register that waited the full 10 s for a socket we had not served
  again left the kubelet without our devices for that long);
* on kubelets before 1.37 another process can take our devices away while our stream stays open:
  a leaving agent that registers again closes the client of the resource, ours included in the
  kubelet's eyes, and marks every device unhealthy. Nothing on our stream says so. So the agent
  compares the kubelet's count (PodResources) with what it advertises Healthy shortly after
  another agent's socket of the resource goes and on every backstop poll, and registers again
  when the kubelet is short (`KubeletView`);
* after SIGTERM nothing registers from the loop: a round in flight is cancelled. Only a
  handed-over agent with NO other agent of its resource serving (older or newer) registers once
  more before it goes (see above); a leaving agent with a successor never does.

The rules are kept by parts, each with one job: `Registrar` (the loop that reconciles: which
kubelet is there, registering with it), `PluginSocket` (our socket, served and served again, its
name, the Register call), `streams.StreamWatch` (what the kubelet does with our registrations'
streams: never opened, dropped), `registrationcheck.RegistrationCheck` (judging the registration
we stand on, with `KubeletView`, the kubelet's count of our devices) and `handover.HandOver`
(hand-overs, and the last registration before leaving).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from inotify_simple import flags

from patchbay_agent.api import api_pb2, api_pb2_grpc
from patchbay_agent.backoff import Backoff
from patchbay_agent.constants import API_VERSION, KUBELET_SOCKET
from patchbay_agent.deviceplugin.handover import HandOver
from patchbay_agent.deviceplugin.registrationcheck import (
    VIEW_AFTER_LEAVE,
    AllocatableRead,
    RegistrationCheck,
    Verdict,
)
from patchbay_agent.deviceplugin.server import DevicePluginServicer, device_plugin_server
from patchbay_agent.deviceplugin.streams import StreamWatch
from patchbay_agent.fswatch import DirWatcher
from patchbay_agent.kubelet.pluginserver import PluginServer, file_identity
from patchbay_agent.kubelet.sockets import is_same_resource, probe
from patchbay_agent.metrics import Metrics
from patchbay_agent.wakeup import wait_any

log = logging.getLogger(__name__)

#: What the kubelet's device manager answers a Register for a socket path it still holds.
ALREADY_CONNECTED = "device plugin already connected"


class PluginSocket:
    """Our socket in the plugin directory and the Register call that names it: served by the
    servicer (a fresh server each time), served again when removed, moved to a new name when the
    kubelet holds a stale endpoint for the old one."""

    def __init__(
        self,
        servicer: DevicePluginServicer,
        plugin_dir: Path,
        endpoint: str,
        resource_name: str,
        *,
        register_timeout: float = 10.0,
        rename: Callable[[], str] | None = None,
    ) -> None:
        """`rename` gives a fresh socket name when the kubelet refuses ours as "already
        connected" (None: the name is kept)."""
        self.plugin_dir = plugin_dir
        #: our socket's file name in plugin_dir (what RegisterRequest.endpoint says)
        self.endpoint = endpoint
        self.kubelet_socket = plugin_dir / KUBELET_SOCKET
        self._servicer = servicer
        self._resource_name = resource_name
        self.register_timeout = register_timeout
        self._rename = rename
        self.server: PluginServer | None = None
        #: attempts to serve the socket that failed (e.g. the plugin directory was gone)
        self.serve_failures = 0

    @property
    def path(self) -> Path:
        return self.plugin_dir / self.endpoint

    @property
    def intact(self) -> bool:
        """Served, and the file in the directory is still the one we bound."""
        return self.server is not None and self.server.socket_intact()

    @property
    def movable(self) -> bool:
        return self._rename is not None

    async def serve(self) -> None:
        """(Re)start the gRPC server on a fresh socket. Old streams are cut at once: they belong
        to a kubelet that is gone or that will reconnect through the new registration."""
        if self.server is not None:
            await self.server.stop(0, remove_socket=True)
            self.server = None
        server = device_plugin_server(self._servicer, self.path)
        await server.start()
        self.server = server

    async def serve_again(self, backoff: Backoff) -> float | None:
        """Serve it (it was removed, or is not served yet); a retry delay when that fails."""
        if self.server is not None:
            log.info("Plugin socket %s was removed (kubelet restart?): serving again", self.path)
        try:
            await self.serve()
        except (OSError, RuntimeError) as e:
            # e.g. the plugin directory itself is gone for a moment (grpc: "Failed to bind").
            # Keep trying; the agent must outlive a directory being recreated.
            self.server = None
            self.serve_failures += 1
            delay = backoff.next()
            log.warning("Cannot serve on %s (%s); retrying in %.2fs", self.path, e, delay)
            return delay
        return None

    async def move(self) -> None:
        """Give up our socket path for good (the kubelet may hold a stale endpoint for it): stop
        serving it, remove it, take a new name. The next round serves that and registers it."""
        assert self._rename is not None
        old = self.path
        self.endpoint = self._rename()
        log.warning("The kubelet still holds an endpoint for %s: moving to a new socket %s", old, self.path)
        await self.stop(0)

    async def stop(self, grace: float) -> None:
        """Stop serving and remove our socket (only if it is still ours)."""
        if self.server is not None:
            await self.server.stop(grace, remove_socket=True)
            self.server = None

    async def register(self, *, endpoint: str | None = None, deadline: float | None = None) -> None:
        """One Register call (of our socket, or of `endpoint`); raises grpc.aio.AioRpcError when
        the kubelet refuses or is absent."""
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=endpoint or self.endpoint,
            resource_name=self._resource_name,
            options=self._servicer.options,
        )
        # A private subchannel pool: gRPC otherwise shares one connection per address across
        # channels, and after a kubelet restart that shared one may still be backing off from
        # the old socket, failing this Register at once. The Go kubelet dials fresh each time too
        # (docs/facts.md#plugin-sockets).
        async with grpc.aio.insecure_channel(
            f"unix://{self.kubelet_socket}", options=[("grpc.use_local_subchannel_pool", 1)]
        ) as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            await stub.Register(request, timeout=deadline or self.register_timeout)


class Registrar:
    """Serves the plugin socket and keeps it registered with whatever kubelet is there (the module
    doc's rules): the loop, which kubelet is there, the registrations. Its parts, built here:
    `PluginSocket`, `handover.HandOver` and `registrationcheck.RegistrationCheck`; the streams'
    bookkeeping (`streams.StreamWatch`) is the servicer's, which both share."""

    def __init__(
        self,
        servicer: DevicePluginServicer,
        plugin_dir: Path,
        endpoint: str,
        resource_name: str,
        metrics: Metrics,
        *,
        poll_interval: float = 10.0,
        register_timeout: float = 10.0,
        backoff: Backoff | None = None,
        rename: Callable[[], str] | None = None,
        kubelet_allocatable: AllocatableRead | None = None,
        advertised_healthy: Callable[[], tuple[int, int]] | None = None,
        kubelet_keeps_one_client: Callable[[], Awaitable[bool | None]] | None = None,
    ) -> None:
        """`kubelet_allocatable` reads how many of our devices the kubelet counts allocatable now
        (PodResources) and `advertised_healthy` how many we advertise Healthy (with the snapshot's
        version); without them a re-registration after a drop does not wait for the kubelet and
        the kubelet's view is not checked (`KubeletView`). `kubelet_keeps_one_client` reads
        whether the kubelet keeps one client per resource (`HandOver.learn`; None: not known)."""
        self.plugin_dir = plugin_dir
        self.socket = PluginSocket(
            servicer, plugin_dir, endpoint, resource_name, register_timeout=register_timeout, rename=rename
        )
        self.kubelet_socket = self.socket.kubelet_socket
        #: the servicer's ListAndWatch streams, and what they say about our registrations
        self.streams: StreamWatch = servicer.streams
        self._resource_name = resource_name
        self._metrics = metrics
        self._poll_interval = poll_interval
        self._backoff = backoff or Backoff()
        #: wakes the loop: set by the plugin directory's events and by every stream that opens or ends
        self._kick = self.streams.wake
        #: identity of the kubelet.sock our registration stands with; None while not registered
        self._registered_kubelet: tuple[int, int] | None = None
        #: a kubelet.sock whose kubelet is gone (connections refused): never registered with
        self._dead_kubelet: tuple[int, int] | None = None
        self.registration_count = 0
        self.handover = HandOver(
            plugin_dir, resource_name, self.socket.register, self.streams, kubelet_keeps_one_client
        )
        self.check = RegistrationCheck(
            self.streams,
            self.handover,
            self.kubelet_socket,
            resource_name,
            kubelet_allocatable=kubelet_allocatable,
            advertised_healthy=advertised_healthy,
        )
        #: Register calls whose dial-back found our socket gone, served again meanwhile
        self.served_during_register = 0

    @property
    def socket_path(self) -> Path:
        return self.socket.path

    @property
    def endpoint(self) -> str:
        return self.socket.endpoint

    @property
    def server(self) -> PluginServer | None:
        return self.socket.server

    @property
    def registered(self) -> bool:
        return self._registered_kubelet is not None

    @property
    def streaming(self) -> bool:
        """Registered, the kubelet holds the stream of our newest registration (only then does it
        count our devices), and, where a hand-over is due, it is done: what readiness means for a
        device plugin (a rollout removes the previous agent only then)."""
        return (
            self.registered
            and self.streams.newest_open
            and not self.handover.in_flight
            and not self.handover.due(self.endpoint)
        )

    def _set_registered(self, kubelet: tuple[int, int] | None) -> None:
        """Registered with the kubelet whose socket has this identity, or (None) not registered."""
        self._registered_kubelet = kubelet
        self._metrics.registered.set(0 if kubelet is None else 1)

    def _on_event(self, directory: Path, name: str, mask: int) -> None:
        if name in (KUBELET_SOCKET, self.endpoint) or not name:
            self._kick.set()
        elif not is_same_resource(name, self._resource_name):
            return
        elif mask & (flags.CREATE | flags.MOVED_TO):
            self.handover.arrived(name)
        elif mask & (flags.DELETE | flags.MOVED_FROM):
            # Another agent of our resource left: on kubelets before 1.37 its exit may have taken
            # our devices with it (look once its streams have surely ended), or, had it registered
            # after us, left the kubelet's Allocate dialing its removed socket (register again).
            now = time.monotonic()
            self.check.view.look_at(*(now + t for t in VIEW_AFTER_LEAVE))
            if self.handover.may_hold_the_endpoint(self.endpoint, name):
                self.check.endpoint_may_be_gone(now)
            self._kick.set()

    async def _ensure_serving(self) -> float | None:
        """Serve our socket if it is not served or was removed; a retry delay when that fails."""
        if self.socket.intact:
            return None
        self._set_registered(None)
        return await self.socket.serve_again(self._backoff)

    async def _reconcile(self) -> float | None:
        """Bring reality in line; returns when to look again (after a failure, or to check that
        a registration's stream came), else None."""
        if (delay := await self._ensure_serving()) is not None:
            return delay
        kubelet_id = file_identity(self.kubelet_socket)
        if kubelet_id is not None and kubelet_id == self._dead_kubelet and probe(self.kubelet_socket) == 0:
            self._dead_kubelet = None  # a new kubelet's socket that happens to look the same
        if kubelet_id is None or kubelet_id == self._dead_kubelet:
            if self.registered:
                log.info("Kubelet socket %s is gone: waiting for a kubelet", self.kubelet_socket)
            self._set_registered(None)
            return None
        if kubelet_id == self._registered_kubelet:
            verdict = await self.check.judge(self.endpoint)
            if not isinstance(verdict, Verdict):
                return verdict
            self._set_registered(None)
            if verdict is Verdict.KUBELET_GONE:
                self._dead_kubelet = kubelet_id
                return None
            kubelet_id = file_identity(self.kubelet_socket)
            if kubelet_id is None:
                return None
        wait = self.streams.not_before - time.monotonic()
        if wait > 0:
            return wait
        if self.streams.take_after_drop():
            await self.check.let_go()
        return await self._register_ours(kubelet_id)

    async def _register_ours(self, kubelet_id: tuple[int, int]) -> float | None:
        """Register our socket with the kubelet whose socket has `kubelet_id`; when to look again.

        The kubelet dials our socket back INSIDE its Register handler, retrying for up to 10 s
        until the socket answers (`dial` in plugin/v1beta1/client.go, docs/facts.md#plugin-sockets).
        If the kubelet's start wipes our socket meanwhile (a kubelet restart races our Register),
        we serve it again at once, so that very dial finds us, rather than leaving the kubelet
        dialing a missing file for 10 s while we wait for its answer. A new kubelet (its socket
        replaced) abandons the call: that kubelet never saw it."""
        if self.streams.closing:
            return None
        self.streams.registering()
        self.handover.registering()
        call = asyncio.ensure_future(self.socket.register())
        try:
            while not call.done():
                self._kick.clear()
                await wait_any((self._kick, _done_event(call)), self.socket.register_timeout + 1.0)
                if call.done():
                    break
                if file_identity(self.kubelet_socket) != kubelet_id:
                    call.cancel()
                    log.info("A new kubelet appeared while registering: registering with it")
                    return 0.0
                if not self.socket.intact:
                    self.served_during_register += 1
                    log.info("Our socket was removed while the kubelet dials it back: serving it again")
                    if (delay := await self._ensure_serving()) is not None:
                        call.cancel()
                        return delay
            await call
        except asyncio.CancelledError:
            call.cancel()
            raise
        except grpc.aio.AioRpcError as e:
            return await self._registration_failed(e)
        self._backoff.reset()
        grace = self.streams.registered()
        self.handover.new_registration()
        self.check.registered()
        self._set_registered(kubelet_id)
        self.registration_count += 1
        self._metrics.registrations.labels("success").inc()
        log.info("Registered %s with the kubelet at %s", self._resource_name, self.kubelet_socket)
        return grace  # look whether its stream came

    async def _registration_failed(self, e: grpc.aio.AioRpcError) -> float:
        self._set_registered(None)
        self._metrics.registrations.labels("failure").inc()
        delay = self._backoff.next()
        log.warning(
            "Registration with the kubelet failed (%s: %s); retrying in %.2fs",
            e.code().name,
            e.details(),
            delay,
        )
        if self.socket.movable and ALREADY_CONNECTED in (e.details() or ""):
            await self.socket.move()
        return delay

    async def run(self, stop: asyncio.Event) -> None:
        """Serve, register and keep registered until `stop` is set. A round in progress when
        `stop` is set is cancelled (a Register in flight included): nothing registers after it."""
        watcher = DirWatcher(self._on_event)
        watcher.ensure([self.plugin_dir])
        next_poll = time.monotonic() + self._poll_interval
        try:
            while not stop.is_set():
                self._kick.clear()
                round_ = asyncio.ensure_future(self._reconcile())
                while not (round_.done() or stop.is_set()):
                    await wait_any((stop, _done_event(round_)), 3600.0)
                if not round_.done():
                    self.streams.close()
                    round_.cancel()
                    await asyncio.gather(round_, return_exceptions=True)
                    break
                retry = round_.result()
                wait = next_poll - time.monotonic()
                await wait_any((self._kick, stop), wait if retry is None else min(retry, wait))
                if time.monotonic() >= next_poll:
                    # The backstop: inode comparison happens in _reconcile; re-add a lost watch;
                    # and look at the kubelet's view of our devices.
                    next_poll = time.monotonic() + self._poll_interval
                    watcher.ensure([self.plugin_dir])
                    self.check.view.look_at(time.monotonic())
        finally:
            self.streams.close()
            watcher.close()

    async def shutdown(self, grace: float) -> None:
        """Stop serving and remove our socket (only if it is still ours), within `grace` and a
        little more; first, where due, the hand-over's last registration (`HandOver.before_leaving`:
        handed over and no other agent of the resource serving)."""
        self.streams.close()
        await self.handover.before_leaving(self.endpoint, registered=self.registered, grace=grace)
        self._set_registered(None)
        await self.socket.stop(grace)


def _done_event(fut: asyncio.Future[Any]) -> asyncio.Event:
    """An Event set when `fut` is done (for wait_any)."""
    event = asyncio.Event()
    if fut.done():
        event.set()
    else:
        fut.add_done_callback(lambda _f: event.set())
    return event
