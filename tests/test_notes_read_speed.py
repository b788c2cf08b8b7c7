"""A fleet's reader decodes every node's note (10,000 for `status --fleet` of a big fleet):
``notejson.check`` reads a sound note in one parse and one walk, and says what the careful
path (``check_careful``: the depth on the text first, then every string, then each field in
its order) says, for any input, sound or hostile. A note as the writer writes it takes the
one-walk path; the walk over the notes reads what ``repo.notes`` reads.

(The figure itself is ``bench/fleet_status.py``'s: no clock here.)
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pygit2
import pytest
from conftest import nodes_file, note_key
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.core.model import Report, ResultState, ServiceResult, Verdict
from reconciler.core.model.desired import ActionKind
from reconciler.fleet import notejson, notes, view
from reconciler.fleet.notejson import MAX_NAME, MAX_NOTE, MAX_TEXT, check, check_careful
from reconciler.fleet.view import notes_in
from reconciler.trust.notesig import NoteKey, NoteTrust, parse_nodes

COMMIT = "c" * 40

# Strings within each bound, to the character (a writer's), and past it, lone surrogates (as
# escapes, or raw in a str), text a bracket or an escaped quote could mislead a scan of.
names = st.one_of(st.text(max_size=8), st.sampled_from(["n" * MAX_NAME, "applied", "é世界", '"[{', "\\", "a\\u0041"]))
texts = st.one_of(names, st.text(max_size=40), st.sampled_from(["t" * MAX_TEXT, "x\\\"y" * 30]))
past = st.sampled_from(["n" * (MAX_NAME + 1), "t" * (MAX_TEXT + 1), "\ud800", "a\udc00b"])
# Anything a hostile writer can put where a field is read: huge integers, floats of any size,
# NaN and infinities, any nesting (up to past the depth bound), any keys.
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=10**17, max_value=10**40),
                    st.floats(allow_nan=True, allow_infinity=True), texts, past)


def nested(depth: int) -> Any:
    value: Any = "deep"
    for i in range(depth):
        value = [value] if i % 2 else {"d": value}
    return value


anything = st.one_of(st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                   st.dictionaries(names | past, inner, max_size=3)),
                                  max_leaves=10),
                     st.integers(min_value=12, max_value=18).map(nested))

# A note as the writer writes it (``notes.to_dict``, ``ServiceResult.to_dict``): sound.
service = st.fixed_dictionaries(
    {"action": names, "detail": texts, "reason": texts, "result": st.sampled_from(["ok", "failed", "skipped"]) | names,
     "steps": st.lists(texts, max_size=3), "pid": st.none() | st.integers(0, 2**22), "hash": st.none() | names})
services = st.one_of(st.dictionaries(names, service, max_size=4),
                     st.tuples(service, st.integers(20, 40)).map(lambda sn: {f"svc{i:02d}": sn[0] for i in range(sn[1])}))
step = st.fixed_dictionaries({"service": names, "step": names, "status": names, "detail": texts})
report = st.fixed_dictionaries(
    {"format": st.just(1), "node": names, "commit": st.just(COMMIT) | names, "state": names, "time": names,
     "services": services},
    optional={"plan_hash": names, "reason": texts, "error": texts, "upgrade": st.lists(step, max_size=3),
              "events": st.lists(texts, max_size=3), "held": st.lists(names, max_size=3),
              "sig": texts, "refused": st.fixed_dictionaries({"head": names, "reason": names, "time": names}),
              "plane": st.fixed_dictionaries({"vip": names}),
              "claim": st.fixed_dictionaries({"node": names, "state": st.sampled_from(["queued", "free", "x"]),
                                              "ticket": st.integers(-1, 2**53 + 1),
                                              "time": st.floats(allow_nan=True, allow_infinity=True)})})
TOP = ["format", "node", "commit", "state", "time", "services", "plan_hash", "reason", "error", "upgrade", "events",
       "pins", "signer", "verdicts", "suspended", "plane", "refused", "held", "facts", "claim", "x"]
FIELDS = ["action", "detail", "reason", "result", "steps", "pid", "hash", "x", "n" * (MAX_NAME + 1), "\ud800"]


@st.composite
def hostile_notes(draw: st.DrawFn) -> dict[str, Any]:
    """A writer's note, or one to three of its fields (of the note or a service) another value,
    anything (bounds broken, wrong types) or gone."""
    body = draw(report)
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
        value = draw(st.one_of(anything, past, names, texts, st.lists(texts | past | scalars, max_size=2)))
        svcs = body.get("services")
        if draw(st.booleans()) and isinstance(svcs, dict) and svcs:
            name = draw(st.sampled_from(sorted(svcs)))
            changed = dict(svcs[name]) if isinstance(svcs[name], dict) else {}
            field = draw(st.sampled_from(FIELDS))
            if draw(st.booleans()):
                changed.pop(field, None)
            else:
                changed[field] = value
            body["services"] = {**svcs, name: changed}
        elif draw(st.booleans()):
            body.pop(draw(st.sampled_from(TOP)), None)
        else:
            body[draw(st.sampled_from(TOP))] = value
    return body


def written(body: Any, ascii: bool, indent: int | None, twist: int) -> str:
    """``body`` as a writer may write it, sometimes twisted where json.dumps never would: a
    key said twice, a number past float's range, trailing garbage, a BOM."""
    text = json.dumps(body, ensure_ascii=ascii, indent=indent, sort_keys=indent is not None)
    if twist == 1 and text.startswith("{"):
        text = '{"services": 1, "state": "x", ' + text[1:] if len(text) > 2 else text
    elif twist == 2:
        text = text.replace('"format": 1', '"format": 1e999', 1)
    elif twist == 3:
        text += " ]"
    elif twist == 4:
        text = "\ufeff" + text
    return text


