"""A review of the quick no-op `agent --once` (``node.quiet``, issue 40), as an attacker and as
an operator: each case here is one where the quick answer once said "unchanged, nothing to do"
while the full pass would have acted, or where it made the user wait twice.

The node and its runner are ``test_once_quick``'s.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from test_once_quick import RUN, Node, node

__all__ = ["node"]  # the fixture, used by name


def test_a_marker_that_is_a_fifo_is_not_waited_on(node: Node) -> None:
    node.marker.unlink()
    os.mkfifo(node.marker, 0o600)
    argv = ["agent", "--once", *node.args]
    try:
        proc = subprocess.run([sys.executable, "-c", RUN, *argv], capture_output=True, text=True, cwd="/",
                              timeout=20)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("`agent --once` waited on a fifo in place of the marker") from exc
    assert proc.stdout.rstrip().endswith("full") and "unchanged, nothing to do" in proc.stdout, proc


def test_a_ledger_restored_from_a_backup_runs_the_full_pass(node: Node, tmp_path: Path) -> None:
    backup = tmp_path / "state.db.bak"
    shutil.copy(node.state / "state.db", backup)
    for suffix in ("-wal",):
        if (node.state / f"state.db{suffix}").exists():
            shutil.copy(node.state / f"state.db{suffix}", tmp_path / f"state.db.bak{suffix}")
    node.dep.edit("services/idle/files/idle.py", "3600", "3605")
    node.dep.commit("a change after the backup")
    assert "applied" in node.once().out
    assert not node.once().quick and node.once().quick  # a full no-op wrote the marker
    # The operator restores the ledger from last night's backup (the agent stopped, as the docs say).
    for suffix in ("-wal", "-shm"):
        (node.state / f"state.db{suffix}").unlink(missing_ok=True)
    shutil.copy(backup, node.state / "state.db")
    if (tmp_path / "state.db.bak-wal").exists():
        shutil.copy(tmp_path / "state.db.bak-wal", node.state / "state.db-wal")
    done = node.once()
    assert not done.quick and done.code == 0 and "applied" in done.out, done  # it runs the last backup's commit


def _polls_of(url: str) -> set[int]:
    """The `git ls-remote` processes polling ``url`` now."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"ls-remote" in argv and url.encode() in argv:
            found.add(int(pid))
    return found


