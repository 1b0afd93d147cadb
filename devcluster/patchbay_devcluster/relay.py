"""A TCP relay that lets the real node's pods reach the API server, which listens on loopback.

Pods on the pod network (the bridge of :mod:`patchbay_devcluster.podnetwork`) cannot reach the
machine's 127.0.0.1. The cluster runs this relay on the bridge's own address, and only there:
for each connection it opens one to the API server and copies bytes both ways, looking at none
of them. TLS passes through untouched, so the API server still authenticates every client itself
and clients verify the API server's certificate, which names the bridge address.

Bounded: at most ``--max-connections`` at once (one more is closed at once, with a warning), an
upstream connect that takes longer than ``--connect-timeout`` fails the connection, a connection
with no bytes either way for ``--idle-timeout`` seconds is closed (the default outlasts the API
server's longest watch), and TCP keepalives find peers that vanished without a word (a pod whose
network namespace is gone). SIGTERM or SIGINT closes the listener and every connection and exits
0. Each connection is logged at debug level (``--verbose``)::

    python -m patchbay_devcluster.relay --listen 10.244.0.1:6443 --connect 127.0.0.1:45678

It never listens on a wildcard address: ``--listen`` must be one address of this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import ipaddress
import logging
import signal
import socket
import sys
from collections.abc import Callable

MODULE = "patchbay_devcluster.relay"
log = logging.getLogger(MODULE)  # the same name when run with ``python -m``

Address = tuple[str, int]

MAX_CONNECTIONS = 256
IDLE_TIMEOUT = 3900.0
"""Seconds without a byte either way. The API server ends a watch after 30 to 60 minutes
(``--min-request-timeout`` 1800s, randomised up to twice that), and a quiet watch sends nothing
until then: a shorter limit would cut watches the API server would have kept."""
CONNECT_TIMEOUT = 5.0
CHUNK = 64 * 1024
KEEPALIVE = (60, 10, 3)
"""TCP keepalive on the pods' side: first probe after 60s idle, then every 10s, 3 unanswered = dead."""


