"""Poll now, hardened (issue 38's review): the webhook receiver bounds what an unauthenticated
caller can hold (connections, time, log lines), answers garbage with a status and never a
traceback, coalesces valid calls instead of dropping them, refuses a replayed GitHub delivery;
a `reconciler poll` during a re-execution is not lost; `poll` signals the lock's holder only,
never a pid the lock file still names from before. Real HTTP over loopback, real daemons.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from conftest import Deployment, SigningKey, git, wait_for
from ports import free_port, wait_listening
from test_cli import cli
from test_shed import Daemon

from reconciler.agent import Agent
from reconciler.core.errors import BadInput
from reconciler.daemon import wake

SECRET = b"s3cret"
BODY = b'{"ref": "refs/heads/main"}'


def _signature(body: bytes = BODY, secret: bytes = SECRET) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def _raw(port: int, request: bytes, timeout: float = 5.0) -> bytes:
    """What the server answers to ``request`` sent as is, up to its close."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        got = b""
        while chunk := s.recv(4096):
            got += chunk
        return got


def _post(port: int, headers: dict[str, str], body: bytes = BODY) -> bytes:
    lines = [b"POST / HTTP/1.1", b"Host: node1", b"Connection: close", b"Content-Length: %d" % len(body)]
    lines += [f"{k}: {v}".encode("latin-1") for k, v in headers.items()]
    return _raw(port, b"\r\n".join(lines) + b"\r\n\r\n" + body)


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def receiver() -> Iterator[Callable[..., tuple[int, list[float]]]]:
    """A receiver in this process on a free loopback port; its wake calls recorded (the delay each asked)."""
    started: list[wake.Receiver] = []

    def start(**kwargs: object) -> tuple[int, list[float]]:
        port = free_port()
        calls: list[float] = []
        r = wake.Receiver(f"127.0.0.1:{port}", SECRET, calls.append, "node1", **kwargs)  # type: ignore[arg-type]
        r.start()
        started.append(r)
        return port, calls

    yield start
    for r in started:
        r.close()


def test_idle_connections_are_bounded_and_timed_out_so_a_slowloris_cannot_pin_the_receiver(
    receiver: Callable[..., tuple[int, list[float]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wake, "TIMEOUT", 1.0)
    port, calls = receiver()
    idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(wake.MAX_CONNECTIONS)]
    try:
        for s in idle:
            s.sendall(b"POST / HTTP/1.1\r\n")  # and never the rest
        time.sleep(0.2)
        started = time.monotonic()
        answer = _post(port, {"X-Signature": _signature()})
        assert _status(answer) == 503 and time.monotonic() - started < 2, answer  # refused at once, not queued
        assert calls == []
        for s in idle:  # each slow caller is cut off after the timeout
            started = time.monotonic()
            assert s.recv(4096) == b""
            assert time.monotonic() - started < 3
    finally:
        for s in idle:
            s.close()
    wait_for(lambda: _status(_post(port, {"X-Signature": _signature()})) == 202, 5, "the receiver to serve again")
    assert calls == [0.0]


def test_garbage_headers_get_a_status_and_no_traceback(
    receiver: Callable[..., tuple[int, list[float]]], capfd: pytest.CaptureFixture[str]
) -> None:
    port, calls = receiver()
    answer = _post(port, {"X-Signature": "sha256=\xff"})
    assert _status(answer) == 401, answer
    for length in (b"abc", b"-5"):
        answer = _raw(port, b"POST / HTTP/1.1\r\nConnection: close\r\nContent-Length: " + length + b"\r\n\r\n")
        assert _status(answer) == 400, answer
    assert b"Python" not in answer and b"BaseHTTP" not in answer  # no banner naming the server's software
    assert calls == []
    _, err = capfd.readouterr()
    assert "Traceback" not in err, err


def test_a_valid_call_within_the_gap_is_coalesced_into_one_later_poll_and_a_replayed_delivery_refused(
    receiver: Callable[..., tuple[int, list[float]]]
) -> None:
    clock = Clock()
    port, calls = receiver(clock=clock)
    assert _status(_post(port, {"X-Hub-Signature-256": _signature(), "X-GitHub-Delivery": "d1"})) == 202
    assert calls == [0.0]
    clock.now += 1  # a second push a second later: polled when the gap ends, not dropped
    assert _status(_post(port, {"X-Hub-Signature-256": _signature(), "X-GitHub-Delivery": "d2"})) == 202
    assert calls == [0.0, wake.MIN_GAP - 1]
    clock.now += 1  # a third joins the poll already planned
    assert _status(_post(port, {"X-Signature": _signature()})) == 202
    assert calls == [0.0, wake.MIN_GAP - 1]
    clock.now += 60
    # The same GitHub delivery again (a sniffed request replayed): refused, nothing asked.
    assert _status(_post(port, {"X-Hub-Signature-256": _signature(), "X-GitHub-Delivery": "d1"})) == 409
    assert calls == [0.0, wake.MIN_GAP - 1]


def test_unauthenticated_calls_are_logged_once_per_source_per_minute(
    receiver: Callable[..., tuple[int, list[float]]], caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    port, calls = receiver(clock=clock)
    with caplog.at_level(logging.INFO, logger="reconciler.agent"):
        for _ in range(5):
            assert _status(_post(port, {"X-Signature": _signature(secret=b"wrong")})) == 401
        refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert len(refused) == 1, refused
        clock.now += 61
        assert _status(_post(port, {})) == 401
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 2 and "4 more" in refused[1], refused
    assert calls == []


def _daemon_config(tmp_path: Path, deployment: Deployment, merge_key: SigningKey, **more: object) -> Path:
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "node": "cmp1", "remote": deployment.url, "state_dir": str(tmp_path / "nodes" / "cmp1"),
        "interval": 3600, "jitter": 0, "trust": {"allowed_signers": str(merge_key.allowed_signers)}, **more,
    }))
    return config


