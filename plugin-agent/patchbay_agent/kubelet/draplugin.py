"""The kubelet's side of a DRA driver: its two sockets, registration, the DRA API versions, the
node lock; the driver underneath (`dra/preparer.py`) only prepares and unprepares claims.

The kubelet finds DRA drivers through its plugin watcher (docs/dra.md#kubelet-registration): a Unix socket
appearing in `<kubelet root>/plugins_registry/` is dialled, asked `GetInfo` (1 s deadline) and told
the outcome with `NotifyRegistrationStatus`; the DRA calls then go to the endpoint GetInfo named.
So this module serves two sockets per agent PROCESS (like the device-plugin socket, the instance
part keeps the old and the new agent of a rollout apart; the kubelet keeps one plugin per endpoint
and refuses a second registration of the same endpoint):

* `<root>/plugins_registry/<driver>-<instance>.sock`: `pluginregistration.Registration`;
* `<root>/plugins/<driver>/dra-<instance>.sock` (the shared node agent:
  `<root>/plugins/patchbay_node-agent/<driver>/dra-<instance>.sock`, see `service_dir`):
  `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` and
  the same handlers under `...v1beta1.DRAPlugin`, and `v1.DRAResourceHealth` and
  `v1alpha1.DRAResourceHealth` (the driver's health streams, `dra/healthservice.py`), which GetInfo
  then lists in supported_versions.

The DRA socket is served first, so the endpoint answers by the time the kubelet learns it. Ready
means the kubelet said `plugin_registered=true`. A socket file that disappears (someone wiped
the directory) is served again, which makes the watcher register it again. At shutdown the
registration socket goes first (the kubelet deregisters the endpoint), then the DRA socket; only
files that are still ours are removed.

Like upstream's kubeletplugin helper, this layer knows nothing of devices, claims' contents or
CDI: it turns the kubelet's calls into `ClaimDriver.prepare` / `unprepare` on `ClaimRef`s and
their `ClaimResult`s back into the version's messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc

from patchbay_agent.api import (
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2_grpc,
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from patchbay_agent.backoff import Backoff
from patchbay_agent.constants import DRA_HEALTH_SERVICES, DRA_PLUGIN_TYPE, DRA_SERVICES, INSTANCE_RE
from patchbay_agent.kubelet.pluginserver import PluginServer
from patchbay_agent.kubelet.sockets import MAX_UNIX_SOCKET_PATH, probe, remove_stale
from patchbay_agent.metrics import Metrics
from patchbay_agent.wakeup import wait_any

log = logging.getLogger(__name__)
#: How often a call waiting for another instance's call (`node_lock`) tries the lock again.
LOCK_POLL_SECONDS = 0.005
#: The lock file in the driver's directory (`service_dir`: a hostPath every instance of the same
#: kind of agent on the node mounts).
LOCK_FILE_NAME = "calls.lock"

REGISTRY_DIR = "plugins_registry"
PLUGINS_DIR = "plugins"
#: Claims' status.devices are written once no prepare or unprepare has run for QUIET_SECONDS (a
#: burst of pod starts is answered first, its status writes follow it), and at the latest after
#: QUIET_MAX_SECONDS of waiting: the status is informational, the calls are on pods' start path.
QUIET_SECONDS = 0.05
QUIET_MAX_SECONDS = 5.0
_HASH_LENGTH = 8


def base_request(name: str) -> str:
    """`gpu` for `gpu/high-memory`: the kubelet stores a subrequest's devices, and a device
    metadata file names them, under its request (upstream's rule)."""
    return name.split("/", 1)[0]


def registry_socket_name(driver: str, instance: str, directory: Path) -> str:
    """`<driver>-<instance>.sock`, or, when the path would not fit sockaddr_un, the driver's head
    plus a hash of it (the kubelet reads the driver from GetInfo, not from the file name)."""
    name = f"{driver}-{instance}.sock"
    if len(str(directory / name).encode()) <= MAX_UNIX_SOCKET_PATH:
        return name
    room = MAX_UNIX_SOCKET_PATH - len(str(directory).encode()) - len(f"/-{instance}.sock") - _HASH_LENGTH - 1
    digest = hashlib.sha256(driver.encode()).hexdigest()[:_HASH_LENGTH]
    return f"{driver[: max(room, 1)]}-{digest}-{instance}.sock"


def service_dir(root: Path, driver: str, plugins_dir: Path | None = None) -> Path:
    """The driver's directory: its service sockets, its lock file (`calls.lock`) and its claim
    records (`claim-<uid>.json`).

    An agent of its own (`plugins_dir` None): `<root>/plugins/<driver>`, or
    `<root>/plugins/patchbay-<hash>` when the socket path in it would not fit sockaddr_un (a long
    driver name under a long root); its pod mounts exactly this directory
    (`render.dra_service_dir` in the operator, the same rule).

    The shared node agent (`plugins_dir` = `options.node_agent_plugins_dir`, the one directory its
    pod mounts): `<plugins_dir>/<driver>`, or `<plugins_dir>/<hash>` when that would not fit. The
    hash alone, without the `patchbay-` prefix, is enough there: only this agent's drivers have
    directories in it, and their names (`<profile>.patchbay.dev`) always have dots; and the 9
    bytes matter: with the dev cluster's kubelet root (37 bytes) `patchbay-<hash>` would not fit
    (113 bytes), the hash does (104). The deepest path is then `<root>` plus 67 bytes, so a shared
    node agent's kubelet root may have at most 40 bytes (an agent of its own: 51)."""
    parent = root / PLUGINS_DIR if plugins_dir is None else plugins_dir
    plain = parent / driver
    if len(str(plain / "dra-0123456789abcdef.sock").encode()) <= MAX_UNIX_SOCKET_PATH:
        return plain
    digest = hashlib.sha256(driver.encode()).hexdigest()[:12]
    return parent / (f"patchbay-{digest}" if plugins_dir is None else digest)


def service_socket_name(instance: str) -> str:
    return f"dra-{instance}.sock"


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    cdi_id: str
    #: the allocation's share of a shared device (consumable capacity); "" else
    share_id: str = ""
    #: more CDI devices for the container: the request's device metadata file, on the request's
    #: first device (dra/metadata.py)
    extra_cdi_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClaimResult:
    """One claim's outcome: devices, or an error message."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class ClaimDriver(Protocol):
    """What the kubelet's calls need of a DRA driver (`dra.preparer.ClaimPreparer`)."""

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        """Every claim's outcome by UID; a claim's failure is its result's error, never a raise."""

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Every claim's error ("" when done) by UID."""


class HealthService(Protocol):
    """The driver's `v1.DRAResourceHealth` servicer, with its `v1alpha1` twin
    (`dra.healthservice.DraHealthServicer`)."""

    @property
    def v1alpha1(self) -> Any:
        """The same streams under `v1alpha1.DRAResourceHealth`."""


@contextlib.asynccontextmanager
async def node_lock(path: Path | None, poll: float = LOCK_POLL_SECONDS) -> AsyncIterator[None]:
    """An exclusive `flock` on `path`, shared by every agent instance of the driver on the node
    (during a rolling update the kubelet may call either), so their prepare and unprepare calls
    run one at a time, as the kubelet's DRA rules ask of plugins with several instances. Polled
    without blocking (LOCK_NB), so a call cancelled while it waits leaves nothing behind; the lock
    goes with the descriptor (and with a process that dies holding it). None: no lock."""
    if path is None:
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(poll)
        yield
    finally:
        os.close(fd)


class CallActivity:
    """The prepare and unprepare calls in flight and when the last one ended: made before the
    preparer (which marks its calls here) and the claim status writer (which waits for `quiet`),
    so that neither needs the other to be built first."""

    def __init__(self) -> None:
        self._in_flight = 0
        self._last_end = 0.0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.asynccontextmanager
    async def call(self) -> AsyncIterator[None]:
        """Marks a prepare or unprepare call in flight (see `quiet`)."""
        self._in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            self._last_end = time.monotonic()
            if not self._in_flight:
                self._idle.set()

    async def quiet(self, settle: float = QUIET_SECONDS, longest: float = QUIET_MAX_SECONDS) -> None:
        """Return once no prepare or unprepare call has run for `settle` seconds, or after
        `longest`. Background API writes wait for it, so that they do not compete with the calls
        the kubelet is waiting for (the dra_path benchmark: a burst of 200 prepares, p50 9.3 ms with the
        claims' status writes interleaved, 7.4 ms without: docs/benchmarks.md)."""
        deadline = time.monotonic() + longest
        while (now := time.monotonic()) < deadline:
            if self._in_flight:
                await wait_any((self._idle,), deadline - now)
            elif (quiet_for := now - self._last_end) < settle:
                await asyncio.sleep(min(settle - quiet_for, deadline - now))
            else:
                return


def _prepare_response(pb2: Any, results: Mapping[str, ClaimResult]) -> Any:
    response = pb2.NodePrepareResourcesResponse()
    for uid, result in results.items():
        entry = response.claims[uid]
        if result.error:
            entry.error = result.error
            continue
        for d in result.devices:
            # The kubelet matches a container's `resources.claims[].request` against these, and
            # stores them without a subrequest's suffix (`gpu`, never `gpu/fast`: upstream's
            # helper strips it too), so a firstAvailable claim's container gets its devices.
            device = entry.devices.add(
                request_names=[base_request(d.request)] if d.request else [],
                pool_name=d.pool,
                device_name=d.device,
                cdi_device_ids=[d.cdi_id, *d.extra_cdi_ids],
            )
            if d.share_id and "share_id" in device.DESCRIPTOR.fields_by_name:
                device.share_id = d.share_id  # v1 only: v1beta1 has no shares
    return response


def _unprepare_response(pb2: Any, errors: Mapping[str, str]) -> Any:
    response = pb2.NodeUnprepareResourcesResponse()
    for uid, error in errors.items():
        entry = response.claims[uid]
        if error:
            entry.error = error
    return response


def _refs(claims: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.uid, c.name) for c in claims]


