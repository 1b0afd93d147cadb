"""The node agent: ONE process per node serving every profile that shares the default agent and
selects this node, each in a unit of its own, supervised so that no profile shares a failure.

Each selected profile runs as its own `resourceagent.ResourceAgent` (its own discovery, health
monitor, device core, front-end: a device-plugin socket and registration or a DRA driver
registration, and its own DeviceReport), all on one event loop with one API client, one
PodResources socket and one HTTP endpoint (/metrics merges every unit's metrics with a `profile`
label). Isolation:

* a profile whose entry is refused (a bad glob, an unknown field) never starts; its DeviceReport
  says `agentError: ConfigInvalid` and why; the others serve;
* a unit that fails to start (discovery cannot work here) or crashes later is stopped alone
  (its sockets removed, its streams ended), reported (`agentError: AgentFailed`) and started
  again with backoff; the others never notice;
* blocking work (device scans, path checks, API writes) runs off the loop, so a hung probe or a
  hung filesystem holds that unit's round, not the loop (exec probes have their own timeouts).

Which profiles select the node is the entries' node selector terms against the Node's labels,
read from the API server at start (`NodeLabels`).

`NodeAgent` decides which profiles run here and applies changes (the entries, the labels, what
can change in place); `UnitSupervisor` runs one profile's agent, reports its failures and starts
it again; `Follower` follows the ConfigMap and the Node through the API server.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from patchbay_agent.backoff import Backoff
from patchbay_agent.config import ConfigError, parse_document
from patchbay_agent.httpserver import HttpEndpoint
from patchbay_agent.metrics import MergedRegistry, Metrics, Registry
from patchbay_agent.nodeconfig import NODE_CONFIG_KEY, ProfileEntry, parse_node_config, selected
from patchbay_agent.options import DEFAULTS, AgentOptions, DraOptions, ReportOptions, node_agent_plugins_dir
from patchbay_agent.report.devicereport import ReportTarget, failure_report
from patchbay_agent.report.reporter import ReportClient, Reporter, report_watch

if TYPE_CHECKING:
    from patchbay_agent.discovery.base import PhysicalDevice
    from patchbay_agent.inventory.keeper import InventoryKeeper
    from patchbay_agent.resourceagent import ResourceAgent

log = logging.getLogger(__name__)

#: Reasons a profile's DeviceReport gives in `agentError`.
CONFIG_INVALID = "ConfigInvalid"
AGENT_FAILED = "AgentFailed"
#: Restart rhythm of a unit that failed.
RESTART_INITIAL = 1.0
RESTART_MAX = 60.0


class NodeClient(ReportClient, Protocol):
    """What the node agent needs of the API besides each unit's needs."""

    def node_labels(self, node_name: str) -> dict[str, str]:
        """The Node's labels; raise when it cannot be read."""


@dataclass
class NodeOptions:
    """Where the node agent runs (flags); each unit's `AgentOptions` derive from it."""

    agent: AgentOptions
    report_namespace: str
    #: `--kubelet-root-dir`: DRA units register in its `plugins_registry/` and keep their drivers'
    #: directories in `plugins_dir` (None: `options.node_agent_plugins_dir` of it)
    kubelet_root_dir: Path = DEFAULTS["kubelet_root_dir"]
    plugins_dir: Path | None = None
    kubeconfig: Path | None = None
    restart_initial: float = RESTART_INITIAL
    restart_max: float = RESTART_MAX
    #: `--inventory-rescan`: the NodeInventory's backstop rescan, seconds; 0 keeps no inventory
    inventory_rescan: float = DEFAULTS["inventory_rescan"]


@dataclass
class Unit:
    """One profile on this node: its entry, its agent while it runs, what went wrong."""

    entry: ProfileEntry
    agent: ResourceAgent | None = None
    #: (reason, message, since) while the profile cannot be served
    failure: tuple[str, str, float] | None = None
    starts: int = 0
    ready_once: bool = False
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    #: while the profile cannot be served: the writer of its failure report
    failure_reporter: Reporter | None = None
    failure_task: asyncio.Task[None] | None = None
    failure_stop: asyncio.Event = field(default_factory=asyncio.Event)


