"""One resource's agent, composed in one place: the device core (discovery + health monitor ->
inventory snapshots), the DeviceReport's writer when there is a profile, and ONE front-end, on one
event loop.

`ResourceAgent.__init__` is the composition: every part gets what it needs through its
constructor, built in an order that allows it (the core, then the PodResources reader and the
reporter, then the front-end, which is handed the reader's `allocated` and the reporter's
`notify`); subscriptions are made when a consumer is built, and nothing depends on their order.
The front-end is the one the options ask for and no other: `deviceplugin.frontend`
(`DevicePluginFrontEnd`: the servicer, the registrar, the CDI spec) or, with `DraOptions`
(`--dra-driver`, docs/dra.md), `dra.frontend` (`DraFrontEnd`: the kubelet plugin's sockets, claims
and their status, the ResourceSlices, the health stream). Each is imported only by an agent that
serves it: a DRA agent builds no device-plugin part, a device-plugin agent loads no DRA stub.

Start-up order matters: the first discovery/health round runs BEFORE anything is served, so the
kubelet's first list already carries the real devices (never an empty one that makes the kubelet
advertise 0 for a moment; docs/facts.md#plugin-sockets); then every CDI spec the agent owns is
written; then the front-end serves and registers (`FrontEnd.start`).

With a profile (`ReportOptions`, `--profile`), the agent also publishes a DeviceReport: the
reporter (`report/reporter.py`) subscribes to the inventory's snapshots and to the PodResources
reader (`core/holders.py`), and writes through the API client (`kubeclient.py`, imported only then) when
the report changed.

A changed profile is applied IN PLACE when the kubelet need not hear of it
(`ResourceAgent.reconfigure`): discovery, health and allocation settings swap under the running
server, the ListAndWatch stream stays open and the registration stands, so the resource never
leaves the kubelet, on every release (kubelets before 1.37 drop a resource whenever a stream ends:
docs/facts.md#kubelet-endpoints). What needs a new agent is the front-end's to say
(`FrontEnd.in_place_refusal`): a device plugin's registration options, device IDs, device node
permissions or CDI kind; any change of a DRA profile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from patchbay_agent.cdi import SpecGuard
from patchbay_agent.config import AgentConfig, Partitions
from patchbay_agent.core.inventory import Inventory, Snapshot
from patchbay_agent.core.monitor import Monitor
from patchbay_agent.discovery import HostRoot, make_backend
from patchbay_agent.httpserver import HttpEndpoint
from patchbay_agent.memory import settle_when_ready
from patchbay_agent.metrics import Metrics
from patchbay_agent.options import AgentOptions, ReportOptions
from patchbay_agent.report.failures import AllocationFailures
from patchbay_agent.wakeup import wait_any

if TYPE_CHECKING:
    from patchbay_agent.core.holders import PodHolders
    from patchbay_agent.dra.preparer import DraClient
    from patchbay_agent.dra.slicepublisher import SlicePublisher
    from patchbay_agent.kubelet.podresources import Container
    from patchbay_agent.report.devicereport import SliceState
    from patchbay_agent.report.reporter import ReportClient, Reporter

    class AgentClient(ReportClient, DraClient, Protocol):
        """Everything an agent may ask of the API (`kubeclient.KubeClient`)."""


log = logging.getLogger(__name__)

Tasks = list[asyncio.Task[None]]


class FrontEnd(Protocol):
    """What the agent asks of its front-end (`DevicePluginFrontEnd`, `DraFrontEnd`), in this
    order: `claim`, `cdi_guard`, `start`; at the end `shutting_down` and `shutdown`."""

    instance: str

    def claim(self) -> None:
        """Before the first round: make this process's socket paths its own (or raise)."""

    def cdi_guard(self, snap: Snapshot) -> SpecGuard | None:
        """Write every CDI spec the front-end owns now; the guard that keeps them."""

    async def start(self, stop: asyncio.Event) -> tuple[Tasks, Tasks]:
        """Serve and register: (its loops, its writers, which are cancelled at shutdown)."""

    def shutting_down(self) -> None:
        """Say what the shutdown removes."""

    async def shutdown(self, grace: float) -> None:
        """After the loops stopped: end the streams, remove the sockets."""

    def healthy(self) -> bool: ...

    def ready(self) -> bool: ...

    def in_place_refusal(self, config: AgentConfig) -> str | None:
        """Why `config` cannot be applied in place (None: it can)."""

    def reconfigure(self, config: AgentConfig) -> None: ...


