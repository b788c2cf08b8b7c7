"""The user's cache of notes verified before (``fleet.known``) read as an attacker would: what
another user, a hostile git server or a node could do with it. Only the user's own, real
directories are written to or read from; a file there is read within bounds, never blocked on;
a line can only be what ``add`` meant; and a note the cache names is still decoded the careful
way (the cache skips the signature check, nothing else).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from conftest import Deployment, git, note_key
from test_fleet_status_speed import add_note, blob_of, fleet, kept, signed_note, status

from reconciler.fleet.known import KnownNotes, digest
from reconciler.trust.notesig import NoteKey, NoteTrust, parse_nodes, public_line

C, B = "c" * 40, "b" * 40
OTHER_UID = 4242  # the tests run as root: a file or directory chowned here is someone else's


@pytest.fixture
def trust() -> NoteTrust:
    return NoteTrust(parse_nodes(public_line("ctl1", NoteKey.load(note_key("ctl1"))) + "\n", "trust/nodes"))


@pytest.fixture
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's XDG_CACHE_HOME, their own (0700)."""
    home = tmp_path / "xdg"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home


def keep(trust: NoteTrust, *lines: tuple[str, str, str]) -> None:
    known = KnownNotes.of(trust)
    assert known is not None
    for line in lines:
        known.add(*line)
    known.save()


def holds(trust: NoteTrust, node: str, obj: str, blob: str) -> bool:
    known = KnownNotes.of(trust)
    return known is not None and known.holds(node, obj, blob)


def test_the_trust_root_named_is_each_key_with_its_principals_and_namespaces_and_the_policy(trust: NoteTrust) -> None:
    from reconciler.trust.notesig import UNSIGNED_ALLOWED

    line = public_line("ctl1", NoteKey.load(note_key("ctl1")))
    others = [NoteTrust(trust.signers, UNSIGNED_ALLOWED),  # a note counted while unsigned ones could
              NoteTrust(parse_nodes(line.replace("ctl1 ", "ctl2 ", 1) + "\n", "trust/nodes")),
              NoteTrust(parse_nodes(line.replace('"reconciler-note"', '"git"') + "\n", "trust/nodes")),
              NoteTrust(parse_nodes(line.replace("ctl1 ", "ctl1,ctl2 ", 1) + "\n", "trust/nodes")),
              NoteTrust(parse_nodes(line + "\n" + public_line("ctl2", NoteKey.load(note_key("ctl2"))) + "\n",
                                    "trust/nodes"))]
    names = {digest(t) for t in [trust, *others]}
    assert None not in names and len(names) == 1 + len(others)
    # a verdict that changes with time, or under keys that could not be read, is never kept
    assert digest(NoteTrust(parse_nodes(line.replace("namespaces=", 'valid-before="29991231",namespaces=') + "\n",
                                        "trust/nodes"))) is None
    assert digest(NoteTrust(trust.signers, problem="trust/nodes unreadable")) is None


def test_a_notes_dir_that_is_a_symlink_is_neither_written_through_nor_pruned(trust: NoteTrust, base: Path,
                                                                             tmp_path: Path) -> None:
    # someone points the notes dir at another directory of the user's, holding files named like
    # ours (a digest): nothing there is pruned, and nothing is written there
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    for i in range(6):
        (victim / f"{i:064x}").write_text("the user's own data\n")
    (base / "reconciler").mkdir(mode=0o700)
    (base / "reconciler" / "notes").symlink_to(victim)
    keep(trust, ("ctl1", C, B))
    assert sorted(p.name for p in victim.iterdir()) == [f"{i:064x}" for i in range(6)]
    assert not holds(trust, "ctl1", C, B)