class _DraCalls:
    """The handlers both DRA service versions share; `pb2` is the version's message module."""

    def __init__(self, preparer: ClaimDriver, metrics: Metrics, pb2: Any) -> None:
        self._preparer = preparer
        self._metrics = metrics
        self._pb2 = pb2

    async def prepare(self, request: Any) -> Any:
        started = time.perf_counter()
        results = await self._preparer.prepare(_refs(request.claims))
        failed = [f"{uid}: {r.error}" for uid, r in results.items() if r.error]
        for line in failed:
            log.warning("NodePrepareResources: %s", line)
        if failed:
            self._metrics.claim_errors.labels("NodePrepareResources").inc(len(failed))
        self._metrics.rpcs.labels("NodePrepareResources", "OK").inc()
        took = time.perf_counter() - started
        self._metrics.dra_prepare_seconds.observe(took)
        log.debug("NodePrepareResources took %.3fs", took)
        return _prepare_response(self._pb2, results)

    async def unprepare(self, request: Any) -> Any:
        started = time.perf_counter()
        errors = await self._preparer.unprepare(_refs(request.claims))
        self._metrics.dra_unprepare_seconds.observe(time.perf_counter() - started)
        if any(errors.values()):
            self._metrics.claim_errors.labels("NodeUnprepareResources").inc(
                sum(1 for e in errors.values() if e)
            )
        self._metrics.rpcs.labels("NodeUnprepareResources", "OK").inc()
        return _unprepare_response(self._pb2, errors)


