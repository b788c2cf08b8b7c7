"""Poll now: `reconciler poll` on the node, or a webhook from a git server's hook or a forge.

Both end the same way: the poll timer's next run is made due now (``Every.now``), so the daemon
polls within a second instead of at its next interval. `reconciler poll` sends ``SIGUSR1`` to
the process the kernel's lock table lists as holding ``agent.lock`` (``poll_now``); the daemon's
main thread takes it through the wakeup pipe it already waits on.

The receiver (``receiver: {listen, secret_file}``) answers ``POST`` with 202 when the body's
HMAC-SHA256 under the shared secret is in ``X-Hub-Signature-256`` (GitHub's ``sha256=<hex>``)
or ``X-Signature`` (the same, for any other caller); anything else gets 401 and nothing
happens. The body is not read for anything else: a push anywhere only says "look now", and the
pass verifies what it finds as always. At most one poll is asked per ``MIN_GAP`` seconds, and a
valid call within the gap is coalesced into a poll when the gap ends (never dropped): a flood of
valid calls (a replayed one, a busy forge) costs at most one fetch per gap. It speaks plain
HTTP with no timestamp or nonce under the signature: a sniffed call can be replayed (only GitHub's
delivery id is remembered, to refuse its exact replay), so it listens on loopback, or behind a
TLS proxy for callers elsewhere. An unauthenticated caller can hold little: ``MAX_CONNECTIONS``
at once (more get 503 at once), ``TIMEOUT`` seconds each, a log line per source per minute.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reconciler.core.errors import BadInput, ConfigError
from reconciler.ledger.statedir import State

log = logging.getLogger("reconciler.agent")

WAKE = signal.SIGUSR1
MIN_GAP = 5.0  # seconds between two polls a webhook may ask for
MAX_BODY = 1 << 20  # a forge's push event is a few KB; a bigger body is not read
TIMEOUT = 10.0  # seconds a connection may stay silent: a slow caller is cut off
MAX_CONNECTIONS = 8  # served at once; a caller more gets 503 at once
LOG_EVERY = 60.0  # seconds between two "refused" lines about one source
SOURCES = 1024  # sources whose refusals are counted apart
DELIVERIES = 1024  # GitHub delivery ids remembered, to refuse a replay


def poll_now(state_dir: Path) -> int:
    """Wake the daemon of ``state_dir``: the pid the kernel lists as holding ``agent.lock``'s
    flock, signalled; ``BadInput`` when none runs there, or when which process holds it cannot
    be told for sure (then nothing is signalled). Never the pid written in the lock file: a
    daemon writes it only once it holds the lock, and until then it names the previous daemon,
    whose pid may be another process's now. The pid is pinned (a pidfd) and the table read again
    before the signal: a holder that exits and whose pid is reused in between is not signalled."""
    state = State(state_dir, create=False)
    lock = state_dir / "agent.lock"
    pid = state.holder("agent.lock")
    if pid is None:
        if state.held("agent.lock") is False:
            raise BadInput(f"no `reconciler agent` daemon runs on state dir {state_dir} ({lock} is not held)",
                           reason="NO_DAEMON")
        raise BadInput(f"cannot tell which process holds {lock} (the kernel's lock table, /proc/locks, does not "
                       "name it to this user): not signalling; run as the daemon's user or root", reason="NO_DAEMON")
    cannot = f"cannot wake the daemon of {state_dir} (pid {pid})"
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as exc:
        raise BadInput(f"{cannot}: {exc.strerror}", reason="NO_DAEMON") from exc
    try:
        if state.holder("agent.lock") != pid:
            raise BadInput(f"{cannot}: it let go of {lock} just now; not signalling, try again", reason="NO_DAEMON")
        signal.pidfd_send_signal(pidfd, WAKE)
    except OSError as exc:
        raise BadInput(f"{cannot}: {exc.strerror}", reason="NO_DAEMON") from exc
    finally:
        os.close(pidfd)
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
    # Imported for a call to check: hashlib and hmac load OpenSSL, 3.5 MB of an idle daemon (issue 40).
    import hashlib
    import hmac

    digest = said.strip().removeprefix("sha256=").lower().encode("utf-8", "replace")  # bytes: any header compares
    want = hmac.new(secret, body, hashlib.sha256).hexdigest().encode()
    return hmac.compare_digest(want, digest)


class Limiter:
    """At most one poll per ``gap`` seconds, and no valid call dropped: a call within the gap
    is coalesced into one poll when the gap ends (a second push right after a poll that
    fetched must not wait a whole interval). A replayed or flooding call thus costs at most
    one fetch per gap."""

    def __init__(self, gap: float = MIN_GAP, clock: Callable[[], float] = time.monotonic) -> None:
        self.gap, self.clock, self.last = gap, clock, float("-inf")  # last: when the last poll asked runs
        self._lock = threading.Lock()

    def delay(self) -> float | None:
        """Seconds from now the poll this call asks for may run; None: it joins one already planned."""
        with self._lock:
            now = self.clock()
            if self.last > now:
                return None
            self.last = max(now, self.last + self.gap)
            return self.last - now


class Quiet:
    """A line per source at most once per ``every`` seconds (how many were kept quiet meanwhile
    said with the next): an unauthenticated caller must not be able to flood the log."""

    def __init__(self, every: float = LOG_EVERY, clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self.clock = every, clock
        self.seen: dict[str, tuple[float, int]] = {}  # source: (when last said, kept quiet since)
        self._lock = threading.Lock()

    def __call__(self, source: str) -> int | None:
        """None: keep quiet; else say it, with this many kept quiet since the last line."""
        with self._lock:
            now = self.clock()
            if len(self.seen) >= SOURCES:  # many sources: forget the quiet ones, then lump new ones together
                self.seen = {k: v for k, v in self.seen.items() if now - v[0] < self.every}
                if len(self.seen) >= SOURCES and source not in self.seen:
                    source = "others"
            said, quiet = self.seen.get(source, (float("-inf"), 0))
            if now - said < self.every:
                self.seen[source] = (said, quiet + 1)
                return None
            self.seen[source] = (now, 0)
            return quiet


class Deliveries:
    """GitHub's delivery ids (``X-GitHub-Delivery``) of the last ``size`` verified calls: the
    exact replay of a GitHub delivery is refused. (The id is not under the signature: this
    stops a replay as sniffed, not a forged id; the limiter bounds what those cost.)"""

    def __init__(self, size: int = DELIVERIES) -> None:
        self.ids: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.size = size
        self._lock = threading.Lock()

    def first_time(self, delivery: str) -> bool:
        with self._lock:
            if delivery in self.ids:
                return False
            self.ids[delivery] = None
            if len(self.ids) > self.size:
                self.ids.popitem(last=False)
            return True


BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
        b"Connection: close\r\n\r\nbusy\n")


class Receiver:
    """The webhook receiver's HTTP server, in its own thread; ``wake(delay)`` is called per
    valid call that is not coalesced into a poll already asked for (``delay``: seconds until it
    may run). At most ``MAX_CONNECTIONS`` are served at once, each for ``TIMEOUT`` seconds at
    most: an unauthenticated caller holds a few threads for a few seconds, never more."""

    def __init__(self, listen: str, secret: bytes, wake: Callable[[float], None], node: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        # Here: http.server (with email and http.client) is about 2 MB of an idle daemon's RSS,
        # and most nodes configure no receiver (issue 40).
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        host, _, port = listen.rpartition(":")
        host = host.strip("[]")
        limiter, quiet, deliveries = Limiter(clock=clock), Quiet(clock=clock), Deliveries()
        slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

        class Handler(BaseHTTPRequestHandler):
            timeout = TIMEOUT  # a caller that sends its request slowly is cut off (``TimeoutError``, handled)

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                raw = (self.headers.get("Content-Length") or "0").strip()
                if not (raw.isascii() and raw.isdigit()):
                    return self._answer(400, "bad Content-Length")
                length = int(raw)
                if length > MAX_BODY:
                    return self._answer(413, "too large")
                body = self.rfile.read(length) if length > 0 else b""
                said = self.headers.get("X-Hub-Signature-256") or self.headers.get("X-Signature")
                if not signed(secret, body, said):
                    source = self.client_address[0]
                    kept = quiet(source)
                    if kept is not None:
                        log.warning("%s: webhook from %s refused: bad or missing signature%s", node, source,
                                    f" ({kept} more refused since the last line)" if kept else "")
                    return self._answer(401, "bad signature")
                delivery = self.headers.get("X-GitHub-Delivery")
                if delivery and not deliveries.first_time(delivery[:100]):
                    return self._answer(409, "this delivery was taken already")
                delay = limiter.delay()
                if delay is None:
                    return self._answer(202, "polling (with the poll asked for just before)")
                wake(delay)
                return self._answer(202, "polling" if delay <= 0 else f"polling in {delay:.0f}s")

            def do_GET(self) -> None:  # noqa: N802
                self._answer(405, "POST a signed body")

            def _answer(self, code: int, text: str) -> None:
                data = (text + "\n").encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def version_string(self) -> str:
                return "reconciler"  # not http.server's banner, which names the Python version

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                del format, args  # each call is logged above when it matters

        class Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            daemon_threads = True
            request_queue_size = 64  # socketserver's 5 drops a burst's connects (a second's retry each)

            def process_request(self, request: Any, client_address: Any) -> None:
                if not slots.acquire(blocking=False):
                    return self._busy(request)
                try:
                    super().process_request(request, client_address)
                except BaseException:
                    slots.release()
                    raise

            def process_request_thread(self, request: Any, client_address: Any) -> None:
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    slots.release()

            def _busy(self, request: socket.socket) -> None:
                """503 at once, on the serving thread (briefly: no thread for a caller too many)."""
                with contextlib.suppress(OSError):
                    request.setblocking(False)
                    request.send(BUSY)
                    # Read what the caller sent, if it came (closing on unread data resets the
                    # connection, and the caller could lose the answer).
                    select.select([request], [], [], 0.2)
                    request.recv(65536)
                self.shutdown_request(request)

            def handle_error(self, request: Any, client_address: Any) -> None:
                # A caller that went away mid-answer, say: a line at debug, never a traceback on stderr.
                log.debug("%s: webhook from %s: %s", node, client_address[0], sys.exc_info()[1])

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


def start_receiver(listen: str | None, secret_file: Path | None, wake: Callable[[float], None],
                   node: str) -> Receiver | None:
    """The receiver the settings ask for, serving; None when they ask for none."""
    if listen is None or secret_file is None:
        return None
    receiver = Receiver(listen, read_secret(secret_file), wake, node)
    receiver.start()
    log.info("%s: webhook receiver on http://%s/", node, listen)
    return receiver
