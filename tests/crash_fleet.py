"""What the kill tests of fleet passes (cutover, budget, put-back) share: agents that sign their
notes, so the others' notes count, and a look at a node's notes ref on the remote with git.

Notes steer other nodes only when their node signed them with the key the repo's
``trust/nodes`` names for it (``trust.notesig``). ``signing`` gives the ``trust/nodes`` file
that names each node's key and the agent setting (``note_key``) that hands it to the node.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import Deployment, nodes_file, note_key
from test_crash_points import Node, in_child

from reconciler.agent import Agent

CLAIM_OBJECT = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # the empty tree: where a node's claim is noted


def signing(nodes: list[str]) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """(repo files to add, per node the AgentConfig settings that make it sign its notes): the
    test session's key of each node (``conftest.note_key``), as the ``agents`` fixture gives it."""
    return {"trust/nodes": nodes_file(*nodes)}, {node: {"note_key": note_key(node)} for node in nodes}


def git_bare(dep: Deployment, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(dep.bare), *args], capture_output=True, text=True,
                          check=True).stdout


def note_history(dep: Deployment, node: str, obj: str) -> list[dict[str, Any]]:
    """Every version of ``node``'s note on ``obj`` that reached the remote, oldest first: each
    notes commit the node pushed (the notes ref is a history of its own)."""
    ref = f"refs/notes/reconciler/{node}"
    try:
        commits = git_bare(dep, "rev-list", "--reverse", ref).split()
    except subprocess.CalledProcessError:
        return []
    out: list[dict[str, Any]] = []
    for c in commits:
        # notes are stored under a fan-out path; ls-tree finds the one for obj at any depth
        entries = git_bare(dep, "ls-tree", "-r", c).splitlines()
        blob = next((e.split()[2] for e in entries if e.split("\t")[1].replace("/", "") == obj), None)
        if blob is None:
            continue
        data = json.loads(git_bare(dep, "cat-file", "blob", blob))
        if not out or out[-1] != data:
            out.append(data)
    return out


def kill_at(node: Node, operation: Callable[[Agent], object] | None, n: int, points: list[str], log: Path) -> None:
    """``test_crash_points.killed_at``, and the killed run's own side effects logged: it must
    die by SIGKILL just before a side effect of the kind counted at ``n``."""
    log.unlink(missing_ok=True)
    status = in_child(node, operation, {"RECONCILER_FAULT_AT": str(n), "RECONCILER_FAULT_LOG": str(log)})
    ran = log.read_text().splitlines() if log.exists() else []
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"not killed before side effect {n} of {len(points)} ({points[n - 1]}): wait status {status}; "
        f"this run's side effects: {ran}")
    assert ran and ran[-1].split()[1] == points[n - 1].split()[1], (
        f"killed before {ran[-1:]}, not before a side effect like {points[n - 1]}: {ran}")