def format_address(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(text: str, *, listen: bool = False) -> Address:
    """``IP:PORT`` (``[IPv6]:PORT``) as (ip, port). A listen address may not be a wildcard."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r}: expected IP:PORT")
    try:
        ip = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        raise ValueError(f"{text!r}: {host!r} is not an IP address") from None
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r}: {port!r} is not a port (1-65535)")
    if listen and ip.is_unspecified:
        raise ValueError(f"{text!r}: listen on one address, never on all of them")
    return str(ip), int(port)


def argv(
    listen: Address, connect: Address, *, python: str = sys.executable, verbose: bool = True
) -> list[str]:
    """The command line that runs the relay as its own process (``MODULE`` is in it, so a PID
    check can tell this Python process from any other)."""
    out = [python, "-m", MODULE, "--listen", format_address(listen), "--connect", format_address(connect)]
    return [*out, "--verbose"] if verbose else out


class Relay:
    """Accepts connections on ``listen`` and splices each one to a new connection to ``connect``."""

    def __init__(
        self,
        listen: Address,
        connect: Address,
        *,
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout: float = IDLE_TIMEOUT,
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        self.listen = listen
        self.connect = connect
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.connect_timeout = connect_timeout
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._count = 0

    @property
    def active(self) -> int:
        return len(self._connections)

    async def start(self) -> Address:
        """Listen; returns the address bound (the port the kernel picked, for port 0)."""
        self._server = await asyncio.start_server(self._handle, self.listen[0], self.listen[1], backlog=128)
        host, port = self._server.sockets[0].getsockname()[:2]
        log.info("Relaying %s to %s", format_address((host, port)), format_address(self.connect))
        return host, port

    async def close(self) -> None:
        """Stop listening, then close every open connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        log.info("Relay closed")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer(writer)
        if len(self._connections) >= self.max_connections:
            log.warning("Refused %s: %d connections open, the most allowed", peer, len(self._connections))
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        # Only close() cancels a connection, and both ends are closed on the way out. Ending
        # quietly: asyncio's stream server logs a handler that ends cancelled as an error.
        with contextlib.suppress(asyncio.CancelledError):
            await self._relay(task, peer, reader, writer)

    async def _relay(
        self, task: asyncio.Task[None], peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._count += 1
        n = self._count
        _keepalive(writer)
        loop = asyncio.get_running_loop()
        started = loop.time()
        counts = [0, 0]  # bytes from the client, bytes to it
        upstream: asyncio.StreamWriter | None = None
        clean = False
        outcome = "cancelled"
        try:
            try:
                async with asyncio.timeout(self.connect_timeout):
                    up_reader, upstream = await asyncio.open_connection(*self.connect)
            except OSError as e:  # TimeoutError included
                outcome = f"connect to {format_address(self.connect)} failed: {e!r}"
                return
            log.debug("#%d %s connected to %s", n, peer, format_address(self.connect))
            try:
                clean = await self._splice(reader, writer, up_reader, upstream, counts)
            except OSError as e:
                reset = isinstance(e, ConnectionError) or e.errno == errno.ENOTCONN
                outcome = f"reset by a peer ({e!r})" if reset else f"error: {e!r}"
            else:
                outcome = "closed" if clean else f"idle for {self.idle_timeout:g}s"
        finally:
            self._connections.discard(task)
            for w in (writer, upstream):
                if w is not None:
                    await _close(w, graceful=clean)
            log.debug(
                "#%d %s %s after %.1fs (%d bytes in, %d out)",
                n,
                peer,
                outcome,
                loop.time() - started,
                counts[0],
                counts[1],
            )

    async def _splice(
        self,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        up_r: asyncio.StreamReader,
        up_w: asyncio.StreamWriter,
        counts: list[int],
    ) -> bool:
        """Copy both ways until both sides have closed (True) or nothing moved for the idle
        timeout (False); the first error of either direction is raised (the other one is then
        cancelled)."""
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[None]] = []
        try:
            async with asyncio.timeout(self.idle_timeout) as deadline:

                def touch() -> None:
                    deadline.reschedule(loop.time() + self.idle_timeout)

                tasks += [
                    asyncio.create_task(_pump(client_r, up_w, touch, counts, 0)),
                    asyncio.create_task(_pump(up_r, client_w, touch, counts, 1)),
                ]
                for finished in asyncio.as_completed(tasks):
                    await finished
        except TimeoutError:
            if deadline.expired():
                return False
            raise  # a socket's own timeout (ETIMEDOUT: keepalives unanswered)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return True


async def _pump(
    src: asyncio.StreamReader, dst: asyncio.StreamWriter, touch: Callable[[], None], counts: list[int], i: int
) -> None:
    """Copy ``src`` to ``dst`` until ``src`` ends, then pass the end on (a half-close)."""
    while data := await src.read(CHUNK):
        touch()
        dst.write(data)
        await dst.drain()
        counts[i] += len(data)
    if dst.can_write_eof():
        dst.write_eof()


async def _close(writer: asyncio.StreamWriter, graceful: bool) -> None:
    """Close after flushing (a clean end), else at once (an error, idle or shutdown)."""
    if graceful:
        writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(5):
                await writer.wait_closed()
                return
    writer.transport.abort()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return format_address((peer[0], peer[1])) if peer else "?"


def _keepalive(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        idle, interval, count = KEEPALIVE
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)


async def run(relay: Relay) -> None:
    """Serve until SIGTERM or SIGINT, then close cleanly."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await relay.start()
    try:
        await stop.wait()
        log.info("Stopping (%d connections open)", relay.active)
    finally:
        await relay.close()


def build_parser() -> argparse.ArgumentParser:
    def address(listen: bool) -> Callable[[str], Address]:
        def parse(text: str) -> Address:
            try:
                return parse_address(text, listen=listen)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e)) from None

        return parse

    def positive(kind: Callable[[str], float]) -> Callable[[str], float]:
        def parse(text: str) -> float:
            value = kind(text)
            if value <= 0:
                raise argparse.ArgumentTypeError(f"{text}: must be > 0")
            return value

        return parse

    p = argparse.ArgumentParser(
        prog=f"python -m {MODULE}",
        description="Copy TCP connections from one address of this machine to another, both "
        "ways, byte for byte (TLS passes through). The dev cluster runs it on the pod network's "
        "bridge address so that pods reach the API server on 127.0.0.1.",
    )
    p.add_argument("--listen", required=True, type=address(True), metavar="IP:PORT", help="never a wildcard")
    p.add_argument("--connect", required=True, type=address(False), metavar="IP:PORT")
    p.add_argument("--max-connections", type=positive(int), default=MAX_CONNECTIONS)
    p.add_argument("--idle-timeout", type=positive(float), default=IDLE_TIMEOUT, metavar="SECONDS")
    p.add_argument("--connect-timeout", type=positive(float), default=CONNECT_TIMEOUT, metavar="SECONDS")
    p.add_argument("-v", "--verbose", action="store_true", help="log every connection")
    return p


def main(args: list[str] | None = None) -> int:
    opts = build_parser().parse_args(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    if opts.verbose:
        log.setLevel(logging.DEBUG)  # this module's connections, not asyncio's internals
    relay = Relay(
        opts.listen,
        opts.connect,
        max_connections=int(opts.max_connections),
        idle_timeout=opts.idle_timeout,
        connect_timeout=opts.connect_timeout,
    )
    try:
        asyncio.run(run(relay))
    except OSError as e:
        log.error("Cannot listen on %s: %s", format_address(opts.listen), e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
