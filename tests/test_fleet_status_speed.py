"""`status --fleet --repo` of a big fleet: each note is decoded and verified once per user, not
on every run (the user's cache of the notes that counted, ``fleet.known``), and what makes
that fast refuses what was refused before: a note changed, copied into another node's ref or
counted under keys the operator's HEAD no longer lists is decoded and verified again, and
refused; a cache file someone else could write is not read. The decoder's one-walk check says
what the careful path says, for any input.

(The figure itself is ``bench/fleet_status.py``'s: no clock here.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import NODES, Deployment, git, note_key
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.fleet import notejson
from reconciler.fleet.known import digest
from reconciler.fleet.notejson import check
from reconciler.trust.notesig import NoteKey, NoteTrust, parse_nodes


def signed_note(node: str, commit: str, state: str = "applied", key: Path | None = None) -> str:
    body = {"format": 1, "node": node, "commit": commit, "state": state, "time": "2026-11-26T10:00:00Z",
            "services": {"web": {"action": "none", "result": "ok", "reason": "", "detail": "", "steps": []}}}
    return json.dumps(NoteKey.load(key or note_key(node)).seal(node, commit, body), indent=2, sort_keys=True)


def add_note(deployment: Deployment, node: str, commit: str, text: str) -> None:
    git("--git-dir", str(deployment.bare), "-c", "user.name=n", "-c", "user.email=n@example.org",
        "notes", f"--ref=reconciler/{node}", "add", "-f", "-m", text, commit)


def status(clone: Path, cache: Path) -> dict[str, Any]:
    """`status --fleet --repo CLONE -o json` as an operator runs it, with ``cache`` as the user's."""
    done = subprocess.run([sys.executable, "-m", "reconciler", "status", "--fleet", "--repo", str(clone), "-o", "json"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "XDG_CACHE_HOME": str(cache)})
    assert done.returncode in (0, 1), done.stderr
    return {n["node"]: n for n in json.loads(done.stdout)["nodes"]}


def kept(cache: Path) -> dict[str, set[str]]:
    """The user's cache: trust root -> its lines (node, object, blob)."""
    where = cache / "reconciler" / "notes"
    return {f.name: set(f.read_text().splitlines()) for f in where.iterdir()}


def fleet(deployment: Deployment, tmp_path: Path) -> tuple[str, Path]:
    """Every node's signed note, applied, on the head; an operator's clone of it."""
    commit = git("rev-parse", "HEAD", cwd=deployment.work)
    for node in NODES:
        add_note(deployment, node, commit, signed_note(node, commit))
    clone = tmp_path / "operator"
    git("clone", "-q", deployment.url, str(clone))
    return commit, clone


def blob_of(deployment: Deployment, node: str, commit: str) -> str:
    return git("--git-dir", str(deployment.bare), "rev-parse", f"refs/notes/reconciler/{node}:{commit}")


def test_the_notes_that_counted_are_kept_in_the_users_cache_and_read_from_it_next_time(
    deployment: Deployment, tmp_path: Path
) -> None:
    commit, clone = fleet(deployment, tmp_path)
    cache = tmp_path / "cache"
    first = status(clone, cache)
    assert {n: s["state"] for n, s in first.items()} == dict.fromkeys(NODES, "applied")
    # one file, named after the trust root, with each node's note: node, the commit, its blob
    (root, lines), = kept(cache).items()
    assert lines == {f"{n} {commit} {blob_of(deployment, n, commit)}" for n in NODES}
    trust = NoteTrust(parse_nodes(git("show", "HEAD:trust/nodes", cwd=clone), "trust/nodes"))
    assert root == digest(trust)
    path = cache / "reconciler" / "notes" / root
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    # a second run finds them all: the file is not written again, and says the same
    before = path.stat().st_ino, path.stat().st_mtime_ns
    assert status(clone, cache) == first
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == before


def test_a_forged_note_is_refused_though_the_cache_holds_the_note_it_replaced(
    deployment: Deployment, tmp_path: Path
) -> None:
    commit, clone = fleet(deployment, tmp_path)
    cache = tmp_path / "cache"
    status(clone, cache)  # every node's note verified, and kept
    # the git server rewrites ctl1's note (failed -> applied is its word, not ctl1's: the
    # signature is ctl1's, the body another), and copies ctl2's verified note, byte for byte (the
    # very blob the cache holds), into cmp1's ref
    forged = json.loads(signed_note("ctl1", commit))
    forged["state"] = "failed"
    add_note(deployment, "ctl1", commit, json.dumps(forged, indent=2, sort_keys=True))
    copied = git("--git-dir", str(deployment.bare), "cat-file", "blob", f"refs/notes/reconciler/ctl2:{commit}")
    add_note(deployment, "cmp1", commit, copied)
    assert blob_of(deployment, "cmp1", commit) == blob_of(deployment, "ctl2", commit)
    shown = status(clone, cache)
    assert shown["ctl1"]["state"] == "unverified" and "signature does not verify" in shown["ctl1"]["detail"]
    assert shown["cmp1"]["state"] == "unverified"
    assert {n: shown[n]["state"] for n in ("ctl2", "ctl3", "cmp2")} == dict.fromkeys(("ctl2", "ctl3", "cmp2"), "applied")
    (lines,) = kept(cache).values()  # neither is kept
    assert f"ctl1 {commit} {blob_of(deployment, 'ctl1', commit)}" not in lines
    assert f"cmp1 {commit} {blob_of(deployment, 'cmp1', commit)}" not in lines


