"""The DRA front-end of one resource, composed: what `resourceagent.ResourceAgent` builds for a
DRA agent (`--dra-driver`, docs/dra.md), and only for one (a device-plugin agent imports none of
it, a DRA agent builds no device-plugin part).

Its parts, built in an order that lets each get what it needs through its constructor: the
prepare calls' activity (`plugin.CallActivity`), the claims' status writer (which waits until
those calls are quiet), the slice publisher (which tells the DeviceReport what the API server
keeps), the claim preparer (which tells the status writer and the PodResources reader), and the
kubelet plugin's sockets (`plugin.DraPlugin`, whose every registration re-asserts the slices),
with the health stream. The publisher and the status writer are the front-end's writers: the
agent cancels them, rather than waiting, when it stops.

Every change of a DRA profile registers again (`in_place_refusal`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from patchbay_agent.backoff import Backoff
from patchbay_agent.cdi import SpecCopies, SpecGuard
from patchbay_agent.config import AgentConfig
from patchbay_agent.core.inventory import Inventory, Snapshot
from patchbay_agent.dra.claimstatus import ClaimStatusWriter
from patchbay_agent.dra.healthservice import DraHealthServicer, HealthReports
from patchbay_agent.dra.metadata import HOST_SUBDIR, DeviceMetadataFiles
from patchbay_agent.dra.preparer import ClaimPreparer, DraClient
from patchbay_agent.dra.slicepublisher import SlicePublisher, slice_watch
from patchbay_agent.dra.slices import slice_devices
from patchbay_agent.kubelet.draplugin import (
    LOCK_FILE_NAME,
    REGISTRY_DIR,
    CallActivity,
    DraPlugin,
    registry_socket_name,
    service_dir,
    service_socket_name,
)
from patchbay_agent.kubelet.sockets import check_path, new_instance
from patchbay_agent.metrics import Metrics
from patchbay_agent.options import AgentOptions

if TYPE_CHECKING:
    from patchbay_agent.core.holders import PodHolders

log = logging.getLogger(__name__)


def _free_instance(registry_dir: Path, services: Path, driver: str) -> str:
    """A fresh instance whose two socket paths are both free."""
    while True:
        instance = new_instance()
        if not os.path.lexists(registry_dir / registry_socket_name(driver, instance, registry_dir)) and (
            not os.path.lexists(services / service_socket_name(instance))
        ):
            return instance


class DraFrontEnd:
    """One resource as a DRA driver (the module doc); driven as `resourceagent.FrontEnd`."""

    def __init__(
        self,
        config: AgentConfig,
        options: AgentOptions,
        inventory: Inventory,
        metrics: Metrics,
        client: DraClient,
        *,
        holders: PodHolders | None = None,
        on_state: Callable[[], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        """`options.dra` is set. `client`: claims to read and their status to write, slices to
        write; `holders`: the PodResources reader (devices pods still hold through the device
        plugin are tainted in the slices, and it reads again after every prepare); `on_state`:
        called when what the API server keeps of the slices changed (the DeviceReport says it);
        `on_failure`: told of every claim NodePrepareResources answers with an error."""
        dra = options.dra
        assert dra is not None
        registry_dir = dra.kubelet_root_dir / REGISTRY_DIR
        services = service_dir(dra.kubelet_root_dir, dra.driver, dra.plugins_dir)
        self.instance = (
            options.instance
            if options.instance is not None
            else _free_instance(registry_dir, services, dra.driver)
        )
        calls = CallActivity()
        self.claim_status = ClaimStatusWriter(
            dra.driver,
            options.node_name,
            client,
            inventory,
            metrics,
            state_dir=services,
            quiet=calls.quiet,
        )
        publisher = self.publisher = SlicePublisher(
            dra.driver,
            options.node_name,
            client,
            lambda: slice_devices(
                inventory.current,
                holders.plugin_held if holders is not None else (),
                config.health.taint_effect,
                config.replicas,
            ),
            metrics,
            on_state=on_state,
            partitions=config.partitions,
            watch=slice_watch(client, dra.driver, options.node_name),
        )
        inventory.subscribe(lambda _snap: publisher.notify())
        if holders is not None:
            # Devices pods still hold through the device plugin (a node moving to DRA) are tainted
            # in the slices: the publisher hears about every change of the holders too.
            holders.subscribe(publisher.notify)
        self.preparer = ClaimPreparer(
            dra.driver,
            options.node_name,
            client,
            inventory,
            allocation=config.allocation,
            cdi_spec_dir=options.cdi_spec_dir,
            lock_path=services / LOCK_FILE_NAME,
            read_async=client.claim_read_async(),
            copies=SpecCopies(options.cdi_spec_dir, services),
            calls=calls,
            status=self.claim_status,
            on_change=holders.allocated if holders is not None else None,
            metrics=metrics,
            metadata=(
                DeviceMetadataFiles(dra.driver, options.node_name, services / HOST_SUBDIR)
                if config.allocation.device_metadata
                else None
            ),
            partitions=config.partitions,
            on_failure=on_failure,
        )
        if self.preparer.metadata is not None:
            inventory.subscribe(lambda _snap: self._refresh_metadata())
        self.plugin = DraPlugin(
            dra.driver,
            dra.kubelet_root_dir,
            self.instance,
            self.preparer,
            metrics,
            poll_interval=options.poll_interval,
            backoff=Backoff(options.backoff_initial, options.backoff_max),
            health=DraHealthServicer(HealthReports(options.node_name, inventory)),
            plugins_dir=dra.plugins_dir,
            on_registered=publisher.force,
        )
        check_path(self.plugin.registry_socket)
        check_path(self.plugin.service_socket)
        self._options = options

    def _refresh_metadata(self) -> None:
        """A new snapshot: the prepared claims' metadata files follow it, off the event loop."""
        with contextlib.suppress(RuntimeError):  # no running loop: a test's direct update
            asyncio.get_running_loop().run_in_executor(None, self._refresh_metadata_now)
            return
        self._refresh_metadata_now()

    def _refresh_metadata_now(self) -> None:
        try:
            if written := self.preparer.refresh_metadata():
                log.info("Device metadata of %d prepared request(s) updated", written)
        except Exception:
            log.exception("Updating the prepared claims' device metadata failed")

    def claim(self) -> None:
        """Nothing before the first round: `start` refuses paths another process serves."""

    def cdi_guard(self, snap: Snapshot) -> SpecGuard | None:
        """Write every claim's CDI spec back from its copy NOW (before registering: after a reboot
        emptied the CDI directory, the kubelet restarts the claims' containers without preparing
        them again), and the guard that writes them again whenever one disappears. First the
        copies a previous agent had not made yet (it died between a prepare's answer and the
        copy, `preparer.LateWrites`): the spec in the directory is the newer one."""
        copies = self.preparer.copies
        if copies is None:
            return None
        self.preparer.late.recover_copies()
        copies.restore(compare=True)
        return SpecGuard(
            self._options.cdi_spec_dir,
            lambda: copies.owned,
            copies.restore,
            poll_interval=self._options.poll_interval,
        )

    async def start(self, stop: asyncio.Event) -> tuple[list[asyncio.Task[None]], list[asyncio.Task[None]]]:
        """Serve both sockets: (the plugin's loop, the writers: slices and claims' status)."""
        await self.plugin.start()
        return [asyncio.create_task(self.plugin.run(stop), name="dra-plugin")], [
            asyncio.create_task(self.publisher.run(stop), name="resource-slices"),
            asyncio.create_task(self.claim_status.run(stop), name="claim-status"),
        ]

    def shutting_down(self) -> None:
        log.info(
            "Shutting down: removing our sockets %s and %s",
            self.plugin.registry_socket,
            self.plugin.service_socket,
        )

    async def shutdown(self, grace: float) -> None:
        """Registration socket first (the kubelet deregisters), then the DRA service, then the
        answered prepares' late writes."""
        await self.plugin.shutdown(grace)
        await self.preparer.late.settle()

    def healthy(self) -> bool:
        return self.plugin.serving

    def ready(self) -> bool:
        """The kubelet said `plugin_registered=true`."""
        return self.plugin.registered

    def in_place_refusal(self, config: AgentConfig) -> str | None:
        return "a DRA profile registers again on every change"

    def reconfigure(self, config: AgentConfig) -> None:
        """Never called (`in_place_refusal`); a new taint effect would reach the slices at once."""
        self.publisher.notify()
