"""A tiny kubelet PodResources server (`v1.PodResourcesLister`) on a real Unix socket, whose answer
the test sets: which containers hold which device IDs of which resource. The agent's reports read
it exactly as they read the kubelet's; it counts the List calls, and can stop answering (UNAVAILABLE)
like a kubelet that is restarting.

`ThreadedPeers` runs such servers (and the Python kubelet peer) on an event loop of their own in a
background thread, for tests whose body is synchronous (a real API server, `wait_for` polling):
a blocking test body must not stall the peers the agent process talks to.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import grpc
from support.pykubelet import unix_server

from patchbay_agent.api import podresources_pb2 as pb
from patchbay_agent.api import podresources_pb2_grpc as pb_grpc

T = TypeVar("T")


class PodResourcesPeer(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, socket: Path) -> None:
        self.socket = socket
        #: (namespace, pod) -> container -> resource -> device IDs
        self._pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
        self.list_calls = 0
        #: False: answer UNAVAILABLE (a kubelet that is not there)
        self.answering = True
        self._server: grpc.aio.Server | None = None
        # The test may change the answer from another thread than the server's.
        self._lock = threading.Lock()

    # -- what the "kubelet" says -------------------------------------------------------------
    def hold(self, namespace: str, pod: str, container: str, resource: str, device_ids: list[str]) -> None:
        """The container holds these device IDs (replacing what it held of that resource)."""
        with self._lock:
            containers = self._pods.setdefault((namespace, pod), {})
            containers.setdefault(container, {})[resource] = list(device_ids)

    def remove_pod(self, namespace: str, pod: str) -> None:
        with self._lock:
            self._pods.pop((namespace, pod), None)

    def response(self) -> pb.ListPodResourcesResponse:
        with self._lock:
            return self._response()

    def _response(self) -> pb.ListPodResourcesResponse:
        return pb.ListPodResourcesResponse(
            pod_resources=[
                pb.PodResources(
                    name=pod,
                    namespace=namespace,
                    containers=[
                        pb.ContainerResources(
                            name=container,
                            devices=[
                                pb.ContainerDevices(resource_name=resource, device_ids=ids)
                                for resource, ids in resources.items()
                            ],
                        )
                        for container, resources in containers.items()
                    ],
                )
                for (namespace, pod), containers in self._pods.items()
            ]
        )

    # -- the service ---------------------------------------------------------------------------
    async def List(
        self, request: pb.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        self.list_calls += 1
        if not self.answering:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet is restarting")
        return self.response()

    async def start(self) -> None:
        self._server = await unix_server(self.socket, pb_grpc.add_PodResourcesListerServicer_to_server, self)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None

    async def __aenter__(self) -> PodResourcesPeer:
        """``async with PodResourcesPeer(...) as peer``: serving, and stopped at the end."""
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class ThreadedPeers:
    """An event loop in a daemon thread; `call(coro)` runs a coroutine there and waits for it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="peers")

    def __enter__(self) -> ThreadedPeers:
        self._thread.start()
        return self

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __exit__(self, *_: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
