"""A daemon that applied a change gives back the memory the change loaded (issue 17): once the
node is settled again it re-executes itself, same PID, keeping its lock, its metrics socket,
its poll phase and what it knew (secrets to redact, what it logged once, backoffs)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from conftest import Deployment, SigningKey, free_port, git, wait_for

from reconciler.agent import Agent
from reconciler.daemon import shed


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def _files(pid: int) -> list[str]:
    """What the process's descriptors point at (those gone while being read skipped)."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return out


class Daemon:
    """``reconciler agent --config`` as a real process, its log in a file."""

    def __init__(self, config: Path, log: Path, code: Path | None = None) -> None:
        """``code``: a directory holding the ``reconciler`` package to run (the checkout's when None)."""
        self.log = log
        self.out = open(log, "w")  # noqa: SIM115  (closed in stop)
        env = {**os.environ, "PYTHONPATH": str(code)} if code is not None else None
        self.proc = subprocess.Popen([sys.executable, "-m", "reconciler", "agent", "--config", str(config)],
                                     stdout=self.out, stderr=subprocess.STDOUT, env=env,
                                     cwd=log.parent if code is not None else None)

    def lines(self, text: str) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if text in line]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        self.out.close()
        return code


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def start(config: Path, code: Path | None = None) -> Daemon:
        started.append(Daemon(config, tmp_path / f"daemon{len(started)}.log", code))
        return started[-1]

    yield start
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait(10)
        d.out.close()


