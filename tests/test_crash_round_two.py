"""Crash safety, round two: an upgrade pass killed anywhere runs each step once; a full disk is
DISK_FULL however SQLite words it; a corrupt ledger is moved aside and the node heals.

One node ``n1`` runs two services, ``web`` and ``api`` (the crash tests' small HTTP app). Each
upgrade commit takes ``web`` to a new version with three steps (``stop``, a ``once`` command
``migrate`` that appends to ``migrate.log``, ``start``) and a deployment-wide post step
``post-mark`` that appends the commit to ``post.log``. Both logs are outside the state dir, so
what they hold is what really ran.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import Deployment, SigningKey, free_port, small_deployment
from test_cli import cli, one_error_line
from test_crash_points import APP, SERVICE, count_points, killed_at, one_pass
from test_faults import processes_of
from test_hardening import _fill, tmpfs

from reconciler.agent import Agent
from reconciler.settings import AgentConfig, TrustConfig

STEPS = """\
version: "{version}"
upgrade:
  - {{name: stop, action: stop}}
  - name: migrate
    action: command
    scope: once
    command: 'echo "$RECONCILER_COMMIT" >> {migrate}'
  - {{name: start, action: start}}
"""


def _inventory(ports: dict[str, int]) -> str:
    return (f"vars:\n  ports: {json.dumps(ports)}\n  values: {{web: a, api: one}}\n"
            "  levels: {web: info, api: info}\n  modes: {web: plain, api: plain}\n"
            "groups:\n  g: {services: [web, api]}\nnodes:\n  n1: {groups: [g]}\n")


@dataclass
class UpgradeNode:
    """The node, its deployment and the two logs the steps append to."""

    deployment: Deployment
    cfg: AgentConfig
    ports: dict[str, int]
    migrate: Path
    post: Path
    version: int = 1

    def upgrade(self) -> str:
        """A commit that takes web to the next version: its steps and the post step run."""
        self.version += 1
        text = self.deployment.read("services/web/service.yaml")
        self.deployment.write("services/web/service.yaml", STEPS.format(version=self.version, migrate=self.migrate)
                              + text[text.index("runtime:"):])
        return self.deployment.commit(f"web: version {self.version}")

    def run(self, operation: Callable[[Agent], object] | None = None) -> object:
        """A plain pass (or ``operation``) by a fresh agent, as ``test_crash_points``' helpers ask."""
        return one_pass(self.cfg, operation)

    def ran(self, log: Path, commit: str) -> int:
        """How many times a step of ``commit`` appended to ``log``."""
        return log.read_text().split().count(commit) if log.exists() else 0


@pytest.fixture
def upgrade_node(tmp_path: Path, merge_key: SigningKey) -> Iterator[UpgradeNode]:
    ports = {"web": free_port(), "api": free_port()}
    migrate, post = tmp_path / "migrate.log", tmp_path / "post.log"
    conf = "[app]\nvalue = {{ values[service] }}\nlevel = {{ levels[service] }}\nrelease = {{ service_version }}\n"
    files = {
        "reconciler.yaml": ("format: 1\nname: crash\npost_upgrade:\n"
                            f"  - {{name: post-mark, after: [web], action: command,"
                            f" command: 'echo \"$RECONCILER_COMMIT\" >> {post}'}}\n"),
        "inventory.yaml": _inventory(ports),
        # A short health hold: some hundred kill points, each a few restarts.
        "services/web/service.yaml": 'version: "1"\n' + SERVICE.replace("  timeout: 10\n",
                                                                        "  timeout: 10\n  min_healthy: 0.05\n"),
        "services/web/templates/app.conf.j2": conf,
        "services/web/files/app.py": APP,
        "services/api/service.yaml": SERVICE,
        "services/api/templates/app.conf.j2": conf,
        "services/api/files/app.py": APP,
    }
    dep = small_deployment(tmp_path, merge_key, files)
    cfg = AgentConfig(node="n1", remote=dep.url, state_dir=tmp_path / "state",
                      trust=TrustConfig(allowed_signers=merge_key.allowed_signers))
    yield UpgradeNode(dep, cfg, ports, migrate, post)
    _stop_all(cfg.state_dir)


def _stop_all(state: Path) -> None:
    from reconciler.drivers.process import ProcessDriver

    driver = ProcessDriver(state / "services", "n1")
    for o in driver.observe():
        driver.remove(o.name)
    for pids in processes_of(state).values():
        for pid in pids:
            os.killpg(pid, 9)


