"""The hand-over between two agents of one resource on kubelets that keep ONE client per resource.

Kubelets before 1.37 keep one device-plugin client per resource (learned from the Node's
kubeletVersion, or from a drop: docs/facts.md#kubelet-endpoints). There, when a rollout's new
agent finds another agent of its resource serving, it HANDS OVER once the kubelet holds its
stream, before it counts as ready: it registers a throw-away socket that refuses the kubelet's
dial-back. The kubelet registers that client in place of ours, fails to connect it and deletes
its client entry, while our stream (and the device manager's endpoint for it) stays. When the
previous agent then exits, the kubelet finds no client of the resource to close: no drop, no dip.

And when an agent leaves: handed over and with NO other agent of its resource serving (older or
newer), it registers its own socket again first, so that its exit makes the kubelet mark the
resource unhealthy as before; with another agent serving, never (its exit would close that
agent's client).

And when ANOTHER agent leaves while we stay: those kubelets send Allocate to the endpoint of the
resource's LAST registration, whoever made it, and a hand-over leaves that endpoint in place. So
when the agent that registered last leaves first (two template changes a second apart: the
older pod, slower to start, registered after the newer one and handed over to it), the kubelet
keeps counting our devices (our stream feeds them) but dials the leaver's removed socket for
every Allocate: pods are refused with "Allocate failed ... no such file or directory" until
someone registers again. The survivor registers again when the leaver may have registered after
its own newest registration (`may_hold_the_endpoint`): that registration was not handed over (an
agent hands over only to OLDER agents, so one that did not was alone or the older one), or the
leaver's socket appeared after it began; and only the NEWEST agent still serving does (an older
survivor that registered would leave the kubelet holding its client, with no older agent to hand
over to, and its own exit would then close it under the newer agent). Otherwise (the usual
rollout: we handed over to the leaver) nothing is sent, so the leaver's exit can never close a
client of ours (docs/facts.md#kubelet-endpoints). `HandOver` is this part of the registrar
(`registration.Registrar`), given the registrar's Register call when it is built.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal

import grpc

from patchbay_agent.deviceplugin.server import detach_server
from patchbay_agent.deviceplugin.streams import StreamWatch
from patchbay_agent.kubelet.sockets import is_same_resource, probe

log = logging.getLogger(__name__)

#: The first kubelet minor that keeps one device-plugin endpoint per socket path; before it, one
#: client per resource, and a rollout hands over (docs/facts.md#kubelet-endpoints). The test
#: matrix's capability `device-plugin-endpoint-per-socket` names the same release.
ENDPOINT_PER_SOCKET_SINCE = (1, 37)
#: How long the re-registration before a last exit may take (at most half the shutdown grace).
#: A hand-over registration has no deadline of its own: it waits for the kubelet's answer (see
#: `HandOver.hand_over`).
LAST_REGISTRATION_TIMEOUT = 2.0

#: One Register call: of our socket, or of `endpoint`, within `deadline` seconds.
Register = Callable[..., Awaitable[None]]


def keeps_one_client(kubelet_version: str) -> bool | None:
    """Whether a kubelet of this version (`v1.36.2`) keeps one client per resource; None for a
    form that cannot be read."""
    parsed = re.match(r"v?(\d+)\.(\d+)", kubelet_version)
    if parsed is None:
        return None
    return (int(parsed.group(1)), int(parsed.group(2))) < ENDPOINT_PER_SOCKET_SINCE


class HandOver:
    """When to hand over, the hand-over itself, and what to do before leaving (module doc)."""

    def __init__(
        self,
        plugin_dir: Path,
        resource_name: str,
        register: Register,
        streams: StreamWatch,
        kubelet_keeps_one_client: Callable[[], Awaitable[bool | None]] | None = None,
    ) -> None:
        """`register`: the registrar's Register call; `streams`: its servicer's streams (a drop
        proves one client per resource); `kubelet_keeps_one_client`: reads whether this kubelet
        keeps one client per resource (`learn`)."""
        self._kubelet_keeps_one_client = kubelet_keeps_one_client
        self._plugin_dir = plugin_dir
        self._resource_name = resource_name
        self._register = register
        self._streams = streams
        #: the kubelet keeps one client per resource (before 1.37); None: not known (read from the
        #: Node's kubeletVersion at start; a drop proves it too)
        self.one_client_per_resource: bool | None = None
        #: our newest registration was handed over
        self.done = False
        #: a hand-over registration is in flight: not Ready until the kubelet has answered it (else
        #: a rollout may remove the previous agent first, and its exit closes our stream)
        self.in_flight = False
        #: hand-overs the kubelet answered as it should
        self.count = 0
        #: other agents' sockets of our resource that appeared since our newest registration
        #: began: they may have registered after it
        self._arrived: set[str] = set()

    async def learn(self) -> None:
        """Ask once, before the registrar's loop starts, whether this kubelet keeps one client
        per resource (a drop proves it later too)."""
        if self._kubelet_keeps_one_client is not None:
            self.one_client_per_resource = await self._kubelet_keeps_one_client()

    def new_registration(self) -> None:
        """A fresh registration of ours: not handed over yet."""
        self.done = False

    def registering(self) -> None:
        """A Register of ours begins: every agent that registers after it arrives from now on."""
        self._arrived.clear()

    def arrived(self, name: str) -> None:
        """Another agent's socket of our resource appeared (`name`)."""
        self._arrived.add(name)

    def may_hold_the_endpoint(self, endpoint: str, name: str) -> bool:
        """Another agent's socket of our resource (`name`) went: whether, on a kubelet that keeps
        one client per resource, that agent may have registered after our newest registration,
        so that the kubelet's Allocate now dials its removed socket (module doc), and we are the
        one to register again: no agent NEWER than us serves. A newer one registered after us
        (and, with us serving, handed over), so the endpoint is its own or its decision; were we
        to register, the kubelet would hold OUR client (no older agent for us to hand over to)
        and our exit would take the newer agent's devices with it (seen on a v1.34.4 node: A
        alone, B and C 0.2 s apart, B removed, A registered again, A's exit left 0 healthy)."""
        arrived = name in self._arrived
        self._arrived.discard(name)
        if not self.one_client or (self.done and not arrived):
            return False
        return not self.serving_others(endpoint, than="newer")

    @property
    def one_client(self) -> bool:
        return bool(self.one_client_per_resource) or self._streams.drops > 0

    def due(self, endpoint: str) -> bool:
        """A hand-over is due: one client per resource, not yet handed over, and an older agent of
        the resource serving."""
        return self.one_client and not self.done and bool(self.serving_others(endpoint, than="older"))

    def serving_others(self, endpoint: str, *, than: Literal["older", "newer"] | None = None) -> list[str]:
        """Other agents' sockets of our resource that something serves now. `than="older"`: only
        sockets created no later than ours (a rollout, we the new half: only the newcomer hands
        over); `"newer"`: only sockets created after ours. Age is the sockets' modification time:
        each agent creates its socket when it serves, and registers at once."""
        try:
            names = os.listdir(self._plugin_dir)
            ours = os.stat(self._plugin_dir / endpoint).st_mtime_ns if than else 0
        except OSError:
            return []

        def of_age(name: str) -> bool:
            if than is None:
                return True
            try:
                theirs = os.stat(self._plugin_dir / name).st_mtime_ns
            except OSError:
                return False
            return theirs <= ours if than == "older" else theirs > ours

        return [
            n
            for n in names
            if n != endpoint
            and is_same_resource(n, self._resource_name)
            and of_age(n)
            and probe(self._plugin_dir / n) == 0
        ]

    async def hand_over(self, endpoint: str) -> None:
        """Register a socket that refuses the kubelet (see the module doc), then remove it. Done
        at most once per registration: whatever the kubelet answered, readiness is not held back
        again (at worst the previous agent's exit costs a drop, as without a hand-over).

        The call waits for the kubelet's answer, under the registrar's usual Register deadline
        (the kubelet's own dial-back gives up after 10 s), never a shorter one: the kubelet goes
        on with a Register whose caller gave up. With a 2 s deadline a busy machine made the
        agent give up, remove the socket and count as Ready while the kubelet still held the
        throw-away client and dialed its removed socket; the previous agent's exit then closed
        that client and marked every device unhealthy (a sockets test saw DEADLINE_EXCEEDED and
        no hand-over under load)."""
        self.done = True
        self.in_flight = True
        name = endpoint.removesuffix(".sock") + "-handover.sock"
        server = detach_server(self._plugin_dir / name)
        try:
            await server.start()
            await self._register(endpoint=name)
            log.warning("The kubelet accepted a hand-over registration it should have refused")
        except grpc.aio.AioRpcError as e:
            if "hand-over" in (e.details() or ""):
                self.count += 1
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
            # The throw-away socket goes BEFORE readiness is let go: a Ready agent leaves no
            # hand-over socket behind for the kubelet (or a later hand-over) to find.
            try:
                await server.stop(0, remove_socket=True)
            finally:
                self.in_flight = False

    async def before_leaving(self, endpoint: str, *, registered: bool, grace: float) -> None:
        """Handed over and with no other agent of the resource serving (older or newer), register
        our socket again: the kubelet then holds a client that our exit closes, and marks the
        resource unhealthy (capacity nobody serves must not stay). With another agent serving,
        never: our exit would close ITS client (kubelets before 1.37)."""
        others = self.serving_others(endpoint)
        if self.done and registered and not others:
            try:
                await self._register(deadline=min(LAST_REGISTRATION_TIMEOUT, max(grace / 2, 0.1)))
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
