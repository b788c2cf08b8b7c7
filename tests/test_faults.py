"""Faults: services that crash, an agent killed mid-apply, two runs at once, a daemon."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Deployment, SigningKey, demo_secrets, wait_for

from reconciler.agent import Agent
from reconciler.core.errors import Busy
from reconciler.core.model import ObservedService
from reconciler.daemon.supervisor import Supervisor
from reconciler.drivers.observe import observe
from reconciler.node.context import drivers_for


def pids(agent: Agent) -> dict[str, int | None]:
    return {o.name: o.pid for o in observe(agent.cfg.node, drivers_for(agent.cfg, None)).services}


def processes_of(state_dir: Path) -> dict[str, list[int]]:
    """Every live process on the machine that runs a service of this state dir, by service."""
    found: dict[str, list[int]] = {}
    marker = f"RECONCILER_DATA_DIR={state_dir}/services/".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            continue
        for var in env.split(b"\0"):
            if var.startswith(marker):
                service = var[len(marker):].split(b"/")[0].decode()
                found.setdefault(service, []).append(int(entry.name))
    return found


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_supervisor_restarts_a_killed_service_with_backoff(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    cmp1 = agents("cmp1", deployment.url)
    cmp1.reconcile_once()
    clock = FakeClock()
    supervisor = Supervisor(cmp1, clock)
    first = pids(cmp1)["compute-agent"]
    assert first is not None

    os.kill(first, signal.SIGKILL)
    wait_for(lambda: pids(cmp1)["compute-agent"] is None, what="death seen")
    assert supervisor.tick() == ["compute-agent"]
    second = pids(cmp1)["compute-agent"]
    assert second not in (None, first)

    # It dies again at once: the next restart waits 1 s, the one after 2 s.
    os.kill(second, signal.SIGKILL)  # type: ignore[arg-type]
    wait_for(lambda: pids(cmp1)["compute-agent"] is None, what="second death seen")
    assert supervisor.tick() == []
    clock.now += 1.0
    assert supervisor.tick() == ["compute-agent"]
    third = pids(cmp1)["compute-agent"]
    os.kill(third, signal.SIGKILL)  # type: ignore[arg-type]
    wait_for(lambda: pids(cmp1)["compute-agent"] is None, what="third death seen")
    clock.now += 1.0
    assert supervisor.tick() == []
    clock.now += 1.0
    assert supervisor.tick() == ["compute-agent"]
    assert pids(cmp1)["node-exporter"] is not None
    revives = [r for r in cmp1.ledger.history("compute-agent") if r.action == "revive"]
    assert len(revives) == 3 and all(r.result == "ok" for r in revives)


def test_the_supervisor_adopts_the_copy_a_killed_run_left_instead_of_starting_another(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    cmp1 = agents("cmp1", deployment.url)
    assert cmp1.reconcile_once().exit_code == 0
    recorded = pids(cmp1)["compute-agent"]
    assert recorded is not None
    # A run that restarted the service was killed between the spawn and the record: the record
    # names a process that is gone, and the one it started runs unrecorded.
    proc = Path(f"/proc/{recorded}")
    argv, env = proc.joinpath("cmdline").read_bytes().split(b"\0")[:-1], proc.joinpath("environ").read_bytes()
    cwd = os.readlink(proc / "cwd")
    os.kill(recorded, signal.SIGKILL)
    wait_for(lambda: pids(cmp1)["compute-agent"] is None, what="the recorded process gone")
    unrecorded = subprocess.Popen(argv, env=dict(v.split(b"=", 1) for v in env.split(b"\0") if b"=" in v), cwd=cwd,
                                  start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert Supervisor(cmp1, FakeClock()).tick() == []  # nothing revived: the copy is adopted
        assert pids(cmp1)["compute-agent"] == unrecorded.pid
        assert processes_of(cmp1.cfg.state_dir)["compute-agent"] == [unrecorded.pid]
    finally:
        unrecorded.kill()
        unrecorded.wait()


def test_what_the_supervisor_reads_each_tick_agrees_with_a_full_observation(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    from reconciler.drivers.process import ProcessDriver

    cmp1 = agents("cmp1", deployment.url)
    assert cmp1.reconcile_once().exit_code == 0
    [driver] = [d for d in cmp1.drivers(None).values() if isinstance(d, ProcessDriver)]

    def seen(observed: list[ObservedService]) -> list[tuple[object, ...]]:
        return [(o.name, o.running, o.hash, o.commit, o.pid, o.drift) for o in observed]

    full = driver.observe
    observed: list[int] = []

    def counted() -> list[ObservedService]:
        observed.append(1)
        return full()

    driver.observe = counted  # type: ignore[method-assign]
    # All up: the records and their processes' stat are enough; no full observation.
    assert seen(driver.liveness()) == seen(full()) and all(o.running for o in driver.liveness())
    assert observed == []
    dead = pids(cmp1)["compute-agent"]
    os.kill(dead, signal.SIGKILL)  # type: ignore[arg-type]
    wait_for(lambda: not driver.running("compute-agent"), what="death seen")
    # One down: the full observation (its strays swept before the supervisor revives it).
    assert [o.name for o in driver.liveness() if not o.running] == ["compute-agent"] and observed == [1]


def test_a_pass_does_not_sweep_the_record_the_supervisor_is_writing(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    import threading
    import time

    from reconciler.node.reconcile import prepare

    cmp1 = agents("cmp1", deployment.url)
    assert cmp1.reconcile_once().exit_code == 0
    assert cmp1.reconcile_once().exit_code == 0  # a quiet pass: it swept what the first one may have left
    # The supervisor reviving a service holds the services lock while it writes the record's
    # temp file: a pass starting then must not take it for a killed run's leftover.
    in_flight = cmp1.cfg.state_dir / "services" / "compute-agent" / ".rc-tmp-record.json.supervisor"
    swept = threading.Event()

    def a_pass_starts() -> None:
        prepare(cmp1.ctx)
        swept.set()

    with cmp1.state.services_lock():
        in_flight.write_text("{}")
        sweeper = threading.Thread(target=a_pass_starts)
        sweeper.start()
        time.sleep(1.0)
        assert in_flight.exists() and not swept.is_set()
    sweeper.join(35)
    # Its writer is this process, alive (issue 40: a pass sweeps after another process or a
    # failure only); once the writer is gone (a killed daemon), the next process sweeps it.
    assert swept.is_set() and in_flight.exists()
    prepare(agents("cmp1", deployment.url).ctx)
    assert not in_flight.exists()


def test_two_runs_never_overlap(deployment: Deployment, agents: Callable[..., Agent]) -> None:
    a = agents("cmp2", deployment.url)
    with a.state.lock(), pytest.raises(Busy, match="another reconciler run holds the lock"):
        agents("cmp2", deployment.url).reconcile_once()


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "reconciler", *args]


def test_agent_killed_mid_apply_is_finished_by_the_next_run(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path, merge_key: SigningKey
) -> None:
    # A service that takes 3 s to become healthy keeps the agent inside apply long enough.
    port = deployment.port_bases["ctl1"] + 50
    deployment.write("services/slow/service.yaml", (
        "runtime:\n  command: [python3, slow.py]\n"
        "files:\n  - {path: slow.py, source: slow.py}\n"
        f"health:\n  tcp: \"127.0.0.1:{port}\"\n  timeout: 20\n"
    ))
    deployment.write("services/slow/files/slow.py", (
        "import socket, time\ntime.sleep(3)\ns = socket.socket()\n"
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('127.0.0.1', {port}))\ns.listen()\nwhile True:\n    time.sleep(60)\n"
    ))
    deployment.edit("inventory.yaml", "services: [db, identity, lb]", "services: [db, identity, lb, slow]")
    deployment.commit("add a slow service")
    state_dir = tmp_path / "nodes" / "ctl1"
    args = ["agent", "--once", "--node", "ctl1", "--remote", deployment.url, "--state-dir", str(state_dir),
            "--allowed-signers", str(merge_key.allowed_signers),
            "--age-identity", str(demo_secrets("ctl1").age_identity)]
    proc = subprocess.Popen(_cli(*args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def in_flight() -> bool:
        db = state_dir / "state.db"
        if not db.exists():
            return False
        try:
            with sqlite3.connect(db) as conn:
                rows = conn.execute("SELECT service FROM journal WHERE status='intent'").fetchall()
        except sqlite3.OperationalError:  # the agent is still creating its tables
            return False
        return ("slow",) in rows

    wait_for(in_flight, 30, "the agent to be applying the slow service")
    proc.kill()
    proc.wait()

    agent = agents("ctl1", deployment.url)  # the fixture stops every service afterwards
    result = agent.reconcile_once()

    assert result.exit_code == 0
    assert ("slow", "start") in [i[1:] for i in result.interrupted]  # with those started beside it
    assert result.report is not None and result.report.state == "applied"
    running = processes_of(state_dir)
    assert sorted(running) == ["db", "identity", "lb", "node-exporter", "slow"]
    assert all(len(p) == 1 for p in running.values()), f"a service runs twice: {running}"
    assert (deployment.note("ctl1") or {}).get("state") == "applied"


def _daemon_config(deployment: Deployment, tmp_path: Path, merge_key: SigningKey, interval: float) -> Path:
    """cmp2's daemon config, its state dir where the ``agents`` fixture puts cmp2's."""
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"node: cmp2\nremote: {deployment.url}\nstate_dir: {tmp_path / 'nodes' / 'cmp2'}\n"
        f"interval: {interval}\njitter: 0\nsupervise_interval: 0.5\n"
        f"trust:\n  allowed_signers: {merge_key.allowed_signers}\n"
    )
    return config


@contextlib.contextmanager
def _daemon(config: Path) -> Iterator[None]:
    """`reconciler agent --config` running; stopped with SIGTERM at the end, which it must take
    cleanly (exit 0, no traceback)."""
    daemon = subprocess.Popen(_cli("agent", "--config", str(config)), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        yield
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, stderr = daemon.communicate(timeout=30)
    assert daemon.returncode == 0 and "Traceback" not in stderr, stderr


def _kvm_applied(deployment: Deployment, seconds: float) -> None:
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    c2 = deployment.commit("kvm everywhere")
    wait_for(lambda: (deployment.note("cmp2", c2) or {}).get("state") == "applied", seconds, "note of c2")


def test_daemon_applies_new_commits_and_restarts_a_killed_service(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path, merge_key: SigningKey
) -> None:
    config = _daemon_config(deployment, tmp_path, merge_key, interval=1)
    agent = agents("cmp2", deployment.url)  # for reading state, and cleanup
    with _daemon(config):
        wait_for(lambda: (deployment.note("cmp2") or {}).get("state") == "applied", 30, "first note")
        victim = pids(agent)["node-exporter"]
        assert victim
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: pids(agent).get("node-exporter") not in (None, victim), 15, "supervisor restart")
        _kvm_applied(deployment, 30)
    # The daemon exits; the services it started keep running.
    assert all(pids(agent).values())



def test_a_daemon_killed_as_it_re_executes_leaves_a_node_the_next_start_finishes_from(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path, merge_key: SigningKey
) -> None:
    # The daemon's one side effect outside a pass: its execv, once settled after applying
    # (reconciler/shed.py). Killed just before it, with the lock, the metrics socket and the
    # memory file of what it knew made inheritable and the variable set.
    config = _daemon_config(deployment, tmp_path, merge_key, interval=0.5)
    points = tmp_path / "points"
    killed = subprocess.run(_cli("agent", "--config", str(config)), capture_output=True, text=True, timeout=120,
                            env={**os.environ, "RECONCILER_FAULT_AT": "exec", "RECONCILER_FAULT_LOG": str(points)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert points.read_text().splitlines()[-1].split()[1] == "exec"
    agent = agents("cmp2", deployment.url)  # for reading state, and cleanup
    left = pids(agent)
    assert (deployment.note("cmp2") or {}).get("state") == "applied" and all(left.values())

    # The next start: the lock is free, nothing is left to do, the services run on untouched;
    # and it goes on to apply the next commit.
    with _daemon(config):
        _kvm_applied(deployment, 60)
    now = pids(agent)
    assert now["node-exporter"] == left["node-exporter"]  # not touched by the kvm change
    assert all(now.values())


@pytest.mark.parametrize("shown", [False, True], ids=["quiet", "progress"])
def test_a_ref_lock_left_by_a_killed_git_fetch_is_removed_once_no_git_can_hold_it(
    deployment: Deployment, agents: Callable[..., Agent], caplog: pytest.LogCaptureFixture, shown: bool
) -> None:
    from reconciler.core.errors import RemoteError
    from reconciler.source.gitrun import GIT_TIMEOUT

    ctl1 = agents("ctl1", deployment.url)
    assert ctl1.reconcile_once().exit_code == 0
    ctl1.source.progress = shown  # on a terminal, the fetch is GitPython's, showing its progress
    # What git leaves when it dies while updating the branch's ref in the mirror.
    lock = ctl1.source.path / "refs" / "heads" / "main.lock"
    lock.write_text("")
    deployment.edit("inventory.yaml", "token_ttl: 3600", "token_ttl: 1200")
    c1 = deployment.commit("shorter tokens")
    # Young: it may be a live git's (another command on this state dir); the fetch fails, saying so.
    with pytest.raises(RemoteError, match=r"fetch from .*main\.lock.*File exists"):
        ctl1.reconcile_once()
    assert lock.exists()
    # Older than any git of ours may run: a dead one's. Removed, said, and the poll goes on.
    old = lock.stat().st_mtime - GIT_TIMEOUT - 1
    os.utime(lock, (old, old))
    result = ctl1.reconcile_once()
    assert result.exit_code == 0 and result.commit == c1 and not lock.exists(), result
    assert "left by a git process killed" in caplog.text