@settings(max_examples=300, deadline=None)
@given(hostile_notes(), st.booleans(), st.sampled_from([None, 2]), st.sampled_from([0] * 6 + [1, 2, 3, 4]),
       st.sampled_from(["bytes", "str", "bad utf-8"]))
def test_a_note_read_in_one_walk_says_what_the_careful_path_says(
    body: dict[str, Any], ascii: bool, indent: int | None, twist: int, kind: str
) -> None:
    text = written(body, ascii, indent, twist)
    raw: str | bytes = text if kind == "str" else text.encode("utf-8", "surrogatepass")
    if kind == "bad utf-8":
        raw = text.encode("utf-8", "surrogatepass") + b"\xff"
    assert check(raw) == check_careful(raw)


@settings(max_examples=150, deadline=None)
@given(anything, st.booleans(), st.sampled_from(["bytes", "str"]))
def test_any_json_read_in_one_walk_says_what_the_careful_path_says(body: Any, ascii: bool, kind: str) -> None:
    text = json.dumps(body, ensure_ascii=ascii)
    raw = text if kind == "str" else text.encode("utf-8", "surrogatepass")
    assert check(raw) == check_careful(raw)


def a_service(**changed: Any) -> dict[str, Any]:
    return {"action": "restart", "detail": "d" * 100, "hash": None, "pid": 7, "reason": "exit 1", "result": "failed",
            "steps": ["stop", "start"], **changed}


# A service's field (or one more) out of its bound, or of the wrong type: what each says.
BROKEN: dict[str, tuple[dict[str, Any], str]] = {
    "action": ({"action": "n" * 257}, "services.db.action: not a name (a string of at most 256 characters)"),
    "result": ({"result": 7}, "services.db.result: not a name (a string of at most 256 characters)"),
    "hash": ({"hash": "n" * 257}, "services.db.hash: not a name (a string of at most 256 characters)"),
    "hash type": ({"hash": 5}, "services.db.hash: not a name (a string of at most 256 characters)"),
    "pid": ({"pid": True}, "services.db.pid: a boolean, not an integer"),
    "pid float": ({"pid": 1.5}, "services.db.pid: a number, not an integer"),
    "steps": ({"steps": [1]}, "services.db.steps: not a list of strings"),
    "steps text": ({"steps": "stop"}, "services.db.steps: not a list of strings"),
    "steps object": ({"steps": [{}]}, "services.db.steps: not a list of strings"),
    "detail": ({"detail": 3}, "services.db.detail: a number, not a string"),
    "reason": ({"reason": None}, "services.db.reason: a null, not a string"),
    "long key": ({"k" * 257: 1}, "a key of 257 characters, more than 256"),
    "deep": ({"x": nested(14)}, "nested 17 deep, more than 16"),
    "surrogate": ({"detail": "\ud800"}, "a text holding a lone surrogate"),
    "long text": ({"detail": "e" * 5000}, "a text of 5000 characters, more than 4096"),
    "long step": ({"steps": ["e" * 5000]}, "a text of 5000 characters, more than 4096"),
    "huge pid": ({"pid": 10**19}, "an integer of 20 digits, more than 18"),
}


