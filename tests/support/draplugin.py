"""The kubelet's side of a DRA driver's two sockets, as the tests play it: the plugin watcher's
registration (GetInfo, then NotifyRegistrationStatus) and the calls on the service socket."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from patchbay_agent.api import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)


async def register(registration: Path, seconds: float = 5) -> Any:
    """What the plugin watcher does with a new registration socket; the driver's InfoResponse."""
    async with grpc.aio.insecure_channel(f"unix://{registration}") as channel:
        stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=seconds)
        await stub.NotifyRegistrationStatus(
            pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=seconds
        )
        return info


async def node_call(endpoint: str, method: str, claim: dra_v1_pb2.Claim) -> Any:
    """``NodePrepareResources`` or ``NodeUnprepareResources`` (``method``) for one claim, as the
    kubelet calls it on the driver's service socket (within the 45 s it gives a call)."""
    async with grpc.aio.insecure_channel(f"unix://{endpoint}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        request = getattr(dra_v1_pb2, f"{method}Request")(claims=[claim])
        return await getattr(stub, method)(request, timeout=45)