class NodeAgent:
    """See the module doc. `run(stop)` until SIGTERM."""

    def __init__(
        self,
        entries: Sequence[ProfileEntry],
        options: NodeOptions,
        client: NodeClient,
        *,
        labels: Mapping[str, str] | None = None,
        follow: str | None = None,
    ) -> None:
        """`labels`: the Node's labels (default: read from the API server at `run`); `follow`:
        the name of the ConfigMap of the node config, watched with the Node for live changes."""
        self.entries = list(entries)
        self.options = options
        self.client = client
        self.labels = dict(labels) if labels is not None else None
        self.units: dict[str, Unit] = {}
        #: the ConfigMap (in the report namespace) to follow with the Node's labels; None: neither
        self.follow = follow
        self.reconfigurations = 0
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._pending: asyncio.Task[dict[str, str]] | None = None
        #: the NodeInventory's writer while it runs (`--inventory-rescan` above 0)
        self.keeper: InventoryKeeper | None = None
        self.http = HttpEndpoint(
            _Metrics(MergedRegistry(self._registries)),
            self._healthy,
            self._ready,
            max_connections=options.agent.http_max_connections,
        )

    def _registries(self) -> list[tuple[str, Registry]]:
        return [(n, u.agent.metrics.registry) for n, u in sorted(self.units.items()) if u.agent is not None]

    def _healthy(self) -> bool:
        return True

    def _ready(self) -> bool:
        """Ready once every unit served at least once or is reported failed: one profile's
        trouble must not hold the node's agent (and the other profiles' rollout) back."""
        return all(u.ready_once or u.failure is not None for u in self.units.values())

    def unit_options(self, entry: ProfileEntry) -> AgentOptions:
        base, node = self.options.agent, self.options
        report = replace(
            base.report or ReportOptions(profile="", namespace=""),
            profile=entry.profile,
            namespace=node.report_namespace,
            kubeconfig=node.kubeconfig,
        )
        dra = None
        if entry.driver and entry.mode == "DRA":
            # The shared node agent: every driver's directory inside its one directory under the
            # kubelet's plugins directory, the only part of it its pod mounts; an agent of its own
            # given the plugins directory itself: its driver's own (`draplugin.service_dir`).
            parent = node.plugins_dir or node_agent_plugins_dir(node.kubelet_root_dir)
            own = parent == node.kubelet_root_dir / "plugins"
            dra = DraOptions(entry.driver, node.kubelet_root_dir, node.kubeconfig, None if own else parent)
        return replace(base, http_address=None, instance=None, report=report, dra=dra)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve the selected profiles until `stop`, reconfiguring live when the config or the
        Node's labels change (`follow`), then stop them all."""
        self._stop = stop
        self._loop = asyncio.get_running_loop()
        if self.labels is None:
            self.labels = await self._read_labels(stop)
            if self.labels is None:
                return
        if self.options.agent.http_address is not None:
            await self.http.start(*self.options.agent.http_address)
        await self.reconfigure()
        keeper_stop = asyncio.Event()
        keeper_task = self._start_inventory(keeper_stop)
        followers: list[Follower] = []
        if self.follow is not None:
            client: Any = self.client  # kubeclient.KubeClient: a FollowClient too
            node = self.options.agent.node_name
            namespace = self.options.report_namespace
            followers = [
                Follower(client, ("v1", "configmaps", self.follow, namespace), self._deliver_config),
                Follower(client, ("v1", "nodes", node, None), self._deliver_node),
            ]
            for f in followers:
                f.start()
        try:
            await stop.wait()
        finally:
            for f in followers:
                f.stop()
            keeper_stop.set()
            if keeper_task is not None:
                await asyncio.gather(keeper_task, return_exceptions=True)
            async with self._lock:
                for name in list(self.units):
                    self.units[name].stop.set()
                tasks = [u.task for u in self.units.values() if u.task is not None]
                await asyncio.gather(*tasks, return_exceptions=True)
            await self.http.stop()

    def _start_inventory(self, stop: asyncio.Event) -> asyncio.Task[None] | None:
        """The NodeInventory's writer (`inventory.keeper`), for a client that can write it."""
        if self.options.inventory_rescan <= 0 or not hasattr(self.client, "apply_inventory"):
            return None
        from patchbay_agent.discovery.base import HostRoot
        from patchbay_agent.inventory.keeper import InventoryKeeper, inventory_watch

        agent = self.options.agent
        pod = agent.report.pod_name if agent.report is not None else None
        client: Any = self.client
        self.keeper = InventoryKeeper(
            HostRoot(agent.host_root),
            agent.node_name,
            pod,
            client,
            self.served,
            rescan=self.options.inventory_rescan,
            watch=inventory_watch(client, agent.node_name),
        )
        return asyncio.create_task(self.keeper.run(stop), name="node-inventory")

    def served(self) -> dict[str, list[PhysicalDevice]]:
        """Each running profile's devices now (what the NodeInventory says serves what)."""
        out: dict[str, list[PhysicalDevice]] = {}
        for name, unit in self.units.items():
            if unit.agent is not None and unit.agent.started.is_set():
                out[name] = list(unit.agent.inventory.current.physical.values())
        return out

    def _served_changed(self) -> None:
        if self.keeper is not None:
            self.keeper.notify()

    async def _read_labels(self, stop: asyncio.Event) -> dict[str, str] | None:
        """The Node's labels, asked again with backoff while the API server does not answer (an
        agent that exits would only crash-loop); None when stopped first."""
        backoff = Backoff(0.5, 30.0)
        node = self.options.agent.node_name
        while not stop.is_set():
            try:
                return await asyncio.to_thread(self.client.node_labels, node)
            except Exception as e:
                delay = backoff.next()
                log.warning("Cannot read node %s's labels (%s); again in %.1fs", node, e, delay)
                await _first((stop,), timeout=delay)
        return None

    async def reconfigure(self) -> dict[str, str]:
        """Bring the units in line with the entries and labels now: a profile no longer selected
        (or listed) stops, a new one starts, a changed one is applied to its running agent in
        place where the kubelet need not hear of it ("reconfigured": same registration, same
        stream, no dip on any release; `ResourceAgent.reconfigure`) and otherwise restarts and
        registers again ("restarted"); the other units are left alone. Returns what was done."""
        async with self._lock:
            assert self.labels is not None
            desired = {
                e.profile: e for e in selected(self.entries, self.labels, self.options.agent.node_name)
            }
            done: dict[str, str] = {}
            for name in sorted(set(self.units) - set(desired)):
                await self._stop_unit(name)
                done[name] = "stopped"
            for name, entry in desired.items():
                unit = self.units.get(name)
                if unit is not None and unit.entry.key == entry.key:
                    continue
                if unit is not None and self._reconfigure_in_place(unit, entry):
                    done[name] = "reconfigured"
                    continue
                if unit is not None:
                    await self._stop_unit(name)
                done[name] = "restarted" if unit is not None else "started"
                self._start_unit(entry)
            if done:
                self.reconfigurations += 1
                log.info(
                    "Node %s now serves %s (%s)",
                    self.options.agent.node_name,
                    ", ".join(sorted(self.units)) or "no profile",
                    ", ".join(f"{n} {what}" for n, what in sorted(done.items())),
                )
            return done

    def _reconfigure_in_place(self, unit: Unit, entry: ProfileEntry) -> bool:
        """Hand a changed entry to the unit's running agent; True when it took it in place."""
        agent, old = unit.agent, unit.entry
        if (
            agent is None
            or not agent.started.is_set()
            or unit.failure is not None
            or entry.config is None
            or old.config is None
            or (old.mode, old.driver) != (entry.mode, entry.driver)
        ):
            return False
        try:
            applied = agent.reconfigure(entry.config)
        except Exception as e:
            log.warning(
                "Cannot change DevicePluginProfile %s in place (%s); starting it again", entry.profile, e
            )
            return False
        if applied:
            unit.entry = entry  # a later restart of the unit (a crash) starts from the new entry
        return applied

    def _start_unit(self, entry: ProfileEntry) -> None:
        unit = self.units[entry.profile] = Unit(entry)
        supervisor = UnitSupervisor(
            unit, self.options, self.client, self.unit_options, changed=self._served_changed
        )
        unit.task = asyncio.create_task(supervisor.run(self._stop), name=f"profile-{entry.profile}")

    async def _stop_unit(self, name: str) -> None:
        unit = self.units.pop(name)
        unit.stop.set()
        if unit.task is not None:
            await asyncio.gather(unit.task, return_exceptions=True)
        self._served_changed()

    def update(
        self, entries: Sequence[ProfileEntry] | None = None, labels: Mapping[str, str] | None = None
    ) -> None:
        """New entries and/or labels (on the event loop): reconfigure when anything changed."""
        changed = False
        if entries is not None and [e.key for e in entries] != [e.key for e in self.entries]:
            self.entries, changed = list(entries), True
        if labels is not None and dict(labels) != self.labels:
            self.labels, changed = dict(labels), True
        if changed:
            self._pending = asyncio.create_task(self.reconfigure())

    def _deliver_config(self, obj: Mapping[str, Any]) -> None:
        """From the ConfigMap follower's thread: parse, then hand over to the loop."""
        text = str((obj.get("data") or {}).get(NODE_CONFIG_KEY) or "")
        try:
            entries = parse_node_config(parse_document(text, f"ConfigMap key {NODE_CONFIG_KEY}"))
        except ConfigError as e:
            log.error("Ignoring the new node config (keeping the current one): %s", e)
            return
        self._loop.call_soon_threadsafe(lambda: self.update(entries=entries))

    def _deliver_node(self, obj: Mapping[str, Any]) -> None:
        labels = {str(k): str(v) for k, v in ((obj.get("metadata") or {}).get("labels") or {}).items()}
        self._loop.call_soon_threadsafe(lambda: self.update(labels=labels))


