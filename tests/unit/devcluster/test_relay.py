"""The relay that lets the real node's pods reach the API server: its command line, its address
rules, and its behaviour on loopback sockets of its own (bytes both ways, half-close, TLS passing
through, the connection cap, idle connections, a refused upstream, shutdown on SIGTERM)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from patchbay_devcluster import pki, relay
from patchbay_devcluster.node import NODE_IP
from patchbay_devcluster.poll import poll_until
from patchbay_devcluster.procs import free_port, pid_runs
from patchbay_devcluster.relay import Relay, parse_address

LOOPBACK = "127.0.0.1"
WAIT = 10.0  # a bound on every wait here, never a timing assertion

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def test_argv_runs_the_module_from_this_interpreter() -> None:
    argv = relay.argv((NODE_IP, 6443), (LOOPBACK, 34567), python="/venv/bin/python")
    assert argv == [
        "/venv/bin/python",
        "-m",
        "patchbay_devcluster.relay",
        "--listen",
        "10.244.0.1:6443",
        "--connect",
        "127.0.0.1:34567",
        "--verbose",
    ]
    assert relay.MODULE in argv[1:]  # what the PID check looks for besides the binary
    assert relay.argv(("::1", 1), ("::1", 2), verbose=False)[3:] == [
        "--listen",
        "[::1]:1",
        "--connect",
        "[::1]:2",
    ]
    assert relay.argv((NODE_IP, 1), (LOOPBACK, 2))[0] == sys.executable


def test_addresses_are_ip_and_port_and_a_listen_address_is_never_a_wildcard() -> None:
    assert parse_address("10.244.0.1:6443", listen=True) == ("10.244.0.1", 6443)
    assert parse_address("[::1]:443") == ("::1", 443)
    assert parse_address("0.0.0.0:80") == ("0.0.0.0", 80)  # connecting there is the caller's business
    for wildcard in ("0.0.0.0:6443", "[::]:6443"):
        with pytest.raises(ValueError, match="never on all of them"):
            parse_address(wildcard, listen=True)
    for bad, why in (
        ("localhost:6443", "not an IP address"),
        ("10.244.0.1", "expected IP:PORT"),
        (":6443", "expected IP:PORT"),
        ("10.244.0.1:0", "not a port"),
        ("10.244.0.1:65536", "not a port"),
        ("10.244.0.1:x", "not a port"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_address(bad)


def test_the_command_line_refuses_a_wildcard_listen_address(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        relay.main(["--listen", "0.0.0.0:6443", "--connect", "127.0.0.1:1"])
    assert exited.value.code == 2
    assert "never on all of them" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        relay.main(["--listen", "127.0.0.1:1", "--connect", "127.0.0.1:2", "--max-connections", "0"])


@asynccontextmanager
async def server(handler: Handler, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[int]:
    """An upstream of the test's own on 127.0.0.1 (a port the kernel picks)."""
    srv = await asyncio.start_server(handler, LOOPBACK, 0, ssl=ssl_context)
    try:
        yield int(srv.sockets[0].getsockname()[1])
    finally:
        srv.close()


@asynccontextmanager
async def running(
    upstream: int, max_connections: int = relay.MAX_CONNECTIONS, idle_timeout: float = relay.IDLE_TIMEOUT
) -> AsyncIterator[tuple[Relay, int]]:
    r = Relay((LOOPBACK, 0), (LOOPBACK, upstream), max_connections=max_connections, idle_timeout=idle_timeout)
    _, port = await r.start()
    try:
        yield r, port
    finally:
        await r.close()


