"""DRA mode's device health to the kubelet: `NodeWatchResources` of `v1.DRAResourceHealth` and
`v1alpha1.DRAResourceHealth`.

The kubelet (ResourceHealthStatus, on by default from 1.36) opens this stream on the DRA service
socket and shows what it hears in the `allocatedResourcesStatus` of the pods that hold the devices
(docs/dra.md#health-to-the-kubelet). Which version it dials depends on its release
(docs/facts.md#dra-health-v1alpha1): 1.37 picks `v1` when GetInfo's supported_versions lists it,
else `v1alpha1`; 1.34 to 1.36 (with the gate on) dial `v1alpha1` whatever the plugin lists. So
both are served from the same lists: a v1alpha1 message is the v1 one read through the v1alpha1
types (every field number and type is the same, so are the bytes).

The kubelet keeps a reported health only for the device's timeout (30 s by default) counted from
when the message ARRIVED, then says Unknown: so the list is sent again as a heartbeat, not only on
changes.

Every message is the whole list, as the slices name it: pool = the node name, device =
`draslices.device_name(physical ID)`, HEALTHY when the snapshot counts the device healthy, else
UNHEALTHY with the tracker's reason (UNKNOWN only for a device the tracker never observed). A
device that leaves the snapshot is sent once more as UNKNOWN on that stream, then left out.

The list is built once per snapshot version (and unhealthy reasons) and API version, and shared by
every stream; a stream only waits on the inventory, so nothing here blocks the event loop. Streams
end cleanly (status OK) when the inventory closes at shutdown, and are cancelled with their
connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from patchbay_agent.api import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
)
from patchbay_agent.core.health import DeviceStatus
from patchbay_agent.core.inventory import Inventory, Snapshot
from patchbay_agent.dra.slices import device_name

log = logging.getLogger(__name__)

#: The timeout the agent asks for per device (the kubelet's default, said explicitly).
HEALTH_CHECK_TIMEOUT_SECONDS = 30
#: How often the list is sent when nothing changed: well inside the timeout.
HEARTBEAT_SECONDS = 10.0
#: The kubelet truncates longer messages.
MAX_MESSAGE_LENGTH = 1024

V1Response = dra_health_v1_pb2.NodeWatchResourcesResponse
V1alpha1Response = dra_health_v1alpha1_pb2.NodeWatchResourcesResponse
M = TypeVar("M", bound=Message)


def as_version(response: V1Response, message_type: type[M]) -> M:
    """`response` as the same message of another API version: v1 and v1alpha1 share every field
    number and type, so its bytes read as the other type unchanged."""
    if isinstance(response, message_type):
        return response
    return message_type.FromString(response.SerializeToString())


def _message(st: DeviceStatus | None) -> str:
    if st is None or st.healthy:
        return ""
    text = f"{st.reason}: {st.message}" if st.reason and st.message else st.reason or st.message
    return text[:MAX_MESSAGE_LENGTH]


def health_response(snap: Snapshot, pool: str, now: float) -> dra_health_v1_pb2.NodeWatchResourcesResponse:
    """The whole device list of `snap` as the kubelet wants it (see the module doc). Pure."""
    healthy = snap.healthy_physical
    devices = []
    for pid in snap.physical:
        if pid in healthy:
            health, message = dra_health_v1_pb2.HEALTHY, ""
        else:
            st = snap.status_of(pid)
            health = dra_health_v1_pb2.UNKNOWN if st is None else dra_health_v1_pb2.UNHEALTHY
            message = _message(st)
        devices.append(
            dra_health_v1_pb2.DeviceHealth(
                device=dra_health_v1_pb2.DeviceIdentifier(pool_name=pool, device_name=device_name(pid)),
                health=health,
                last_updated_time=int(now),
                health_check_timeout_seconds=HEALTH_CHECK_TIMEOUT_SECONDS,
                message=message,
            )
        )
    return dra_health_v1_pb2.NodeWatchResourcesResponse(devices=devices)


class HealthReports:
    """The current list, built once per snapshot version and unhealthy reasons."""

    def __init__(self, pool: str, inventory: Inventory, clock: Callable[[], float] = time.time) -> None:
        self.pool = pool
        self.inventory = inventory
        self._clock = clock
        self._key: tuple[object, ...] | None = None
        self._response = dra_health_v1_pb2.NodeWatchResourcesResponse()
        #: the current list in other API versions, built from `_response` on first use
        self._other: dict[type[Message], Message] = {}

    def response(self, snap: Snapshot) -> dra_health_v1_pb2.NodeWatchResourcesResponse:
        healthy = snap.healthy_physical
        sick = tuple((pid, _message(snap.status_of(pid))) for pid in snap.physical if pid not in healthy)
        key = (tuple(snap.physical), sick)
        if key != self._key:
            self._response = health_response(snap, self.pool, self._clock())
            self._key = key
            self._other = {}
        return self._response

    def response_as(self, snap: Snapshot, message_type: type[M]) -> M:
        """The current list as `message_type` (a v1 or v1alpha1 NodeWatchResourcesResponse),
        built once per list and version."""
        v1 = self.response(snap)
        if isinstance(v1, message_type):
            return v1
        cached = self._other.get(message_type)
        if not isinstance(cached, message_type):
            cached = self._other[message_type] = as_version(v1, message_type)
        return cached


class DraHealthServicer(dra_health_v1_pb2_grpc.DRAResourceHealthServicer):
    """`v1.DRAResourceHealth`: one stream per kubelet connection (see the module doc); its
    `v1alpha1` attribute serves `v1alpha1.DRAResourceHealth` from the same lists and counts."""

    def __init__(self, reports: HealthReports, heartbeat: float = HEARTBEAT_SECONDS) -> None:
        self._reports = reports
        self._heartbeat = heartbeat
        #: streams open now, over both versions (for tests and logs)
        self.streams = 0
        #: streams opened since the start, by API version ("v1", "v1alpha1")
        self.opened: dict[str, int] = {"v1": 0, "v1alpha1": 0}
        self.v1alpha1 = DraHealthV1alpha1Servicer(self)

    async def NodeWatchResources(  # noqa: N802 - the gRPC method name
        self,
        request: dra_health_v1_pb2.NodeWatchResourcesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[dra_health_v1_pb2.NodeWatchResourcesResponse]:
        async for message in self.watch(V1Response, "v1"):
            yield message

    async def watch(self, message_type: type[M], version: str) -> AsyncIterator[M]:
        """The stream in one API version: the list now, then on every change or heartbeat."""
        inventory = self._reports.inventory
        self.streams += 1
        self.opened[version] = self.opened.get(version, 0) + 1
        log.info("The kubelet watches device health over %s (%d stream(s))", version, self.streams)
        sent: set[str] = set()
        snap: Snapshot | None = inventory.current
        try:
            while snap is not None:
                response = self._reports.response(snap)
                names = {d.device.device_name for d in response.devices}
                gone = sent - names
                sent = names
                if gone:
                    yield as_version(_with_unknown(response, self._reports.pool, sorted(gone)), message_type)
                else:
                    yield self._reports.response_as(snap, message_type)
                try:
                    snap = await asyncio.wait_for(inventory.next_change(snap.version), self._heartbeat)
                except TimeoutError:
                    snap = inventory.current  # the heartbeat: the same list again
        finally:
            self.streams -= 1
            log.info("A device health stream ended (%d left)", self.streams)


class DraHealthV1alpha1Servicer(dra_health_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    """`v1alpha1.DRAResourceHealth`, the version kubelets before 1.37 dial: the v1 servicer's
    streams, in v1alpha1 types."""

    def __init__(self, v1: DraHealthServicer) -> None:
        self._v1 = v1

    async def NodeWatchResources(  # noqa: N802 - the gRPC method name
        self,
        request: dra_health_v1alpha1_pb2.NodeWatchResourcesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[dra_health_v1alpha1_pb2.NodeWatchResourcesResponse]:
        async for message in self._v1.watch(V1alpha1Response, "v1alpha1"):
            yield message


def _with_unknown(
    response: dra_health_v1_pb2.NodeWatchResourcesResponse, pool: str, names: list[str]
) -> dra_health_v1_pb2.NodeWatchResourcesResponse:
    out = dra_health_v1_pb2.NodeWatchResourcesResponse()
    out.CopyFrom(response)
    for name in names:
        out.devices.add(
            device=dra_health_v1_pb2.DeviceIdentifier(pool_name=pool, device_name=name),
            health=dra_health_v1_pb2.UNKNOWN,
            last_updated_time=int(time.time()),
            health_check_timeout_seconds=HEALTH_CHECK_TIMEOUT_SECONDS,
            message="no longer discovered",
        )
    return out
