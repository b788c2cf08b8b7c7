"""A second look at the fast read of notes (``notejson``'s one-walk path, ``view.notes_in``,
the batches ``fleet_view`` judges), from where a compromised node stands: what it can push
that the fast read takes otherwise than the careful read, or than git reads a notes tree.
"""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path
from typing import Any

import pygit2
import pytest
from conftest import git, nodes_file, note_key

from reconciler.core.errors import CorruptMirror
from reconciler.fleet import notejson, view
from reconciler.fleet.notejson import check, check_careful
from reconciler.fleet.view import fetch_from_clone, fleet_view, notes_in
from reconciler.trust.notesig import NoteKey, NoteTrust, parse_nodes

WHO = pygit2.Signature("n", "n@example.org", 0, 0)


def a_report(node: str, commit: str, **changed: Any) -> dict[str, Any]:
    return {"format": 1, "node": node, "commit": commit, "state": "applied", "time": "2026-11-27T04:00:00Z",
            "services": {"web": {"action": "none", "detail": "", "hash": None, "pid": 7, "reason": "",
                                 "result": "ok", "steps": []}}, **changed}


def test_a_key_said_twice_is_refused_as_the_careful_path_refuses_it() -> None:
    """json.loads keeps the last of a key said twice: the first value, however deep, is gone
    from what was built, but the careful path counts the depth on the text, its brackets too."""
    sound = json.dumps(a_report("ctl1", "c" * 40, x=1))
    for key in ("x", "services"):
        for deep, why in (("[" * 16 + "]" * 16, "nested 17 deep, more than 16"),
                          (json.dumps({"a": [[{"b": [[[[[[[[[[[[[[1]]]]]]]]]]]]]]}]]}), "nested 19 deep, more than 16")):
            text = f'{{"{key}": {deep}, {sound[1:]}'  # the deep one first: the writer's after it
            assert json.loads(text) == json.loads(sound)
            for raw in (text, text.encode()):
                assert check_careful(raw) == why
                assert check(raw) == why, (key, type(raw))
    # Said twice within the bound: both paths read the last, as before.
    text = f'{{"x": {"[" * 15 + "]" * 15}, {sound[1:-1]}, "x": 1}}'
    assert check(text) == check_careful(text) == {**a_report("ctl1", "c" * 40), "x": 1}


def test_a_writers_note_with_brackets_in_its_texts_still_takes_the_one_walk_path() -> None:
    """Brackets in a note's strings (a failed service's output quoting JSON or a list, escaped
    non-ASCII beside them) are not taken for a key said twice: the note is still read in one walk."""
    body = a_report("ctl1", "c" * 40, state="failed", error="db: {'code': [1, 2]} [[[[[[[[[[[[[[[[[[ é")
    body["services"]["db"] = {**body["services"]["web"], "result": "failed", "detail": "{" * 40, "steps": ["[x]"]}
    for indent in (None, 2):
        raw = json.dumps(body, indent=indent, sort_keys=True).encode()
        text, values = notejson._text_of(raw)
        assert notejson._fast(text, values) == body == check_careful(raw)


def push_notes_tree(node_repo: Path, ref: str, entries: list[tuple[str, str, str]]) -> None:
    """Point ``ref`` of ``node_repo`` at a notes commit of a tree of ``entries`` (mode, name, id)
    written as git stores any tree (``--literally``: a mode git's own tools would not make)."""
    raw = b"".join(f"{mode} {name}".encode("utf-8", "surrogateescape") + b"\0" + bytes.fromhex(oid)
                   for mode, name, oid in entries)
    tree = subprocess.run(["git", "-C", str(node_repo), "hash-object", "--literally", "-w", "-t", "tree", "--stdin"],
                          input=raw, capture_output=True, check=True).stdout.decode().strip()
    commit = git("-C", str(node_repo), "commit-tree", "-m", "notes", tree).strip()
    git("-C", str(node_repo), "update-ref", ref, commit)


