"""The README's first command, `./demo.sh`, run as a newcomer runs it: five nodes converge on a
git remote, reviewed changes roll out with the least disruptive action each, an unsigned
commit is refused everywhere, and every service is stopped at the end. Read back from what
the demo leaves: the remote's notes and the machine's processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import ROOT

NODES = ("ctl1", "ctl2", "ctl3", "cmp1", "cmp2")
CONTROLLERS = ("ctl1", "ctl2", "ctl3")
PASSWORD = "demo-only-Rt4k8w2m63"  # the new db password the demo sets with sops


def _git(bare: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(bare), *args], check=True, capture_output=True,
                          text=True).stdout


def _actions(note: dict[str, Any]) -> dict[str, str]:
    return {name: svc["action"] for name, svc in note["services"].items()}


def _left_running(under: Path) -> list[str]:
    """Processes whose working directory or command line is in the demo's folder."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone, or not ours to read
        if cwd.startswith(str(under)) or str(under) in cmdline:
            out.append(f"{pid}: {cmdline}")
    return out


def test_the_readme_demo_converges_rolls_out_least_disruptive_changes_refuses_an_unsigned_commit_and_cleans_up(
    tmp_path: Path,
) -> None:
    root = tmp_path / "demo"
    proc = subprocess.run([str(ROOT / "demo.sh"), "--dir", str(root)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "stopped every service" in proc.stdout

    bare = root / "cloud.git"
    subjects = dict(line.split(" ", 1) for line in _git(bare, "log", "--format=%H %s", "main").splitlines())
    by_subject = {s: c for c, s in subjects.items()}
    assert list(by_subject) == ["sneaky: weaker tokens", "db: a new password", "identity: tokens live 10 minutes",
                                "identity: four API workers", "demo-cloud: initial deployment"]
    notes = {(node, subject): json.loads(_git(bare, "notes", f"--ref=reconciler/{node}", "show", commit))
             for node in NODES for subject, commit in by_subject.items()}

    # The first merge: every node started its slice.
    for node in NODES:
        first = notes[node, "demo-cloud: initial deployment"]
        assert first["state"] == "applied" and set(_actions(first).values()) == {"start"}, first
    assert set(_actions(notes["ctl1", "demo-cloud: initial deployment"])) == {"db", "identity", "lb", "node-exporter"}
    assert set(_actions(notes["cmp1", "demo-cloud: initial deployment"])) == {"compute-agent", "node-exporter"}

    # One template line: identity restarts on the controllers, nothing else moves anywhere.
    for node in NODES:
        note = notes[node, "identity: four API workers"]
        moved = {s: a for s, a in _actions(note).items() if a != "none"}
        assert note["state"] == "applied" and moved == ({"identity": "restart"} if node in CONTROLLERS else {}), note
    # A key its rules call a reload, then a secret the db and identity reload for.
    for node in CONTROLLERS:
        ttl, password = notes[node, "identity: tokens live 10 minutes"], notes[node, "db: a new password"]
        assert {s: a for s, a in _actions(ttl).items() if a != "none"} == {"identity": "reload"}, ttl
        assert {s: a for s, a in _actions(password).items() if a != "none"} == {"db": "reload",
                                                                                 "identity": "reload"}, password
    # The unsigned commit: refused by every node, nothing done.
    for node in NODES:
        refused = notes[node, "sneaky: weaker tokens"]
        assert (refused["state"], refused["reason"], refused["services"]) == ("refused", "UNSIGNED", {}), refused

    # The secret never reached the screen or a note.
    assert PASSWORD not in proc.stdout + proc.stderr
    assert not [key for key, note in notes.items() if PASSWORD in json.dumps(note)]
    # Every service the demo started is gone.
    assert _left_running(root) == []


def _demo_failing_at_its_first_push(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The demo in its own temporary folder (TMPDIR), stopped by a remote that refuses the first
    push: by then it has made the merge key, the nodes' note keys and the deployment repo."""
    stubs, tmp = tmp_path / "bin", tmp_path / "tmp"
    stubs.mkdir()
    tmp.mkdir()
    git_stub = stubs / "git"
    git_stub.write_text(f'#!/bin/sh\n[ "$1" = push ] && {{ echo "stub: the remote is down" >&2; exit 1; }}\n'
                        f'exec {shutil.which("git")} "$@"\n')
    git_stub.chmod(0o755)
    proc = subprocess.run([sys.executable, str(ROOT / "examples/demo.py"), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TMPDIR": str(tmp), "PATH": f"{stubs}:{os.environ['PATH']}",
                                            "COLUMNS": "200"})
    assert proc.returncode != 0 and "demo: command failed" in proc.stderr + proc.stdout, proc.stdout + proc.stderr
    return proc, tmp


def test_the_demo_removes_its_temporary_folder_and_the_keys_in_it_even_when_a_step_fails(tmp_path: Path) -> None:
    proc, tmp = _demo_failing_at_its_first_push(tmp_path)
    assert list(tmp.iterdir()) == [], proc.stdout
    assert "removed " in proc.stdout


def test_the_demo_keeps_its_folder_with_keep_and_says_where(tmp_path: Path) -> None:
    proc, tmp = _demo_failing_at_its_first_push(tmp_path, "--keep")
    kept, = tmp.glob("reconciler-demo-*")
    assert (kept / "trust/merge_key").exists() and str(kept) in proc.stdout


def test_test_sh_with_arguments_runs_just_those_tests_and_installs_nothing(tmp_path: Path) -> None:
    """The README's other command, for one file: no apt-get even as root with every system
    package missing (a PATH without them), no lint, no types; pytest with the arguments given."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("bash", "git", "sha256sum", "cut", "cat", "dirname", "id"):
        (tools / tool).symlink_to(shutil.which(tool) or tool)
    # the interpreter itself, not a version manager's shim (pyenv's is a script needing more tools)
    (tools / "python3").symlink_to(Path(sys.executable).resolve())
    (tools / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/apt-get.log\n')
    (tools / "apt-get").chmod(0o755)
    proc = subprocess.run([str(ROOT / "test.sh"), "-p", "no:cacheprovider", "-n", "0", "tests/test_contrib.py", "-k",
                           "parses"], capture_output=True, text=True, timeout=300, env={**os.environ, "PATH": str(tools)})
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not (tmp_path / "apt-get.log").exists(), (tmp_path / "apt-get.log").read_text()
    assert "note: openssh-client gnupg" in proc.stderr and "without arguments installs them" in proc.stderr