def dra_holdings(
    inventory: Inventory, driver: str, pool: str, partitions: Partitions | None
) -> Callable[[Container], list[str]]:
    """A DRA agent's holders: the physical IDs (what the report uses) of the devices the
    kubelet's PodResources lists under a container's claims, for our driver and node pool, whole
    devices and partitions alike. A DRA profile's change restarts its agent, so `partitions` is
    the one it serves."""
    from patchbay_agent.dra.slices import pool_devices

    names_of = pool_devices(partitions)

    def held(c: Container) -> list[str]:
        claimed = c.claimed_devices(driver, pool)
        if not claimed:  # most containers: no need to name the node's devices
            return []
        names = names_of(inventory.current).physical
        return [names[n] for n in claimed if n in names]

    return held


def pod_holders(
    config: AgentConfig, options: AgentOptions, report: ReportOptions, inventory: Inventory, metrics: Metrics
) -> PodHolders:
    """The PodResources reader of an agent with reports: who holds which of our devices."""
    # Imported only here: an agent without reports pays nothing for them (the PodResources stubs
    # and the report code about 0.4 MiB).
    from patchbay_agent.core.holders import PodHolders

    held = None
    if options.dra is not None:
        held = dra_holdings(inventory, options.dra.driver, options.node_name, config.partitions)
    return PodHolders(
        report.pod_resources_socket,
        config.resource_name,
        metrics,
        period=report.pod_resources_period,
        held=held,
    )


