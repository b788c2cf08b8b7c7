"""Loopback ports for the real servers the tests start (git daemon, sshd, nginx...): a free
one, and waiting until a server listens on it."""

from __future__ import annotations

import contextlib
import http.server
import socket
import subprocess
import threading
import time
from collections.abc import Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_listening(port: int, what: str, proc: subprocess.Popen[bytes] | subprocess.Popen[str] | None = None,
                   seconds: float = 10) -> None:
    """Until something accepts connections on the loopback ``port``; RuntimeError if ``proc``
    (the server) exits first, with what it said on a piped stderr, or after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            said = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"{what} exited: {(said.decode() if isinstance(said, bytes) else said).strip()}")
        if listening(port):
            return
        time.sleep(0.02)
    raise RuntimeError(f"{what} did not listen on port {port} within {seconds:g} s")


@contextlib.contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """An HTTP server on a free loopback port, answering with ``handler`` in a thread: its URL,
    and the server shut down and its socket closed after, even when the test fails."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