def test_the_bounds_are_said_as_they_were_on_either_path() -> None:
    """Each bound a service's field can break, in a note of one service (only its keys can
    break a bound when read as UTF-8: the cheapest path) and of forty (strings can too)."""
    for count in (1, 40):
        for case, (changed, why) in BROKEN.items():
            for missing in ((), ("hash",) if "pid" in changed else ("pid",)):  # an older writer's: a field fewer
                broken = {k: v for k, v in a_service(**changed).items() if k not in missing}
                body = {"format": 1, "node": "ctl1", "commit": COMMIT, "state": "failed",
                        "services": {**{f"svc{i:03d}": a_service() for i in range(count - 1)}, "db": broken}}
                for ascii in (True, False):
                    text = json.dumps(body, ensure_ascii=ascii, indent=2)
                    for raw in (text, text.encode("utf-8", "surrogatepass")):
                        said = "not UTF-8" if case == "surrogate" and not ascii and isinstance(raw, bytes) else why
                        assert check(raw) == check_careful(raw) == said, (count, case, missing, ascii, type(raw))
    big = {"format": 1, "node": "ctl1", "commit": COMMIT, "state": "failed", "services": {"db": a_service()}}
    assert check(json.dumps({**big, "x": nested(16)})) == "nested 17 deep, more than 16"
    assert check(json.dumps({**big, "x": nested(15)})) == json.loads(json.dumps({**big, "x": nested(15)}))
    assert check(json.dumps({**big, "services": {"s" * 257: a_service()}})) == "a key of 257 characters, more than 256"
    assert check(json.dumps({**big, "services": {"db": "up"}})) == "services.db: a string, not an object"
    assert check(json.dumps({**big, "state": 1, "format": "1"})) == "format: a string, not an integer"
    assert check(json.dumps({**big, "state": "s" * 257})) == "state: not a name (a string of at most 256 characters)"
    assert check(json.dumps({**big, "format": True})) == "format: a boolean, not an integer"
    assert check(json.dumps({**big, "pins": []})) == "pins: a array, not an object"
    assert check(json.dumps({**big, "error": None})) == "error: a null, not a string"


def a_note_as_written(services: int, failed: bool = False) -> str:
    results = tuple(ServiceResult(f"svc{i:02d}", ActionKind.RESTART if failed else ActionKind.NONE,
                                  ResultState.FAILED if failed and i == 0 else ResultState.OK,
                                  "exit 1" if failed else "", "x" * 300 if failed else "", pid=1000 + i,
                                  hash="a" * 64, steps=("stop", "start") if failed else ())
                    for i in range(services))
    return notes.encode(Report("ctl1", COMMIT, Verdict.FAILED if failed else Verdict.APPLIED, "2026-11-26T10:00:00Z",
                               services=results, plan_hash="0" * 64, error="svc00 failed" if failed else ""))


def test_a_note_as_the_writer_writes_it_is_read_in_one_walk() -> None:
    """What makes a fleet's read fast: a sound note never reaches the careful path."""
    for services, failed in ((1, False), (5, False), (30, False), (30, True), (120, True)):
        raw = a_note_as_written(services, failed).encode()
        assert len(raw) <= MAX_NOTE
        text, values = notejson._text_of(raw)
        fast = notejson._fast(text, values)
        assert fast is not None, (services, failed)
        assert fast == check_careful(raw) == json.loads(raw)


