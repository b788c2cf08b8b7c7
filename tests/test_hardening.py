"""Promises kept under an operator's hands: rollback, unpin, retry, apply, read commands, the daemon.

Each test is a defect a new user hit on a two-node fleet with a canary wave (ctl1, then ctl2),
written against the commands and the notes, as an operator sees them. History::

    C1 initial --- C2 token_ttl 900 (reload) --- C3 ... (each test says what C3 is)
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from conftest import Deployment, SigningKey, age_args, wait_for
from needs import unavailable

from reconciler.agent import Agent
from reconciler.node.operations import retry

CANARY = """\
rollout:
  waves:
    - {name: canary, nodes: [ctl1]}
    - {name: rest, nodes: [ctl2]}
"""


def cli(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reconciler", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def node_args(agent: Agent, key: SigningKey) -> list[str]:
    return ["--node", agent.cfg.node, "--remote", agent.cfg.remote, "--state-dir", str(agent.cfg.state_dir),
            "--allowed-signers", str(key.allowed_signers), *age_args(agent)]


def ttl(deployment: Deployment, node: str) -> int:
    url = f"http://127.0.0.1:{deployment.port_bases[node] + 5}/v3"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return int(json.loads(resp.read())["token_ttl"])


def set_ttl(deployment: Deployment, value: int) -> str:
    text = deployment.read("inventory.yaml")
    old = next(line for line in text.splitlines() if line.strip().startswith("token_ttl:"))
    deployment.edit("inventory.yaml", old, f"  token_ttl: {value}")
    return deployment.commit(f"tokens live {value} s")


def break_identity(deployment: Deployment) -> str:
    deployment.edit("services/identity/templates/identity.conf.j2", "port = {{ port_base + ports.identity }}",
                    "port = five-thousand")
    return deployment.commit("identity: a config the program rejects")


@pytest.fixture
def fleet(deployment: Deployment, agents: Callable[..., Agent]) -> dict[str, Agent]:
    """ctl1 (canary) and ctl2, both converged on C1 and C2."""
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + CANARY)
    deployment.commit("canary first")
    nodes = {n: agents(n, deployment.url) for n in ("ctl1", "ctl2")}
    for n in ("ctl1", "ctl2"):
        assert nodes[n].reconcile_once().exit_code == 0
    set_ttl(deployment, 900)
    for n in ("ctl1", "ctl2"):
        assert nodes[n].reconcile_once().exit_code == 0
    return nodes


def test_a_rollback_on_a_node_whose_head_failed_keeps_the_failure_and_the_fleet_halted(
    deployment: Deployment, fleet: dict[str, Agent], merge_key: SigningKey
) -> None:
    c1 = deployment.commit("nothing changes", push=False)  # a commit both nodes ran identity from
    deployment.push()
    for n in ("ctl1", "ctl2"):
        fleet[n].reconcile_once()
    bad = break_identity(deployment)
    assert fleet["ctl1"].reconcile_once().exit_code == 1
    assert (deployment.note("ctl1", bad) or {})["state"] == "failed"

    ctl1 = fleet["ctl1"]
    ctl1.close()
    proc = cli("rollback", "identity", "--to", c1, *node_args(ctl1, merge_key), "-o", "json")
    assert proc.returncode == 0, proc.stderr

    note = deployment.note("ctl1", bad) or {}
    assert note["state"] == "failed"  # the failure stays in the note: the fleet gate reads it
    assert note.get("pins") == {"identity": c1}
    assert any("rollback of identity" in e for e in cast(list[str], note.get("events", [])))
    again = fleet["ctl2"].reconcile_once()
    assert again.report is not None and again.report.state == "halted"
    assert ttl(deployment, "ctl2") == 900  # ctl2 never started the bad commit
    assert (deployment.note("ctl2", bad) or {})["state"] == "halted"


def test_rollback_without_to_steps_back_one_version_at_a_time_and_status_names_its_commit(
    deployment: Deployment, fleet: dict[str, Agent], merge_key: SigningKey
) -> None:
    ctl1 = fleet["ctl1"]
    c2 = deployment.note("ctl1")["commit"]  # type: ignore[index]
    c3 = set_ttl(deployment, 600)
    assert ctl1.reconcile_once().exit_code == 0 and ttl(deployment, "ctl1") == 600
    ctl1.close()
    args = node_args(ctl1, merge_key)

    assert cli("rollback", "identity", *args).returncode == 0
    assert ttl(deployment, "ctl1") == 900
    status = json.loads(cli("status", *args, "-o", "json").stdout)
    identity = next(s for s in status["services"] if s["name"] == "identity")
    assert identity["commit"] == c2  # the commit its running files were rendered from, not the head

    proc = cli("rollback", "identity", *args)  # once more: back to C1's value, not forward to C3's
    assert proc.returncode == 0, proc.stderr
    assert ttl(deployment, "ctl1") == 3600
    assert (deployment.note("ctl1", c3) or {})["state"] == "applied"


def test_unpin_brings_the_service_back_to_the_head_and_retry_names_only_the_head(
    deployment: Deployment, fleet: dict[str, Agent], merge_key: SigningKey
) -> None:
    ctl1 = fleet["ctl1"]
    ctl1.close()
    args = node_args(ctl1, merge_key)
    assert cli("rollback", "identity", *args).returncode == 0
    assert ttl(deployment, "ctl1") == 3600

    assert cli("unpin", "identity", *args).returncode == 0
    plan = json.loads(cli("plan", *args, "-o", "json").stdout)
    assert {a["service"]: a["action"] for a in plan["actions"]}["identity"] == "reload"
    proc = cli("apply", *args, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["report"]["services"]["identity"]["action"] == "reload"
    assert ttl(deployment, "ctl1") == 900
    assert cli("unpin", "identity", *args).returncode == 2  # nothing pinned now: said, not ignored

    # A commit that failed here once, then a fix: `retry` has nothing to retry.
    break_identity(deployment)
    assert cli("agent", "--once", *args).returncode == 1
    deployment.edit("services/identity/templates/identity.conf.j2", "port = five-thousand",
                    "port = {{ port_base + ports.identity }}")
    deployment.commit("identity: fixed")
    assert cli("agent", "--once", *args).returncode == 0
    proc = cli("retry", *args)
    assert proc.returncode == 0 and "nothing to retry" in proc.stdout


def test_apply_of_a_service_the_node_does_not_run_is_bad_input_and_notes_nothing(
    deployment: Deployment, fleet: dict[str, Agent], merge_key: SigningKey
) -> None:
    ctl1 = fleet["ctl1"]
    ctl1.close()
    head = set_ttl(deployment, 300)
    proc = cli("apply", "--service", "compute-agent", *node_args(ctl1, merge_key))
    assert proc.returncode == 2
    assert "compute-agent" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert deployment.note("ctl1", head) is None  # nothing noted: the next wave does not start
    assert fleet["ctl2"].reconcile_once().waiting.startswith("waiting for ctl1")


def test_read_commands_do_not_create_a_node_where_there_is_none(tmp_path: Path, merge_key: SigningKey) -> None:
    wrong = tmp_path / "no-such-node"
    for command in ("status", "history"):
        proc = cli(command, "--node", "ctl1", "--state-dir", str(wrong), "--allowed-signers",
                   str(merge_key.allowed_signers))
        assert proc.returncode == 2, (command, proc.stderr)
        assert "does not exist" in proc.stderr and "Traceback" not in proc.stderr
        assert not wrong.exists()


def test_history_of_a_service_the_node_never_ran_says_so_instead_of_an_empty_table(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey
) -> None:
    cmp1 = agents("cmp1", deployment.url)
    assert cmp1.reconcile_once().exit_code == 0
    cmp1.close()
    known = cli("history", "compute-agent", *node_args(cmp1, merge_key), "-o", "json")
    assert known.returncode == 0 and {r["service"] for r in json.loads(known.stdout)} == {"compute-agent"}
    assert cli("history", "compute-agent", "--limit", "0", *node_args(cmp1, merge_key)).returncode == 0
    typo = cli("history", "compute-agnet", *node_args(cmp1, merge_key))
    assert (typo.returncode, typo.stdout) == (2, "")
    assert typo.stderr == ("error: service 'compute-agnet': not in this node's history (it has: compute-agent, "
                           "node-exporter) [BAD_INPUT]\n")


def test_a_second_daemon_on_the_same_state_dir_is_refused_at_start(
    deployment: Deployment, merge_key: SigningKey, tmp_path: Path
) -> None:
    state = tmp_path / "nodes" / "cmp1"
    args = ["agent", "--node", "cmp1", "--remote", deployment.url, "--state-dir", str(state), "--allowed-signers",
            str(merge_key.allowed_signers), "--interval", "60", "--jitter", "0"]
    first = subprocess.Popen([sys.executable, "-m", "reconciler", *args], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (state / "agent.lock").exists() or first.poll() is not None, 20, "the first daemon")
        wait_for(lambda: (deployment.note("cmp1") or {}).get("state") == "applied", 30, "the first pass")
        second = cli(*args, timeout=20)
        assert second.returncode != 0
        assert "another `reconciler agent`" in second.stderr and "Traceback" not in second.stderr
    finally:
        first.terminate()
        first.wait(15)
        cli("agent", "--once", "--node", "cmp1", "--remote", deployment.url, "--state-dir", str(state),
            "--allowed-signers", str(merge_key.allowed_signers))
        _stop_services(state)


def _stop_services(state: Path) -> None:
    from reconciler.drivers.process import ProcessDriver

    driver = ProcessDriver(state / "services", "n")
    for o in driver.observe():
        driver.remove(o.name)


@pytest.fixture
def stalled_git_server() -> Iterator[str]:
    """A git:// server that accepts connections and never answers: a poll hangs on it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                held.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"git://127.0.0.1:{server.getsockname()[1]}/cloud.git"
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        server.close()


