"""The floor under the agent's Allocate latency, its start time and its DRA prepare: a bare
`grpc.aio` server that answers at once, with none of the agent's code. The ``agent`` scenario starts
it as a third side, so the figures separate what Python's gRPC costs from what the agent adds.

    python -m patchbay_bench.floor SOCKET_PATH
    python -m patchbay_bench.floor SOCKET_PATH --register KUBELET_SOCKET RESOURCE DEVICES
    python -m patchbay_bench.floor SOCKET_PATH --dra POOL DEVICE

With ``--dra`` it serves the DRA kubelet plugin service instead (the ``dra_path`` scenario's
floor): NodePrepareResources answers every claim with DEVICE of POOL and one CDI device ID, with
no GET of the claim and no file written; NodeUnprepareResources answers every claim empty. What
a call to it costs is Python's gRPC server plus the socket: the least any Python DRA driver pays.

With ``--register`` it is also the least a Python device plugin does to be seen: it registers
with the kubelet and streams DEVICES healthy devices from ListAndWatch, so "exec -> the kubelet sees
the devices" has a Python floor beside the agent and the Go stub.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import grpc

from patchbay_agent.api import api_pb2, api_pb2_grpc, dra_v1_pb2, dra_v1_pb2_grpc

RESPONSE = api_pb2.AllocateResponse(
    container_responses=[
        api_pb2.ContainerAllocateResponse(
            envs={"PATCHBAY_DEVICES": "ttyUSB0", "BAUD": "115200"},
            devices=[
                api_pb2.DeviceSpec(container_path="/dev/ttyUSB0", host_path="/dev/ttyUSB0", permissions="rw")
            ],
        )
    ]
)


class Floor(api_pb2_grpc.DevicePluginServicer):
    def __init__(self, devices: int = 0) -> None:
        self.devices = [api_pb2.Device(ID=f"floor-{n}", health="Healthy") for n in range(devices)]

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: Any
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions()

    async def ListAndWatch(self, request: api_pb2.Empty, context: Any) -> Any:
        yield api_pb2.ListAndWatchResponse(devices=self.devices)
        await asyncio.Event().wait()  # nothing ever changes

    async def Allocate(self, request: api_pb2.AllocateRequest, context: Any) -> api_pb2.AllocateResponse:
        return RESPONSE


class DraFloor(dra_v1_pb2_grpc.DRAPluginServicer):
    """A DRA plugin that does none of the work: each claim gets the same one device."""

    def __init__(self, pool: str, device: str) -> None:
        cdi = [f"floor/dra={device}"]
        self.device = dra_v1_pb2.Device(
            request_names=["serial"], pool_name=pool, device_name=device, cdi_device_ids=cdi
        )

    async def NodePrepareResources(
        self, request: dra_v1_pb2.NodePrepareResourcesRequest, context: Any
    ) -> dra_v1_pb2.NodePrepareResourcesResponse:
        answer = dra_v1_pb2.NodePrepareResourceResponse(devices=[self.device])
        return dra_v1_pb2.NodePrepareResourcesResponse(claims={c.uid: answer for c in request.claims})

    async def NodeUnprepareResources(
        self, request: dra_v1_pb2.NodeUnprepareResourcesRequest, context: Any
    ) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
        return dra_v1_pb2.NodeUnprepareResourcesResponse(
            claims={c.uid: dra_v1_pb2.NodeUnprepareResourceResponse() for c in request.claims}
        )


async def main(socket: str, register: list[str], dra: list[str]) -> None:
    server = grpc.aio.server()
    if dra:
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(DraFloor(dra[0], dra[1]), server)  # type: ignore[no-untyped-call]
        register = []
    else:
        floor = Floor(int(register[2]) if register else 0)
        api_pb2_grpc.add_DevicePluginServicer_to_server(floor, server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    if register:
        kubelet, resource = register[0], register[1]
        async with grpc.aio.insecure_channel(f"unix://{kubelet}") as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            await stub.Register(
                api_pb2.RegisterRequest(
                    version="v1beta1", endpoint=socket.rsplit("/", 1)[-1], resource_name=resource
                ),
                timeout=10,
            )
    print('{"ready": true}', flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    args = sys.argv[1:]
    extra = args[args.index("--register") + 1 :] if "--register" in args else []
    dra = args[args.index("--dra") + 1 : args.index("--dra") + 3] if "--dra" in args else []
    asyncio.run(main(args[0], extra, dra))