def _assert_upgraded(node: UpgradeNode, head: str, what: str) -> None:
    state = node.cfg.state_dir
    assert node.ran(node.migrate, head) == 1, (what, node.migrate.read_text() if node.migrate.exists() else "")
    assert node.ran(node.post, head) == 1, (what, node.post.read_text() if node.post.exists() else "")
    note = node.deployment.note("n1", head) or {}
    assert note.get("state") == "applied", (what, note)
    steps = {s["step"]: s["status"] for s in note.get("upgrade", [])}  # type: ignore[attr-defined]
    assert steps == {"stop": "done", "migrate": "done", "start": "done", "post-mark": "done"}, (what, steps)
    procs = processes_of(state)
    assert sorted(procs) == ["api", "web"] and all(len(p) == 1 for p in procs.values()), (what, procs)
    assert f"release = {node.version}" in (state / "services" / "web" / "live" / "app.conf").read_text(), what
    left = [p for p in state.rglob("*") if p.name.startswith(".rc-tmp-") and "mirror.git" not in p.parts]
    left += [p for p in (state / "upgrade").glob("*/*") if p.is_dir()]
    assert not left, (what, left)


def test_a_post_step_killed_before_it_is_recorded_done_does_not_run_again(upgrade_node: UpgradeNode,
                                                                          tmp_path: Path) -> None:
    """Killed just before the ledger write that records post-mark done, the post step's command
    has run; the next plain pass finds its exit status and records it, and does not run it twice."""
    node = upgrade_node
    node.run()
    head = node.upgrade()
    points = count_points(node, None, tmp_path / "points.log")  # type: ignore[arg-type]
    node.run()
    _assert_upgraded(node, head, "counted pass")

    head = node.upgrade()
    at = next(i for i, p in enumerate(points, 1) if p.split(" ", 1)[1] == "db step /post-mark done")
    killed_at(node, None, at, points)  # type: ignore[arg-type]
    assert node.ran(node.post, head) == 1  # it ran, and the agent died before recording it
    node.run()
    _assert_upgraded(node, head, f"killed before side effect {at} ({points[at - 1]})")


def test_killed_at_every_side_effect_of_an_upgrade_pass_each_step_runs_once(upgrade_node: UpgradeNode,
                                                                           tmp_path: Path) -> None:
    """The pass that runs web's steps (one of them ``once``), applies and runs the post step,
    killed before each of its numbered side effects in turn, each time on a new upgrade commit;
    then plain passes until the note settles. Each step ran exactly once, the note says applied
    with every step done, one process per service, nothing left in the state dir."""
    node = upgrade_node
    node.run()
    node.upgrade()
    points = count_points(node, None, tmp_path / "points.log")  # type: ignore[arg-type]
    assert any("spawn upgrade step web/migrate" in p for p in points), points
    assert any("spawn upgrade step /post-mark" in p for p in points), points
    for n in range(1, len(points) + 1):
        head = node.upgrade()
        killed_at(node, None, n, points)  # type: ignore[arg-type]
        for _ in range(3):
            node.run()
            if (node.deployment.note("n1", head) or {}).get("state") == "applied" and node.ran(node.post, head):
                break
        _assert_upgraded(node, head, f"killed before side effect {n} of {len(points)} ({points[n - 1]})")


# A full disk ---------------------------------------------------------------------------------
@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs: room for a small node's state dir, and a disk that really fills up."""
    with tmpfs(tmp_path / "disk", "2M") as mount:
        yield mount


