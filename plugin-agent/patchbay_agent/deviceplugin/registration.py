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
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from inotify_simple import flags

from patchbay_agent.api import api_pb2, api_pb2_grpc
from patchbay_agent.backoff import Backoff
from patchbay_agent.constants import API_VERSION, KUBELET_SOCKET
from patchbay_agent.deviceplugin.server import DevicePluginServicer, detach_server, device_plugin_server
from patchbay_agent.fswatch import DirWatcher
from patchbay_agent.kubelet.pluginserver import PluginServer, file_identity
from patchbay_agent.kubelet.sockets import is_same_resource, probe
from patchbay_agent.metrics import Metrics
from patchbay_agent.wakeup import wait_any

log = logging.getLogger(__name__)

#: After a registration, how long the kubelet may take to open its ListAndWatch stream before a
#: stream that ended (an older one) counts as lost. Streams of a registration the kubelet had
#: already opened count as lost at once.
STREAM_OPEN_GRACE = 1.0
#: The same grace on a kubelet that has dropped us before (one client per resource), where a
#: registration without a stream is most likely a registration dropped before its stream opened:
#: it starts short and doubles per registration in a row whose stream never came (up to
#: STREAM_OPEN_GRACE), so a kubelet that is merely slow is not flooded with registrations.
DROPPING_KUBELET_STREAM_GRACE = 0.1
#: After the kubelet dropped us, how long to wait at most for its PodResources to show none of
#: our devices allocatable (it has run its disconnect) before registering again, and how often to
#: look. The kubelet's disconnect follows the connection close within microseconds; the bound only
#: matters when another endpoint keeps the devices allocatable (v1.37 promotes one).
DROP_SETTLE_TIMEOUT = 0.1
DROP_SETTLE_EVERY = 0.002
#: A registration dropped sooner than this after it was made counts as a repeated drop: the next
#: re-registration waits (10 ms, then x4 up to 1 s), so two kubelet clients closing each other in
#: turn cannot make us knock in a tight loop.
QUICK_DROP = 1.0
#: What the kubelet's device manager answers a Register for a socket path it still holds.
ALREADY_CONNECTED = "device plugin already connected"
#: The first kubelet minor that keeps one device-plugin endpoint per socket path; before it, one
#: client per resource, and a rollout hands over (docs/facts.md#kubelet-endpoints). The test
#: matrix's capability `device-plugin-endpoint-per-socket` names the same release.
ENDPOINT_PER_SOCKET_SINCE = (1, 37)
#: How long a hand-over registration (and the re-registration before a last exit) may take.
HANDOVER_TIMEOUT = 2.0
#: After another agent's socket of our resource goes, when to look at the kubelet's view of our
#: devices: once its streams have surely ended and the kubelet acted on that (tens of ms on a
#: quiet node), and again later for a busy one.
VIEW_AFTER_LEAVE = (0.05, 0.3, 1.0, 3.0)
#: A view found short is looked at again this much later before it counts (our own list may be on
#: its way to the kubelet).
VIEW_CONFIRM = 0.1
#: What connecting to a socket file answers when no process listens on it any more.
GONE = frozenset({errno.ECONNREFUSED, errno.ENOENT})


class _Register:
    """What `Registrar._check_registration` returns when we must register now."""


REGISTER = _Register()


class KubeletView:
    """Whether the kubelet counts as allocatable every device we advertise healthy, read from its
    PodResources (GetAllocatableResources). On kubelets before 1.37 another process's client can
    take our devices away while OUR stream stays open (a leaving agent that registered again,
    docs/facts.md#kubelet-endpoints); nothing on the stream tells us, so we look: shortly after
    another agent's socket of our resource goes, and on every backstop poll."""

    def __init__(
        self,
        kubelet_allocatable: Callable[[], Awaitable[int]] | None,
        advertised_healthy: Callable[[], tuple[int, int]] | None,
    ) -> None:
        """`advertised_healthy` gives (snapshot version, devices we advertise Healthy)."""
        self._read = kubelet_allocatable
        self._ours = advertised_healthy
        #: when to look (monotonic times, sorted)
        self._looks: list[float] = []
        #: looks that found the kubelet short of our devices, and re-registrations they caused
        self.short_seen = 0

    @property
    def available(self) -> bool:
        return self._read is not None and self._ours is not None

    @property
    def due(self) -> float | None:
        """When to look next (monotonic); None: no look due."""
        return self._looks[0] if self._looks else None

    def look_at(self, *when: float) -> None:
        if self.available:
            self._looks = sorted({*self._looks, *when})

    def looked(self, now: float) -> None:
        """Every look due by `now` is done."""
        self._looks = [t for t in self._looks if t > now]

    async def short(self) -> str | None:
        """A message when the kubelet counts fewer of our devices allocatable than we advertise
        Healthy, twice VIEW_CONFIRM apart with our devices unchanged (a list of ours on its way
        to the kubelet is not a loss); else None. Errors reading PodResources count as not short."""
        assert self._read is not None
        assert self._ours is not None
        try:
            version, ours = self._ours()
            theirs = await self._read()
            if theirs >= ours:
                return None
            await asyncio.sleep(VIEW_CONFIRM)
            again, ours = self._ours()
            theirs = await self._read()
        except (grpc.aio.AioRpcError, OSError) as e:
            log.debug("PodResources unreadable while checking the kubelet's view: %s", e)
            return None
        if again != version or theirs >= ours:
            return None
        self.short_seen += 1
        return f"the kubelet counts {theirs} of our {ours} healthy devices allocatable"


