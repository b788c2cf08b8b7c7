"""The README's first command, `./demo.sh`, run as a newcomer runs it: five nodes converge on a
git remote, reviewed changes roll out with the least disruptive action each, an unsigned
commit is refused everywhere, and every service is stopped at the end. Read back from what
the demo leaves: the remote's notes and the machine's processes."""

from __future__ import annotations

import json
import os
import subprocess
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
