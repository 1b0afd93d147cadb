"""The floor under the agent's Allocate latency: a bare `grpc.aio` server whose Allocate returns a
constant response, with none of the agent's code. The ``agent`` scenario starts it as a third
side, so the figures separate what Python's gRPC costs from what the agent adds.

    python -m patchbay_bench.floor SOCKET_PATH
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import grpc

from patchbay_agent.api import api_pb2, api_pb2_grpc

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
    async def Allocate(self, request: api_pb2.AllocateRequest, context: Any) -> api_pb2.AllocateResponse:
        return RESPONSE


async def main(socket: str) -> None:
    server = grpc.aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(Floor(), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    print('{"ready": true}', flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