@pytest.mark.parametrize("leave", [0, 16 * 1024])
def test_a_full_disk_under_the_ledger_is_disk_full_with_the_path_and_the_free_space(
    upgrade_node: UpgradeNode, merge_key: SigningKey, tiny_disk: Path, leave: int
) -> None:
    """A node whose state dir is on a small filesystem applied a commit; the disk fills up to
    ``leave`` bytes free. SQLite cannot even open the ledger (its shared-memory index needs
    32 KiB) and says 'disk I/O error': the agent says DISK_FULL, with the state dir and the free
    space, on one line, exit 1; once there is room the next pass converges."""
    state = tiny_disk / "state"
    config = tiny_disk.parent / "n1.yaml"
    config.write_text("min_free_mb: 0\n")  # no margin asked for: room for the state dir alone
    args = ["agent", "--once", "--config", str(config), "--node", "n1", "--remote", upgrade_node.deployment.url, "--state-dir", str(state),
            "--allowed-signers", str(merge_key.allowed_signers)]
    try:
        assert cli(*args).returncode == 0
        head = upgrade_node.deployment.commit("nothing new, a new head")
        filler = _fill(tiny_disk, leave)
        assert shutil.disk_usage(state).free <= leave

        proc = cli(*args)

        assert proc.returncode == 1, proc.stderr
        one_error_line(proc, "DISK_FULL")
        free = f"{shutil.disk_usage(state).free // 1024} KiB free"
        assert str(state) in proc.stderr and free in proc.stderr, (free, proc.stderr)
        filler.unlink()
        done = cli(*args)
        assert done.returncode == 0, done.stderr
        assert (upgrade_node.deployment.note("n1", head) or {}).get("state") == "applied"
    finally:
        _stop_all(state)


