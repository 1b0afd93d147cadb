"""A proxy in front of the dev cluster's API server that serves one namespace's DeviceReports itself.

Why: the operator's memory with 5,000 reports at the CRD's bounds (0.75 MB of JSON each) cannot
be measured with the reports stored for real here: 3.7 GB is over etcd's default 2 GiB quota,
and the API server's watch cache would hold them decoded. So the operator (the real program, a
host process) talks to this proxy, which forwards every request to the API server (as the dev
cluster's admin) except the LIST and WATCH of ``--namespace``'s devicereports: a LIST is served
page by page (``limit``/``continue``) from one report per ``--node-label`` node, each the largest
the CRD admits (``--size bounds``) or a small one of 4 devices (``--size small``), naming that
node's agent pod (so the operator believes it); a WATCH stays open with no event. Listens on
127.0.0.1 only, with the API server's own serving certificate (it names 127.0.0.1).

    python -m patchbay_bench.reportproxy --pki DIR --upstream PORT --port PORT --namespace NS \
        --profile NAME --node-label KEY=VALUE --size bounds|small
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import ssl
import sys
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web
from support.reports import device_report

from patchbay_bench.peers import largest_report

PLACEHOLDERS = re.compile(rb'(NODE|"AGENT"|UID)')
"""What the template report holds in place of each node's values (re.split keeps them as parts)."""
HOP = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding", "host"}


def small_report(namespace: str, node: str, profile: str) -> dict[str, Any]:
    devices = [{"id": f"ttyUSB{i}", "health": "Healthy"} for i in range(4)]
    summary = {"total": 4, "healthy": 4, "unhealthy": 0, "allocated": 0}
    return device_report(namespace, node, profile, "example.com/serial", devices, summary, agent="")


class Proxy:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.upstream = f"https://127.0.0.1:{args.upstream}"
        self.reports_path = f"/apis/patchbay.dev/v1beta1/namespaces/{args.namespace}/devicereports"
        make = largest_report if args.size == "bounds" else small_report
        obj = make(args.namespace, "NODE", args.profile)
        obj["agent"] = "AGENT"
        obj["metadata"].update(resourceVersion="1", uid="UID")
        # The report's text cut once at its placeholders: each served report is the parts joined
        # with its node's values, a few microseconds, where three str.replace over 0.73 MB and
        # its encode took 2.2 ms a report (11 s of the two cores at 5,000 nodes, as much CPU as
        # the client's own decode: docs/benchmarks.md).
        self.parts = PLACEHOLDERS.split(json.dumps(obj, separators=(",", ":")).encode())
        self.session: ClientSession | None = None
        self._agents: list[tuple[str, str]] | None = None

    async def start(self) -> None:
        ctx = ssl.create_default_context(cafile=str(self.args.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.args.pki / "admin.crt"), str(self.args.pki / "admin.key"))
        # Bodies pass through as they come (auto_decompress off), so the API server must not
        # compress them: aiohttp asks for gzip by default, and the API server gzips a body over
        # 128 KiB (a LIST at 5,000 nodes), which the proxy would hand on without its header.
        self.session = ClientSession(
            connector=TCPConnector(ssl=ctx, limit=64),
            timeout=ClientTimeout(total=None, sock_read=None),
            auto_decompress=False,
            headers={"Accept-Encoding": "identity"},
        )

    async def agents(self) -> list[tuple[str, str]]:
        """(node, its agent pod) for every selected node, in a stable order: read once (the
        nodes and pods stand still during a run), not for every page, which at 5,000 nodes
        made each page wait seconds for two LISTs of the real API server."""
        if self._agents is None:
            self._agents = await self._read_agents()
        return self._agents

    async def _read_agents(self) -> list[tuple[str, str]]:
        assert self.session is not None
        key, _, value = self.args.node_label.partition("=")
        async with self.session.get(
            f"{self.upstream}/api/v1/nodes", params={"labelSelector": f"{key}={value}"}
        ) as r:
            nodes = sorted(n["metadata"]["name"] for n in (await r.json())["items"])
        pods_url = f"{self.upstream}/api/v1/namespaces/{self.args.namespace}/pods"
        async with self.session.get(
            pods_url, params={"labelSelector": f"patchbay.dev/profile={self.args.profile}"}
        ) as r:
            pods = {p["spec"].get("nodeName"): p["metadata"]["name"] for p in (await r.json())["items"]}
        return [(n, pods.get(n, "")) for n in nodes]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and request.path == self.reports_path:
            if request.query.get("watch") in ("1", "true"):
                return await self.hold(request)
            return await self.list_page(request)
        return await self.forward(request)

    async def list_page(self, request: web.Request) -> web.StreamResponse:
        everything = await self.agents()
        start = int(request.query.get("continue") or 0)
        limit = int(request.query.get("limit") or 0) or len(everything)
        page = everything[start : start + limit]
        more = start + limit < len(everything)
        meta: dict[str, Any] = {"resourceVersion": "1"}
        if more:
            meta.update(
                {"continue": str(start + limit), "remainingItemCount": len(everything) - start - limit}
            )
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        # As the API server writes a custom resource's list: keys sorted, the metadata last.
        await resp.write(b'{"apiVersion":"patchbay.dev/v1beta1","items":[')
        for i, (node, pod) in enumerate(page):
            values = {
                b"NODE": node.encode(),
                b'"AGENT"': json.dumps(pod).encode(),
                b"UID": f"u-{node}".encode(),
            }
            if i:
                await resp.write(b",")
            await resp.write(b"".join(values.get(part, part) for part in self.parts))
        tail = {"kind": "DeviceReportList", "metadata": meta}
        await resp.write(b"]," + json.dumps(tail, separators=(",", ":"))[1:].encode())
        await resp.write_eof()
        return resp

    async def hold(self, request: web.Request) -> web.StreamResponse:
        """A watch that sees nothing change, until its timeout (the client then opens another)."""
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await asyncio.sleep(min(float(request.query.get("timeoutSeconds") or 300), 600))
        await resp.write_eof()
        return resp

    async def forward(self, request: web.Request) -> web.StreamResponse:
        assert self.session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP | {"accept-encoding"}}
        body = await request.read()
        async with self.session.request(
            request.method, f"{self.upstream}{request.path_qs}", headers=headers, data=body or None
        ) as up:
            resp = web.StreamResponse(
                status=up.status, headers={k: v for k, v in up.headers.items() if k.lower() not in HOP}
            )
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp


async def serve(args: argparse.Namespace) -> None:
    proxy = Proxy(args)
    await proxy.start()
    app = web.Application(client_max_size=16 * 2**20)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(str(args.pki / "apiserver.crt"), str(args.pki / "apiserver.key"))
    await web.TCPSite(runner, "127.0.0.1", args.port, ssl_context=tls).start()
    print(f"serving on 127.0.0.1:{args.port}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pki", type=Path, required=True, help="the dev cluster's pki directory")
    ap.add_argument("--upstream", type=int, required=True, help="the API server's port on 127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--node-label", required=True)
    ap.add_argument("--size", choices=("bounds", "small"), default="bounds")
    asyncio.run(serve(ap.parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