def test_a_cache_file_that_is_a_symlink_is_not_read(trust: NoteTrust, base: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text(f"ctl1 {C} {B}\n")
    elsewhere.chmod(0o600)
    where = base / "reconciler" / "notes"
    where.mkdir(mode=0o700, parents=True)
    name = digest(trust)
    assert name is not None
    (where / name).symlink_to(elsewhere)
    assert not holds(trust, "ctl1", C, B)
    keep(trust, ("ctl1", "d" * 40, B))  # the link is replaced, the file it named left as it was
    assert elsewhere.read_text() == f"ctl1 {C} {B}\n"


def test_a_cache_in_a_world_writable_xdg_cache_home_under_another_users_dir_is_not_used(
    trust: NoteTrust, base: Path
) -> None:
    # XDG_CACHE_HOME writable by all (no sticky bit): another user made reconciler/ in it first
    base.chmod(0o777)
    theirs = base / "reconciler"
    theirs.mkdir(mode=0o777)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    keep(trust, ("ctl1", C, B))
    assert list(theirs.iterdir()) == []  # the user's verdicts are not written where others can swap them
    assert not holds(trust, "ctl1", C, B)


def test_a_cache_under_a_non_sticky_world_writable_xdg_cache_home_is_not_used(trust: NoteTrust, base: Path) -> None:
    # the user's own reconciler/ and notes/, but anyone can rename them away and put others in place
    base.chmod(0o777)
    keep(trust, ("ctl1", C, B))
    assert not holds(trust, "ctl1", C, B)
    base.chmod(0o1777)  # sticky (/tmp): only the owner renames what is in it
    keep(trust, ("ctl1", C, B))
    assert holds(trust, "ctl1", C, B)


def test_a_cache_file_that_is_a_fifo_is_not_waited_on(trust: NoteTrust, base: Path) -> None:
    where = base / "reconciler" / "notes"
    where.mkdir(mode=0o700, parents=True)
    name = digest(trust)
    assert name is not None
    fifo = where / name
    os.mkfifo(fifo, 0o600)
    reader = threading.Thread(target=holds, args=(trust, "ctl1", C, B), daemon=True)
    reader.start()
    reader.join(5)
    blocked = reader.is_alive()
    if blocked:  # let it go: a writer opening the other end ends its wait
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert not blocked


def test_a_huge_cache_file_is_not_read(trust: NoteTrust, base: Path) -> None:
    keep(trust, ("ctl1", C, B))
    name = digest(trust)
    assert name is not None
    path = base / "reconciler" / "notes" / name
    with path.open("r+b") as f:  # sparse: 100 MB on paper, nothing on disk
        f.truncate(100 * 1024 * 1024)
    assert not holds(trust, "ctl1", C, B)


def test_a_line_is_only_ever_the_node_object_and_blob_added(trust: NoteTrust, base: Path) -> None:
    # a node named with a newline (or a space) would write a line of its choosing: such a name
    # is not kept (git's ref names hold neither; a name from elsewhere might)
    keep(trust, (f"ctl1 {C} {B}\nx", "e" * 40, "f" * 40), (f"ctl1 {C}", B, "f" * 40), ("ctl2", "not hex", B))
    assert not holds(trust, "ctl1", C, B)
    assert not holds(trust, f"ctl1 {C}", B, "f" * 40)
    assert not holds(trust, "ctl2", "not hex", B)


def test_a_note_the_cache_names_is_still_decoded_the_careful_way(deployment: Deployment, tmp_path: Path) -> None:
    # ctl3 signs a note the decoder refuses (an error of 5,000 characters: plain JSON takes it);
    # a line for it is in the user's cache (an older reader's, with looser bounds, or any lie):
    # the note is still read within bounds, and does not count
    commit, clone = fleet(deployment, tmp_path)
    cache = tmp_path / "cache"
    status(clone, cache)
    body = json.loads(signed_note("ctl3", commit, "failed"))
    del body["sig"]
    body["error"] = "e" * 5000
    add_note(deployment, "ctl3", commit, json.dumps(NoteKey.load(note_key("ctl3")).seal("ctl3", commit, body)))
    (root,) = kept(cache)
    path = cache / "reconciler" / "notes" / root
    path.write_text(path.read_text() + f"ctl3 {commit} {blob_of(deployment, 'ctl3', commit)}\n")
    shown = status(clone, cache)["ctl3"]
    assert shown["state"] != "failed" and "5000 characters, more than 4096" in shown["detail"]
    assert git("rev-parse", "HEAD", cwd=clone) == commit


@pytest.mark.parametrize("cells", [
    [("applied\\", True)],  # a state word ending in a backslash: rich's style tag reads it as an escape
    [("web\u200d", False)],  # a zero-width joiner joins the padding after it, in rich's count
    [("x", False), ("\U000e0001\u200c\U0001f3fb\u2003\u2003", False)],  # rich drops a trailing em space
    [("\x1b]0;owned\x07ok\x1b[2J", False), ("[red]x", True), ("\u202eevil", False)],
])
def test_a_hostile_cell_is_written_plain_as_rich_prints_it(cells: list[tuple[str, bool]]) -> None:
    import io

    from rich.console import Console

    from reconciler.cli.fleet import plain_table, rich_table

    rows = [[*cells, *[("x", False)] * (3 - len(cells))]]
    printed = io.StringIO()
    Console(file=printed, width=80, highlight=False, soft_wrap=True).print(rich_table("t", ["wave", "node", "state"], rows))
    plain = plain_table("t", ["wave", "node", "state"], rows, 80)
    assert plain is None or plain == printed.getvalue()
    assert "\x1b" not in printed.getvalue() and "\u202e" not in printed.getvalue()
