"""`reconciler logs`: a service's own output, from its driver, printed and followed."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from conftest import Deployment, SigningKey
from test_cli import node_args

from reconciler.agent import Agent


def live_conf(agent: Agent) -> str:
    return (agent.cfg.state_dir / "services" / "identity" / "live" / "identity.conf").read_text()


def logs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", "logs", *args], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ))


def test_logs_prints_the_last_lines_then_follows_what_the_service_writes(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey
) -> None:
    ctl1 = agents("ctl1", deployment.url)
    assert ctl1.reconcile_once().exit_code == 0
    args = node_args(ctl1, merge_key)

    port = next(int(line.split("=")[1]) for line in live_conf(ctl1).splitlines() if line.startswith("port ="))
    log = (ctl1.cfg.state_dir / "services" / "identity" / "service.log").read_text()
    last = logs("identity", *args, "-n", "3")
    assert last.returncode == 0, last.stderr
    assert last.stdout == "".join(log.splitlines(keepends=True)[-3:])
    everything = logs("identity", *args, "-n", "1000").stdout
    assert everything == log and f"identity ready on 127.0.0.1:{port} (node=ctl1" in everything
    as_json = json.loads(logs("identity", *args, "-n", "1000", "-o", "json").stdout)
    assert as_json == {"service": "identity", "driver": "process", "output": log}

    follow = subprocess.Popen([sys.executable, "-m", "reconciler", "logs", "identity", *args, "-n", "0", "-f"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ))
    try:
        seen = b""
        sel = selectors.DefaultSelector()
        assert follow.stdout is not None
        sel.register(follow.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 30
        # A request a second until one shows: the follower starts at the log's end whenever its
        # start-up (imports, on a loaded machine) is over, and sees each request after that.
        while b"GET /status" not in seen and time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as resp:
                assert resp.status == 200
            if sel.select(timeout=1):
                seen += os.read(follow.stdout.fileno(), 4096)
        assert b"GET /status" in seen, seen
        assert b"ready on" not in seen  # -n 0: only what came after it started
    finally:
        follow.terminate()
        follow.wait(timeout=10)


def test_logs_of_a_service_the_node_does_not_run_is_one_line_and_exit_2(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path
) -> None:
    ctl1 = agents("ctl1", deployment.url)
    assert ctl1.reconcile_once().exit_code == 0
    proc = logs("compute-agent", *node_args(ctl1, merge_key))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: service compute-agent does not run on node ctl1 (it runs: db, identity, lb, node-exporter) "
        "[UNKNOWN_SERVICE]"]
    nowhere = logs("identity", "--node", "ctl9", "--state-dir", str(tmp_path / "none"))
    assert nowhere.returncode == 2 and len(nowhere.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "none").exists()  # a read makes no state dir


def test_a_service_log_past_its_limit_is_rotated_by_the_supervisor_without_a_restart(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    from reconciler.daemon.supervisor import Supervisor
    from reconciler.drivers.servicelog import LOG_LIMIT

    ctl1 = agents("ctl1", deployment.url)
    assert ctl1.reconcile_once().exit_code == 0
    d = ctl1.cfg.state_dir / "services" / "identity"
    pid = int(json.loads((d / "record.json").read_text())["pid"])
    with (d / "service.log").open("ab") as log:  # as if it had run for months
        log.write(b"x" * (LOG_LIMIT + 1) + b"\n")

    Supervisor(ctl1).tick()

    assert (d / "service.log.1").stat().st_size > LOG_LIMIT
    assert (d / "service.log").stat().st_size == 0
    assert oct((d / "service.log.1").stat().st_mode & 0o777) == "0o600"
    port = next(int(line.split("=")[1]) for line in live_conf(ctl1).splitlines() if line.startswith("port ="))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as resp:
        assert resp.status == 200
    deadline = time.monotonic() + 10
    while b"GET /status" not in (d / "service.log").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.1)
    # the same process writes on, at the start of the cut file
    assert (d / "service.log").read_bytes().startswith(b"identity 127.0.0.1 \"GET /status")
    assert int(json.loads((d / "record.json").read_text())["pid"]) == pid
    os.kill(pid, 0)


def test_the_agents_own_log_for_the_journal_and_for_log_shippers(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path
) -> None:
    """Under systemd (stderr is the journal's stream) no timestamps, a syslog priority prefix
    per line; `--log-format json` one object a line. Each node's first pass, which logs."""
    def first_pass(node: str, *options: str, stdout: int | IO[str] | None = None, stderr: int | IO[str] | None = None,
                   env: Mapping[str, str] | None = None, capture_output: bool = False) -> subprocess.CompletedProcess[str]:
        args = node_args(agents(node, deployment.url), merge_key)
        return subprocess.run([sys.executable, "-m", "reconciler", "-v", *options, "agent", "--once", *args],
                              text=True, timeout=120, stdout=stdout, stderr=stderr, env=env, capture_output=capture_output)

    err = tmp_path / "stderr"
    with err.open("w") as f:
        st = os.fstat(f.fileno())
        journal = {**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        done = first_pass("ctl1", stderr=f, stdout=subprocess.DEVNULL, env=journal)
    lines = err.read_text().splitlines()
    assert done.returncode == 0 and lines, lines
    assert all(line[:3] in ("<6>", "<4>", "<3>") for line in lines), lines
    assert "<6>INFO start db: not running on this node yet" in lines, lines
    assert not any(line[3:7].isdigit() for line in lines)  # no date: journald stamps it

    # the same variable inherited by a process whose stderr is elsewhere: text, with the time
    other = first_pass("ctl2", capture_output=True, env=journal)
    assert other.returncode == 0 and other.stderr[:2] == "20", other.stderr

    shipped = first_pass("ctl3", "--log-format", "json", capture_output=True)
    records = [json.loads(line) for line in shipped.stderr.splitlines()]
    assert records and all({"time", "level", "logger", "message"} <= set(r) for r in records), shipped.stderr
    assert any(r["level"] == "info" and r["message"].startswith("start db") for r in records), records