class UnitSupervisor:
    """Runs one profile's agent on this node and keeps it running, alone (the module doc): a
    refused config or a failed agent is reported in the profile's DeviceReport (a reporter of its
    own while the failure lasts) and the agent is started again with backoff."""

    def __init__(
        self,
        unit: Unit,
        options: NodeOptions,
        client: NodeClient,
        unit_options: Callable[[ProfileEntry], AgentOptions],
        *,
        changed: Callable[[], None] = lambda: None,
    ) -> None:
        """`unit_options`: the options of a profile's agent (`NodeAgent.unit_options`); `changed`:
        called when the profile's devices change (the NodeInventory says what serves what)."""
        self.unit = unit
        self._changed = changed
        self._options = options
        self._client = client
        self._unit_options = unit_options

    def _target(self, entry: ProfileEntry) -> ReportTarget:
        opts = self._options
        pod = opts.agent.report.pod_name if opts.agent.report is not None else None
        resource = (
            entry.config.resource_name if entry.config is not None else str(entry.raw.get("resourceName"))
        )
        return ReportTarget(entry.profile, opts.agent.node_name, opts.report_namespace, resource, pod)

    async def run(self, stop: asyncio.Event) -> None:
        """Run the profile's agent; on failure report it, wait, start it again (see module doc)."""
        unit = self.unit
        entry = unit.entry
        try:
            if entry.config is None:
                log.error(
                    "Not serving DevicePluginProfile %s: its config is refused: %s",
                    entry.profile,
                    entry.error,
                )
                self._failed(CONFIG_INVALID, entry.error)
                await _first((stop, unit.stop))
                return
            backoff = Backoff(self._options.restart_initial, self._options.restart_max)
            while not (stop.is_set() or unit.stop.is_set()):
                unit.starts += 1
                agent_stop = asyncio.Event()
                try:
                    # Imported with the first unit: a node agent that serves no profile on its node
                    # never loads the front-ends (gRPC, the stubs).
                    from patchbay_agent.resourceagent import ResourceAgent

                    client: Any = self._client
                    entry = unit.entry  # changed in place since the last start, maybe
                    assert entry.config is not None
                    agent = unit.agent = ResourceAgent(entry.config, self._unit_options(entry), client)
                    runner = asyncio.create_task(agent.run(agent_stop), name=f"agent-{entry.profile}")
                    watch = asyncio.create_task(self._watch_start(agent))
                    await _first((stop, unit.stop), task=runner)
                    agent_stop.set()
                    watch.cancel()
                    await self._finish(runner)
                    if stop.is_set() or unit.stop.is_set():
                        return
                    crashed: BaseException = RuntimeError("the agent stopped by itself")
                except Exception as e:
                    crashed = e
                agent_stop.set()
                delay = backoff.next()
                message = f"{type(crashed).__name__}: {crashed}"
                log.error(
                    "DevicePluginProfile %s failed on this node (%s); starting it again in %.1fs; the "
                    "node's other profiles keep serving",
                    entry.profile,
                    message,
                    delay,
                )
                self._failed(AGENT_FAILED, message)
                await _first((stop, unit.stop), timeout=delay)
        finally:
            await self._stop_failure_report()

    async def _finish(self, runner: asyncio.Task[None]) -> None:
        """Let a stopped agent shut down gracefully; one stuck before it could look at its stop
        (its first round on a hung probe) is cancelled after the grace period and a margin."""
        await asyncio.wait({runner}, timeout=self._options.agent.shutdown_grace + 5.0)
        if not runner.done():
            runner.cancel()
        await runner

    async def _watch_start(self, agent: ResourceAgent) -> None:
        """The new agent started (its first round done, serving): it writes the profile's report
        from now on, so the failure report stops; ready once the kubelet has it."""
        unit = self.unit
        await agent.started.wait()
        agent.inventory.subscribe(lambda _snapshot: self._changed())
        self._changed()
        await self._stop_failure_report()
        unit.failure = None
        while not agent.ready:  # noqa: ASYNC110 - the front-ends have no event for it; a 0.1 s look
            await asyncio.sleep(0.1)
        unit.ready_once = True

    def _failed(self, reason: str, message: str) -> None:
        """Say why the profile is not served in its DeviceReport (written by a reporter of its own
        while the failure lasts; each new failure notifies it)."""
        unit = self.unit
        since = unit.failure[2] if unit.failure is not None else time.time()
        unit.failure = (reason, message, since)
        if unit.failure_reporter is None:
            target = self._target(unit.entry)

            def build(uid: str | None) -> dict[str, Any]:
                assert unit.failure is not None
                reason, message, since = unit.failure
                return failure_report(
                    target,
                    reason,
                    message,
                    since,
                    uid,
                    node_group=unit.entry.node_group,
                    revision=unit.entry.revision,
                )

            reporter = unit.failure_reporter = Reporter(
                target,
                self._client,
                build,
                Metrics(target.resource_name, target.node_name),
                watch=report_watch(self._client, target),
            )
            unit.failure_stop = asyncio.Event()
            unit.failure_task = asyncio.create_task(reporter.run(unit.failure_stop))
        else:
            unit.failure_reporter.notify()

    async def _stop_failure_report(self) -> None:
        unit = self.unit
        if unit.failure_task is not None:
            unit.failure_stop.set()
            await asyncio.gather(unit.failure_task, return_exceptions=True)
        unit.failure_reporter, unit.failure_task = None, None