# A corrupt ledger ----------------------------------------------------------------------------
def _truncate_to_half(db: Path) -> None:
    with open(db, "r+b") as f:
        f.truncate(db.stat().st_size // 2)


def _damage_header(db: Path) -> None:
    with open(db, "r+b") as f:  # the magic string and the page size: not a database any more
        f.write(b"this is no SQLite file at all..")


@pytest.mark.parametrize("damage", [_truncate_to_half, _damage_header], ids=["truncated", "header"])
def test_a_corrupt_ledger_is_moved_aside_and_the_node_heals_without_touching_its_services(
    upgrade_node: UpgradeNode, merge_key: SigningKey, damage: Callable[[Path], None]
) -> None:
    """A node applied a commit and runs web and api (process driver). Its ledger is damaged
    while no agent runs. The next `agent --once`, as a user runs it, exits 0: the damaged file
    is kept beside a fresh ledger, the node rebuilds what it knows as after a lost state dir
    (its notes on the remote, the drivers' records), the services keep running untouched (the
    same pids), the note stays applied and carries the event, and `status` says it happened."""
    node, state = upgrade_node, upgrade_node.cfg.state_dir
    args = ["--node", "n1", "--remote", node.deployment.url, "--state-dir", str(state),
            "--allowed-signers", str(merge_key.allowed_signers)]
    assert cli("agent", "--once", *args).returncode == 0
    head = node.deployment.commit("a second commit: more history in the ledger")
    assert cli("agent", "--once", *args).returncode == 0
    assert (node.deployment.note("n1", head) or {}).get("state") == "applied"
    running = processes_of(state)
    assert sorted(running) == ["api", "web"]
    db = state / "state.db"
    assert not (state / "state.db-wal").exists()  # the agent closed it: one file holds it all
    damage(db)
    damaged = db.read_bytes()

    proc = cli("agent", "--once", *args)

    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "ledger" in proc.stderr and "corrupt" in proc.stderr, proc.stderr  # logged at ERROR
    assert processes_of(state) == running  # not restarted, not doubled
    kept = sorted(state.glob("state.db.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == damaged, kept
    note = node.deployment.note("n1", head) or {}
    assert note.get("state") == "applied", note
    assert any("ledger" in e and str(kept[0]) in e for e in note.get("events", [])), note  # type: ignore[attr-defined]

    shown = cli("status", "--node", "n1", "--state-dir", str(state))
    assert shown.returncode == 0, shown.stderr
    assert "corrupt" in shown.stdout and str(kept[0]) in shown.stdout.replace("\n", ""), shown.stdout
    as_json = json.loads(cli("status", "--node", "n1", "--state-dir", str(state), "-o", "json").stdout)
    assert as_json["ledger_damaged"]["moved_to"] == str(kept[0]), as_json

    again = cli("agent", "--once", *args)  # healed: the next pass is a plain one
    assert again.returncode == 0 and "corrupt" not in again.stderr, again.stderr
    assert processes_of(state) == running
    assert len(list(state.glob("state.db.corrupt-*"))) == 1


HOLD_LOCK = """\
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.write(fd, f"{os.getpid()}\\n".encode())
print("held", flush=True)
sys.stdin.read()
"""


def test_a_corrupt_ledger_under_a_running_daemon_is_not_moved_aside_by_a_command(
    upgrade_node: UpgradeNode, merge_key: SigningKey
) -> None:
    """A daemon holds the state dir (agent.lock) and its ledger open when the ledger is found
    damaged by a command that builds the node's agent (`suspend`): moving it aside there would
    leave the daemon writing the renamed copy and the command a fresh one (the suspension never
    seen). The command says so in one line and changes nothing; with the daemon gone, the next
    `agent --once` heals as before."""
    node, state = upgrade_node, upgrade_node.cfg.state_dir
    args = ["--node", "n1", "--remote", node.deployment.url, "--state-dir", str(state),
            "--allowed-signers", str(merge_key.allowed_signers)]
    assert cli("agent", "--once", *args).returncode == 0
    db = state / "state.db"
    _damage_header(db)
    damaged = db.read_bytes()
    daemon = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(state / "agent.lock")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert daemon.stdout is not None and daemon.stdout.readline() == "held\n"
        proc = cli("suspend", "--reason", "disk swap", *args)

        assert proc.returncode != 0
        one_error_line(proc, "LEDGER_ERROR")
        assert "damaged" in proc.stderr and f"pid {daemon.pid}" in proc.stderr and "restart" in proc.stderr
        assert db.read_bytes() == damaged  # still state.db, nothing moved, nothing new beside it
        assert not list(state.glob("state.db.corrupt-*")) and not (state / "state.db-wal").exists()
    finally:
        daemon.kill()
        daemon.wait()

    healed = cli("agent", "--once", *args)
    assert healed.returncode == 0, healed.stderr
    kept = sorted(state.glob("state.db.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == damaged, kept


def test_the_daemon_itself_heals_its_ledger_under_its_own_lock(tmp_path: Path) -> None:
    """The daemon takes agent.lock before its agent opens the ledger after a re-execution
    (``shed``): its own lock (its pid in agent.lock) does not stop it healing."""
    from reconciler.ledger import Ledger
    from reconciler.ledger.statedir import State

    Ledger.open(tmp_path).close()
    _damage_header(tmp_path / "state.db")
    with State(tmp_path).daemon_lock():
        Ledger.open(tmp_path).close()
    assert len(list(tmp_path.glob("state.db.corrupt-*"))) == 1


def test_killed_at_every_side_effect_of_the_pass_that_heals_a_corrupt_ledger_the_next_run_finishes_it(
    upgrade_node: UpgradeNode, merge_key: SigningKey, tmp_path: Path
) -> None:
    """The healing pass is a pass like any: killed before each of its numbered side effects (the
    ledger moved aside, the fresh one filled from the notes, the adoption, the note), the next
    plain `agent --once` finishes it: exit 0, the services untouched, the damaged file kept, the
    note applied with the event."""
    node, state = upgrade_node, upgrade_node.cfg.state_dir
    args = ["--node", "n1", "--remote", node.deployment.url, "--state-dir", str(state),
            "--allowed-signers", str(merge_key.allowed_signers)]

    def agent_once(**env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "reconciler", "agent", "--once", *args], capture_output=True,
                              text=True, timeout=120, env={**os.environ, **env})

    assert agent_once().returncode == 0
    head = node.deployment.commit("a second commit")
    assert agent_once().returncode == 0
    running = processes_of(state)
    _truncate_to_half(state / "state.db")
    damaged = (state / "state.db").read_bytes()
    snapshot = tmp_path / "snapshot"
    shutil.copytree(state, snapshot, symlinks=True)

    def restore() -> None:
        shutil.rmtree(state)
        shutil.copytree(snapshot, state, symlinks=True)

    log = tmp_path / "points.log"
    assert agent_once(RECONCILER_FAULT_LOG=str(log)).returncode == 0
    points = log.read_text().splitlines()
    assert any("aside" in p for p in points), points
    for n in range(1, len(points) + 1):
        restore()
        killed = agent_once(RECONCILER_FAULT_AT=str(n))
        assert killed.returncode == -9, (n, points[n - 1], killed.returncode, killed.stderr[-500:])
        after = agent_once()
        where = f"killed at {points[n - 1]}"
        assert after.returncode == 0 and "Traceback" not in after.stderr, (where, after.stderr[-800:])
        assert processes_of(state) == running, where  # not restarted, not doubled
        assert any(p.read_bytes() == damaged for p in state.glob("state.db.corrupt-*")), where
        note = node.deployment.note("n1", head) or {}
        assert note.get("state") == "applied", (where, note)
        assert any("ledger" in e for e in note.get("events", [])), (where, note)  # type: ignore[attr-defined]
        assert agent_once().returncode == 0 and processes_of(state) == running, where  # and a plain one after