class Registrar:
    """Serves the plugin socket and keeps it registered with whatever kubelet is there."""

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
        kubelet_allocatable: Callable[[], Awaitable[int]] | None = None,
        advertised_healthy: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        """`kubelet_allocatable` reads how many of our devices the kubelet counts allocatable now
        (PodResources) and `advertised_healthy` how many we advertise Healthy (with the snapshot's
        version); without them a re-registration after a drop does not wait for the kubelet and
        the kubelet's view is not checked (`KubeletView`)."""
        self.plugin_dir = plugin_dir
        #: our socket's file name in plugin_dir (what RegisterRequest.endpoint says)
        self.endpoint = endpoint
        #: gives a fresh socket name when the kubelet refuses ours as "already connected"
        self._rename = rename
        self.kubelet_socket = plugin_dir / KUBELET_SOCKET
        self._servicer = servicer
        self._resource_name = resource_name
        self._metrics = metrics
        self._poll_interval = poll_interval
        self._register_timeout = register_timeout
        self._backoff = backoff or Backoff()
        self._kick = asyncio.Event()
        self.server: PluginServer | None = None
        #: identity of the kubelet.sock our registration stands with; None while not registered
        self._registered_kubelet: tuple[int, int] | None = None
        #: a kubelet.sock whose kubelet is gone (connections refused): never registered with
        self._dead_kubelet: tuple[int, int] | None = None
        self.registration_count = 0
        #: attempts to serve the socket that failed (e.g. the plugin directory was gone)
        self.serve_failures = 0
        #: when set, check at this monotonic time whether the kubelet still holds a stream
        self._stream_check_at: float | None = None
        #: the servicer's count of streams ever opened, at our newest registration
        self._streams_at_registration = 0
        #: the kubelet dropped the stream of our newest registration (re-register at once)
        self._dropped = False
        #: re-registrations because the kubelet dropped us while it stayed (kubelets < v1.37 do
        #: in every maxSurge rollout)
        self.drops = 0
        self._kubelet_allocatable = kubelet_allocatable
        self._registered_at = 0.0
        self._drop_backoff = Backoff(initial=0.01, maximum=1.0, factor=4.0)
        #: register no sooner than this (monotonic): the wait after a quick repeated drop
        self._not_before = 0.0
        #: the next registration follows a drop: wait for the kubelet to let go first
        self._after_drop = False
        #: the kubelet keeps one client per resource (before 1.37); None: not known (the agent
        #: sets it from the Node's kubeletVersion; a drop proves it too)
        self.one_client_per_resource: bool | None = None
        #: our newest registration was handed over (see the module doc); hand-overs done
        self._handed_over = False
        #: a hand-over registration is in flight: not Ready until the kubelet has answered it (else
        #: a rollout may remove the previous agent first, and its exit closes our stream)
        self._handing_over = False
        self.handovers = 0
        #: registrations made again because their stream never opened, and how many in a row
        self.unopened = 0
        self._unopened_in_a_row = 0
        self.view = KubeletView(kubelet_allocatable, advertised_healthy)
        #: registrations made again because the kubelet had lost our devices (`KubeletView`)
        self.retakes = 0
        self._retake = False
        #: Register calls whose dial-back found our socket gone, served again meanwhile
        self.served_during_register = 0
        #: set once stop is seen or shutdown began: nothing registers from then on
        self.closing = False
        servicer.on_stream_closed = self._stream_closed
        servicer.on_stream_opened = self._kick.set

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / self.endpoint

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
            and self._stream_of_newest_open()
            and not self._handing_over
            and not self._handover_due()
        )

    @property
    def _one_client(self) -> bool:
        return bool(self.one_client_per_resource) or self.drops > 0

    def _handover_due(self) -> bool:
        return self._one_client and not self._handed_over and bool(self._serving_others(older_only=True))

    def _serving_others(self, *, older_only: bool) -> list[str]:
        """Other agents' sockets of our resource that something serves now. `older_only`: only
        sockets created no later than ours (a rollout, we the new half: only the newcomer hands
        over). Age is the sockets' modification time: each agent creates its socket when it
        serves."""
        try:
            names = os.listdir(self.plugin_dir)
            ours = os.stat(self.socket_path).st_mtime_ns if older_only else 0
        except OSError:
            return []

        def old_enough(name: str) -> bool:
            if not older_only:
                return True
            try:
                return os.stat(self.plugin_dir / name).st_mtime_ns <= ours
            except OSError:
                return False

        return [
            n
            for n in names
            if n != self.endpoint
            and is_same_resource(n, self._resource_name)
            and old_enough(n)
            and probe(self.plugin_dir / n) == 0
        ]

    async def _hand_over(self) -> None:
        """Register a socket that refuses the kubelet (see the module doc), then remove it. Done
        at most once per registration: whatever the kubelet answered, readiness is not held back
        again (at worst the previous agent's exit costs a drop, as without a hand-over)."""
        self._handed_over = True
        self._handing_over = True
        name = self.endpoint.removesuffix(".sock") + "-handover.sock"
        server = detach_server(self.plugin_dir / name)
        try:
            await server.start()
            await self.register(endpoint=name, deadline=HANDOVER_TIMEOUT)
            log.warning("The kubelet accepted a hand-over registration it should have refused")
        except grpc.aio.AioRpcError as e:
            if "hand-over" in (e.details() or ""):
                self.handovers += 1
                log.info(
                    "Handed over %s: the kubelet keeps our stream and holds no client that the other "
                    "agent's exit would close (kubelets before v1.37)",
                    self._resource_name,
                )
            else:
                log.warning("Hand-over registration failed otherwise (%s: %s)", e.code().name, e.details())
        except (OSError, RuntimeError) as e:
            log.warning("Cannot serve the hand-over socket %s: %s", name, e)
        finally:
            self._handing_over = False
            await server.stop(0, remove_socket=True)

    def _stream_of_newest_open(self) -> bool:
        return (
            self._servicer.open_streams > 0 and self._servicer.streams_opened > self._streams_at_registration
        )

    def _stream_grace(self) -> float:
        if self.drops == 0:
            return STREAM_OPEN_GRACE
        return min(STREAM_OPEN_GRACE, DROPPING_KUBELET_STREAM_GRACE * float(2**self._unopened_in_a_row))

    def _set_registered(self, kubelet: tuple[int, int] | None) -> None:
        """Registered with the kubelet whose socket has this identity, or (None) not registered."""
        self._registered_kubelet = kubelet
        self._metrics.registered.set(0 if kubelet is None else 1)

    async def serve(self) -> None:
        """(Re)start the gRPC server on a fresh socket. Old streams are cut at once: they belong
        to a kubelet that is gone or that will reconnect through the new registration."""
        if self.server is not None:
            await self.server.stop(0, remove_socket=True)
            self.server = None
        server = device_plugin_server(self._servicer, self.socket_path)
        await server.start()
        self.server = server

    def _stream_closed(self) -> None:
        if self.closing or self._servicer.open_streams > 0:
            return  # shutting down, or the kubelet still holds a stream of ours
        if self._servicer.streams_opened > self._streams_at_registration:
            # The stream of our newest registration was open and is gone: the kubelet dropped us,
            # or it is gone itself (a restart); _check_registration tells which.
            self._dropped = True
            self._stream_check_at = time.monotonic()
        elif self._stream_check_at is None:
            # An older registration's stream ended and the newest one's has not opened (yet): the
            # check set at registration decides; this only covers a check already passed.
            self._stream_check_at = time.monotonic() + self._stream_grace()
        self._kick.set()

    async def _kubelet_let_go(self) -> None:
        """Wait (at most DROP_SETTLE_TIMEOUT) until the kubelet counts none of our devices
        allocatable: then its disconnect has run and cannot undo the registration we send next.
        Errors reading PodResources end the wait: registering is what matters."""
        if self._kubelet_allocatable is None:
            return
        deadline = time.monotonic() + DROP_SETTLE_TIMEOUT
        try:
            # A poll, not an event: the kubelet announces nothing; PodResources is all there is.
            while await self._kubelet_allocatable() > 0 and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(DROP_SETTLE_EVERY)
        except (grpc.aio.AioRpcError, OSError) as e:
            log.debug("PodResources unreadable while waiting for the kubelet to let go: %s", e)

    def _on_event(self, directory: Path, name: str, mask: int) -> None:
        if name in (KUBELET_SOCKET, self.endpoint) or not name:
            self._kick.set()
        elif mask & (flags.DELETE | flags.MOVED_FROM) and is_same_resource(name, self._resource_name):
            # Another agent of our resource left: on kubelets before 1.37 its exit may have taken
            # our devices with it. Look once its streams have surely ended.
            now = time.monotonic()
            self.view.look_at(*(now + t for t in VIEW_AFTER_LEAVE))
            self._kick.set()

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
            await stub.Register(request, timeout=deadline or self._register_timeout)

    async def _ensure_serving(self) -> float | None:
        """Serve our socket if it is not served or was removed; a retry delay when that fails."""
        if self.server is not None and self.server.socket_intact():
            return None
        if self.server is not None:
            log.info("Plugin socket %s was removed (kubelet restart?): serving again", self.socket_path)
        self._set_registered(None)
        try:
            await self.serve()
        except (OSError, RuntimeError) as e:
            # e.g. the plugin directory itself is gone for a moment (grpc: "Failed to bind").
            # Keep trying; the agent must outlive a directory being recreated.
            self.server = None
            self.serve_failures += 1
            delay = self._backoff.next()
            log.warning("Cannot serve on %s (%s); retrying in %.2fs", self.socket_path, e, delay)
            return delay
        return None

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
            verdict = await self._check_registration(kubelet_id)
            if not isinstance(verdict, _Register):
                return verdict
            kubelet_id = file_identity(self.kubelet_socket)
            if kubelet_id is None:
                return None
        wait = self._not_before - time.monotonic()
        if wait > 0:
            return wait
        if self._after_drop:
            self._after_drop = False
            await self._kubelet_let_go()
        return await self._register_ours(kubelet_id)

    async def _check_registration(self, kubelet_id: tuple[int, int]) -> float | _Register | None:
        """Registered with the kubelet that is there: hand over when due, look at the stream of
        our newest registration and at the kubelet's view. REGISTER when we must register again;
        else when to look again (None: on the next event)."""
        now = time.monotonic()
        if self._stream_of_newest_open():
            if self._handover_due():
                await self._hand_over()
            if self.view.due is not None and now >= self.view.due and not self._handing_over:
                self.view.looked(now)
                if self._one_client and (why := await self.view.short()) is not None:
                    self.retakes += 1
                    log.warning(
                        "%s while our ListAndWatch stream is open (kubelets before v1.37 after "
                        "another agent of %s left): registering again",
                        why[0].upper() + why[1:],
                        self._resource_name,
                    )
                    self._set_registered(None)
                    return REGISTER
        check_at = self._stream_check_at
        if check_at is None:
            return self._view_wait(now)
        if now < check_at:
            return min(check_at - now, self._view_wait(now) or check_at - now)
        self._stream_check_at = None
        dropped, self._dropped = self._dropped, False
        if self._stream_of_newest_open():
            self._unopened_in_a_row = 0
            return self._view_wait(now)
        if not dropped and self._servicer.open_streams > 0:
            # Streams of an earlier registration of ours are still held; the newest
            # registration's stream never came. Kubelets before v1.37 keep the older client.
            # Look again a grace later; a registration is made again only once none is held.
            self._stream_check_at = now + self._stream_grace()
            return self._stream_grace()
        self._set_registered(None)
        if probe(self.kubelet_socket) in GONE:
            # Our stream ended because the kubelet itself went (a restart): not a drop. Its socket
            # file stays until the next kubelet replaces it; wait for that (inotify).
            self._dead_kubelet = kubelet_id
            log.info(
                "The kubelet at %s is gone (its socket refuses): waiting for a kubelet", self.kubelet_socket
            )
            return None
        if not dropped and self._servicer.streams_opened == self._streams_at_registration:
            self.unopened += 1
            self._unopened_in_a_row += 1
            log.warning(
                "The kubelet opened no ListAndWatch stream within %.0f ms of our registration "
                "(dropped before it opened: kubelets before v1.37 can): registering again",
                (now - self._registered_at) * 1000,
            )
        elif dropped:
            self.drops += 1
            self._after_drop = True
            if now - self._registered_at < QUICK_DROP:
                delay = self._drop_backoff.next()
                self._not_before = now + delay
                log.warning(
                    "Dropped again %.0f ms after registering: registering again in %.0f ms",
                    (now - self._registered_at) * 1000,
                    delay * 1000,
                )
            else:
                self._drop_backoff.reset()
                log.warning(
                    "The kubelet dropped our ListAndWatch stream without restarting (kubelets before "
                    "v1.37 do when another plugin process of %s leaves): registering again at once",
                    self._resource_name,
                )
        return REGISTER

    def _view_wait(self, now: float) -> float | None:
        """How long until the kubelet's view is due to be looked at (None: not due)."""
        return None if self.view.due is None else max(0.0, self.view.due - now)

    async def _register_ours(self, kubelet_id: tuple[int, int]) -> float | None:
        """Register our socket with the kubelet whose socket has `kubelet_id`; when to look again.

        The kubelet dials our socket back INSIDE its Register handler, retrying for up to 10 s
        until the socket answers (`dial` in plugin/v1beta1/client.go, docs/facts.md#plugin-sockets).
        If the kubelet's start wipes our socket meanwhile (a kubelet restart races our Register),
        we serve it again at once, so that very dial finds us, rather than leaving the kubelet
        dialing a missing file for 10 s while we wait for its answer. A new kubelet (its socket
        replaced) abandons the call: that kubelet never saw it."""
        if self.closing:
            return None
        # Counted before the call: the kubelet may open the new stream before Register returns.
        self._streams_at_registration = self._servicer.streams_opened
        call = asyncio.ensure_future(self.register())
        try:
            while not call.done():
                self._kick.clear()
                await wait_any((self._kick, _done_event(call)), self._register_timeout + 1.0)
                if call.done():
                    break
                if file_identity(self.kubelet_socket) != kubelet_id:
                    call.cancel()
                    log.info("A new kubelet appeared while registering: registering with it")
                    return 0.0
                if self.server is None or not self.server.socket_intact():
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
        # A fresh registration supersedes streams that ended before it; its own stream is
        # checked for a grace from now.
        self._dropped = False
        self._handed_over = False
        self._registered_at = time.monotonic()
        self._stream_check_at = self._registered_at + self._stream_grace()
        self._set_registered(kubelet_id)
        self.registration_count += 1
        self._metrics.registrations.labels("success").inc()
        log.info("Registered %s with the kubelet at %s", self._resource_name, self.kubelet_socket)
        return self._stream_check_at - self._registered_at  # look whether its stream came

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
        if self._rename is not None and ALREADY_CONNECTED in (e.details() or ""):
            await self._move_to_new_socket()
        return delay

    async def _move_to_new_socket(self) -> None:
        """Give up our socket path for good (the kubelet may hold a stale endpoint for it): stop
        serving it, remove it, take a new name. The next round serves that and registers it."""
        assert self._rename is not None
        old = self.socket_path
        self.endpoint = self._rename()
        log.warning(
            "The kubelet still holds an endpoint for %s: moving to a new socket %s", old, self.socket_path
        )
        if self.server is not None:
            await self.server.stop(0, remove_socket=True)
            self.server = None

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
                    self.closing = True
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
                    self.view.look_at(time.monotonic())
        finally:
            self.closing = True
            watcher.close()

    async def shutdown(self, grace: float) -> None:
        """Stop serving and remove our socket (only if it is still ours), within `grace` and a
        little more. Handed over and with no other agent of the resource serving (older or
        newer), register our socket again first: the kubelet then holds a client that our exit
        closes, and marks the resource unhealthy (capacity nobody serves must not stay). With
        another agent serving, never: our exit would close ITS client (kubelets before 1.37)."""
        self.closing = True
        others = self._serving_others(older_only=False)
        if self._handed_over and self.registered and not others:
            try:
                await self.register(deadline=min(HANDOVER_TIMEOUT, max(grace / 2, 0.1)))
                log.info(
                    "No other agent of %s: registered again so that the kubelet sees us go",
                    self._resource_name,
                )
            except grpc.aio.AioRpcError as e:
                log.warning("Could not register again before leaving (%s: %s)", e.code().name, e.details())
        elif others:
            log.info(
                "Leaving %s to %s: not registering again", self._resource_name, ", ".join(sorted(others))
            )
        self._set_registered(None)
        if self.server is not None:
            await self.server.stop(grace, remove_socket=True)
            self.server = None


def _done_event(fut: asyncio.Future[Any]) -> asyncio.Event:
    """An Event set when `fut` is done (for wait_any)."""
    event = asyncio.Event()
    if fut.done():
        event.set()
    else:
        fut.add_done_callback(lambda _f: event.set())
    return event