class FollowClient(Protocol):
    """What following an object needs of the API (`kubeclient.KubeClient`)."""

    def get_object(
        self, version: str, plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any]: ...

    def watch_object(
        self,
        version: str,
        plural: str,
        name: str,
        resource_version: str,
        *,
        namespace: str | None = None,
        timeout_seconds: int = 300,
    ) -> Iterator[tuple[str, dict[str, Any]]]: ...


class Follower(threading.Thread):
    """One object by name: GET, then WATCH from its resourceVersion, again and again; every
    version seen goes to `deliver` (in this thread). On a failure or a 410 it lists again after a
    backoff. A daemon thread: it never holds the process at exit."""

    def __init__(
        self,
        client: FollowClient,
        what: tuple[str, str, str, str | None],
        deliver: Callable[[Mapping[str, Any]], None],
    ) -> None:
        """`what`: (API version, plural, name, namespace or None)."""
        version, plural, name, namespace = what
        super().__init__(name=f"follow-{plural}-{name}", daemon=True)
        self._client, self._version, self._plural, self._name = client, version, plural, name
        self._deliver, self._namespace = deliver, namespace
        self._stopped = threading.Event()
        self.events = 0

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        backoff = Backoff(1.0, 30.0)
        while not self._stopped.is_set():
            try:
                obj = self._client.get_object(self._version, self._plural, self._name, self._namespace)
                self._deliver(obj)
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
                for kind, event in self._client.watch_object(
                    self._version, self._plural, self._name, rv, namespace=self._namespace
                ):
                    if self._stopped.is_set():
                        return
                    if kind == "ERROR":
                        break
                    self.events += 1
                    if kind in ("ADDED", "MODIFIED"):
                        self._deliver(event)
                backoff.reset()
            except Exception as e:
                delay = backoff.next()
                log.warning("Following %s %s failed (%s); again in %.1fs", self._plural, self._name, e, delay)
                self._stopped.wait(delay)


class _Metrics:
    """What HttpEndpoint needs: a `registry` to render."""

    def __init__(self, registry: MergedRegistry) -> None:
        self.registry = registry


def entries_changed(old: Sequence[ProfileEntry], new: Sequence[ProfileEntry]) -> dict[str, str]:
    """profile -> "added" / "removed" / "changed" between two configs (unchanged ones left out)."""
    before = {e.profile: e.key for e in old}
    after = {e.profile: e.key for e in new}
    out = {p: "removed" for p in before.keys() - after.keys()}
    out |= {p: "added" for p in after.keys() - before.keys()}
    out |= {p: "changed" for p in before.keys() & after.keys() if before[p] != after[p]}
    return out


async def _first(
    events: Sequence[asyncio.Event],
    task: asyncio.Task[None] | None = None,
    timeout: float | None = None,  # noqa: ASYNC109 - a wait that ends early on events, not a deadline
) -> None:
    """Until one of `events` is set, `task` ends (its result is not taken) or `timeout` passed."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(
            [*waiters, *([task] if task else [])], timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for w in waiters:
            w.cancel()
