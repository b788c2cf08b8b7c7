"""One compromised node, writing only its own notes ref, against the rest of the fleet.

Waves: canary [ctl1] -> controllers [ctl2, ctl3] one at a time -> computes [cmp*]. ctl1 is the
compromised node: its notes are written straight into its ref on the bare remote (file://), as
its own push would put them. The victims are real agents with their own mirrors (ctl2 reads ctl1
while it waits its turn), and the operator's view is the real CLI, `status --fleet` and `history
--fleet` from a plain clone, as a subprocess.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Deployment, git, note_key
from test_rollout import ROLLOUT

from reconciler.agent import Agent

ESC = "\x1b"


def hostile_note(deployment: Deployment, node: str, obj: str, body: str | bytes, tmp_path: Path) -> None:
    """What the compromised ``node`` pushes: ``body`` as its note on ``obj`` (any object name)."""
    f = tmp_path / "hostile-note"
    f.write_bytes(body if isinstance(body, bytes) else body.encode())
    git("--git-dir", str(deployment.bare), "notes", f"--ref=reconciler/{node}", "add", "-f", "-F", str(f), obj)


def failed_note(commit: str, error: str, state: str = "failed", node: str = "ctl1") -> str:
    """A well-formed note from ``node``, signed with its own key: the compromised node has it."""
    from reconciler.trust.notesig import NoteKey

    body = {"format": 1, "node": node, "commit": commit, "state": state, "time": "2030-01-01T00:00:00Z",
            "error": error, "reason": "HEALTH",
            "services": {"identity": {"result": "failed", "reason": "health", "detail": error[:80]}}}
    return json.dumps(NoteKey.load(note_key(node)).seal(node, commit, body))


def fleet_cli(deployment: Deployment, clone: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The operator's `reconciler ... --fleet` from a plain clone, on a wide terminal."""
    return subprocess.run([sys.executable, "-m", "reconciler", *args, "--fleet", "--repo", str(clone), "--remote",
                           deployment.url], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "400"})


def rollout_commit(deployment: Deployment, tmp_path: Path) -> tuple[str, Path]:
    deployment.write("reconciler.yaml", deployment.read("reconciler.yaml") + ROLLOUT)
    commit = deployment.commit("roll out in waves")
    clone = tmp_path / "laptop"
    git("clone", "-q", deployment.url, str(clone))
    return commit, clone


def status_of(deployment: Deployment, clone: Path) -> dict[str, dict[str, Any]]:
    proc = fleet_cli(deployment, clone, "status", "-o", "json")
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return {s["node"]: s for s in json.loads(proc.stdout)["nodes"]}


# Attack 3: JSON a reader cannot parse without blowing up (over the size bound, under it but
# nested past Python's recursion limit, a number Python refuses to convert).
HOSTILE: dict[str, Callable[[str], str]] = {
    "nested 200000 deep": lambda c: "[" * 200_000 + "]" * 200_000,
    "nested 20000 deep, under the size bound": lambda c: '{"state": "applied", "x": ' + "[" * 20_000 + "]" * 20_000
    + "}",
    "a 5000-digit number": lambda c: '{"format": 1' + "0" * 5000 + f', "state": "applied", "commit": "{c}"}}',
    "a 5000-digit ticket": lambda c: '{"format": 1, "claim": {"state": "queued", "ticket": ' + "9" * 5000 + "}}",
    "an infinite time": lambda c: '{"format": 1, "state": "applied", "time": 1e999}',
    "a string never closed, full of escaped quotes": lambda c: '{"error": "' + '\\"' * 32_000,
}


@pytest.mark.parametrize("what", sorted(HOSTILE))
def test_a_note_no_parser_survives_is_a_malformed_note_the_fleet_waits_on(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path, what: str,
    caplog: pytest.LogCaptureFixture
) -> None:
    c1, clone = rollout_commit(deployment, tmp_path)
    hostile_note(deployment, "ctl1", c1, HOSTILE[what](c1), tmp_path)
    ctl2 = agents("ctl2", deployment.url)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):  # every pass goes on, and says it once
            assert ctl2.reconcile_once().waiting == "waiting for ctl1"
    said = [r.getMessage() for r in caplog.records if "malformed note" in r.getMessage()]
    assert said == [f"malformed note from ctl1 on {c1}: {said[0].split(': ', 1)[1]}"], said

    status = status_of(deployment, clone)
    assert status["ctl1"]["state"] == "malformed", status["ctl1"]
    assert status["ctl1"]["detail"].startswith(f"malformed note from ctl1 on {c1}: ")
    assert status["ctl2"]["state"] == "pending"
    history = fleet_cli(deployment, clone, "history", "-o", "json")
    assert history.returncode == 0 and "Traceback" not in history.stderr, history.stderr[-3000:]