def test_a_second_push_right_after_a_poll_is_polled_when_the_gap_ends_not_dropped(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path, merge_key: SigningKey
) -> None:
    port = free_port()
    secret = tmp_path / "receiver.secret"
    secret.write_bytes(SECRET + b"\n")
    secret.chmod(0o600)
    config = _daemon_config(tmp_path, deployment, merge_key,
                            receiver={"listen": f"127.0.0.1:{port}", "secret_file": str(secret)})
    agents("cmp1", deployment.url, state_dir=tmp_path / "nodes" / "cmp1")  # cleanup
    daemon = Daemon(config, tmp_path / "daemon.log")
    try:
        wait_listening(port, "the webhook receiver", seconds=30)
        first = git("rev-parse", "HEAD", cwd=deployment.work)
        wait_for(lambda: (deployment.note("cmp1", first) or {}).get("state") == "applied", 30, "the first pass")
        second = deployment.commit("second")
        assert _status(_post(port, {"X-Signature": _signature()})) == 202
        third = deployment.commit("third")
        assert _status(_post(port, {"X-Signature": _signature()})) == 202  # within the gap: coalesced
        wait_for(lambda: deployment.note("cmp1", third) is not None, 15, "the coalesced poll")
        assert deployment.note("cmp1", second) is not None
    finally:
        assert daemon.stop() == 0


# Loaded by the daemon's interpreters (PYTHONPATH): at the re-execution's last step, once, wait
# for the test, then `reconciler poll` the daemon while its main thread blocks the signal (a
# worker thread takes it), as one that comes during the execv would.
POLL_DURING_EXEC = """
import os, signal, time
from reconciler.core import faults
_point = faults.point

def point(kind, detail=""):
    gate = os.environ.pop("WAKE_GATE", None) if kind == "exec" else None
    if gate is not None:
        open(gate + ".at", "w").close()
        while not os.path.exists(gate + ".go"):
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.2)
    _point(kind, detail)

faults.point = point
"""


def test_a_poll_that_comes_while_the_daemon_re_executes_is_taken_by_the_new_interpreter(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path, merge_key: SigningKey,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(textwrap.dedent(POLL_DURING_EXEC))
    gate = tmp_path / "gate"
    monkeypatch.setenv("PYTHONPATH", f"{hook}:{Path(__file__).parent.parent}")
    monkeypatch.setenv("WAKE_GATE", str(gate))
    config = _daemon_config(tmp_path, deployment, merge_key)
    agents("cmp1", deployment.url, state_dir=tmp_path / "nodes" / "cmp1")  # cleanup
    daemon = Daemon(config, tmp_path / "daemon.log")
    try:
        first = git("rev-parse", "HEAD", cwd=deployment.work)
        wait_for(lambda: (deployment.note("cmp1", first) or {}).get("state") == "applied", 60, "the first apply")
        assert cli("poll", "--config", str(config)).returncode == 0  # the quiet pass after work: it re-executes
        wait_for(lambda: Path(f"{gate}.at").exists(), 30, "the re-execution")
        second = deployment.commit("second")
        Path(f"{gate}.go").touch()
        wait_for(lambda: bool(daemon.lines("agent re-executed")), 30, "the new interpreter")
        # The next poll by the interval is an hour away: only the poll asked during the execv polls now.
        wait_for(lambda: deployment.note("cmp1", second) is not None, 20, "the poll asked during the re-execution")
    finally:
        assert daemon.stop() == 0, daemon.log.read_text()


HOLDER = """
import fcntl, os, signal, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)  # a daemon between its flock and writing its pid
signal.signal(signal.SIGUSR1, lambda *_: open(sys.argv[2], "w").close())
print("held", flush=True)
time.sleep(60)
"""


def test_poll_signals_the_lock_holder_never_a_pid_the_lock_file_still_names(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    lock = state_dir / "agent.lock"
    victim = subprocess.Popen(["sleep", "60"])  # the previous daemon's pid, reused by another process
    lock.write_text(f"{victim.pid}\n")
    woken = tmp_path / "woken"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), str(woken)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert wake.poll_now(state_dir) == holder.pid
        wait_for(woken.exists, 5, "the holder to be woken")
        assert victim.poll() is None  # the pid in the file was never signalled
    finally:
        for p in (victim, holder):
            p.kill()
            p.wait(10)
    with pytest.raises(BadInput, match="NO_DAEMON|no `reconciler agent`"):
        wake.poll_now(state_dir)  # nobody holds it now


def test_diff_local_defaults_to_the_repo_given(deployment: Deployment, tmp_path: Path) -> None:
    deployment.edit("inventory.yaml", "token_ttl: 3600", "token_ttl: 7200")  # not committed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run([sys.executable, "-m", "reconciler", "diff", "--local", "--repo", str(deployment.work),
                           "--node", "ctl1", "--exit-code"], capture_output=True, text=True, cwd=elsewhere, timeout=120)
    assert proc.returncode == 1, proc.stderr  # the repo's work tree, not the current directory