async def shout_back(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read to the end, answer once with the upper-cased bytes, close."""
    data = await reader.read()
    writer.write(data.upper())
    await writer.drain()
    writer.close()


async def shout_a_line_back(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer one line with it upper-cased, close (TLS has no half-close to wait for)."""
    writer.write((await reader.readline()).upper())
    await writer.drain()
    writer.close()


async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Keep the connection open, answering nothing, until the peer closes."""
    await reader.read()
    writer.close()


async def closed_by_peer(reader: asyncio.StreamReader) -> bool:
    try:
        return await reader.read(1) == b""
    except ConnectionResetError:
        return True


async def test_bytes_go_both_ways_untouched_and_a_half_close_passes_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=relay.MODULE)
    payload = bytes(range(97, 123)) * 100_000  # 2.6 MB: many reads and writes, flow control
    async with server(shout_back) as upstream, running(upstream) as (r, port):
        reader, writer = await asyncio.open_connection(LOOPBACK, port)
        writer.write(payload)
        await writer.drain()
        writer.write_eof()  # the upstream answers only once it sees the end
        async with asyncio.timeout(WAIT):
            answer = await reader.read()
        assert answer == payload.upper()
        writer.close()
        await poll_async(lambda: r.active == 0)
    logged = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.DEBUG]
    assert any(f"connected to 127.0.0.1:{upstream}" in m for m in logged), logged
    assert any("closed after" in m and f"({len(payload)} bytes in, {len(payload)} out)" in m for m in logged)


async def test_tls_passes_through_and_the_client_verifies_the_upstream(tmp_path: Path) -> None:
    """The relay never terminates TLS: the client handshakes with the upstream itself, which
    must name the address the client dialled (here 127.0.0.1, as the API server names the
    bridge address)."""
    ca = pki.CertificateAuthority(tmp_path)
    cert = ca.issue("server", "upstream", server=True)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert.cert, cert.key)
    client_ctx = ssl.create_default_context(cafile=str(ca.pair.cert))
    async with server(shout_a_line_back, server_ctx) as upstream, running(upstream) as (_, port):
        async with asyncio.timeout(WAIT):
            reader, writer = await asyncio.open_connection(
                LOOPBACK, port, ssl=client_ctx, server_hostname=LOOPBACK
            )
            assert writer.get_extra_info("peercert")["subject"] == ((("commonName", "upstream"),),)
            writer.write(b"hello\n")
            await writer.drain()
            assert await reader.readline() == b"HELLO\n"
            writer.close()
        with pytest.raises(ssl.SSLCertVerificationError, match="match"):
            await asyncio.open_connection(LOOPBACK, port, ssl=client_ctx, server_hostname="10.9.9.9")


async def test_connections_over_the_cap_are_closed_and_the_others_kept() -> None:
    async with server(hold) as upstream, running(upstream, max_connections=1) as (r, port):
        _, first_w = await asyncio.open_connection(LOOPBACK, port)
        await poll_async(lambda: r.active == 1)
        second_r, second_w = await asyncio.open_connection(LOOPBACK, port)
        async with asyncio.timeout(WAIT):
            assert await closed_by_peer(second_r)
        second_w.close()
        assert r.active == 1
        first_w.close()
        await poll_async(lambda: r.active == 0)
        _, again_w = await asyncio.open_connection(LOOPBACK, port)
        await poll_async(lambda: r.active == 1)  # room again
        again_w.close()


async def test_an_idle_connection_is_closed_on_both_sides() -> None:
    upstream_closed = asyncio.Event()

    async def watch(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if await closed_by_peer(reader):
            upstream_closed.set()
        writer.close()

    async with server(watch) as upstream, running(upstream, idle_timeout=0.3) as (r, port):
        reader, writer = await asyncio.open_connection(LOOPBACK, port)
        async with asyncio.timeout(WAIT):
            assert await closed_by_peer(reader)
            await upstream_closed.wait()
        writer.close()
        await poll_async(lambda: r.active == 0)


async def test_a_refused_upstream_closes_the_client() -> None:
    nothing = free_port()  # nothing listens there
    async with running(nothing) as (r, port):
        reader, writer = await asyncio.open_connection(LOOPBACK, port)
        async with asyncio.timeout(WAIT):
            assert await closed_by_peer(reader)
        writer.close()
        await poll_async(lambda: r.active == 0)


async def test_close_stops_listening_and_closes_open_connections() -> None:
    async with server(hold) as upstream:
        r = Relay((LOOPBACK, 0), (LOOPBACK, upstream))
        _, port = await r.start()
        reader, writer = await asyncio.open_connection(LOOPBACK, port)
        await poll_async(lambda: r.active == 1)
        async with asyncio.timeout(WAIT):
            await r.close()
            assert await closed_by_peer(reader)
        writer.close()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(LOOPBACK, port)


def test_the_program_relays_and_exits_cleanly_on_sigterm(tmp_path: Path) -> None:
    upstream = socket.create_server((LOOPBACK, 0))
    port = free_port()
    log = tmp_path / "relay.log"
    argv = relay.argv((LOOPBACK, port), (LOOPBACK, upstream.getsockname()[1]))
    with log.open("wb") as out:
        child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        client = poll_until(
            "the relay listening",
            lambda: socket.create_connection((LOOPBACK, port), timeout=WAIT),
            timeout=WAIT,
            ignore=(ConnectionRefusedError,),
        )
        assert pid_runs(child.pid, sys.executable, relay.MODULE)
        upstream.settimeout(WAIT)
        conn, _ = upstream.accept()
        client.sendall(b"ping")
        assert conn.recv(4) == b"ping"
        conn.sendall(b"pong")
        client.settimeout(WAIT)
        assert client.recv(4) == b"pong"
        child.send_signal(signal.SIGTERM)
        assert child.wait(WAIT) == 0
        with contextlib.suppress(ConnectionResetError):
            assert client.recv(1) == b""  # the relay closed it on its way out
        client.close()
        conn.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        upstream.close()
    text = log.read_text()
    assert f"Relaying 127.0.0.1:{port} to 127.0.0.1:" in text, text
    assert "connected to" in text and "Stopping (1 connections open)" in text and "Relay closed" in text, text
    assert "bytes in" in text, text
    assert "Warning" not in text, text  # runpy's, were the module imported before it runs
    assert "ERROR" not in text and "Traceback" not in text, text


async def poll_async(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT):
        while True:
            if check():
                return
            await asyncio.sleep(0.01)
