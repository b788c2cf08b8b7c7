"""`status --fleet` of a commit verifies, of each node's history of notes, only those its status
shows (on the commit, on a descendant, refusing to rewind to it: ``fleet.view.Shown``), and it
shows what it showed when every note was verified: a forged or unsigned note on another commit
is neither judged nor in the view, one it shows is refused as before.

(The figure itself is ``bench/fleet_status.py``'s: no clock here.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pygit2
from conftest import Deployment, git, note_key
from test_fleet_status_speed import add_note, signed_note

from reconciler.fleet import view
from reconciler.fleet.rollout import FleetView, plan_rollout
from reconciler.fleet.status import NodeStatus, fleet_status
from reconciler.repo.load import load_repo
from reconciler.repo.tree import open_tree
from reconciler.trust.notesig import NoteKey, note_trust


def test_status_of_a_commit_judges_only_the_notes_it_shows_and_shows_the_same(
    deployment: Deployment, tmp_path: Path
) -> None:
    # A, then B on it. Each node's ref holds its history: what it noted on A and on B.
    a = git("rev-parse", "HEAD", cwd=deployment.work)
    git("commit", "-q", "--allow-empty", "-m", "B", cwd=deployment.work)
    git("push", "-q", deployment.url, "main", cwd=deployment.work)
    b = git("rev-parse", "HEAD", cwd=deployment.work)
    for node in ("cmp1", "cmp2", "ctl2"):
        add_note(deployment, node, a, signed_note(node, a))
    add_note(deployment, "cmp1", b, signed_note("cmp1", b))
    add_note(deployment, "ctl1", b, signed_note("ctl1", b, "failed"))
    forged = json.loads(signed_note("ctl1", a))
    forged["state"] = "failed"  # on A, forged: refused when judged
    add_note(deployment, "ctl1", a, json.dumps(forged, indent=2, sort_keys=True))
    unsigned = {k: v for k, v in json.loads(signed_note("ctl3", a)).items() if k != "sig"}
    add_note(deployment, "ctl3", a, json.dumps(unsigned, indent=2, sort_keys=True))
    # ctl2 runs A and refused to be moved to B (a branch moved back and forth): shown for B
    body = {**json.loads(signed_note("ctl2", a)), "refused": {"head": b, "reason": "not a descendant",
                                                                "time": "2026-11-26T11:00:00Z"}}
    body.pop("sig")
    add_note(deployment, "ctl2", a, json.dumps(NoteKey.load(note_key("ctl2")).seal("ctl2", a, body), indent=2))
    clone = tmp_path / "operator"
    git("clone", "-q", deployment.url, str(clone))
    view.fetch_from_clone(clone, "origin", "main")
    repo = pygit2.Repository(str(clone))
    trust = note_trust(repo, str(repo.head.target))
    loaded = load_repo(open_tree(clone, b))
    rollout = plan_rollout(loaded.settings, loaded.nodes, loaded.members)

    def shown(commit: str, about: str | None) -> tuple[list[NodeStatus], FleetView]:
        for table in (view._DECODED, view._CHECKED):
            table.clear()
        fleet = view.fleet_view(repo, trust=trust, about=about)
        return fleet_status(rollout, sorted(loaded.nodes), commit, fleet), fleet

    for commit in (a, b):
        (every, whole), (only, part) = shown(commit, None), shown(commit, commit)
        assert only == every, commit
        # what it does not show is not judged: for B, the notes on A but ctl2's that names B
        if commit == b:
            assert {s.node: s.state for s in only} == {
                "cmp1": "applied", "cmp2": "pending", "ctl1": "failed", "ctl2": "refused", "ctl3": "pending"}
            assert {n: {x.commit for x in notes} for n, notes in part.notes.items() if notes} == {
                "cmp1": {b}, "ctl1": {b}, "ctl2": {a}}
            assert set(whole.rejected) == {"ctl1", "ctl3"} and not part.rejected
        else:
            assert {s.node: s.state for s in only} == {
                "cmp1": "applied", "cmp2": "applied", "ctl1": "unverified", "ctl2": "applied", "ctl3": "unverified"}
            assert part.rejected == whole.rejected