def test_the_supervisor_restarts_a_dead_service_while_a_poll_hangs_on_a_stalled_server(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path,
    stalled_git_server: str,
) -> None:
    cmp1 = agents("cmp1", deployment.url)
    assert cmp1.reconcile_once().exit_code == 0
    cmp1.close()
    config = tmp_path / "cmp1.yaml"
    config.write_text(f"node: cmp1\nremote: {stalled_git_server}\nstate_dir: {cmp1.cfg.state_dir}\n"
                      f"interval: 1\njitter: 0\nsupervise_interval: 0.3\n"
                      f"trust: {{allowed_signers: {merge_key.allowed_signers}}}\n")
    daemon = subprocess.Popen([sys.executable, "-m", "reconciler", "agent", "--config", str(config)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2.0)  # the first poll is now stuck on the server
        record = json.loads((cmp1.cfg.state_dir / "services" / "compute-agent" / "record.json").read_text())
        os.kill(record["pid"], 9)

        def revived() -> bool:
            rec = json.loads((cmp1.cfg.state_dir / "services" / "compute-agent" / "record.json").read_text())
            # a restart writes its record before the spawn (no pid yet), then again with the pid
            return bool(rec.get("pid") and rec["pid"] != record["pid"] and Path(f"/proc/{rec['pid']}").exists())

        wait_for(revived, 20, "the supervisor to restart compute-agent during the stalled poll")
    finally:
        daemon.terminate()
        daemon.wait(15)


def test_the_daemon_logs_a_verdict_once_with_its_reason_and_the_service_output(
    deployment: Deployment, agents: Callable[..., Agent], merge_key: SigningKey, tmp_path: Path
) -> None:
    ctl1 = agents("ctl1", deployment.url)
    assert ctl1.reconcile_once().exit_code == 0
    ctl1.close()
    bad = break_identity(deployment)
    config = tmp_path / "ctl1.yaml"
    config.write_text(f"node: ctl1\nremote: {deployment.url}\nstate_dir: {ctl1.cfg.state_dir}\n"
                      f"interval: 0.5\njitter: 0\nsupervise_interval: 5\n"
                      f"trust: {{allowed_signers: {merge_key.allowed_signers}}}\n"
                      f"secrets: {{age_identity: {ctl1.cfg.secrets.age_identity}}}\n")
    log = tmp_path / "daemon.log"
    with open(log, "w") as out:
        daemon = subprocess.Popen([sys.executable, "-m", "reconciler", "agent", "--config", str(config)],
                                  stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: (deployment.note("ctl1", bad) or {}).get("state") == "failed", 60, "the failed note")
            # Settled on the failed head, the daemon re-executes to give back memory (issue 17).
            wait_for(lambda: "agent re-executed" in log.read_text(), 60, "the daemon to re-execute")
            time.sleep(4)  # eight more polls of the same failed head, by the new interpreter
        finally:
            daemon.terminate()
            daemon.wait(15)
    lines = log.read_text().splitlines()
    verdicts = [line for line in lines if bad[:12] in line and "failed" in line]
    assert verdicts and all("[APPLY_FAILED]" in line or "not retried" in line for line in verdicts), lines
    assert sum("[APPLY_FAILED]" in line and "identity" in line for line in lines) == 1, lines
    assert sum("not retried" in line for line in lines) <= 1, lines
    assert any("output" in line for line in verdicts), lines  # the service's own last words
    # What the daemon had said once, its new interpreter knew, and did not say again.
    assert any("agent re-executed" in line for line in lines), lines


def _fill(path: Path, leave: int) -> Path:
    """Fill ``path``'s filesystem until ``leave`` bytes are free."""
    filler = path / "filler"
    free = os.statvfs(path).f_bavail * os.statvfs(path).f_frsize
    with open(filler, "wb") as f:
        f.truncate(0)
        chunk = b"\0" * 2**20
        left = max(0, free - leave)
        while left > 0:
            try:
                f.write(chunk[: min(len(chunk), left)])
                f.flush()
            except OSError:
                break
            left -= min(len(chunk), left)
    return filler


@contextlib.contextmanager
def tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A real filesystem of ``size`` at ``mount`` (root only), unmounted after: a disk that
    really fills up."""
    if os.geteuid() != 0:
        unavailable("root", "mounting a small filesystem needs root (CI runs as root)")
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs: a state dir whose disk can really fill up."""
    with tmpfs(tmp_path / "disk", "64m") as mount:
        yield mount


def test_a_full_disk_is_a_one_line_error_before_anything_changes_and_the_next_run_converges(
    deployment: Deployment, merge_key: SigningKey, small_disk: Path
) -> None:
    state = small_disk / "cmp1"
    args = ["--node", "cmp1", "--remote", deployment.url, "--state-dir", str(state),
            "--allowed-signers", str(merge_key.allowed_signers)]
    try:
        assert cli("agent", "--once", *args).returncode == 0
        deployment.edit("inventory.yaml", "hypervisor: qemu", "hypervisor: kvm")
        head = deployment.commit("kvm")
        filler = _fill(small_disk, 2 * 2**20)

        proc = cli("agent", "--once", *args)
        assert proc.returncode == 1
        assert "DISK_FULL" in proc.stderr and str(state) in proc.stderr and "MiB free" in proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert deployment.note("cmp1", head) is None

        # The same with no margin asked for: the disk fills up in the middle of the pass.
        config = small_disk / "cmp1.yaml"
        config.write_text("min_free_mb: 0\n")
        filler.unlink()
        filler = _fill(small_disk, 0)
        proc = cli("agent", "--once", "--config", str(config), *args)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) <= 2, proc.stderr  # the error, and maybe a push warning

        filler.unlink()
        done = cli("agent", "--once", *args, "-o", "json")
        assert done.returncode == 0, done.stderr
        assert (deployment.note("cmp1", head) or {}).get("state") == "applied"
        assert not [p for p in state.rglob(".rc-tmp-*")] and not [p for p in state.rglob(".tmp-*")]
    finally:
        _stop_services(state)