def test_a_note_kept_under_keys_the_operators_head_no_longer_lists_is_refused(
    deployment: Deployment, tmp_path: Path
) -> None:
    commit, clone = fleet(deployment, tmp_path)
    cache = tmp_path / "cache"
    status(clone, cache)
    # the operator checks out a commit whose trust/nodes gives ctl1 another key
    other = tmp_path / "ctl1-new-key"
    NoteKey.load_or_create(other)
    nodes = clone / "trust" / "nodes"
    nodes.write_text("".join(line if not line.startswith("ctl1 ") else
                             f'ctl1 namespaces="reconciler-note" {NoteKey.load(other).public_line}\n'
                             for line in nodes.read_text().splitlines(keepends=True)))
    git("-c", "user.name=o", "-c", "user.email=o@example.org", "commit", "-q", "-am", "ctl1's new key", cwd=clone)
    shown = status(clone, cache)
    assert shown["ctl1"]["state"] == "unverified"
    assert shown["ctl2"]["state"] == "applied"
    assert len(kept(cache)) == 2  # another root, another file


def test_a_cache_file_others_can_write_is_not_read(deployment: Deployment, tmp_path: Path) -> None:
    commit, clone = fleet(deployment, tmp_path)
    cache = tmp_path / "cache"
    status(clone, cache)
    # a line for a note no key signed, planted in the file: the user's own file (0600) is
    # believed, as ssh believes known_hosts; one others can write is not read at all
    unsigned = json.dumps({"format": 1, "node": "ctl3", "commit": commit, "state": "failed"}, indent=2)
    add_note(deployment, "ctl3", commit, unsigned)
    (root,) = kept(cache)
    path = cache / "reconciler" / "notes" / root
    path.write_text(path.read_text() + f"ctl3 {commit} {blob_of(deployment, 'ctl3', commit)}\n")
    path.chmod(0o666)
    assert status(clone, cache)["ctl3"]["state"] == "unverified"
    path.write_text(path.read_text() + f"ctl3 {commit} {blob_of(deployment, 'ctl3', commit)}\n")
    path.chmod(0o600)
    assert status(clone, cache)["ctl3"]["state"] == "failed"


def careful(raw: str | bytes) -> dict[str, Any] | str:
    """The decoder's careful path alone (depth on the text, then every string, then the
    fields): what ``check`` said before its one-walk path, for any input."""
    saved = notejson._PARSED_FIRST
    notejson._PARSED_FIRST = -1  # every text counts as too bracketed to parse first
    try:
        return check(raw)
    finally:
        notejson._PARSED_FIRST = saved


strings = st.one_of(st.text(max_size=8), st.text(min_size=250, max_size=300), st.just("x" * 4097),
                    st.sampled_from(["\ud800", "a\udc00", "ok"]))
values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), strings),
                      lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(strings, inner, max_size=3)),
                      max_leaves=24)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["state", "error", "services", "upgrade", "held", "claim", "x"]), values,
                       max_size=4), st.booleans(), st.booleans())
def test_the_one_walk_check_says_what_the_careful_path_says(body: dict[str, Any], as_bytes: bool, ascii: bool) -> None:
    text = json.dumps(body, ensure_ascii=ascii)
    raw = text.encode("utf-8", "surrogatepass") if as_bytes else text
    assert check(raw) == careful(raw)


def test_the_fields_read_without_a_call_are_still_held_to_their_bounds() -> None:
    long = "s" * 257
    assert check(json.dumps({"state": long})) == "state: not a name (a string of at most 256 characters)"
    assert check(json.dumps({"services": {"db": {"result": long}}})) == \
        "services.db.result: not a name (a string of at most 256 characters)"
    assert check(json.dumps({"refused": {"head": long}})) == "refused.head: not a name (a string of at most 256 characters)"
    assert check(json.dumps({"error": 7})) == "error: a number, not a string"
    assert isinstance(check(json.dumps({"state": "s" * 256, "error": "e" * 4096})), dict)


cells = st.one_of(st.sampled_from(["applied", "failed", "-", "", "·", "ctl1", "a:smile:b", ":thumbs_up:", "x[red]y",
                                   "a\\[b", "C:\\path", "nodé世界", "tab\there", "e\u0301", "\x1b[31mred"]),
                  st.text(max_size=12))


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=20), st.lists(st.lists(st.tuples(cells, st.booleans()), min_size=3, max_size=3), max_size=6),
       st.integers(min_value=20, max_value=120))
def test_a_table_written_plain_is_what_rich_prints(title: str, rows: list[list[tuple[str, bool]]], width: int) -> None:
    """Piped (no colour), `status --fleet` writes its table itself: the same characters as rich,
    or rich lays it out (a table wider than the console)."""
    import io

    from rich.console import Console

    from reconciler.cli.common import escape
    from reconciler.cli.fleet import plain_table, rich_table

    printed = io.StringIO()
    Console(file=printed, width=width, highlight=False, soft_wrap=True).print(
        rich_table(escape(title), ["wave", "node", "state"], rows))
    plain = plain_table(escape(title), ["wave", "node", "state"], rows, width)
    assert plain is None or plain == printed.getvalue()
    if rows and all(len(t) < 4 and t.isascii() and t.isalnum() for row in rows for t, _ in row):
        assert plain is not None  # a narrow table is written plain