def test_each_note_is_decoded_once_per_process_not_on_every_view(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every pass reads the fleet several times over: a note (content-addressed) costs its
    decoding once, however many notes the compromised node writes and however long it waits."""
    from reconciler.fleet import notes

    c1, _ = rollout_commit(deployment, tmp_path)
    hostile_note(deployment, "ctl1", c1, '{"error": "' + '\\"' * 32_000 + c1, tmp_path)  # its own blob
    decoded: list[str] = []
    real = notes.body

    def body(node: str, obj: str, text: str | bytes) -> Any:  # the real decoder, counted
        decoded.append(node)
        return real(node, obj, text)

    monkeypatch.setattr(notes, "body", body)
    ctl2 = agents("ctl2", deployment.url)
    for _ in range(3):
        assert ctl2.reconcile_once().waiting == "waiting for ctl1"
    assert decoded.count("ctl1") == 1


# Attack 4: a note on an object that is not a commit.
def test_a_note_on_a_tree_or_a_blob_is_ignored_not_taken_for_mirror_damage(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    c1, clone = rollout_commit(deployment, tmp_path)
    tree = git("rev-parse", f"{c1}^{{tree}}", cwd=deployment.work)
    blob = git("rev-parse", f"{c1}:reconciler.yaml", cwd=deployment.work)
    hostile_note(deployment, "ctl1", tree, failed_note(tree, "boom", state="applied"), tmp_path)
    hostile_note(deployment, "ctl1", blob, failed_note(blob, "boom", state="applied"), tmp_path)
    ctl2 = agents("ctl2", deployment.url)
    assert ctl2.reconcile_once().waiting == "waiting for ctl1"
    mirror = os.stat(ctl2.source.path).st_ino
    for _ in range(2):
        assert ctl2.reconcile_once().waiting == "waiting for ctl1"
    assert os.stat(ctl2.source.path).st_ino == mirror  # never re-cloned

    status = status_of(deployment, clone)
    assert (status["ctl1"]["state"], status["ctl2"]["state"]) == ("pending", "pending")


# Attack 5: a failure reason of 20 MB, and one within bounds but long.
def test_a_20_mb_error_is_not_copied_into_the_halted_nodes_notes_nor_logged_whole(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    c1, clone = rollout_commit(deployment, tmp_path)
    hostile_note(deployment, "ctl1", c1, failed_note(c1, "x" * 20_000_000), tmp_path)
    ctl2 = agents("ctl2", deployment.url)
    with caplog.at_level(logging.DEBUG):
        result = ctl2.reconcile_once()
    assert result.waiting == "waiting for ctl1"  # a note out of bounds is no note: not a halt either
    assert max(len(r.getMessage()) for r in caplog.records) < 4096
    note = deployment.note("ctl2", c1)
    assert note is None or len(json.dumps(note)) < 8192
    status = status_of(deployment, clone)
    assert status["ctl1"]["state"] == "malformed" and len(status["ctl1"]["detail"]) < 300


def test_a_long_error_is_quoted_cut_by_the_halted_node(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    c1, clone = rollout_commit(deployment, tmp_path)
    hostile_note(deployment, "ctl1", c1, failed_note(c1, "y" * 4000), tmp_path)
    ctl2 = agents("ctl2", deployment.url)
    with caplog.at_level(logging.DEBUG):
        result = ctl2.reconcile_once()
    assert result.report is not None and result.report.state == "halted"
    error = result.report.error
    assert error.startswith(f"halted: ctl1 failed {c1[:12]} (identity): yyy") and error.endswith("… [cut, 4000 bytes]")
    assert len(error) < 1300
    assert max(len(r.getMessage()) for r in caplog.records) < 2048
    note = deployment.note("ctl2", c1)
    assert note is not None and note["error"] == error


# Attack 7: escape sequences for the operator's terminal.
def test_escape_sequences_in_a_note_never_reach_the_terminal(
    deployment: Deployment, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    c1, clone = rollout_commit(deployment, tmp_path)
    trick = "\x1b[2J\x1b[1A\x1b]0;all good\x07\u202eoh\u202c identity\tdid not\nstart\x9b31m\x7f"
    hostile_note(deployment, "ctl1", c1, failed_note(c1, trick), tmp_path)
    # and a state that is rich markup: printed as text, not parsed (a MarkupError traceback)
    hostile_note(deployment, "cmp2", c1, failed_note(c1, "[/]", state="[/][bold]\x1b[5m", node="cmp2"), tmp_path)
    ctl2 = agents("ctl2", deployment.url)
    halted = ctl2.reconcile_once().report
    assert halted is not None and halted.state == "halted" and ESC not in halted.error
    assert "identity did not start" in halted.error

    for command in ("status", "history"):
        proc = fleet_cli(deployment, clone, command)
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        shown = proc.stdout + proc.stderr
        assert not any(c in shown for c in (ESC, "\x07", "\x9b", "\x7f", "\u202e", "\u202c")), repr(shown)
        assert "ctl1" in shown and "identity did not start" in shown, shown
        assert command == "history" or "[/][bold]" in shown
    page = tmp_path / "fleet.html"
    proc = fleet_cli(deployment, clone, "status", "--html", str(page))
    html = page.read_text()
    assert ESC not in html and "\x07" not in html and "identity did not start" in html