def _leftovers(state: Path) -> list[Any]:
    return [p for p in state.rglob("*") if p.name.startswith((".rc-tmp-", ".tmp-")) and "mirror.git" not in p.parts]


def test_on_failure_node_puts_back_every_service_the_failed_run_changed(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + "on_failure: node\n")
    deployment.commit("a failed run puts the whole node back")
    ctl1 = agents("ctl1", deployment.url)
    assert ctl1.reconcile_once().exit_code == 0
    db_conf = ctl1.cfg.state_dir / "services" / "db" / "live"
    before = {p.name: p.read_text() for p in db_conf.iterdir()}
    deployment.edit("inventory.yaml", "db_max_connections: 200", "db_max_connections: 300")
    deployment.edit("services/identity/templates/identity.conf.j2", "port = {{ port_base + ports.identity }}",
                    "port = five-thousand")
    bad = deployment.commit("more db connections, and a broken identity")

    result = ctl1.reconcile_once()

    assert result.exit_code == 1
    assert {p.name: p.read_text() for p in db_conf.iterdir()} == before  # db runs its old slice again
    note = deployment.note("ctl1", bad) or {}
    assert note["state"] == "failed"
    assert any(e.startswith("on_failure node: db put back to") for e in cast(list[str], note.get("events", []))), note
    assert ttl(deployment, "ctl1") == 3600


def test_a_node_that_lost_its_disk_does_not_retry_a_commit_its_own_note_says_failed(
    deployment: Deployment, agents: Callable[..., Agent]
) -> None:
    import shutil

    ctl1 = agents("ctl1", deployment.url)
    assert ctl1.reconcile_once().exit_code == 0
    bad = break_identity(deployment)
    assert ctl1.reconcile_once().exit_code == 1
    ctl1.close()
    shutil.rmtree(ctl1.cfg.state_dir / "mirror.git")
    for name in ("state.db", "state.db-wal", "state.db-shm"):
        (ctl1.cfg.state_dir / name).unlink(missing_ok=True)

    fresh = agents("ctl1", deployment.url)
    result = fresh.reconcile_once()

    assert result.report is None and result.skipped.startswith("failed here before"), result
    assert (deployment.note("ctl1", bad) or {})["state"] == "failed"
    assert retry(fresh.ctx) == bad
