"""Which keys of a config file changed: the domains a planner judges, file format by file format."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.core import inifile
from reconciler.core.compare import Domain, _changes, domains, file_decision, flatten
from reconciler.core.inifile import has_header, ini_changes
from reconciler.core.model import FileSpec


def changed(path: str, old: str, new: str) -> list[tuple[str | None, str]]:
    return [(d.key, d.what) for d in domains([FileSpec(path, 0o644, old.encode())],
                                              [FileSpec(path, 0o644, new.encode())])]


NOVA = "[DEFAULT]\ntransport_url = rabbit://{first}\ntransport_url = rabbit://{second}\ndebug = false\n"


def test_a_change_to_the_first_of_two_repeated_keys_is_named() -> None:
    assert changed("nova.conf", NOVA.format(first="one", second="two"), NOVA.format(first="uno", second="two")) == [
        ("DEFAULT.transport_url", "changed")]


def test_swapping_the_order_of_repeated_values_is_a_change() -> None:
    assert changed("nova.conf", NOVA.format(first="one", second="two"), NOVA.format(first="two", second="one")) == [
        ("DEFAULT.transport_url", "changed")]


def test_a_repeated_section_merges_in_order() -> None:
    old = "[filter:authtoken]\nuse = egg:a\n[app:main]\nx = 1\n[filter:authtoken]\nuse = egg:b\ndelay = 1\n"
    new = "[filter:authtoken]\nuse = egg:c\n[app:main]\nx = 1\n[filter:authtoken]\nuse = egg:b\ndelay = 1\n"
    assert changed("api-paste.ini", old, new) == [("filter:authtoken.use", "changed")]
    assert changed("api-paste.ini", old, old.replace("delay = 1", "delay = 2")) == [("filter:authtoken.delay", "changed")]


def test_only_comments_and_layout_changed_with_repeated_keys() -> None:
    old = NOVA.format(first="one", second="two")
    new = "# messaging\n[DEFAULT]\n\ntransport_url=rabbit://one\n; fallback\ntransport_url = rabbit://two\ndebug: false\n"
    assert changed("nova.conf", old, new) == [(None, "changed (comments or layout only)")]


def test_ini_continuation_lines_and_files_without_sections() -> None:
    old = "[DEFAULT]\nhosts = a\n  b\nname = x\n"
    assert changed("svc.conf", old, old.replace("  b", "  c")) == [("DEFAULT.hosts", "changed")]
    assert changed("svc.conf", old, old.replace("  b\n", "")) == [("DEFAULT.hosts", "changed")]
    sysctl = "net.ipv4.ip_forward = 1\nvm.swappiness = 10\n"
    assert changed("90-cloud.conf", sysctl, sysctl.replace("10", "1")) == [("vm.swappiness", "changed")]
    assert changed("x.conf", "[a]\nk = 1\n", "[a]\nnot an option\n") == [(None, "changed")]


def test_a_rendered_billion_laughs_yaml_is_judged_as_a_whole_file_at_once() -> None:
    lines = ['l0: &l0 "lol"'] + [f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]" for n in range(1, 10)]
    start = time.monotonic()
    result = domains([FileSpec("app.yaml", 0o644, b"l0: 1\n")], [FileSpec("app.yaml", 0o644, "\n".join(lines).encode())])
    assert result == [Domain("app.yaml", None, "changed")]
    assert time.monotonic() - start < 5


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(["[s]", "  [s]", "k = [v]", "\t", " ", "\n", "\r", "\r\n", "\x0b", "\x1c", "\x85",
                                 "\u2028", "\u3000", "x", "#", "["]), max_size=12))
def test_a_section_header_is_found_on_any_line_however_lines_end(parts: list[str]) -> None:
    text = "".join(parts)
    by_line = any(line.lstrip().startswith("[") for line in text.splitlines())
    assert has_header(text.encode()) is by_line


# A line of a rendered INI file as (kind, name, value), and the same line written out.
LINE = st.one_of(
    st.tuples(st.just("option"), st.sampled_from(["k", "j", "m"]), st.sampled_from(["1", "2", "[x]"]),
              st.sampled_from(["", "  "]), st.sampled_from([" = ", "=", ": "])),
    st.tuples(st.just("section"), st.sampled_from(["s", "t"]), st.sampled_from(["", " "]), st.just(""), st.just("")),
    st.tuples(st.just("more"), st.just(""), st.sampled_from(["a", "b"]), st.sampled_from(["    ", "\t"]), st.just("")),
    st.tuples(st.sampled_from(["#", ";"]), st.just(""), st.sampled_from(["a", "b"]), st.sampled_from(["", "  "]),
              st.just("")),
    st.tuples(st.just("blank"), st.just(""), st.just(""), st.sampled_from(["", "  "]), st.just("")),
)
JUNK = st.tuples(st.just("junk"), st.just(""), st.sampled_from(["bad line", "=v"]), st.just(""), st.just(""))


def written(kind: str, name: str, value: str, indent: str, sep: str) -> str:
    if kind == "option":
        return f"{indent}{name}{sep}{value}"
    if kind == "section":
        return f"[{value}{name}{value}]"
    return {"blank": indent, "junk": value}.get(kind, f"{indent}{kind}{value}" if kind in "#;" else indent + value)


@settings(max_examples=1500, deadline=None)
@given(st.lists(LINE, max_size=12), st.data())
def test_two_ini_files_of_one_shape_read_in_one_pass_differ_in_the_keys_a_whole_parse_finds(
        lines: list[tuple[str, str, str, str, str]], data: st.DataObject) -> None:
    # The other file: mostly the same lines, some with another value (the same shape), some
    # replaced by any line (another shape), sometimes one line more.
    other = []
    for kind, name, value, indent, sep in lines:
        roll = data.draw(st.integers(0, 9))
        if roll < 3:
            value = data.draw(st.sampled_from(["1", "2", "3", "a", "b", " "]))
        elif roll == 3:
            kind, name, value, indent, sep = data.draw(LINE if data.draw(st.integers(0, 4)) else JUNK)
        other.append(written(kind, name, value, indent, sep))
    if data.draw(st.integers(0, 9)) == 0:
        other.append(written(*data.draw(LINE)))
    old = ("\n".join(written(*line) for line in lines) + "\n").encode()
    new = ("\n".join(other) + "\n").encode()
    fa, fb = flatten("f.conf", old), flatten("f.conf", new)
    whole = None if fa is None or fb is None else [
        (k, "added" if k not in fa else "removed" if k not in fb else "changed")
        for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]
    assert _changes(FileSpec("f.conf", 0o644, old), FileSpec("f.conf", 0o644, new)) == whole
    one_pass = ini_changes(old.decode().splitlines(True), new.decode().splitlines(True))
    if one_pass is not None:  # taken, and the same answer
        assert whole is not None and one_pass == [k for k, _ in whole]


@pytest.mark.parametrize(("old", "new", "keys"), [
    # A rendered config with one value changed, most of a fleet diff's files.
    (NOVA.format(first="a", second="b") + "[api]\nworkers = 4\n",
     NOVA.format(first="a", second="b") + "[api]\nworkers = 8\n", ["api.workers"]),
    # A continuation line changed, a comment and a blank line alike on both sides.
    ("[s]\n# c\nk = 1\n    x\n\nj = 2\n", "[s]\n# c\nk = 1\n    y\n\nj = 2\n", ["s.k"]),
    # Only a comment changed: same keys, same values.
    ("k = 1\n# old\n", "k = 1\n# new\n", []),
])
def test_files_of_one_shape_are_compared_in_one_pass(old: str, new: str, keys: list[str]) -> None:
    assert ini_changes(old.splitlines(True), new.splitlines(True)) == keys
    assert _changes(FileSpec("f.conf", 0o644, old.encode()), FileSpec("f.conf", 0o644, new.encode())) == [
        (k, "changed") for k in keys]


@pytest.mark.parametrize(("old", "new", "keys"), [
    # "k" at another indent: the next line continues it in one file and is an option in the other.
    (b"[s]\nk = 1\n  j = 2\n", b"[s]\n  k = 1\n  j = 2\n", [("s.j", "added"), ("s.k", "changed")]),
    # A continuation line in one file, an option in the other.
    (b"[s]\nk = 1\n    a\n", b"[s]\nk = 1\nj = 2\n", [("s.j", "added"), ("s.k", "changed")]),
    # A blank line ends a value; a comment does not.
    (b"k = 1\n\n", b"k = 1\n# c\n", []),
    (b"k = 1\n\n  j = 2\n", b"k = 1\n# c\n  j = 2\n", [("j", "removed"), ("k", "changed")]),
    # Another section: the same option names are other keys.
    (b"[s]\nk = 1\n", b"[t]\nk = 1\n", [("s.k", "removed"), ("t.k", "added")]),
])
def test_files_of_another_shape_are_each_parsed_whole(old: bytes, new: bytes, keys: list[tuple[str, str]]) -> None:
    assert ini_changes(old.decode().splitlines(True), new.decode().splitlines(True)) is None
    assert _changes(FileSpec("f.conf", 0o644, old), FileSpec("f.conf", 0o644, new)) == keys


def test_a_secret_files_lines_are_judged_but_not_kept_in_the_line_tables() -> None:
    """A daemon and a review bot live long: the tables that spare a fleet diff reading a line
    twice keep no line of a file that holds a secret, changed or not, nor any of its values."""
    old = b"[database]\nconnection = mysql://nova:s3cret-old@db/nova\nuser = nova-s3cret-user\n"
    new = b"[database]\nconnection = mysql://nova:s3cret-new@db/nova\nuser = nova-s3cret-user\n"
    secret = file_decision(FileSpec("nova.conf", 0o600, old, True), FileSpec("nova.conf", 0o600, new, True), ())
    kept = [line for line in (*inifile._READ, *inifile._MOVES) if "s3cret" in line]

    assert secret[1] == "only [database] connection changed in nova.conf (no rule: restart)"
    assert kept == []
    # The same file without a secret: its lines are kept, so the check above could fail.
    file_decision(FileSpec("nova.conf", 0o644, old), FileSpec("nova.conf", 0o644, new), ())
    assert any("s3cret" in line for line in (*inifile._READ, *inifile._MOVES))