def test_a_gitlink_in_a_nodes_notes_tree_stops_no_reader(tmp_path: Path) -> None:
    """A compromised node pushes a notes tree holding gitlinks named after commits: git takes
    it (a gitlink's commit need not be anywhere), and reads it as no note; a reader that took
    one for a note would read an object the repository never had, and every reader of the
    fleet, the agents' rollout gate and `status --fleet` alike, would stop on a damaged mirror."""
    server = tmp_path / "server.git"
    git("init", "-q", "--bare", str(server))
    node = tmp_path / "ctl1"
    git("init", "-q", "-b", "main", str(node))
    git("-C", str(node), "-c", "user.name=n", "-c", "user.email=n@example.org", "commit", "-q", "--allow-empty",
        "-m", "c0")
    commit = git("-C", str(node), "rev-parse", "HEAD").strip()
    keys = {n: NoteKey.load(note_key(n)) for n in ("ctl1", "ctl2")}

    def blob(node_name: str) -> str:
        sealed = json.dumps(keys[node_name].seal(node_name, commit, a_report(node_name, commit)))
        return subprocess.run(["git", "-C", str(node), "hash-object", "-w", "--stdin"], input=sealed.encode(),
                              capture_output=True, check=True).stdout.decode().strip()

    absent = "13" * 20  # no object anywhere
    other = "ab" * 20  # the gitlinks' names: commits, the annotated objects of notes
    push_notes_tree(node, "refs/notes/reconciler/ctl1", [
        ("160000", other, absent),  # a gitlink, as `git mktree` makes one
        ("160755", "cd" * 20, absent),  # one git reads as a gitlink and libgit2 as an executable file
        ("100644", commit, blob("ctl1")),  # the node's own note, sound
        ("100644", "\udcff", blob("ctl1")),  # a name not UTF-8 (libgit2 lists it, on an object id it never set)
    ])
    push_notes_tree(node, "refs/notes/reconciler/ctl2", [("100644", commit, blob("ctl2"))])
    git("-C", str(node), "push", "-q", str(server), "main", "refs/notes/reconciler/ctl1", "refs/notes/reconciler/ctl2")
    listed = git("-C", str(server), "notes", "--ref=reconciler/ctl1", "list").split()
    assert listed == [blob("ctl1"), commit]  # git: one note; the gitlinks are none

    reader = tmp_path / "reader"
    git("clone", "-q", "--bare", str(server), str(reader))
    head = fetch_from_clone(reader, "origin", "main")
    repo = pygit2.Repository(str(reader))
    tip = repo.revparse_single("refs/reconciler/fleet/ctl1").id
    assert [(str(o), str(b)) for o, b in notes_in(repo, tip)] == [(commit, blob("ctl1"))]
    trust = NoteTrust(parse_nodes(nodes_file("ctl1", "ctl2"), "trust/nodes"))
    seen = fleet_view(repo, trust=trust, about=head)
    assert {n: [x.commit for x in notes] for n, notes in seen.notes.items()} == {"ctl1": [commit], "ctl2": [commit]}
    assert seen.rejected == {}


def test_a_read_that_fails_mid_batch_says_what_was_read_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A note whose blob the repository lacks is damage (the reader stops, the mirror is cloned
    again); the notes read before it were judged, and their warnings said, one at a time: in a
    batch too."""
    repo = pygit2.init_repository(str(tmp_path / "fleet.git"), bare=True)
    empty = repo.TreeBuilder().write()
    commit = str(repo.create_commit(None, WHO, WHO, "c0", empty, []))

    def notes_ref(node: str, entries: list[tuple[str, pygit2.Oid]]) -> None:
        raw = b"".join(b"100644 %s\0" % name.encode() + oid.raw for name, oid in sorted(entries))
        tree = repo.odb.write(pygit2.enums.ObjectType.TREE, raw)
        repo.create_commit(f"refs/notes/reconciler/{node}", WHO, WHO, "notes", tree, [])

    notes_ref("a1", [(commit, repo.create_blob(b"{not json"))])
    notes_ref("a2", [(commit, pygit2.Oid(hex="12" * 20))])  # its blob lost

    def read(batch: int) -> list[str]:
        monkeypatch.setattr(view, "_BATCH", batch)
        for memo in (view._DECODED, view._SAID, view._CHECKED):
            memo.clear()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="reconciler.fleet"), pytest.raises(CorruptMirror):
            fleet_view(repo, "refs/notes/reconciler/", trust=NoteTrust(problem="none"))
        return [r.getMessage() for r in caplog.records]

    one_by_one = read(1)
    assert one_by_one == [f"malformed note from a1 on {commit}: not JSON (Expecting property name enclosed in "
                          "double quotes at character 1)"]
    assert read(64) == one_by_one