def a_notes_commit(repo: pygit2.Repository, paths: dict[str, bytes], stored: str = "git") -> pygit2.Oid:
    """A notes commit of a tree holding ``paths`` (fanout directories as git notes makes them,
    or any); ``stored`` "reversed": each tree's entries stored in the reverse of git's order."""
    def tree(entries: dict[str, Any]) -> pygit2.Oid:
        made = []
        for name, value in entries.items():
            if isinstance(value, dict):
                made.append((name, pygit2.enums.FileMode.TREE, tree(value)))
            else:
                made.append((name, pygit2.enums.FileMode.BLOB, repo.create_blob(value)))
        made.sort(key=lambda e: e[0] + ("/" if e[1] == pygit2.enums.FileMode.TREE else ""),
                  reverse=stored == "reversed")
        raw = b"".join(b"%o %s\0" % (mode, name.encode()) + oid.raw for name, mode, oid in made)
        return repo.odb.write(pygit2.enums.ObjectType.TREE, raw)

    nested: dict[str, Any] = {}
    for path, data in paths.items():
        *dirs, name = path.split("/")
        where = nested
        for d in dirs:
            where = where.setdefault(d, {})
        where[name] = data
    who = pygit2.Signature("n", "n@example.org", 0, 0)
    return repo.create_commit(None, who, who, "notes", tree(nested), [])


def listed(repo: pygit2.Repository, commit: pygit2.Oid) -> list[tuple[str, str]]:
    repo.references.create("refs/notes/probe", commit, force=True)
    return [(str(n.annotated_id), str(n.id)) for n in repo.notes("refs/notes/probe")]  # type: ignore[call-arg]


def test_the_walk_over_a_notes_tree_lists_what_libgit2s_note_iterator_lists(tmp_path: Path) -> None:
    repo = pygit2.init_repository(str(tmp_path / "notes.git"), bare=True)
    ids = [f"{i:02x}" * 20 for i in range(0, 256, 15)] + ["ab" * 20, "abcd" + "0" * 36, "ab" + "1" * 38]
    layouts = {
        "flat": {i: i.encode() for i in ids},
        "fanout": {f"{i[:2]}/{i[2:]}": i.encode() for i in ids},
        "fanout twice": {f"{i[:2]}/{i[2:4]}/{i[4:]}": i.encode() for i in ids},
        "mixed": {(i if n % 3 == 0 else f"{i[:2]}/{i[2:]}" if n % 3 == 1 else f"{i[:2]}/{i[2:4]}/{i[4:]}"): i.encode()
                  for n, i in enumerate(ids)},
        "upper case": {i.upper(): i.encode() for i in ids[:4]},
        "a file and a directory of one name": {"ab" * 20: b"1", f"{'ab' * 19}/ab": b"2"},
        "empty": {},
    }
    for layout, paths in layouts.items():
        for stored in ("git", "reversed"):
            commit = a_notes_commit(repo, paths, stored)
            mine = [(str(o), str(b)) for o, b in notes_in(repo, commit)]
            assert mine == listed(repo, commit), (layout, stored)
            assert len(mine) == len(paths)
    # Paths that name no object: libgit2 lists them with an object id it never set; the walk skips them.
    odd = {"README": b"r", "abc": b"s", "ab" * 20 + "a": b"t", "zz/" + "ab" * 19: b"u", "cd" * 20: b"note"}
    commit = a_notes_commit(repo, odd)
    note = repo.create_blob(b"note")
    assert notes_in(repo, commit) == [(pygit2.Oid(hex="cd" * 20), note)]
    assert (str(note), "cd" * 20) in {(b, o) for o, b in listed(repo, commit)}
    with pytest.raises(ValueError):  # a notes ref on a blob: as repo.notes, no notes there
        notes_in(repo, note)