class DraV1Servicer(dra_v1_pb2_grpc.DRAPluginServicer):
    """`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`."""

    def __init__(self, preparer: ClaimDriver, metrics: Metrics) -> None:
        self._calls = _DraCalls(preparer, metrics, dra_v1_pb2)

    async def NodePrepareResources(  # noqa: N802 - the gRPC method name
        self, request: dra_v1_pb2.NodePrepareResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dra_v1_pb2.NodePrepareResourcesResponse:
        response: dra_v1_pb2.NodePrepareResourcesResponse = await self._calls.prepare(request)
        return response

    async def NodeUnprepareResources(  # noqa: N802 - the gRPC method name
        self, request: dra_v1_pb2.NodeUnprepareResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
        response: dra_v1_pb2.NodeUnprepareResourcesResponse = await self._calls.unprepare(request)
        return response


class DraV1beta1Servicer(dra_v1beta1_pb2_grpc.DRAPluginServicer):
    """`k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`: the same handlers, for older kubelets."""

    def __init__(self, preparer: ClaimDriver, metrics: Metrics) -> None:
        self._calls = _DraCalls(preparer, metrics, dra_v1beta1_pb2)

    async def NodePrepareResources(  # noqa: N802 - the gRPC method name
        self,
        request: dra_v1beta1_pb2.NodePrepareResourcesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> dra_v1beta1_pb2.NodePrepareResourcesResponse:
        response: dra_v1beta1_pb2.NodePrepareResourcesResponse = await self._calls.prepare(request)
        return response

    async def NodeUnprepareResources(  # noqa: N802 - the gRPC method name
        self,
        request: dra_v1beta1_pb2.NodeUnprepareResourcesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> dra_v1beta1_pb2.NodeUnprepareResourcesResponse:
        response: dra_v1beta1_pb2.NodeUnprepareResourcesResponse = await self._calls.unprepare(request)
        return response


class RegistrationServicer(pluginregistration_pb2_grpc.RegistrationServicer):
    """`pluginregistration.Registration`: who we are, and the kubelet's verdict."""

    def __init__(
        self,
        driver: str,
        endpoint: Callable[[], Path],
        on_status: Callable[[bool, str], None],
        services: Sequence[str] = DRA_SERVICES,
    ) -> None:
        self._driver = driver
        self._endpoint = endpoint
        self._on_status = on_status
        self._services = list(services)

    async def GetInfo(  # noqa: N802 - the gRPC method name
        self, request: pluginregistration_pb2.InfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pluginregistration_pb2.PluginInfo:
        return pluginregistration_pb2.PluginInfo(
            type=DRA_PLUGIN_TYPE,
            name=self._driver,
            endpoint=str(self._endpoint()),
            supported_versions=self._services,
        )

    async def NotifyRegistrationStatus(  # noqa: N802 - the gRPC method name
        self, request: pluginregistration_pb2.RegistrationStatus, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pluginregistration_pb2.RegistrationStatusResponse:
        self._on_status(request.plugin_registered, request.error)
        return pluginregistration_pb2.RegistrationStatusResponse()


class DraPlugin:
    """Serves the two sockets (see the module doc) and tracks the kubelet's registration verdict."""

    def __init__(
        self,
        driver: str,
        kubelet_root: Path,
        instance: str,
        preparer: ClaimDriver,
        metrics: Metrics,
        *,
        poll_interval: float = 10.0,
        backoff: Backoff | None = None,
        health: HealthService | None = None,
        plugins_dir: Path | None = None,
        on_registered: Callable[[], None] | None = None,
    ) -> None:
        """`plugins_dir`: where the driver's directory goes (`service_dir`; None: an agent of its
        own, `<kubelet_root>/plugins/<driver>`). `on_registered`: called after every
        `plugin_registered=true` (the slices are re-asserted: the kubelet deletes a driver's
        slices when it starts and when the driver was gone for a while)."""
        self.driver = driver
        self.instance = instance
        self.preparer = preparer
        self.registry_dir = kubelet_root / REGISTRY_DIR
        self.registry_socket = self.registry_dir / registry_socket_name(driver, instance, self.registry_dir)
        self.service_socket = service_dir(kubelet_root, driver, plugins_dir) / service_socket_name(instance)
        self._metrics = metrics
        self._poll_interval = poll_interval
        self._backoff = backoff or Backoff()
        self.registered = False
        self.registrations = 0
        self._on_registered = on_registered
        #: `v1.DRAResourceHealth` and `v1alpha1.DRAResourceHealth`, served (and advertised) when given
        self.health = health
        services = (*DRA_SERVICES, *DRA_HEALTH_SERVICES) if health is not None else DRA_SERVICES
        registration = RegistrationServicer(driver, lambda: self.service_socket, self._on_status, services)

        def add_service(server: grpc.aio.Server) -> None:
            dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(DraV1Servicer(preparer, metrics), server)  # type: ignore[no-untyped-call]
            dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
                DraV1beta1Servicer(preparer, metrics), server
            )  # type: ignore[no-untyped-call]
            if health is not None:
                dra_health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(health, server)  # type: ignore[no-untyped-call]
                dra_health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(health.v1alpha1, server)  # type: ignore[no-untyped-call]

        def add_registration(server: grpc.aio.Server) -> None:
            pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(registration, server)  # type: ignore[no-untyped-call]

        self.service = PluginServer(self.service_socket, add_service, "the DRA service", make_dir=True)
        self.registration = PluginServer(
            self.registry_socket, add_registration, "DRA plugin registration", make_dir=True
        )

    def _on_status(self, registered: bool, error: str) -> None:
        self.registered = registered
        self._metrics.registered.set(1 if registered else 0)
        self._metrics.registrations.labels("success" if registered else "failure").inc()
        if registered:
            self.registrations += 1
            log.info("The kubelet registered DRA driver %s (endpoint %s)", self.driver, self.service_socket)
            if self._on_registered is not None:
                self._on_registered()
        else:
            log.warning("The kubelet refused DRA driver %s: %s", self.driver, error)

    @property
    def serving(self) -> bool:
        return self.service.serving and self.registration.serving

    def remove_stale(self) -> None:
        """Remove our driver's sockets whose agents are gone (connection refused); a live one (the
        other agent of a rollout) stays."""
        prefix = self.registry_socket.name[: -len(f"{self.instance}.sock")]

        def registry_match(name: str) -> bool:
            return (
                name.startswith(prefix)
                and name.endswith(".sock")
                and bool(INSTANCE_RE.fullmatch(name[len(prefix) : -len(".sock")]))
            )

        def service_match(name: str) -> bool:
            return re.fullmatch(r"dra-[a-z0-9]{1,16}\.sock", name) is not None

        remove_stale(self.registry_dir, registry_match, self.registry_socket.name)
        remove_stale(self.service_socket.parent, service_match, self.service_socket.name)

    async def _serve(self) -> float | None:
        """(Re)serve whichever socket is not intact; the retry delay after a failure, else None."""
        try:
            if not self.service.socket_intact():
                if self.service.serving:
                    log.info("DRA socket %s was removed: serving again", self.service_socket)
                await self.service.stop(0)
                await self.service.start()
                # The kubelet must learn the endpoint anew: re-serve the registration socket too.
                await self.registration.stop(0)
            if not self.registration.socket_intact():
                if self.registration.serving:
                    log.info("Registration socket %s was removed: serving again", self.registry_socket)
                self.registered = False
                self._metrics.registered.set(0)
                await self.registration.stop(0)
                await self.registration.start()
        except (OSError, RuntimeError) as e:
            delay = self._backoff.next()
            log.warning("Cannot serve the DRA plugin sockets (%s); retrying in %.2fs", e, delay)
            return delay
        self._backoff.reset()
        return None

    async def start(self) -> None:
        """Serve both sockets (the DRA service first); raises when that is impossible at start,
        ValueError when another process serves one of our paths (an --instance already taken)."""
        for path in (self.registry_socket, self.service_socket):
            if probe(path) == 0:
                raise ValueError(
                    f"{path} is served by another process: instance {self.instance!r} is taken "
                    "(leave --instance out to draw a fresh one)"
                )
        self.remove_stale()
        await self.service.start()
        await self.registration.start()

    async def run(self, stop: asyncio.Event) -> None:
        """Keep both sockets served until `stop` is set (a slow backstop poll of their identity)."""
        while not stop.is_set():
            retry = await self._serve()
            await wait_any((stop,), self._poll_interval if retry is None else retry)

    async def shutdown(self, grace: float) -> None:
        """Registration socket first (the kubelet deregisters), then the DRA service."""
        self.registered = False
        self._metrics.registered.set(0)
        await self.registration.stop(0)
        await self.service.stop(grace)