@contextmanager
def first_poll_hangs(bare: Path, url: str) -> Iterator[None]:
    """The remote's first `ls-remote` hangs (its refs a fifo nobody writes) until that git is
    gone, or 30 s; every later one is answered (the fifo written, as the file was)."""
    refs = bare / "packed-refs"
    kept = refs.read_bytes() if refs.exists() else b""
    refs.unlink(missing_ok=True)
    os.mkfifo(refs)
    stop = threading.Event()

    def serve() -> None:
        first, since = None, time.monotonic()
        while not stop.is_set():
            polls = _polls_of(url)
            if first is None:
                first, since = (min(polls), time.monotonic()) if polls else (None, since)
            elif first not in polls or time.monotonic() - since > 30:
                try:
                    fd = os.open(refs, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO: nobody reads now
                except OSError:
                    pass
                else:
                    os.write(fd, kept)
                    os.close(fd)
            time.sleep(0.02)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        yield
    finally:
        stop.set()
        server.join()
        refs.unlink()
        refs.write_bytes(kept)


def test_a_remote_that_does_not_answer_the_quick_poll_is_left_to_the_full_pass(node: Node) -> None:
    # The quick path gives up on a remote that does not answer within its own short time (not
    # the full pass's two minutes, after which the full pass would wait as long again): the
    # full pass polls once more, here answered, and says so itself.
    with first_poll_hangs(node.dep.bare, node.dep.url):
        done = node.once()
    assert not done.quick and done.code == 0 and done.out.endswith(": unchanged, nothing to do"), done
    assert node.once().quick


def test_a_pass_killed_at_a_side_effect_leaves_no_marker_the_quick_path_trusts(node: Node, tmp_path: Path) -> None:
    # A no-op pass has one side effect, the marker's rename: killed there, no marker.
    node.marker.unlink()
    log = tmp_path / "noop.log"
    counted = node.once(env={"RECONCILER_FAULT_LOG": str(log)})
    assert counted.code == 0 and not counted.quick and node.marker.exists(), counted
    assert [line.split()[1] for line in log.read_text().splitlines()] == ["rename"]
    node.marker.unlink()
    killed = node.once(env={"RECONCILER_FAULT_AT": "1"})
    assert killed.code == -9 and not node.marker.exists(), killed
    after = node.once()
    assert not after.quick and "left half written by a killed run" in after.err, after
    # A pass applying a change, killed at its first side effect, half way and at its last
    # (its note pushed): the next run is a full one, which finishes it.
    node.dep.edit("services/idle/files/idle.py", "3600", "3610")
    node.dep.commit("a change, its side effects counted")
    log = tmp_path / "apply.log"
    assert "applied" in node.once(env={"RECONCILER_FAULT_LOG": str(log)}).out
    count = len(log.read_text().splitlines())
    for at, text in ((1, "3611"), (count // 2, "3612"), (count, "3613")):
        assert [node.once().quick for _ in range(2)] == [False, True]  # a full no-op, then quick
        node.dep.edit("services/idle/files/idle.py", str(int(text) - 1), text)
        node.dep.commit(f"killed before side effect {at} of {count}")
        killed = node.once(env={"RECONCILER_FAULT_AT": str(at)})
        assert killed.code == -9 and not node.marker.exists(), (at, killed)
        again = node.once()
        assert not again.quick and again.code == 0, (at, again)
        assert text in (node.state / "services/idle/live/idle.py").read_text(), (at, again)


def test_the_package_reinstalled_at_the_same_version_runs_the_full_pass(node: Node, tmp_path: Path) -> None:
    # A distribution's patch release keeps the upstream version: the code is new all the same.
    import reconciler

    site = tmp_path / "site"
    shutil.copytree(Path(reconciler.__file__).parent, site / "reconciler",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {"PYTHONPATH": str(site)}
    first = node.once(env=env)
    assert not first.quick and first.code == 0, first  # another installation: its own full pass
    assert node.once(env=env).quick
    init = site / "reconciler/__init__.py"
    fresh = init.with_name("__init__.py.new")  # as a package manager unpacks it: a new file renamed over
    fresh.write_bytes(init.read_bytes())
    fresh.replace(init)
    done = node.once(env=env)
    assert not done.quick and done.code == 0, done


def test_a_stray_process_of_a_service_is_stopped_by_the_full_pass(node: Node) -> None:
    # A process carrying a service's mark that its record does not name (a run killed between
    # the spawn and the record, a child that left the service's process tree): every full pass
    # stops it (``ProcessDriver._sweep``), so the quick path may not answer while one lives.
    env = dict(v.split("=", 1) for v in
               Path(f"/proc/{node.record['pid']}/environ").read_text().split("\0") if "=" in v)
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env,
                             start_new_session=True)
    try:
        done = node.once()
        assert not done.quick and done.code == 0, done
        assert stray.wait(timeout=30) is not None  # stopped by the pass
    finally:
        stray.kill()
        stray.wait()


def test_ctrl_c_while_the_quick_poll_waits_on_the_remote_is_said_as_a_pass_says_it(node: Node) -> None:
    # Ctrl-C at a terminal reaches the command's process group while its quick poll waits: the
    # user is told what a pass would say (nothing was being changed), exit 130, no traceback,
    # and the poll's git (in a session of its own) is not left behind.
    with first_poll_hangs(node.dep.bare, node.dep.url):
        agent = subprocess.Popen([sys.executable, "-m", "reconciler", "agent", "--once", *node.args],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
                                 start_new_session=True,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            deadline = time.monotonic() + 30
            while not _polls_of(node.dep.url) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert _polls_of(node.dep.url), "the quick poll never started"
            os.killpg(agent.pid, signal.SIGINT)
            out, err = agent.communicate(timeout=30)
        finally:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.communicate()
        assert agent.returncode == 130, err
        assert err.splitlines() == ["error: aborted: no service was being changed; the next run starts over [ABORTED]"]
        assert out == "" and not _polls_of(node.dep.url)