class ResourceAgent:
    """One resource on one node: construct (fails fast on discovery errors), then `run()`."""

    def __init__(self, config: AgentConfig, options: AgentOptions, client: AgentClient | None = None) -> None:
        """`client`: the API client (`kubeclient.KubeClient` or a test's): writes the DeviceReport
        when `options.report` is set, reads claims and writes ResourceSlices when `options.dra`
        is, and tells a device plugin its kubelet's version; built by the command (main.py) or the
        node agent, never here. None: no API at all (a device plugin without a report); ValueError
        when reports or DRA need one."""
        self.config = config
        self.options = options
        self.metrics = Metrics(
            config.resource_name, options.node_name, holder_labels=options.metrics_holder_labels
        )
        self.inventory = Inventory(
            config.replicas, config.allocation.permissions, host_path_prefix=options.host_path_prefix
        )
        host_root = HostRoot(options.host_root)
        self.backend = make_backend(config.discovery, host_root)
        self.monitor = Monitor(self.backend, host_root, config.health, self.inventory, self.metrics)
        self.started = asyncio.Event()
        #: the Allocate / PreStartContainer calls and prepared claims answered with an error
        #: (the report's `allocationFailures`)
        self.failures = AllocationFailures()
        if client is None and (options.report or options.dra) is not None:
            # One place builds the agent's API client: the command (main.py) or the node agent.
            raise ValueError("an agent with a DeviceReport or a DRA driver needs an API client")
        #: the PodResources reader and the DeviceReport's writer, with a profile only
        self.holders: PodHolders | None = None
        self.reporter: Reporter | None = None
        #: DRA: the slices' publisher, whose state the report carries (`_slice_state`)
        self._publisher: SlicePublisher | None = None
        if options.report is not None:
            assert client is not None
            self.holders = pod_holders(config, options, options.report, self.inventory, self.metrics)
            self.reporter = self._reporter(options.report, self.holders, client)
        self.front = self._front_end(client)
        self.http = HttpEndpoint(
            self.metrics, self.front.healthy, self.front.ready, max_connections=options.http_max_connections
        )

    @property
    def instance(self) -> str:
        """The instance part of this process's socket names."""
        return self.front.instance

    def _front_end(self, client: AgentClient | None) -> FrontEnd:
        """The one front-end this agent serves, built here and only here (module doc)."""
        if self.options.dra is not None:
            from patchbay_agent.dra.frontend import DraFrontEnd

            assert client is not None

            dra = DraFrontEnd(
                self.config,
                self.options,
                self.inventory,
                self.metrics,
                client,
                holders=self.holders,
                on_state=self.reporter.notify if self.reporter is not None else None,
                on_failure=self.failures.record,
            )
            self._publisher = dra.publisher
            return dra
        from patchbay_agent.deviceplugin.frontend import DevicePluginFrontEnd

        return DevicePluginFrontEnd(
            self.config,
            self.options,
            self.inventory,
            self.metrics,
            holders=self.holders,
            api=client,
            on_failure=self.failures.record,
        )

    def _reporter(self, report: ReportOptions, holders: PodHolders, client: ReportClient) -> Reporter:
        """The DeviceReport's writer, subscribed to the snapshots and the holders."""
        from patchbay_agent.report.devicereport import ReportTarget, build_report
        from patchbay_agent.report.reporter import Reporter, report_watch

        target = ReportTarget(
            report.profile,
            self.options.node_name,
            report.namespace,
            self.config.resource_name,
            report.pod_name,
        )

        def build(node_uid: str | None) -> dict[str, Any]:
            return build_report(
                target,
                self.inventory.current,
                holders.containers,
                node_uid,
                slices=self._slice_state(),
                node_group=self.config.node_group,
                revision=self.config.revision,
                allocation_failures=self.failures.field(),
            )

        reporter = Reporter(target, client, build, self.metrics, watch=report_watch(client, target))
        holders.subscribe(reporter.notify)
        # A failure counts at once; the write is the change writer's, coalesced like any other.
        self.failures.subscribe(reporter.notify)
        self.inventory.subscribe(lambda _snap: reporter.notify())
        return reporter

    def _slice_state(self) -> SliceState | None:
        """DRA: what the API server does with the slices' taints, what is left out."""
        publisher = self._publisher
        if publisher is None:
            return None
        from patchbay_agent.report.devicereport import SliceState

        return SliceState(
            publisher.taints.value,
            frozenset(publisher.withheld),
            publisher.sharing.value if self.config.replicas > 1 else "",
            publisher.partitions.value if self.config.partitions is not None else "",
        )

    def in_place_refusal(self, config: AgentConfig) -> str | None:
        """Why `config` cannot be applied to this running agent in place (None: it can). A change
        of the revision's name alone (a change of the profile that does not reach this node, such
        as its node selector) is applied in place in every mode: only the report says it."""
        if replace(config, revision=self.config.revision) == self.config:
            return None
        return self.front.in_place_refusal(config)

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
        self.front.reconfigure(config)
        self.monitor.reconfigure(backend, config.health)
        if self.reporter is not None:
            self.reporter.notify()  # the report names the node group and revision, maybe all that changed
        log.info(
            "Applied the profile change for %s in place (registration and stream kept%s)",
            config.resource_name,
            ", new discovery" if backend is not None else "",
        )
        return True

    async def _report(self, stop: asyncio.Event) -> None:
        """The reporter, once the first PodResources read was tried: the first report already
        names the pods that hold devices."""
        assert self.holders is not None
        assert self.reporter is not None
        await wait_any((self.holders.attempted, stop), self.holders.rpc_timeout + 1.0)
        await self.reporter.run(stop)

    @property
    def ready(self) -> bool:
        """Registered with the kubelet as a DRA driver, or as a device plugin whose newest
        registration's ListAndWatch stream the kubelet holds (only then does it count our
        devices; a rollout removes the previous agent only after this one is Ready)."""
        return self.front.ready()

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set, then shut down gracefully (socket removed, streams ended).

        Raises ListTooLargeError from the first round: a list the kubelet would refuse is a
        configuration error, reported before anything is served; ValueError when our socket path
        is served by another process.
        """
        self.front.claim()
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
        guard = self.front.cdi_guard(snap)
        if self.options.http_address is not None:
            await self.http.start(*self.options.http_address)
        tasks = [asyncio.create_task(self.monitor.run(stop), name="monitor")]
        if guard is not None:
            tasks.append(asyncio.create_task(guard.run(stop), name="cdi-specs"))
        loops, writers = await self.front.start(stop)
        # Writers are cancelled, not awaited, at shutdown: a write hanging on the API server must
        # not delay removing our socket (the HTTP request itself ends within its timeout).
        report_tasks = list(writers)
        tasks += loops + writers
        if self.holders is not None and self.reporter is not None:
            more = [
                asyncio.create_task(self.holders.run(stop), name="pod-resources"),
                asyncio.create_task(self._report(stop), name="reporter"),
            ]
            report_tasks += more
            tasks += more
        settler = asyncio.create_task(settle_when_ready(self.front.ready, stop), name="settle-memory")
        self.started.set()
        stopper = asyncio.ensure_future(stop.wait())
        crashed: BaseException | None = None
        try:
            done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
            for t in tasks:
                if t in done and not t.cancelled() and t.exception() is not None:
                    crashed = t.exception()
            if crashed is None and not stop.is_set():
                # Each loop runs until `stop`; one that returned before it would otherwise stop
                # the agent with no word of why, and a standalone agent would exit 0.
                ended = ", ".join(t.get_name() for t in tasks if t in done)
                crashed = RuntimeError(f"the agent's {ended} loop ended by itself before a stop was asked")
                log.error("%s: stopping", crashed)
        finally:
            stop.set()
            stopper.cancel()
            settler.cancel()
            self.front.shutting_down()
            # The loops first (each ends at `stop`; a registration in flight is cancelled), THEN
            # the streams: a stream that ends while the registrar still runs would be taken for a
            # kubelet's drop and registered again (kubelets before 1.37 close the new agent's
            # client when a leaving agent registers).
            for t in report_tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.inventory.close()
            await self.front.shutdown(self.options.shutdown_grace)
            await self.http.stop()
        if crashed is not None:
            raise crashed
