"""The note decoder and the claim reader against whatever a compromised node can write: no input
raises, everything out of bounds is a malformed note with a reason, and what is let through
has the types the readers rely on. Plus the text every table prints from a note.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.core.model import Report, ResultState, ServiceResult, Verdict
from reconciler.core.model.desired import ActionKind
from reconciler.core.text import printable
from reconciler.fleet import notes
from reconciler.fleet.notejson import MAX_DEPTH, MAX_NOTE, MAX_TEXT, MAX_TICKET, _depth, check
from reconciler.fleet.notes import CLAIM_OBJECT, Claim, Malformed, Note

FUZZ = settings(max_examples=300, deadline=None)
COMMIT = "a" * 40

# JSON-ish values as a hostile writer would nest them: any scalar Python's json can write
# (huge integers, floats of any size, NaN and infinities), strings with any code point.
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=10**17, max_value=10**40),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=50))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=8)
# What the readers look at, filled with anything.
fields = st.fixed_dictionaries({}, optional={
    "format": values, "state": values, "time": values, "error": values, "reason": values, "node": values,
    "services": st.one_of(values, st.dictionaries(st.text(max_size=8), st.dictionaries(
        st.sampled_from(["result", "reason", "detail", "steps", "pid", "hash"]), values), max_size=3)),
    "upgrade": st.one_of(values, st.lists(st.dictionaries(st.sampled_from(["service", "step", "status"]), values),
                                          max_size=3)),
    "plane": st.one_of(values, st.dictionaries(st.just("vip"), values)),
    "claim": st.one_of(values, st.fixed_dictionaries({}, optional={
        "state": st.one_of(st.sampled_from(["choosing", "queued", "free"]), values),
        "ticket": st.one_of(st.integers(), values), "time": values, "action": values})),
})


def dumps(value: Any) -> str:
    return json.dumps(value)  # NaN, Infinity written as Python writes them (huge numbers: below)


def read_as_a_reader_does(raw: str | bytes) -> None:
    """Everything a reader does with a note: decode it, then parse it as a report and a claim."""
    data = notes.body("ctl1", COMMIT, raw)
    assert notes.decode(raw) == (None if isinstance(data, Malformed) else data)
    if isinstance(data, Malformed):
        assert str(data).startswith(f"malformed note from ctl1 on {COMMIT}: ") and len(str(data)) < 300
        return
    note = Note.parse("ctl1", COMMIT, data)
    assert all(isinstance(v, str) for v in (note.state, note.time, note.error, note.failed_service, note.vip))
    assert len(note.error) <= MAX_TEXT
    claim = Claim.parse("ctl1", data)
    if claim is not None:
        assert 0 <= claim.ticket <= MAX_TICKET and math.isfinite(claim.time)
        assert claim.ticket + 1 <= MAX_TICKET + 1  # one higher is exact
        assert check(claim.encode()) == json.loads(claim.encode())  # what a node writes reads back


@FUZZ
@given(st.binary(max_size=2000))
def test_any_bytes(raw: bytes) -> None:
    read_as_a_reader_does(raw)
    read_as_a_reader_does(raw.decode("latin-1"))


@settings(max_examples=150, deadline=None)  # each example costs more to draw than to read
@given(fields)
def test_any_note_shaped_json(body: dict[str, Any]) -> None:
    read_as_a_reader_does(dumps(body))


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=300_000), st.sampled_from(["[", "{\"a\":", "[{\"b\":"]),
       st.booleans())
def test_deep_nesting(depth: int, opener: str, closed: bool) -> None:
    closer = {"[": "]", "{\"a\":": "}", "[{\"b\":": "}]"}[opener]
    text = opener * depth + ("1" + closer * depth if closed else "")
    read_as_a_reader_does(text)
    if depth * opener.count("[") + depth * opener.count("{") > MAX_DEPTH:
        assert notes.decode(text) is None


@FUZZ
@given(st.integers(min_value=19, max_value=9000), st.sampled_from(["ticket", "time", "format"]))
def test_huge_numbers(digits: int, field: str) -> None:
    number = "9" * digits
    text = (f'{{"claim": {{"state": "queued", "{field}": {number}}}}}' if field != "format"
            else f'{{"format": {number}, "state": "applied"}}')
    assert isinstance(notes.body("ctl1", CLAIM_OBJECT, text), Malformed)
    for bad in ("NaN", "Infinity", "-Infinity", "1e999", "-1e999"):
        assert isinstance(notes.body("ctl1", CLAIM_OBJECT, f'{{"claim": {{"state": "free", "time": {bad}}}}}'),
                          Malformed)


def test_the_bounds_are_said_by_name() -> None:
    assert check("x" * (MAX_NOTE + 1)) == f"{MAX_NOTE + 1} bytes, more than 64 KiB"
    assert check("[" * 17 + "]" * 17) == "nested 17 deep, more than 16"
    assert check('{"error": "' + "e" * 5000 + '"}') == "a text of 5000 characters, more than 4096"
    assert check('{"claim": {"state": "queued", "ticket": 9007199254740993}}') == \
        "claim.ticket: not an integer from 0 to 2**53"
    assert check('{"state": ["applied"]}') == "state: not a name (a string of at most 256 characters)"
    assert check('{"services": {"db": {"result": "failed", "detail": 3}}}') == \
        "services.db.detail: a number, not a string"
    assert check('"\\ud800"') == "a JSON string, not an object"
    assert check('{"error": "\\ud800"}') == "a text holding a lone surrogate"
    assert isinstance(check('{"state": "applied", "brackets in a string": "[[[[[[[[[[[[[[[[[[[["}'), dict)


def test_a_nodes_own_long_error_is_cut_to_fit_what_readers_accept() -> None:
    """An honest node whose service printed 20 MB: its note is cut, and every reader reads it."""
    huge, long = "z" * 20_000_000, "w" * 100_000
    report = Report("ctl1", COMMIT, Verdict.FAILED, "2030-01-01T00:00:00Z",
                    services=tuple(ServiceResult(f"svc{i}", ActionKind.RESTART, ResultState.FAILED, long, long)
                                   for i in range(300)),
                    reason="HEALTH", error=huge, events=(long,) * 50)
    text = notes.encode(report)
    assert len(text.encode()) < MAX_NOTE - 4096  # room left for the signature
    note = Note.parse("ctl1", COMMIT, notes.decode(text) or {})
    assert note.state == "failed" and note.failed_service == "svc0"
    assert note.error.startswith("zzz") and note.error.endswith(f"… [cut, {len(huge)} bytes]")


def test_printable_keeps_the_words_and_drops_what_a_terminal_obeys() -> None:
    trick = "\x1b[2J\x1b[1A\x1b]0;all good\x07\u202eoh\u202c identity\tdid not\nstart\x9b31m\x7f\x00\ud800"
    assert printable(trick) == "oh identity did not start"
    assert printable("y" * 4000, 1024) == "y" * 1024 + "… [cut, 4000 bytes]"
    assert printable("x" * 20_000_000, 10) == "x" * 10 + "… [cut, 20000000 bytes]"


@FUZZ
@given(st.text(max_size=200))
def test_printable_never_leaves_a_control_character(text: str) -> None:
    shown = printable(text)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0x202A <= ord(c) <= 0x202E
                   or 0x2066 <= ord(c) <= 0x2069 or 0xD800 <= ord(c) <= 0xDFFF for c in shown)
    shown.encode("utf-8")


def a_full_honest_note() -> str:
    """A report of many services, indented as a node writes it, just under the size bound."""
    service = {"result": "failed", "action": "restart", "reason": "exit 1", "detail": "listening on [::]:80 {tls}",
               "steps": ["stop", "start"], "pid": 4000, "hash": "h" * 16}
    services = {f"svc{i:04d}": service for i in range(MAX_NOTE // len(json.dumps(service)))}
    while len(text := json.dumps({"format": 1, "node": "ctl1", "commit": COMMIT, "state": "failed",
                                  "services": services}, indent=2, sort_keys=True)) > MAX_NOTE:
        services.popitem()
    return text


def cpu_seconds(text: str, enough: float = math.inf, tries: int = 3) -> float:
    """The least CPU time of a few decodes of ``text`` (this process's only: other tests running
    beside this one do not count), stopping at the first one within ``enough``."""
    best = math.inf
    for _ in range(tries):
        start = time.process_time()
        check(text)
        best = min(best, time.process_time() - start)
        if best <= enough:
            break
    return best


def test_a_string_left_open_costs_no_more_than_reading_an_honest_note() -> None:
    """64 KiB a compromised node writes so that scanning it is quadratic (a string never closed,
    full of escapes): every reader decodes every note on every view, so each must cost about
    what an honest note of the same size does, and be malformed."""
    honest = a_full_honest_note()
    assert isinstance(check(honest), dict)
    honest_cost = cpu_seconds(honest, tries=5)
    for hostile in ('"' + '\\"' * 32767, '"\\' * 32768, "[" + '"\\\\' * 20000, "\\" * MAX_NOTE,
                    '"' * MAX_NOTE, '["' * (MAX_NOTE // 2), "[" * MAX_NOTE):
        assert len(hostile.encode()) <= MAX_NOTE
        assert notes.decode(hostile) is None
        assert isinstance(notes.body("ctl1", COMMIT, hostile), Malformed)
        cost = cpu_seconds(hostile, enough=20 * honest_cost)
        assert cost <= 20 * honest_cost, (hostile[:12], cost, honest_cost)


def test_a_string_never_closed_is_said_and_an_escaped_backslash_closes_one() -> None:
    assert check('{"error": "x') == "not JSON (a string never closed, from character 10)"
    assert check('{"error": "x\\"}') == "not JSON (a string never closed, from character 10)"
    assert check('{"error": "x\\\\"}') == {"error": "x\\"}
    assert check('{"error": "[[[[[[[[[[[[[[[[[[\\"]]]"}') == {"error": '[[[[[[[[[[[[[[[[[["]]]'}


def depth_of(value: Any) -> int:
    if isinstance(value, dict | list):
        return 1 + max(map(depth_of, value.values() if isinstance(value, dict) else value), default=0)
    return 0


# Strings made of what the scanner looks at: quotes, backslashes, brackets.
tricky = st.text(alphabet=st.sampled_from('"\\[]{}a\u00e9\n'), max_size=12)
nested = st.recursive(st.one_of(st.none(), st.integers(), tricky),
                      lambda inner: st.one_of(st.lists(inner, max_size=3),
                                              st.dictionaries(tricky, inner, max_size=3)), max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(nested, st.booleans(), st.sampled_from([None, 0, 2]))
def test_the_scanner_counts_the_depth_json_reads(value: Any, ascii_only: bool, indent: int | None) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    assert _depth(text) == depth_of(json.loads(text))
