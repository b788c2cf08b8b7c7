"""A no-op `agent --once` from a timer answers from what the last full no-op pass proved
(issue 40): the same poll of the remote, the same look at the services and settings, and none
of the full pass's imports; anything that differs (or any doubt) runs the full pass.

Each test runs the real `reconciler agent --once` command in a fresh interpreter, which says
after it ran whether the full pass was imported (``reconciler.agent``) or not (quick).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import Deployment, SigningKey, small_deployment, wait_for

from reconciler.agent import Agent

RUN = """
import runpy, sys
sys.argv = ["reconciler", *sys.argv[1:]]
try:
    runpy.run_module("reconciler", run_name="__main__")
except SystemExit as exc:
    code = exc.code
else:
    code = 0
print("\\n@@", code, "full" if "reconciler.agent" in sys.modules else "quick")
"""

FILES = {"reconciler.yaml": "format: 1\nname: once\n",
         "inventory.yaml": "groups:\n  all:\n    services: [idle]\nnodes:\n  q1:\n    groups: [all]\n",
         "services/idle/service.yaml": "runtime:\n  command: [python3, idle.py]\n"
                                       "files:\n  - {path: idle.py, source: idle.py}\n",
         "services/idle/files/idle.py": "import time\nwhile True:\n    time.sleep(3600)\n"}


@dataclass(frozen=True)
class Done:
    code: int
    out: str
    err: str
    quick: bool


@dataclass
class Node:
    dep: Deployment
    state: Path
    args: list[str]

    def run(self, *words: str, extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> Done:
        argv = [*words, *(self.args if words[:1] == ("agent",) else self.node_args()), *extra]
        proc = subprocess.run([sys.executable, "-c", RUN, *argv], capture_output=True, text=True,
                              env={**os.environ, **(env or {})}, cwd="/")
        said, _, tail = proc.stdout.rpartition("\n@@ ")
        if not tail:  # killed: no line of its own
            return Done(proc.returncode, proc.stdout, proc.stderr, False)
        code, how = tail.split()
        return Done(int(code) if code != "None" else 0, said.strip(), proc.stderr, how == "quick")

    def once(self, *extra: str, env: dict[str, str] | None = None) -> Done:
        return self.run("agent", "--once", extra=extra, env=env)

    def node_args(self) -> list[str]:
        keep = ("--node", "--remote", "--state-dir", "--note-key", "--allowed-signers")
        return [w for i, w in enumerate(self.args) if w in keep or (i and self.args[i - 1] in keep)]

    @property
    def record(self) -> dict[str, object]:
        data: dict[str, object] = json.loads((self.state / "services/idle/record.json").read_text())
        return data

    @property
    def marker(self) -> Path:
        return self.state / "noop.json"


@pytest.fixture
def node(tmp_path: Path, merge_key: SigningKey, agents: Callable[..., Agent]) -> Node:
    """A converged node whose last `agent --once` was a full no-op (it wrote what the next
    one checks)."""
    dep = small_deployment(tmp_path, merge_key, FILES)
    first = agents("q1", dep.url)  # stops what the node started, at teardown
    state = first.cfg.state_dir
    first.close()
    signers = tmp_path / "allowed_signers"
    signers.write_bytes(merge_key.allowed_signers.read_bytes())
    args = ["--node", "q1", "--remote", dep.url, "--state-dir", str(state), "--allowed-signers", str(signers),
            "--note-key", str(first.cfg.note_key)]
    n = Node(dep, state, args)
    applied = n.once()
    assert applied.code == 0 and not applied.quick, applied
    full = n.once()
    assert full.code == 0 and full.out.startswith("q1 @ ") and full.out.endswith(": unchanged, nothing to do"), full
    return n


def test_a_converged_node_answers_without_the_full_pass_and_says_what_it_would(node: Node) -> None:
    full_json = node.once("-o", "json")  # the full pass's object (it wrote the marker again)
    quick = node.once()
    assert quick.quick and quick.code == 0, quick
    assert quick.out.endswith(": unchanged, nothing to do") and quick.err == "", quick
    quick_json = node.once("-o", "json")
    assert quick_json.quick, quick_json
    assert json.loads(quick_json.out) == json.loads(full_json.out)
    assert quick_json.out == full_json.out


def test_a_signed_commit_pushed_is_fetched_and_applied(node: Node) -> None:
    node.dep.edit("services/idle/files/idle.py", "3600", "3601")
    node.dep.commit("a new version")
    done = node.once()
    assert not done.quick and done.code == 0, done
    assert "applied" in done.out, done
    assert "3601" in (node.state / "services/idle/live/idle.py").read_text()


def test_a_service_killed_is_restarted(node: Node) -> None:
    pid = int(str(node.record["pid"]))
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2],
             what="the service gone")
    done = node.once()
    assert not done.quick and done.code == 0, done
    assert node.record["pid"] != pid
    assert node.once().code == 0 and node.once().quick  # a full no-op again, then quick


def test_a_rendered_file_edited_is_repaired(node: Node) -> None:
    live = node.state / "services/idle/live/idle.py"
    original = live.read_text()
    live.write_text(original + "# edited by hand\n")
    done = node.once()
    assert not done.quick and done.code == 0, done
    assert live.read_text() == original


def test_a_pass_that_warned_leaves_no_marker_so_the_next_one_says_it_again(node: Node) -> None:
    node.marker.unlink()
    (node.state / ".rc-tmp-left").write_text("half")  # as a killed run leaves a write
    warned = node.once()
    assert not warned.quick and warned.code == 0 and "left half written by a killed run" in warned.err, warned
    assert not node.marker.exists()
    assert not node.once().quick and node.once().quick


def test_changed_settings_run_the_full_pass(node: Node, tmp_path: Path) -> None:
    signers = tmp_path / "allowed_signers"
    signers.write_text(signers.read_text() + "# another line\n")
    done = node.once()
    assert not done.quick and done.code == 0, done
    assert node.once().quick
    other = node.once("--trust-policy", "head")
    assert not other.quick and other.code == 0, other


def test_a_corrupt_marker_runs_the_full_pass(node: Node) -> None:
    commit = "0" * 40
    for text in ["", "{", "[]", '{"v": 1}', "\x00" * 100, '{"v": 1, "commit": "' + commit + '"}',
                 node.marker.read_text().replace('"free": ', '"free": "').replace(', "named"', '", "named"')]:
        node.marker.write_text(text)
        done = node.once()
        assert not done.quick and done.code == 0 and done.err == "", (text, done)
        assert done.out.endswith(": unchanged, nothing to do") and commit[:12] not in done.out
    assert node.once().quick  # the full pass wrote it again


def test_a_state_changing_command_or_a_killed_pass_leaves_no_marker(node: Node) -> None:
    assert node.marker.exists()
    stop = node.run("stop", "idle")
    assert stop.code == 0, stop
    assert not node.marker.exists()
    done = node.once()
    assert not done.quick and done.code == 0, done
    started = node.run("start", "idle")
    assert started.code == 0, started
    after = [node.once() for _ in range(3)]
    assert [a.code for a in after] == [0, 0, 0] and after[-1].quick, after
    # A pass killed at its first side effect (a new commit) leaves none either.
    node.dep.edit("services/idle/files/idle.py", "3600", "3602")
    node.dep.commit("killed while applying")
    killed = node.once(env={"RECONCILER_FAULT_AT": "1"})
    assert killed.code == -signal.SIGKILL, killed
    assert not node.marker.exists()
    done = node.once()
    assert not done.quick and "applied" in done.out, done


def test_a_held_lock_runs_the_full_pass(node: Node) -> None:
    fd = os.open(node.state / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = node.once()
    finally:
        os.close(fd)
    assert not done.quick and done.code != 0 and "lock" in done.err, done
