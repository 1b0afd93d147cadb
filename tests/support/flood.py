"""A flood of idle HTTP connections, run as a process of its own (stdlib only).

    python tests/support/flood.py HOST PORT N SECONDS

Keeps up to N connections to HOST:PORT open, each having sent half a request line and then
nothing, reopening at once whatever the server closes, for SECONDS; prints how many connections it
opened. A process of its own so that a test's probe never waits for this loop's hold on the GIL:
its latency is then the server's (tests/e2e/test_http_flood_on_real_node.py).
"""

from __future__ import annotations

import contextlib
import resource
import selectors
import socket
import sys
import time

HALF_A_REQUEST = b"GET /metrics HTTP/1.1\r\n"


def flood(host: str, port: int, n: int, seconds: float) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 256), hard))
    sel = selectors.DefaultSelector()
    opened = 0
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            for _ in range(min(200, n - len(sel.get_map()))):
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex((host, port))
                opened += 1
                sel.register(s, selectors.EVENT_WRITE, "connecting")
            for key, _ in sel.select(timeout=0.05):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                if key.data == "connecting":
                    try:
                        s.send(HALF_A_REQUEST)
                        sel.modify(s, selectors.EVENT_READ, "held")
                        continue
                    except OSError:
                        pass
                else:  # answered (408) or closed by the server: make another
                    with contextlib.suppress(OSError):
                        s.recv(4096)
                sel.unregister(s)
                s.close()
    finally:
        for key in list(sel.get_map().values()):
            sel.unregister(key.fileobj)
            key.fileobj.close()  # type: ignore[union-attr]
        sel.close()
    return opened


if __name__ == "__main__":
    host, port, n, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    print(flood(host, port, n, seconds), flush=True)