def _config(tmp_path: Path, node: Agent, merge_key: SigningKey, **more: object) -> Path:
    config = tmp_path / f"{node.cfg.node}.yaml"
    config.write_text(yaml.safe_dump({
        "node": node.cfg.node, "remote": node.cfg.remote, "state_dir": str(node.cfg.state_dir),
        "interval": 0.5, "jitter": 0, "supervise_interval": 1,
        "trust": {"allowed_signers": str(merge_key.allowed_signers)}, **more,
    }))
    return config


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def test_an_agent_that_applied_a_change_gives_back_its_memory_and_keeps_its_pid_lock_and_port(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path,
    daemon: Callable[..., Daemon],
) -> None:
    cmp1 = agents("cmp1", deployment.url)
    cmp1.close()
    port = free_port()
    config = _config(tmp_path, cmp1, merge_key, metrics={"listen": f"127.0.0.1:{port}"})
    agent = daemon(config)
    pid = agent.proc.pid
    first = git("rev-parse", "HEAD", cwd=deployment.work)
    wait_for(lambda: (deployment.note("cmp1", first) or {}).get("state") == "applied", 60, "the first apply")
    # The pass that applied loaded pygit2, Jinja2, the planner; the quiet poll after it re-executes.
    wait_for(lambda: bool(agent.lines("agent re-executed (1 so far)")), 30, "the daemon to re-execute itself")
    assert agent.proc.poll() is None and agent.proc.pid == pid
    given = agent.lines("re-executing to give back")
    assert len(given) == 1 and float(given[0].split("give back ")[1].split(" MB")[0]) >= shed.GROWTH_MB, given
    time.sleep(2)  # four quiet polls of the fresh interpreter
    assert "_pygit2" not in _maps(pid)  # its quiet polls never load it
    held = _files(pid)
    assert not any("reconciler-resume" in f for f in held), held  # the secrets' memory file is closed
    assert sum(f.endswith("/agent.lock") for f in held) == 1, held

    # Still the one daemon of its state dir: the lock was never let go.
    second = subprocess.run([sys.executable, "-m", "reconciler", "agent", "--config", str(config)],
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 1 and "another `reconciler agent`" in second.stderr, second.stderr
    # The metrics socket was handed over, not bound again; it serves what the ledger says.
    text = _scrape(port)
    assert f'reconciler_applied_commit_info{{commit="{first}"}} 1.0' in text
    assert 'reconciler_runs_total{state="applied"} 1.0' in text

    # The re-executed daemon is a whole daemon: it applies the next change, and gives back again.
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    second_commit = deployment.commit("kvm")
    wait_for(lambda: (deployment.note("cmp1", second_commit) or {}).get("state") == "applied", 60,
             "the second apply")
    wait_for(lambda: bool(agent.lines("agent re-executed (2 so far)")), 30, "the second re-execution")
    assert agent.proc.pid == pid
    assert len(agent.lines("agent started")) == 1  # one start; the rest were re-executions
    # Nothing of the first interpreter piles up in the third: the ledger open once, one lock.
    held = _files(pid)
    assert sum(f.endswith("/agent.lock") for f in held) == 1, held
    assert sum(f.endswith("/state.db") for f in held) == 1, held
    # The services the re-executed daemon started can be stopped: no signal mask of its
    # hand-over reached them.
    for record in (cmp1.cfg.state_dir / "services").glob("*/record.json"):
        service = json.loads(record.read_text()).get("pid")
        blocked = int(Path(f"/proc/{service}/status").read_text().split("SigBlk:")[1].split()[0], 16)
        assert not blocked & (1 << (signal.SIGTERM - 1)), record
    assert agent.stop() == 0


def _settled(deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path,
             daemon: Callable[..., Daemon], code: Path | None = None, **more: object) -> tuple[Daemon, Path]:
    """A daemon started on a node that had converged already, after its first quiet poll."""
    cmp1 = agents("cmp1", deployment.url)
    assert cmp1.reconcile_once().exit_code == 0
    cmp1.close()
    config = _config(tmp_path, cmp1, merge_key, **more)
    agent = daemon(config, code)
    wait_for(lambda: bool(agent.lines("unchanged")), 30, "the first quiet poll")
    return agent, config


def test_a_settled_agent_that_applied_nothing_never_re_executes(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path,
    daemon: Callable[..., Daemon],
) -> None:
    agent, _ = _settled(deployment, agents, merge_key, tmp_path, daemon)
    time.sleep(3)  # six more quiet polls
    assert agent.lines("re-execut") == []
    assert agent.stop() == 0


def test_a_settled_agent_serving_metrics_stays_light_and_a_failing_remote_does_not_make_it_re_execute(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path,
    daemon: Callable[..., Daemon],
) -> None:
    # Metrics record each poll's head and its commit time; reading that time through the
    # mirror's pygit2 grew a quiet agent by 11 MB, and the next error pass then re-executed it.
    port = free_port()
    agent, _ = _settled(deployment, agents, merge_key, tmp_path, daemon,
                        metrics={"listen": f"127.0.0.1:{port}"})
    head = git("rev-parse", "HEAD", cwd=deployment.work)
    wait_for(lambda: f'reconciler_head_commit_info{{commit="{head}"}} 1.0' in _scrape(port), 30,
             "a quiet poll in the metrics")
    assert "_pygit2" not in _maps(agent.proc.pid)
    away = deployment.bare.with_name("away.git")
    deployment.bare.rename(away)
    wait_for(lambda: bool(agent.lines("REMOTE")), 30, "a poll that fails")
    away.rename(deployment.bare)
    wait_for(lambda: 'reconciler_polls_total{result="error"} 1.0' in _scrape(port), 30, "the error in the metrics")
    wait_for(lambda: 'reconciler_last_poll_result{result="unchanged"} 1.0' in _scrape(port), 30,
             "a quiet poll once the remote is back")
    time.sleep(2)  # four more quiet polls
    assert agent.lines("re-execut") == []
    assert "_pygit2" not in _maps(agent.proc.pid)
    assert agent.stop() == 0


def _applies_a_change_and_keeps_its_memory(deployment: Deployment, agent: Daemon) -> str:
    """A commit the settled agent applies (work that would make it re-execute): it does not,
    and says why once; that line."""
    deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
    head = deployment.commit("kvm")
    wait_for(lambda: (deployment.note("cmp1", head) or {}).get("state") == "applied", 60, "the apply")
    wait_for(lambda: bool(agent.lines("not re-executing")), 30, "the agent to say why it keeps its memory")
    time.sleep(2)  # four more quiet polls: no second word, no re-execution
    assert agent.lines("agent re-executed") == []
    [said] = agent.lines("not re-executing")
    return said


def test_a_config_file_changed_under_a_running_agent_keeps_it_from_re_executing(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path,
    daemon: Callable[..., Daemon],
) -> None:
    agent, config = _settled(deployment, agents, merge_key, tmp_path, daemon)
    # An operator edits the file and has not restarted the agent: a fresh interpreter would
    # read the new file, so the agent keeps its memory rather than apply a file nobody restarted for.
    config.write_text(config.read_text().replace("supervise_interval: 1", "supervise_interval: 2"))
    assert "config file differs" in _applies_a_change_and_keeps_its_memory(deployment, agent)
    assert agent.stop() == 0


def test_code_upgraded_under_a_running_agent_keeps_it_from_re_executing_into_it(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path,
    daemon: Callable[..., Daemon],
) -> None:
    # The agent runs from an installed copy of the package; pip upgrades it under the running
    # agent and nobody restarts it. A re-execution would switch to the new code unasked (with the
    # old one's hand-over), so the agent keeps its memory and says to restart it.
    code = tmp_path / "installed"
    shutil.copytree(Path(shed.__file__).parents[1], code / "reconciler", ignore=shutil.ignore_patterns("__pycache__"))
    agent, _ = _settled(deployment, agents, merge_key, tmp_path, daemon, code)
    upgraded = code / "reconciler" / "render" / "node.py"
    upgraded.write_text(upgraded.read_text() + "\n# the next release\n")
    said = _applies_a_change_and_keeps_its_memory(deployment, agent)
    assert f"agent's code in {code / 'reconciler'} changed since it started" in said and "restart it" in said
    assert agent.stop() == 0


HAND_OVER = """
import fcntl, json, os, select, signal, sys, threading, time
from reconciler.daemon import shed
if sys.argv[1] == "before":
    lock = os.open(sys.argv[2], os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    signal.signal(signal.SIGTERM, lambda *_: None)
    signals = shed.Signals()
    def other():  # a worker thread that takes SIGTERM, not SIGINT
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        time.sleep(60)
    threading.Thread(target=other, daemon=True).start()
    time.sleep(0.2)
    signal.pthread_sigmask(signal.SIG_BLOCK, shed.Signals.STOPS)  # as the daemon's main thread does
    # Two stops that come during the hand-over: SIGTERM, taken by the worker thread, whose
    # Python handler can never run now; SIGINT, which no thread takes: pending across execv.
    os.kill(os.getpid(), signal.SIGTERM)
    select.select([signals.read_fd], [], [], 10)
    os.kill(os.getpid(), signal.SIGINT)
    shed.hand_over(shed.Carry(
        lock_fd=lock, metrics_fd=None, poll_due=12.5, supervise_due=13.0, failures={"db": 3},
        next_try={"db": 20.0}, up_since={"web": 1.5}, verdict=("c0ffee", "unchanged", ""),
        said=(("failed", "c0ffee"), ("poll", "REMOTE", "down")), secrets=(("hunter2", "db.password"),),
        pulled_ahead=("c0ffee",), sheds=1, started_mb=30.5, signal_fds=signals.fds,
    ), [sys.executable, sys.argv[0], "after", sys.argv[2]])
else:
    carry = shed.take_over()
    got = {"pid": os.getpid(), "env": shed.ENV in os.environ, "carry": {
        k: v for k, v in vars(carry).items() if k not in ("lock_fd", "signal_fds")}}
    got["lock_is_the_file"] = os.fstat(carry.lock_fd).st_ino == os.stat(sys.argv[2]).st_ino
    got["term_in_the_pipe"] = shed.Signals(carry.signal_fds).stop_asked()
    interrupted = []
    signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, shed.Signals.STOPS)
    got["int_delivered"] = interrupted == [True]
    got["memory_file_open"] = any("reconciler-resume" in os.readlink(f"/proc/self/fd/{fd}")
                                  for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}"))
    print(json.dumps(got))
"""


def test_a_hand_over_keeps_the_lock_the_knowledge_and_the_stops_that_came_meanwhile(tmp_path: Path) -> None:
    script = tmp_path / "hand_over.py"
    script.write_text(HAND_OVER)
    lock = tmp_path / "agent.lock"
    proc = subprocess.Popen([sys.executable, str(script), "before", str(lock)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    got = json.loads(out)
    assert got["pid"] == proc.pid  # execv: the same process
    assert got["carry"] == {
        "metrics_fd": None, "poll_due": 12.5, "supervise_due": 13.0, "failures": {"db": 3},
        "next_try": {"db": 20.0}, "up_since": {"web": 1.5}, "verdict": ["c0ffee", "unchanged", ""],
        "said": [["failed", "c0ffee"], ["poll", "REMOTE", "down"]], "secrets": [["hunter2", "db.password"]],
        "pulled_ahead": ["c0ffee"], "sheds": 1, "started_mb": 30.5,
    }
    assert got["env"] is False  # no child of the new interpreter sees the variable
    assert got["lock_is_the_file"]
    assert got["term_in_the_pipe"] is True and got["int_delivered"] is True
    assert got["memory_file_open"] is False  # the file that carried the secrets is closed


def test_what_a_replaced_interpreter_knew_is_known_again(deployment: Deployment,
                                                         agents: Callable[..., Agent]) -> None:
    node = agents("cmp1", deployment.url)
    node.take_back([("failed", "c0ffee")], [("hunter2", "db.password")], ["c0ffee"])
    assert node.redact("login with hunter2 failed") == "login with <secret db.password> failed"
    assert node.ledger.redact is node.redact  # what it writes to its history is cleaned too
    assert node.pulled_ahead == {"c0ffee"}
    assert node.said() == (("failed", "c0ffee"),)


def test_the_said_keys_come_back_as_the_tuples_they_were() -> None:
    carry = shed.Carry(lock_fd=3, metrics_fd=None, poll_due=0.0, supervise_due=0.0,
                       said=(("failed", "c0ffee"), ("poll", ("nested", 1), None), object()))
    back = shed._decode(shed._encode(carry))
    assert back.said == (("failed", "c0ffee"), ("poll", ("nested", 1), None))  # what JSON cannot carry is dropped
