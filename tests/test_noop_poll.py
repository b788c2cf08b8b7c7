"""A poll that finds nothing does as little as it can (issue 40): no sweep of the state dir, no
scan of /proc, no read of files whose stat did not change; and still notices, at that poll, a
killed process or a file edited by hand, and what it no longer looks for every poll (a stray
copy in /proc) at the next full look."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import SigningKey, small_deployment

from reconciler.agent import Agent
from reconciler.drivers import glance
from reconciler.drivers.proctable import MARKER, marker, start_time_of

FILES = {
    "reconciler.yaml": "format: 1\nname: quiet\n",
    "inventory.yaml": "groups:\n  all:\n    services: [idle]\nnodes:\n  q1:\n    groups: [all]\n",
    "services/idle/service.yaml": (
        "runtime:\n  command: [python3, idle.py]\nfiles:\n  - {path: idle.py, source: idle.py}\n"
        "  - {path: idle.conf, source: idle.conf}\n"
    ),
    "services/idle/files/idle.py": "import time\nwhile True:\n    time.sleep(3600)\n",
    "services/idle/files/idle.conf": "mode = quiet\n",
}


@pytest.fixture
def node(tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent],
         monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Agent, list[float]]]:
    """A converged node with one process service, and the clock of its full looks."""
    dep = small_deployment(tmp_path, merge_key, FILES)
    agent = agents("q1", dep.url)
    clock = [0.0]
    monkeypatch.setattr(glance.GLANCE, "clock", lambda: clock[0])
    monkeypatch.setattr(glance, "RACY_NS", 50_000_000)  # a stat 50 ms old is believed: no 2 s waits
    result = agent.reconcile_once()
    assert result.exit_code == 0 and result.report is not None
    time.sleep(0.1)
    yield agent, clock


def _quiet(agent: Agent) -> None:
    result = agent.reconcile_once()
    assert result.exit_code == 0 and result.report is None and result.plan is None, result


def _record_pid(agent: Agent) -> int:
    import json

    return int(json.loads((agent.cfg.state_dir / "services/idle/record.json").read_text())["pid"])


def test_a_poll_that_finds_nothing_does_not_sweep_but_after_another_process_one_does(
        node: tuple[Agent, list[float]]) -> None:
    agent, _ = node
    _quiet(agent)
    left = agent.cfg.state_dir / "services/idle/.rc-tmp-record.json.x"
    left.write_text("half")
    _quiet(agent)
    assert left.exists(), "a no-op poll walked the state dir"
    # Another process held the pass lock (a `reconciler apply`, killed half way): the next pass sweeps.
    take = "import sys; from pathlib import Path; from reconciler.ledger.statedir import State\n" \
           "with State(Path(sys.argv[1])).lock(): pass"
    subprocess.run([sys.executable, "-c", take, str(agent.cfg.state_dir)], check=True)
    _quiet(agent)
    assert not left.exists()


def test_a_killed_process_and_an_edited_file_are_noticed_at_the_next_poll(node: tuple[Agent, list[float]]) -> None:
    agent, _ = node
    _quiet(agent)  # the first look of this process: everything
    _quiet(agent)  # from the stat the look remembered
    conf = agent.cfg.state_dir / "services/idle/live/idle.conf"
    conf.write_text("mode = loud\n")  # the same size: only its stat's times tell
    result = agent.reconcile_once()
    assert result.plan is not None and conf.read_text() == "mode = quiet\n"
    time.sleep(0.1)
    _quiet(agent)
    pid = _record_pid(agent)
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        if start_time_of(pid) is None:
            break
        time.sleep(0.02)
    result = agent.reconcile_once()
    assert result.plan is not None and _record_pid(agent) != pid and start_time_of(_record_pid(agent))


def test_a_stray_copy_is_found_at_the_next_full_look_not_at_every_poll(node: tuple[Agent, list[float]]) -> None:
    agent, clock = node
    _quiet(agent)  # the first look: everything
    root = (agent.cfg.state_dir / "services").absolute()
    env = {**os.environ, MARKER: marker(root, "q1", "idle", "0" * 64)}
    stray = subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)
    try:
        time.sleep(0.1)
        _quiet(agent)
        assert stray.poll() is None, "a no-op poll read every process's environment"
        clock[0] += glance.FULL_EVERY
        _quiet(agent)
        assert stray.wait(15) is not None
    finally:
        if stray.poll() is None:
            stray.kill()
            stray.wait()


def test_a_run_in_another_pid_namespace_with_the_same_pid_still_gets_its_leftovers_swept(
        node: tuple[Agent, list[float]]) -> None:
    """A daemon in a container and a `docker run ... reconciler apply` on the same state volume
    may both be pid 1: the lock file names its holder by pid and a token of its own."""
    agent, _ = node
    _quiet(agent)
    left = agent.cfg.state_dir / "services/idle/.rc-tmp-record.json.y"
    left.write_text("half")
    (agent.cfg.state_dir / "lock").write_text(f"{os.getpid()}\n")  # that other process's, same pid
    _quiet(agent)
    assert not left.exists(), "the other run's leftovers were kept"


def test_a_pass_that_acted_leaves_the_next_one_to_sweep(node: tuple[Agent, list[float]]) -> None:
    """An action that fails is caught, not raised through the lock: a pass that got past the
    no-op check may have left a temp file, so the next pass sweeps."""
    agent, _ = node
    _quiet(agent)
    left = agent.cfg.state_dir / "services/idle/.rc-tmp-record.json.z"
    (agent.cfg.state_dir / "services/idle/live/idle.conf").write_text("mode = edited by hand\n")
    acted = agent.reconcile_once()  # past the no-op check: the drift is put back
    assert acted.plan is not None, acted
    left.write_text("half")  # as a failed action of that pass would leave it
    _quiet(agent)
    assert not left.exists()


def test_a_linked_directory_in_a_live_dir_is_not_walked(tmp_path: Path) -> None:
    live = tmp_path / "live"
    (live / "etc").mkdir(parents=True)
    (live / "etc" / "a.conf").write_text("a = 1\n")
    (live / "loop").symlink_to(".")
    (live / "root").symlink_to("/")
    names = [entry[0] for entry in glance.stat_tree(live)]
    assert names == ["etc", "etc/a.conf", "loop", "root"]


def test_a_hand_edit_that_puts_the_old_times_back_is_still_noticed(node: tuple[Agent, list[float]]) -> None:
    """Same size, and the modification time set back as it was (`touch -r`, a careful editor):
    the change time, which no user can set, still tells."""
    agent, _ = node
    _quiet(agent)
    _quiet(agent)
    conf = agent.cfg.state_dir / "services/idle/live/idle.conf"
    before = conf.stat()
    time.sleep(0.06)  # past the racy window the fixture set: the stat alone is believed
    conf.write_text("mode = shout\n")
    os.utime(conf, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert conf.stat().st_mtime_ns == before.st_mtime_ns and conf.stat().st_size == before.st_size
    result = agent.reconcile_once()
    assert result.plan is not None and conf.read_text() == "mode = quiet\n"
