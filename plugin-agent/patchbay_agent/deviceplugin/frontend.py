"""The Device Plugin front-end of one resource, composed: what `resourceagent.ResourceAgent`
builds for a device-plugin agent, and only for one (a DRA agent builds none of it).

Its parts, each given what it needs when it is built: the CDI spec file (`cdi.CdiSpecs`, with
`allocation.cdi.kind`), the gRPC servicer (`server.py`; it tells the PodResources reader after
every Allocate), and the `registration.Registrar`, which serves the servicer on this process's
own socket and keeps it registered. The socket's name has an instance part per process
(`kubelet/sockets.py`): during a rollout the old and the new agent of one resource are registered
side by side, and the old one's SIGTERM removes only its own socket; at start, sockets of the same
resource that dead agents left behind are removed (`claim`).

What the kubelet is told at registration (pre-start, preferred allocation), the device IDs
(sharing replicas), the device node permissions and the CDI kind cannot change under a running
registration (`in_place_refusal`); everything else can (`reconfigure`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from patchbay_agent.backoff import Backoff
from patchbay_agent.cdi import CdiSpecs, SpecGuard
from patchbay_agent.config import AgentConfig, PreferredPolicy
from patchbay_agent.core.inventory import Inventory, Snapshot
from patchbay_agent.deviceplugin.handover import keeps_one_client
from patchbay_agent.deviceplugin.registration import Registrar
from patchbay_agent.deviceplugin.server import DevicePluginServicer
from patchbay_agent.kubelet.sockets import check_path, new_instance, probe, remove_stale_sockets, socket_name
from patchbay_agent.metrics import Metrics
from patchbay_agent.options import AgentOptions

if TYPE_CHECKING:
    from patchbay_agent.core.holders import PodHolders

log = logging.getLogger(__name__)


class DevicePluginFrontEnd:
    """One resource as a device plugin (the module doc); driven as `resourceagent.FrontEnd`."""

    def __init__(
        self,
        config: AgentConfig,
        options: AgentOptions,
        inventory: Inventory,
        metrics: Metrics,
        *,
        holders: PodHolders | None = None,
        api: object | None = None,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        """`holders`: the PodResources reader, read again after every Allocate (None: no
        reports); `api`: the API client, whose `kubelet_version(node)` says whether the kubelet
        keeps one client per resource (None, or without that method: not known); `on_failure`:
        told of every Allocate or PreStartContainer answered with an error, with its message."""
        self._config = config
        self._options = options
        self._inventory = inventory
        self._api = api
        #: socket names this process has used: never drawn again
        self._used: set[str] = set()
        self.instance = options.instance if options.instance is not None else self._fresh_instance()
        endpoint = self._take(self.instance)
        check_path(options.plugin_dir / endpoint)
        kind = config.allocation.cdi_kind
        self.cdi = CdiSpecs(options.cdi_spec_dir, kind, config.resource_name) if kind else None
        self.servicer = DevicePluginServicer(
            config,
            inventory,
            metrics,
            self.cdi,
            on_allocated=holders.allocated if holders is not None else None,
            on_failure=on_failure,
        )
        self.registrar = Registrar(
            self.servicer,
            options.plugin_dir,
            endpoint,
            config.resource_name,
            metrics,
            poll_interval=options.poll_interval,
            backoff=Backoff(options.backoff_initial, options.backoff_max),
            rename=self._rename,
            kubelet_allocatable=self._kubelet_allocatable if options.report is not None else None,
            advertised_healthy=self.advertised_healthy,
            kubelet_keeps_one_client=self._kubelet_keeps_one_client,
        )

    async def _kubelet_keeps_one_client(self) -> bool | None:
        """Whether this node's kubelet keeps one device-plugin client per resource (before v1.37,
        docs/facts.md#kubelet-endpoints), from its Node's `status.nodeInfo.kubeletVersion`; None
        when that cannot be read (no API client, no answer within 5 s, an unknown form)."""
        getter = getattr(self._api, "kubelet_version", None)
        if getter is None:
            return None
        node = self._options.node_name
        try:
            version = await asyncio.wait_for(asyncio.to_thread(getter, node), 5.0)
        except Exception as e:
            log.warning("Cannot read the kubelet's version from Node %s: %s", node, e)
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

    async def _kubelet_allocatable(self, *, rpc_timeout: float) -> int:
        """How many of our devices the kubelet counts allocatable now (PodResources)."""
        from patchbay_agent.kubelet.podresources import get_allocatable_resources

        assert self._options.report is not None
        got = await get_allocatable_resources(
            self._options.report.pod_resources_socket, rpc_timeout=rpc_timeout
        )
        return got.count(self._config.resource_name)

    def advertised_healthy(self) -> tuple[int, int]:
        """(snapshot version, how many devices we advertise Healthy): what the kubelet should count."""
        snap = self._inventory.current
        return snap.version, len(snap.healthy)

    def _fresh_instance(self) -> str:
        """A random instance whose socket name is not in the plugin directory (used or not)."""
        while True:
            instance = new_instance()
            name = socket_name(self._config.resource_name, instance)
            if name not in self._used and not os.path.lexists(self._options.plugin_dir / name):
                return instance

    def _take(self, instance: str) -> str:
        """The socket name of `instance`, recorded as used by this process."""
        name = socket_name(self._config.resource_name, instance)
        self._used.add(name)
        return name

    def _rename(self) -> str:
        """A new socket name for this process (the kubelet refused the old path for good)."""
        self.instance = self._fresh_instance()
        return self._take(self.instance)

    def claim(self) -> None:
        """Before the first round: refuse a socket path another process serves (an --instance
        already taken), then remove this resource's stale sockets (their agents are gone)."""
        path = self.registrar.socket_path
        if probe(path) == 0:
            raise ValueError(
                f"{path} is served by another process: instance {self.instance!r} is taken "
                "(leave --instance out to draw a fresh one)"
            )
        remove_stale_sockets(self._options.plugin_dir, self._config.resource_name, keep=path.name)

    def cdi_guard(self, snap: Snapshot) -> SpecGuard | None:
        """Write the resource's CDI spec NOW (before serving: after a reboot emptied the CDI
        directory, a pod's container must resolve its CDI names as soon as the kubelet restarts
        it), and the guard that writes it again whenever it disappears."""
        cdi = self.cdi
        if cdi is None:
            return None
        try:
            cdi.ensure(snap)
        except OSError as e:
            # Allocate tries again (and refuses, saying why, if it still cannot).
            log.error("Cannot write the CDI spec %s: %s", cdi.path, e)

        def rewrite() -> int:
            return int(cdi.ensure(self._inventory.current))

        return SpecGuard(
            self._options.cdi_spec_dir, lambda: cdi.owned, rewrite, poll_interval=self._options.poll_interval
        )

    async def start(self, stop: asyncio.Event) -> tuple[list[asyncio.Task[None]], list[asyncio.Task[None]]]:
        """Learn the kubelet's kind, then serve and register (the registrar's loop): (its tasks,
        no writers)."""
        await self.registrar.handover.learn()
        return [asyncio.create_task(self.registrar.run(stop), name="registrar")], []

    def shutting_down(self) -> None:
        log.info("Shutting down: ending streams, removing our socket %s", self.registrar.socket_path)

    async def shutdown(self, grace: float) -> None:
        """After the loops stopped: end the streams, remove our socket (see `Registrar.shutdown`)."""
        await self.registrar.shutdown(grace)

    def healthy(self) -> bool:
        server = self.registrar.server
        return server is not None and server.serving

    def ready(self) -> bool:
        """The kubelet holds the stream of our newest registration (`Registrar.streaming`)."""
        return self.registrar.streaming

    def in_place_refusal(self, config: AgentConfig) -> str | None:
        """Why `config` cannot be applied under the running registration (None: it can)."""
        old = self._config
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

    def reconfigure(self, config: AgentConfig) -> None:
        """Answer Allocate, GetPreferredAllocation and PreStartContainer with `config` from now on
        (`in_place_refusal` said it may)."""
        self._config = config
        self.servicer.reconfigure(config)
