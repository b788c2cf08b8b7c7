"""Which keys of a config file changed: the domains a planner judges, file format by file format."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.compare import Domain, _has_header, domains
from reconciler.model import FileSpec


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
    assert _has_header(text.encode()) is by_line
