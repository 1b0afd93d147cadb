"""One resource's agent: the device core (discovery + health monitor -> inventory snapshots),
one front-end (Device Plugin or DRA) and the writers, wired by subscription, on one event loop.

Start-up order matters: the first discovery/health round runs BEFORE the socket is served, so
the kubelet's first ListAndWatch already carries the real list (never an empty one that makes
the kubelet advertise 0 for a moment; docs/facts.md#plugin-sockets); then serve; then register
(deviceplugin/registration.py).

With a profile (`ReportOptions`, `--profile`), the agent also publishes a DeviceReport: the
reporter (`report/reporter.py`) subscribes to the inventory's snapshots and to the PodResources
reader (`core/holders.py`), and writes through pykube (`kubeclient.py`, imported only then) when
the report changed. Nothing depends on the order in which subscribers were added.

With `DraOptions` (`--dra-driver`, docs/dra.md) the agent is a DRA kubelet plugin instead of a
device plugin: it serves the registration and DRA sockets (`dra/plugin.py`), publishes the node's
devices as ResourceSlices (`dra/slicepublisher.py`) and never registers with the device manager. The
discovery/health loop is the same; ListAndWatch is simply not served.

A changed profile is applied IN PLACE when the kubelet need not hear of it (`ResourceAgent.reconfigure`):
discovery, health and allocation settings swap under the running server, the ListAndWatch stream
stays open and the registration stands, so the resource never leaves the kubelet, on every
release (kubelets before 1.37 drop a resource whenever a stream ends: docs/facts.md#kubelet-endpoints).
A change of what the kubelet was told at registration (pre-start, preferred allocation), of the
device IDs (sharing replicas), of the device node permissions or of the CDI kind needs a new
agent; so does a DRA profile.

Each agent process serves its own socket (`kubelet/sockets.py`): during a rollout the old and the
new agent of one resource are registered side by side, and the old one's SIGTERM removes only its own
socket. At start, sockets of the same resource that dead agents left behind are removed.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from typing import TYPE_CHECKING, Any

from patchbay_agent.backoff import Backoff
from patchbay_agent.cdi import CdiSpecs, SpecCopies, SpecGuard
from patchbay_agent.config import AgentConfig, PreferredPolicy
from patchbay_agent.options import AgentOptions, DraOptions, ReportOptions

__all__ = ["AgentOptions", "DraOptions", "ReportOptions", "ResourceAgent"]
from patchbay_agent.core.inventory import Inventory, Snapshot
from patchbay_agent.core.monitor import Monitor
from patchbay_agent.deviceplugin.handover import keeps_one_client
from patchbay_agent.deviceplugin.registration import Registrar
from patchbay_agent.deviceplugin.server import DevicePluginServicer
from patchbay_agent.discovery import HostRoot, make_backend
from patchbay_agent.httpserver import HttpEndpoint
from patchbay_agent.kubelet.sockets import check_path, new_instance, probe, remove_stale_sockets, socket_name
from patchbay_agent.memory import settle_memory
from patchbay_agent.metrics import Metrics
from patchbay_agent.wakeup import wait_any

if TYPE_CHECKING:
    from patchbay_agent.core.holders import PodHolders
    from patchbay_agent.dra.claimstatus import ClaimStatusWriter
    from patchbay_agent.dra.plugin import AsyncClaimRead, DraClient, DraPlugin
    from patchbay_agent.dra.slicepublisher import SlicePublisher
    from patchbay_agent.kubelet.podresources import Container
    from patchbay_agent.report.reporter import ReportClient, Reporter

log = logging.getLogger(__name__)


class ResourceAgent:
    """One resource on one node: construct (fails fast on discovery errors), then `run()`."""

    def __init__(
        self,
        config: AgentConfig,
        options: AgentOptions,
        report_client: ReportClient | None = None,
        dra_client: DraClient | None = None,
    ) -> None:
        """`report_client` writes the DeviceReport when `options.report` is set, `dra_client`
        reads claims and writes ResourceSlices when `options.dra` is (default for both: pykube,
        `kubeclient.KubeClient`, imported only then); raises kubeclient.ClientConfigError."""
        self.config = config
        self.options = options
        #: socket names this process has used: never drawn again
        self._used: set[str] = set()
        self.instance = options.instance if options.instance is not None else self._fresh_instance()
        endpoint = self._take(self.instance)
        check_path(options.plugin_dir / endpoint)
        self.metrics = Metrics(
            config.resource_name, options.node_name, holder_labels=options.metrics_holder_labels
        )
        self.inventory = Inventory(
            config.replicas, config.allocation.permissions, host_path_prefix=options.host_path_prefix
        )
        host_root = HostRoot(options.host_root)
        self.backend = make_backend(config.discovery, host_root)
        self.monitor = Monitor(self.backend, host_root, config.health, self.inventory, self.metrics)
        kind = config.allocation.cdi_kind
        self.cdi = CdiSpecs(options.cdi_spec_dir, kind, config.resource_name) if kind else None
        self.started = asyncio.Event()
        self.holders: PodHolders | None = None
        self.reporter: Reporter | None = None
        self.dra: DraPlugin | None = None
        self.publisher: SlicePublisher | None = None
        self.claim_status: ClaimStatusWriter | None = None
        #: the API client (reports, DRA), when the agent has one
        self._api: object | None = None
        if options.report is not None:
            self._set_up_report(options.report, report_client)
        self.servicer = DevicePluginServicer(
            config,
            self.inventory,
            self.metrics,
            self.cdi,
            on_allocated=self.holders.allocated if self.holders is not None else None,
        )
        self.registrar = Registrar(
            self.servicer,
            options.plugin_dir,
            endpoint,
            config.resource_name,
            self.metrics,
            poll_interval=options.poll_interval,
            backoff=Backoff(options.backoff_initial, options.backoff_max),
            rename=self._rename,
            kubelet_allocatable=self._kubelet_allocatable if options.report is not None else None,
            advertised_healthy=self._advertised_healthy,
            kubelet_keeps_one_client=self._kubelet_keeps_one_client,
        )
        self.http = HttpEndpoint(
            self.metrics, self._healthy, self._ready, max_connections=options.http_max_connections
        )
        if options.dra is not None:
            self._set_up_dra(options.dra, dra_client)

    async def _kubelet_keeps_one_client(self) -> bool | None:
        """Whether this node's kubelet keeps one device-plugin client per resource (before v1.37,
        docs/facts.md#kubelet-endpoints), from its Node's `status.nodeInfo.kubeletVersion`; None
        when that cannot be read (no API client, no answer within 5 s, an unknown form)."""
        getter = getattr(self._api, "kubelet_version", None)
        if getter is None:
            return None
        try:
            version = await asyncio.wait_for(asyncio.to_thread(getter, self.options.node_name), 5.0)
        except Exception as e:
            log.warning("Cannot read the kubelet's version from Node %s: %s", self.options.node_name, e)
            return None
        one_client = keeps_one_client(str(version))
        if one_client is None:
            return None
        log.info(
            "The kubelet is %s: %s",
            version,
            "one client per resource (hand-overs in rollouts)" if one_client else "one endpoint per socket",
        )
        return one_client

    async def _kubelet_allocatable(self) -> int:
        """How many of our devices the kubelet counts allocatable now (PodResources)."""
        from patchbay_agent.kubelet.podresources import get_allocatable_resources

        assert self.options.report is not None
        got = await get_allocatable_resources(self.options.report.pod_resources_socket, rpc_timeout=0.05)
        return got.count(self.config.resource_name)

    def _advertised_healthy(self) -> tuple[int, int]:
        """(snapshot version, how many devices we advertise Healthy): what the kubelet should count."""
        snap = self.inventory.current
        return snap.version, len(snap.healthy)

    @staticmethod
    def _claim_read(client: DraClient) -> AsyncClaimRead | None:
        """Prepare's claim GET on the event loop where the client can give one (`apiget.py`:
        the real client with credentials apiget handles); else None, the thread path."""
        from patchbay_agent.kubeclient import KubeClient

        if not isinstance(client, KubeClient):
            return None
        real, getter = client, client.getter()
        if getter is None:
            return None
        log.info("Claims are read on the event loop (keep-alive connections to %s)", getter.server)

        async def read(namespace: str, name: str, seconds: float) -> dict[str, Any]:
            return await real.resource_claim_async(getter, namespace, name, seconds=seconds)

        return read

    def _set_up_dra(self, dra: DraOptions, client: DraClient | None) -> None:
        # Imported only here: a device-plugin agent never loads the DRA stubs.
        from patchbay_agent.dra.claimstatus import ClaimStatusWriter
        from patchbay_agent.dra.healthservice import DraHealthServicer, HealthReports
        from patchbay_agent.dra.plugin import (
            LOCK_FILE_NAME,
            CallActivity,
            ClaimPreparer,
            DraPlugin,
            service_dir,
            service_socket_name,
        )
        from patchbay_agent.dra.plugin import registry_socket_name as reg_name
        from patchbay_agent.dra.slicepublisher import SlicePublisher
        from patchbay_agent.dra.slices import slice_devices

        if client is None:
            from patchbay_agent.kubeclient import KubeClient

            client = KubeClient(dra.kubeconfig)
        registry_dir = dra.kubelet_root_dir / "plugins_registry"
        services = service_dir(dra.kubelet_root_dir, dra.driver, dra.plugins_dir)
        if self.options.instance is None:
            # A fresh instance whose two socket paths are both free.
            while os.path.lexists(registry_dir / reg_name(dra.driver, self.instance, registry_dir)) or (
                os.path.lexists(services / service_socket_name(self.instance))
            ):
                self.instance = self._fresh_instance()
        # Built in an order that lets each part get what it needs through its constructor: the
        # calls' activity before the preparer and the status writer, the publisher before the
        # plugin (whose registrations re-assert the slices).
        calls = CallActivity()
        self.claim_status = ClaimStatusWriter(
            dra.driver,
            self.options.node_name,
            client,
            self.inventory,
            self.metrics,
            state_dir=services,
            quiet=calls.quiet,
        )
        holders = self.holders
        publisher = self.publisher = SlicePublisher(
            dra.driver,
            self.options.node_name,
            client,
            lambda: slice_devices(
                self.inventory.current,
                holders.plugin_held if holders is not None else (),
                self.config.health.taint_effect,
                self.config.replicas,
            ),
            self.metrics,
            on_state=self.reporter.notify if self.reporter is not None else None,
        )
        self.inventory.subscribe(lambda _snap: publisher.notify())
        if holders is not None:
            # Devices pods still hold through the device plugin (a node moving to DRA) are tainted
            # in the slices: the publisher hears about every change of the holders too.
            holders.subscribe(publisher.notify)
        preparer = ClaimPreparer(
            dra.driver,
            self.options.node_name,
            client,
            self.inventory,
            allocation=self.config.allocation,
            cdi_spec_dir=self.options.cdi_spec_dir,
            lock_path=services / LOCK_FILE_NAME,
            read_async=self._claim_read(client),
            copies=SpecCopies(self.options.cdi_spec_dir, services),
            calls=calls,
            status=self.claim_status,
            on_change=holders.allocated if holders is not None else None,
            metrics=self.metrics,
        )
        plugin = self.dra = DraPlugin(
            dra.driver,
            dra.kubelet_root_dir,
            self.instance,
            preparer,
            self.metrics,
            poll_interval=self.options.poll_interval,
            backoff=Backoff(self.options.backoff_initial, self.options.backoff_max),
            health=DraHealthServicer(HealthReports(self.options.node_name, self.inventory)),
            plugins_dir=dra.plugins_dir,
            on_registered=publisher.force,
        )
        check_path(plugin.registry_socket)
        check_path(plugin.service_socket)

    def _set_up_report(self, report: ReportOptions, client: ReportClient | None) -> None:
        # Imported only here: an agent without reports pays nothing for them (pykube and requests
        # are about 9 MiB; the PodResources stubs and the report code about 0.4 MiB).
        from patchbay_agent.core.holders import PodHolders
        from patchbay_agent.report.devicereport import ReportTarget, SliceState, build_report
        from patchbay_agent.report.reporter import Reporter

        if client is None:
            from patchbay_agent.kubeclient import KubeClient

            client = KubeClient(report.kubeconfig)
        self._api = client
        held = None
        if self.options.dra is not None:
            # DRA: what the kubelet's PodResources lists under the containers' claims, for our
            # driver and node pool, by slice device name -> the physical ID the report uses.
            from patchbay_agent.dra.slices import device_names

            driver, pool = self.options.dra.driver, self.options.node_name

            def held(c: Container) -> list[str]:
                claimed = c.claimed_devices(driver, pool)
                if not claimed:  # most containers: no need to name the node's devices
                    return []
                names = device_names(self.inventory.current)
                return [names[n] for n in claimed if n in names]

        holders = self.holders = PodHolders(
            report.pod_resources_socket,
            self.config.resource_name,
            self.metrics,
            period=report.pod_resources_period,
            held=held,
        )
        target = ReportTarget(
            report.profile,
            self.options.node_name,
            report.namespace,
            self.config.resource_name,
            report.pod_name,
        )

        def build(node_uid: str | None) -> dict[str, Any]:
            slices = None
            if self.publisher is not None:  # DRA: what the API server does with taints, what is left out
                slices = SliceState(
                    self.publisher.taints.value,
                    frozenset(self.publisher.withheld),
                    self.publisher.sharing.value if self.config.replicas > 1 else "",
                )
            return build_report(target, self.inventory.current, holders.containers, node_uid, slices=slices)

        reporter = self.reporter = Reporter(target, client, build, self.metrics)
        holders.subscribe(reporter.notify)
        self.inventory.subscribe(lambda _snap: reporter.notify())

    def in_place_refusal(self, config: AgentConfig) -> str | None:
        """Why `config` cannot be applied to this running agent in place (None: it can)."""
        old = self.config
        if self.dra is not None:
            return "a DRA profile registers again on every change"
        checks = [
            (old.resource_name == config.resource_name, "resourceName"),
            (old.replicas == config.replicas, "sharing.replicas (the device IDs)"),
            ((old.pre_start is None) == (config.pre_start is None), "preStart (a registration option)"),
            (
                (old.preferred_policy is PreferredPolicy.NONE)
                == (config.preferred_policy is PreferredPolicy.NONE),
                "preferredAllocation (a registration option)",
            ),
            (old.allocation.permissions == config.allocation.permissions, "allocation.permissions"),
            (old.allocation.cdi_kind == config.allocation.cdi_kind, "allocation.cdi.kind"),
        ]
        changed = [what for same, what in checks if not same]
        return f"{', '.join(changed)} changed" if changed else None

    def reconfigure(self, config: AgentConfig) -> bool:
        """Apply a changed profile without leaving the kubelet (see the module doc): True when
        applied; False when the change needs a new agent (`in_place_refusal`). Raises what
        building the new discovery raises (nothing is changed then)."""
        refusal = self.in_place_refusal(config)
        if refusal is not None:
            log.info("Profile change for %s needs a new registration: %s", config.resource_name, refusal)
            return False
        backend = None
        if config.discovery != self.config.discovery:
            backend = make_backend(config.discovery, HostRoot(self.options.host_root))
        self.config = config
        if backend is not None:
            self.backend = backend
        self.servicer.reconfigure(config)
        self.monitor.reconfigure(backend, config.health)
        if self.publisher is not None:
            self.publisher.notify()  # a new taint effect reaches the slices at once
        log.info(
            "Applied the profile change for %s in place (registration and stream kept%s)",
            config.resource_name,
            ", new discovery" if backend is not None else "",
        )
        return True

    def _fresh_instance(self) -> str:
        """A random instance whose socket name is not in the plugin directory (used or not)."""
        while True:
            instance = new_instance()
            name = socket_name(self.config.resource_name, instance)
            if name not in self._used and not os.path.lexists(self.options.plugin_dir / name):
                return instance

    def _take(self, instance: str) -> str:
        """The socket name of `instance`, recorded as used by this process."""
        name = socket_name(self.config.resource_name, instance)
        self._used.add(name)
        return name

    def _rename(self) -> str:
        """A new socket name for this process (the kubelet refused the old path for good)."""
        self.instance = self._fresh_instance()
        return self._take(self.instance)

    def _claim_socket(self) -> None:
        """Refuse a socket path another process serves (an --instance already taken), then
        remove this resource's stale sockets (their agents are gone)."""
        path = self.registrar.socket_path
        if probe(path) == 0:
            raise ValueError(
                f"{path} is served by another process: instance {self.instance!r} is taken "
                "(leave --instance out to draw a fresh one)"
            )
        remove_stale_sockets(self.options.plugin_dir, self.config.resource_name, keep=path.name)

    async def _report(self, stop: asyncio.Event) -> None:
        """The reporter, once the first PodResources read was tried: the first report already
        names the pods that hold devices."""
        assert self.holders is not None
        assert self.reporter is not None
        await wait_any((self.holders.attempted, stop), self.holders.rpc_timeout + 1.0)
        await self.reporter.run(stop)

    def _healthy(self) -> bool:
        if self.dra is not None:
            return self.dra.serving
        return self.registrar.server is not None and self.registrar.server.serving

    @property
    def ready(self) -> bool:
        """Registered with the kubelet as a DRA driver, or as a device plugin whose newest
        registration's ListAndWatch stream the kubelet holds (only then does it count our
        devices; a rollout removes the previous agent only after this one is Ready)."""
        return self._ready()

    def _ready(self) -> bool:
        if self.dra is not None:
            return self.dra.registered
        return self.registrar.streaming

    def _cdi_guard(self, snap: Snapshot) -> SpecGuard | None:
        """Write every CDI spec this agent owns NOW (before it serves or registers: after a reboot
        emptied the CDI directory, a pod's container must resolve its CDI names as soon as the
        kubelet restarts it), and the guard that writes them again whenever one disappears."""
        directory = self.options.cdi_spec_dir
        poll = self.options.poll_interval
        if self.dra is not None:
            copies = self.dra.preparer.copies
            if copies is None:
                return None
            copies.restore(compare=True)
            return SpecGuard(directory, lambda: copies.owned, copies.restore, poll_interval=poll)
        cdi = self.cdi
        if cdi is None:
            return None
        try:
            cdi.ensure(snap)
        except OSError as e:
            # Allocate tries again (and refuses, saying why, if it still cannot).
            log.error("Cannot write the CDI spec %s: %s", cdi.path, e)

        def rewrite() -> int:
            return int(cdi.ensure(self.inventory.current))

        return SpecGuard(directory, lambda: cdi.owned, rewrite, poll_interval=poll)

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set, then shut down gracefully (socket removed, streams ended).

        Raises ListTooLargeError from the first round: a list the kubelet would refuse is a
        configuration error, reported before anything is served; ValueError when our socket path
        is served by another process.
        """
        if self.dra is None:
            self._claim_socket()
        await self.monitor.round(periodic=True)
        snap = self.inventory.current
        log.info(
            "Discovered %d %s device(s) (%d advertised, %d healthy) via %s",
            len(snap.physical),
            self.config.resource_name,
            snap.advertised,
            len(snap.healthy),
            self.backend.name,
        )
        guard = self._cdi_guard(snap)
        if self.options.http_address is not None:
            await self.http.start(*self.options.http_address)
        tasks = [asyncio.create_task(self.monitor.run(stop), name="monitor")]
        if guard is not None:
            tasks.append(asyncio.create_task(guard.run(stop), name="cdi-specs"))
        # Reporting is cancelled, not awaited, at shutdown: a write hanging on the API server
        # must not delay removing our socket (the HTTP request itself ends within its timeout).
        report_tasks: list[asyncio.Task[None]] = []
        if self.dra is not None and self.publisher is not None:
            await self.dra.start()
            tasks.append(asyncio.create_task(self.dra.run(stop), name="dra-plugin"))
            report_tasks.append(asyncio.create_task(self.publisher.run(stop), name="resource-slices"))
            if self.claim_status is not None:
                report_tasks.append(asyncio.create_task(self.claim_status.run(stop), name="claim-status"))
            tasks += report_tasks
        else:
            await self.registrar.handover.learn()
            tasks.append(asyncio.create_task(self.registrar.run(stop), name="registrar"))
        if self.holders is not None and self.reporter is not None:
            more = [
                asyncio.create_task(self.holders.run(stop), name="pod-resources"),
                asyncio.create_task(self._report(stop), name="reporter"),
            ]
            report_tasks += more
            tasks += more
        # Everything allocated so far (modules, config, grpc) lives as long as the process: move it
        # out of the garbage collector's generations so full collections stop walking it. They
        # otherwise land in the middle of Allocate calls and stretch its tail latency
        # (docs/facts.md#plugin-sockets). Collect first: frozen garbage would never be freed.
        settle_memory()
        gc.freeze()
        self.started.set()
        stopper = asyncio.ensure_future(stop.wait())
        crashed: BaseException | None = None
        try:
            done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
            for t in tasks:
                if t in done and not t.cancelled() and t.exception() is not None:
                    crashed = t.exception()
        finally:
            stop.set()
            stopper.cancel()
            if self.dra is not None:
                log.info(
                    "Shutting down: removing our sockets %s and %s",
                    self.dra.registry_socket,
                    self.dra.service_socket,
                )
            else:
                log.info("Shutting down: ending streams, removing our socket %s", self.registrar.socket_path)
            # The loops first (each ends at `stop`; a registration in flight is cancelled), THEN
            # the streams: a stream that ends while the registrar still runs would be taken for a
            # kubelet's drop and registered again (kubelets before 1.37 close the new agent's
            # client when a leaving agent registers).
            for t in report_tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.inventory.close()
            if self.dra is not None:
                await self.dra.shutdown(self.options.shutdown_grace)
            else:
                await self.registrar.shutdown(self.options.shutdown_grace)
            await self.http.stop()
        if crashed is not None:
            raise crashed