def test_notes_judged_a_batch_at_a_time_count_and_are_refused_as_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Notes are read a batch at a time, then judged: what counts, what is refused and why, each
    node's notes in their order and the warnings said are what reading and judging them one by
    one gives, batches cut anywhere among sound, unsigned, forged, malformed and too big notes,
    claims and notes on a tree."""
    repo = pygit2.init_repository(str(tmp_path / "fleet.git"), bare=True)
    who = pygit2.Signature("n", "n@example.org", 0, 0)
    empty = repo.TreeBuilder().write()
    commits: list[str] = []
    for i in range(6):
        commits.append(str(repo.create_commit(None, who, who, f"c{i}", empty, [pygit2.Oid(hex=c) for c in commits[-1:]])))
    builder = repo.TreeBuilder()
    builder.insert("file", repo.create_blob(b"x"), pygit2.enums.FileMode.BLOB)
    tree = builder.write()
    nodes = ("ctl1", "ctl2", "cmp1")
    keys = {n: NoteKey.load(note_key(n)) for n in nodes}

    def report(node: str, commit: str, state: str = "applied") -> dict[str, Any]:
        return {"format": 1, "node": node, "commit": commit, "state": state, "time": "2026-11-26T10:00:00Z",
                "services": {"web": {"action": "none", "detail": "", "hash": None, "pid": 7, "reason": "",
                                     "result": "ok", "steps": []}}}

    def sealed(node: str, commit: str, by: str | None = None, **changed: Any) -> str:
        return json.dumps(keys[by or node].seal(node, commit, {**report(node, commit), **changed}), indent=2)

    claim = {"format": 1, "claim": {"node": "ctl2", "state": "queued", "ticket": 3, "time": 1.0, "action": "restart"}}
    written: dict[str, dict[str, str]] = {
        "ctl1": {c: sealed("ctl1", c) for c in commits},
        "ctl2": {commits[0]: json.dumps(report("ctl2", commits[0])),  # unsigned
                 commits[1]: sealed("ctl2", commits[1], by="cmp1"),  # another node's key
                 commits[2]: "{not json", commits[3]: sealed("ctl2", commits[3], state="failed"),
                 commits[4]: sealed("ctl2", commits[4], error="e" * 70_000),  # past the size bound
                 notes.CLAIM_OBJECT: json.dumps(keys["ctl2"].seal("ctl2", notes.CLAIM_OBJECT, claim)),
                 str(tree): sealed("ctl2", str(tree))},  # on a tree: no report
        "cmp1": {commits[5]: sealed("cmp1", commits[5]), commits[2]: '{"state": ["x"]}',
                 commits[3]: sealed("cmp1", commits[3], state="s" * 300)},
    }
    for node, on in written.items():
        builder = repo.TreeBuilder()
        for obj, text in on.items():
            builder.insert(obj, repo.create_blob(text.encode()), pygit2.enums.FileMode.BLOB)
        repo.create_commit(f"refs/notes/reconciler/{node}", who, who, "notes", builder.write(), [])
    trust = NoteTrust(parse_nodes(nodes_file(*nodes), "trust/nodes"))

    def read(batch: int, about: str | None) -> tuple[Any, ...]:
        monkeypatch.setattr(view, "_BATCH", batch)
        for memo in (view._DECODED, view._SAID, view._CHECKED):
            memo.clear()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="reconciler.fleet"):
            seen = view.fleet_view(repo, "refs/notes/reconciler/", trust=trust, about=about)
        return seen.notes, seen.claims, seen.rejected, [r.getMessage() for r in caplog.records]

    for about in (None, commits[3]):
        one_by_one = read(1, about)
        assert {x.commit for x in one_by_one[0]["ctl1"]} == set(commits if about is None else commits[3:])
        # unsigned, forged, malformed, too big (status of c3: only the malformed ones, whatever commit)
        assert len(one_by_one[2]["ctl2"]) == (4 if about is None else 2) and one_by_one[3]
        assert len(one_by_one[2]["cmp1"]) == 2 and [c.ticket for c in one_by_one[1].values()] == ([3] if about is None else [])
        for batch in (2, 3, 64):
            assert read(batch, about) == one_by_one, (batch, about)
