"""Poll now: `reconciler poll` on the node, or a webhook from a git server's hook or a forge.

Both end the same way: the poll timer's next run is made due now (``Every.now``), so the daemon
polls within a second instead of at its next interval. `reconciler poll` sends ``SIGUSR1`` to
the daemon whose pid ``agent.lock`` holds (only while the daemon holds that lock: never to a pid
that was reused); the daemon's main thread takes it through the wakeup pipe it already waits on.

The receiver (``receiver: {listen, secret_file}``) answers ``POST`` with 202 when the body's
HMAC-SHA256 under the shared secret is in ``X-Hub-Signature-256`` (GitHub's ``sha256=<hex>``)
or ``X-Signature`` (the same, for any other caller); anything else gets 401 and nothing
happens. The body is not read for anything else: a push anywhere only says "look now", and the
pass verifies what it finds as always. At most one poll is asked per ``MIN_GAP`` seconds: a flood
of valid calls (a replayed one, a busy forge) cannot make the node poll in a loop.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from reconciler.core.errors import BadInput, ConfigError
from reconciler.ledger.statedir import State

log = logging.getLogger("reconciler.agent")

WAKE = signal.SIGUSR1
MIN_GAP = 5.0  # seconds between two polls a webhook may ask for
MAX_BODY = 1 << 20  # a forge's push event is a few KB; a bigger body is not read


def poll_now(state_dir: Path) -> int:
    """Wake the daemon of ``state_dir``: its pid, signalled. ``BadInput`` when none runs there."""
    state = State(state_dir, create=False)
    if state.held("agent.lock") is not True:
        raise BadInput(f"no `reconciler agent` daemon runs on state dir {state_dir} (agent.lock is not held)",
                       reason="NO_DAEMON")
    try:
        pid = int((state_dir / "agent.lock").read_text().strip())
        os.kill(pid, WAKE)
    except (OSError, ValueError) as exc:
        raise BadInput(f"cannot wake the daemon of {state_dir}: {exc}", reason="NO_DAEMON") from exc
    return pid


def read_secret(path: Path) -> bytes:
    """The receiver's shared secret; a missing, empty or world-readable file is a setting's mistake."""
    try:
        with path.open("rb") as f:
            if os.fstat(f.fileno()).st_mode & 0o077:
                raise ConfigError(f"receiver.secret_file {path} may be read by others: chmod 600 it")
            secret = f.read().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read receiver.secret_file {path}: {exc.strerror}") from exc
    if not secret:
        raise ConfigError(f"receiver.secret_file {path} is empty")
    return secret


def signed(secret: bytes, body: bytes, said: str | None) -> bool:
    """Whether ``said`` (``sha256=<hex>``, or the bare hex) is the body's HMAC under ``secret``."""
    if not said:
        return False
    digest = said.strip().removeprefix("sha256=")
    want = hmac.new(secret, body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(want, digest.lower())


class Limiter:
    """Lets one call through per ``gap`` seconds; the others are told to come back later."""

    def __init__(self, gap: float = MIN_GAP, clock: Callable[[], float] = time.monotonic) -> None:
        self.gap, self.clock, self.last = gap, clock, float("-inf")
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            now = self.clock()
            if now - self.last < self.gap:
                return False
            self.last = now
            return True


class Receiver:
    """The webhook receiver's HTTP server, in its own thread; ``wake`` is called per valid call."""

    def __init__(self, listen: str, secret: bytes, wake: Callable[[], None], node: str) -> None:
        host, _, port = listen.rpartition(":")
        host = host.strip("[]")
        limiter = Limiter()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    return self._answer(413, "too large")
                body = self.rfile.read(length) if length > 0 else b""
                said = self.headers.get("X-Hub-Signature-256") or self.headers.get("X-Signature")
                if not signed(secret, body, said):
                    log.warning("%s: webhook from %s refused: bad or missing signature", node, self.client_address[0])
                    return self._answer(401, "bad signature")
                if not limiter.allow():
                    return self._answer(429, "a poll was asked for just now")
                wake()
                return self._answer(202, "polling")

            def do_GET(self) -> None:  # noqa: N802
                self._answer(405, "POST a signed body")

            def _answer(self, code: int, text: str) -> None:
                data = (text + "\n").encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                del format, args  # each call is logged above when it matters

        class Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            daemon_threads = True

        try:
            self.server = Server((host, int(port)), Handler)
        except OSError as exc:
            raise ConfigError(f"receiver.listen {listen}: {exc.strerror}") from exc
        self.server.socket.set_inheritable(False)  # the services this daemon starts must not hold it
        self.thread = threading.Thread(target=self.server.serve_forever, name="receiver", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_receiver(listen: str | None, secret_file: Path | None, wake: Callable[[], None],
                   node: str) -> Receiver | None:
    """The receiver the settings ask for, serving; None when they ask for none."""
    if listen is None or secret_file is None:
        return None
    receiver = Receiver(listen, read_secret(secret_file), wake, node)
    receiver.start()
    log.info("%s: webhook receiver on http://%s/", node, listen)
    return receiver
