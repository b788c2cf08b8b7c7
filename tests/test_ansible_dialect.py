"""The Ansible template dialect (issue 39): a repo that opts in renders templates written for
Ansible, with Ansible's semantics; one that does not renders as before.

The filters are held to ansible-core's own plugins, the real peer, on generated inputs: the
same output, or both refuse (ours with a RenderError). ``ipaddr`` lives in the ansible.utils
collection, which is not installed here: it is held to that collection's documented examples.
"""

from __future__ import annotations

import resource
import string
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import bcrypt
import jinja2
import pytest
from ansible.plugins.filter import core as ansible_core  # type: ignore[import-untyped]
from ansible.plugins.filter import mathstuff as ansible_math  # type: ignore[import-untyped]
from ansible.plugins.test import core as ansible_tests  # type: ignore[import-untyped]
from conftest import SigningKey, small_deployment
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.core.errors import RenderError
from reconciler.render.ansible_dialect import FILTERS, named_filters
from reconciler.render.ansible_extras import IP_FILTERS, bcrypt_hash, kolla_url, password_hash, put_address_in_context
from reconciler.render.ansible_tests import TESTS
from reconciler.render.node import render_node
from reconciler.repo.load import load_repo
from reconciler.repo.tree import DirTree

OURS = named_filters({**FILTERS, **IP_FILTERS}, None)
OUR_TESTS = named_filters(TESTS, None)
THEIRS: dict[str, Callable[..., Any]] = {**ansible_core.FilterModule().filters(),
                                         **ansible_math.FilterModule().filters()}
THEIR_TESTS = ansible_tests.TestModule().tests()
ENV = jinja2.Environment()
FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

text = st.text(alphabet=string.ascii_letters + string.digits + " ./-_:{}[]'\"\\\nü", max_size=12)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), text)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(text, inner, max_size=3)), max_leaves=8)
dicts = st.dictionaries(st.sampled_from("abc"), st.recursive(
    st.integers(0, 3), lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                st.dictionaries(st.sampled_from("abc"), inner, max_size=2)),
    max_leaves=5), max_size=3)


def same(name: str, *args: Any, theirs: Callable[..., Any] | None = None, ours: Callable[..., Any] | None = None,
         **kwargs: Any) -> None:
    """Ours gives ansible-core's answer, or refuses (a RenderError) what it refuses."""
    peer = theirs or THEIRS[name]
    try:
        expected = peer(*args, **kwargs)
    except Exception as exc:
        with pytest.raises(RenderError):
            (ours or OURS[name])(*args, **kwargs)
        assert str(exc) is not None
        return
    assert (ours or OURS[name])(*args, **kwargs) == expected


@FEW
@given(st.one_of(st.sampled_from(["yes", "No", "TRUE", "off", "On", "1", "0", "maybe", ""]), st.integers(-2, 3),
                 st.booleans(), st.none(), text))
def test_bool_is_ansibles_and_refuses_what_ansible_only_coerces_with_a_deprecation(value: Any) -> None:
    key = str(value).lower() if isinstance(value, (str, int)) else value
    if key in ansible_core._valid_bool_true | ansible_core._valid_bool_false:
        assert OURS["bool"](value) is ansible_core.to_bool(value)
    else:  # ansible-core 2.19 coerces it with a deprecation warning; 2.23 refuses it
        with pytest.raises(RenderError, match="bool: .* is not a boolean"):
            OURS["bool"](value)


@FEW
@given(values, values, values, st.one_of(st.none(), text))
def test_ternary(value: Any, yes: Any, no: Any, none: Any) -> None:
    same("ternary", value, yes, no, none)


@FEW
@given(text, st.sampled_from(["a", "(b+)", "^.", "[", "x*", r"(?P<n>\d)", "$"]),
       st.sampled_from(["", "X", r"<\1>", r"\g<n>", "\\"]), st.booleans(), st.integers(0, 2))
def test_regex_replace_search_and_escape(value: str, pattern: str, repl: str, ignorecase: bool, count: int) -> None:
    same("regex_replace", value, pattern, repl, ignorecase=ignorecase, count=count)
    same("regex_search", value, pattern, ignorecase=ignorecase)
    if "(" in pattern:
        same("regex_search", value, pattern, r"\1")
    same("regex_escape", value)
    same("regex_escape", value, "posix_basic")


@FEW
@given(values)
def test_json_and_yaml_round_trips(value: Any) -> None:
    for name in ("to_json", "to_nice_json", "to_yaml", "to_nice_yaml"):
        same(name, value)
    same("from_json", THEIRS["to_json"](value))
    same("from_yaml", THEIRS["to_yaml"](value))


@FEW
@given(st.lists(dicts, min_size=1, max_size=3), st.booleans(),
       st.sampled_from(["replace", "keep", "append", "prepend", "append_rp", "prepend_rp", "bogus"]))
def test_combine_recursive_and_list_merge(terms: list[dict[str, Any]], recursive: bool, list_merge: str) -> None:
    same("combine", *terms, recursive=recursive, list_merge=list_merge)
    same("combine", terms)


@FEW
@given(dicts, st.lists(st.dictionaries(st.sampled_from(["key", "value", "k"]), scalars, max_size=3), max_size=3))
def test_dict2items_and_items2dict(d: dict[str, Any], items: list[dict[str, Any]]) -> None:
    same("dict2items", d)
    same("dict2items", d, "k", "v")
    same("items2dict", items)
    same("items2dict", d)


@FEW
@given(st.lists(st.one_of(st.none(), st.sampled_from(["null", "None"]), st.integers(0, 3),
                          st.lists(st.one_of(st.integers(0, 3), st.none(), st.lists(st.integers(0, 3))))),
                max_size=4), st.one_of(st.none(), st.integers(0, 2)), st.booleans())
def test_flatten(value: list[Any], levels: int | None, skip_nulls: bool) -> None:
    same("flatten", value, levels=levels, skip_nulls=skip_nulls)


@FEW
@given(st.lists(st.integers(0, 4), max_size=6), st.lists(st.integers(0, 4), max_size=6))
def test_set_filters_hold_the_same_items_in_a_stable_order(a: list[int], b: list[int]) -> None:
    assert OURS["unique"](ENV, a) == THEIRS["unique"](ENV, a)
    for name in ("difference", "intersect", "union"):
        ours = OURS[name](a, b)
        assert sorted(ours) == sorted(THEIRS[name](ENV, a, b)) and len(set(ours)) == len(ours)
        assert ours == OURS[name](list(a), list(b))  # the same order every time, whatever the hash seed
    assert OURS["zip"](a, b) == list(THEIRS["zip"](a, b))


@FEW
@given(text, st.sampled_from(["sha1", "md5", "sha256", "blake2b", "shake_128", "nope"]), st.booleans())
def test_paths_base64_hash_and_quote(value: str, hashtype: str, urlsafe: bool) -> None:
    for name in ("basename", "dirname", "quote"):
        same(name, value)
    same("quote", None)
    same("b64encode", value, urlsafe=urlsafe)
    same("b64decode", THEIRS["b64encode"](value), urlsafe=False)
    same("b64decode", value)
    same("hash", value, hashtype)


@FEW
@given(st.sampled_from(["1.2", "1.10", "2.19.1", "1.2a1", "1.2b3", "1.0.post1", "10", "a"]),
       st.sampled_from(["1.2", "1.10", "2.9", "1.2a2", "3", ""]),
       st.sampled_from(["<", "lt", ">=", "==", "!=", "ne", "eq", "~"]), st.sampled_from([None, "loose", "strict"]))
def test_version_and_regex_tests(a: str, b: str, op: str, kind: str | None) -> None:
    same("version", a, b, op, version_type=kind, theirs=THEIR_TESTS["version"], ours=OUR_TESTS["version"])
    for name in ("match", "search"):
        same(name, a, r"\d\.", theirs=THEIR_TESTS[name], ours=OUR_TESTS[name])
    for name in ("failed", "succeeded", "changed", "skipped"):
        for result in ({"failed": True}, {"changed": 1}, {"results": [{"changed": True}]}, {}, a):
            same(name, result, theirs=THEIR_TESTS[name], ours=OUR_TESTS[name])


def test_ipaddr_family_gives_ansible_utils_documented_answers() -> None:
    # ansible.utils' ipaddr filter documentation, its test list and its queries.
    test_list = ["192.24.2.1", "host.fqdn", "::1", "192.168.32.0/24", "fe80::100/10", True, ""]
    assert OURS["ipaddr"](test_list) == ["192.24.2.1", "::1", "192.168.32.0/24", "fe80::100/10"]
    assert OURS["ipv4"](test_list) == ["192.24.2.1", "192.168.32.0/24"]
    assert OURS["ipv6"](test_list) == ["::1", "fe80::100/10"]
    assert OURS["ipwrap"](["192.24.2.1", "host.fqdn", "::1", "2001:db8::/32"]) == \
        ["192.24.2.1", "host.fqdn", "[::1]", "[2001:db8::]/32"]
    assert OURS["ipaddr"]("192.0.2.1/24", "address") == "192.0.2.1"
    assert OURS["ipaddr"]("192.0.2.0/24", "address") is False
    assert OURS["ipaddr"]("192.0.2.1/24", "network") == "192.0.2.0"
    assert OURS["ipaddr"]("192.0.2.1/24", "prefix") == 24
    assert OURS["ipaddr"]("192.0.2.1/24", "netmask") == "255.255.255.0"
    assert OURS["ipaddr"]("192.0.2.1/24", "broadcast") == "192.0.2.255"
    assert OURS["ipaddr"]("192.0.2.0/24", "net") == "192.0.2.0/24"
    assert OURS["ipaddr"]("not an address") is False
    with pytest.raises(RenderError, match="ipaddr: query 'wat' is not supported"):
        OURS["ipaddr"]("192.0.2.1", "wat")


def test_kollas_filters_and_password_hashes() -> None:
    # kolla-ansible's own unit tests (kolla_ansible/tests/unit/test_address_filters.py).
    assert put_address_in_context("10.0.0.1", "url") == "10.0.0.1"
    assert put_address_in_context("fd::1", "url") == "[fd::1]"
    assert put_address_in_context("fd::1", "memcache") == "inet6:[fd::1]"
    assert put_address_in_context("10.0.0.1", "rabbitmq") == "10,0,0,1"
    assert kolla_url("fd::1", "https", 443) == "https://[fd::1]"
    assert kolla_url("h", "http", "8080", "/v3") == "http://h:8080/v3"
    hashed = password_hash("s3cret", "bcrypt", salt="abcdefghijklmnopqrstuu")
    assert hashed.startswith("$2b$12$abcdefghijklmnopqrstuu") and bcrypt.checkpw(b"s3cret", hashed.encode())
    assert bcrypt_hash("pw", salt="prometheus") == bcrypt_hash("pw", salt="prometheus")
    assert bcrypt.checkpw(b"pw", bcrypt_hash("pw", salt="prometheus").encode())
    with pytest.raises(RenderError, match="needs a salt"):
        password_hash("s3cret", "bcrypt")


SERVICE = "runtime: {command: [x]}\nfiles: [{path: out, template: t.j2}]\n"
INVENTORY = ("vars: {debug: 'yes', base: {log: {level: info}, hosts: [a]}, extra: {log: {file: x}, hosts: [b]}}\n"
             "groups:\n  g: {services: [s]}\nnodes:\n  n1: {groups: [g]}\n")


def repo(dialect: str | None, template: str, **more: str) -> dict[str, str]:
    settings = "format: 1\nname: p\n" + (f"templates: {{dialect: {dialect}}}\n" if dialect else "")
    return {"reconciler.yaml": settings, "inventory.yaml": INVENTORY, "services/s/service.yaml": SERVICE,
            "services/s/templates/t.j2": template, **{f"services/s/templates/{k}": v for k, v in more.items()}}


def render(tmp_path: Path, key: SigningKey, files: dict[str, str]) -> tuple[int, str, Path]:
    dep = small_deployment(tmp_path, key, files)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "reconciler", "render", "--repo", str(dep.work), "--rev", "HEAD",
                           "--all", "--out", str(out)], capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr, out


def test_a_repo_that_opts_in_renders_an_ansible_template(tmp_path: Path, merge_key: SigningKey) -> None:
    template = ("debug = {{ debug | bool | ternary('on', 'off') }}\n"
                "{{ base | combine(extra, recursive=True, list_merge='append') | to_json }}\n"
                "host = {{ inventory_hostname }}\n{{ lookup('template', 'part.j2') }}")
    code, output, out = render(tmp_path, merge_key, repo("ansible", template, **{"part.j2": "part of {{ node }}"}))
    assert code == 0, output
    assert (out / "n1/s/out").read_text() == ('debug = on\n{"log": {"level": "info", "file": "x"}, '
                                              '"hosts": ["a", "b"]}\nhost = n1\npart of n1')


def test_without_the_opt_in_an_ansible_filter_is_still_an_error(tmp_path: Path, merge_key: SigningKey) -> None:
    code, output, _ = render(tmp_path, merge_key, repo(None, "{{ debug | bool }}"))
    assert code == 2 and "services/s/templates/t.j2:1: node n1: template syntax error: No filter named 'bool'" \
        in output, output


def test_a_template_compiled_for_one_dialect_is_not_reused_by_the_other(tmp_path: Path) -> None:
    # Same template path and text in both repos, in one process: the compiled code names the filters.
    rendered = []
    for dialect in ("ansible", None):
        root = tmp_path / str(dialect)
        for rel, content in repo(dialect, "{{ debug | bool }}").items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(content)
        try:
            rendered.append(render_node(load_repo(DirTree(root)), "n1", "x").services[0].files[0].content)
        except RenderError as exc:
            rendered.append(str(exc).encode())
    assert rendered == [b"True", b"services/s/templates/t.j2:1: node n1: template syntax error: No filter named 'bool'."]


@pytest.mark.parametrize(("call", "said"), [
    ("lookup('file', '/etc/passwd')", "lookup('file') is not available"),
    ("lookup('template', '../../x')", "template not found: ../../x (outside services/s/templates/)"),
    ("lookup('template', '/etc/passwd')", "template not found: /etc/passwd"),
    ("'x' | bool", "bool: 'x' is not a boolean"),
    ("'api' | kolla_address", "kolla_address: no interface for network 'api'"),
    # Each round doubles bcrypt's time in one C call (31: some 36 hours); an indent repeats on
    # every line (this one made 205 MB); the context's resolver holds secret-derived values.
    ("'pw' | password_hash('bcrypt', salt='abcdefghijklmnopqrstuu', rounds=15)",
     "password_hash: rounds must be between 4 and 14, got 15"),
    ("[[[[1]]]] | to_json(indent=5000000)", "to_json: indent must be between 0 and 16, got 5000000"),
    ("lookup('vars', ' resolver')", "lookup('vars'): ' resolver' is not a variable's name"),
])
def test_what_the_dialect_refuses_is_a_one_line_error(tmp_path: Path, merge_key: SigningKey, call: str,
                                                      said: str) -> None:
    code, output, _ = render(tmp_path, merge_key, repo("ansible", "line one\n{{ " + call + " }}\n"))
    assert code == 2 and "services/s/templates/t.j2:2: node n1, service s: " + said in output, output
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1, output


BOUNDED = """
import sys
from pathlib import Path
from reconciler.core.errors import RenderError
from reconciler.core.limits import Limits
from reconciler.render.node import render_node
from reconciler.repo.load import load_repo
from reconciler.repo.tree import DirTree
repo = load_repo(DirTree(Path(sys.argv[1])), Limits(render_seconds=float(sys.argv[2]), file_bytes=1 << 20))
try:
    print(render_node(repo, "n1", "x").services[0].files[0].content.decode())
except RenderError as exc:
    print(exc)
"""


def _bounded() -> None:
    # What only the render's budget can stop must fail this test, not take the machine: without
    # it, these ran for hours (in one C call, or a loop the sandbox cannot see) or took gigabytes.
    resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))
    resource.setrlimit(resource.RLIMIT_CPU, (30, 30))


def render_bounded(tmp_path: Path, template: str, seconds: float) -> str:
    """The node's render, in a process held to 1.5 GB and 30 s of CPU, with a render deadline of
    ``seconds`` and a value limit of 1 MiB (10 MiB printed by Python's JSON encoder is seconds
    of CI): the file it renders, or the error."""
    for rel, content in repo("ansible", template).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(content)
    proc = subprocess.run([sys.executable, "-c", BOUNDED, str(tmp_path), str(seconds)], capture_output=True,
                          text=True, preexec_fn=_bounded)
    return (proc.stdout + proc.stderr).strip()


# A list holding the one before it twice, 40 levels: a few objects, 2**40 ones once printed.
SHARED = "{% set ns = namespace(v=[1]) %}{% for _ in range(40) %}{% set ns.v = [ns.v, ns.v] %}{% endfor %}"
BIG = "{% set s = 'x' * 1000000 %}"  # just under the value limit, shared by 3000 items below
UNHASHABLE = "{% set a = range(100000) | batch(1) | list %}"  # 100,000 one-item lists


@pytest.mark.parametrize(("template", "seconds", "said"), [
    (SHARED + "\n{{ ns.v | to_json }}\n", 30, "a value larger than 1 MiB (render limit)"),
    (SHARED + "\n{{ ns.v | to_nice_json(indent=16) }}\n", 30, "a value larger than 1 MiB (render limit)"),
    (BIG + "\n{{ ([s] * 3000) | to_nice_yaml }}\n", 30, "a value larger than 1 MiB (render limit)"),
    (UNHASHABLE + "\n{{ a | intersect(a) | length }}\n", 1, "rendering took longer than 1 s (render limit)"),
    (UNHASHABLE + "\n{{ a | union(a) | unique | length }}\n", 1, "rendering took longer than 1 s (render limit)"),
    ("\n{{ 'pw' | password_hash('bcrypt', salt='abcdefghijklmnopqrstuu', rounds=31) }}\n", 30,
     "password_hash: rounds must be between 4 and 14, got 31"),
])
def test_a_filter_that_would_run_for_hours_or_build_gigabytes_is_stopped_at_a_render_limit(
        tmp_path: Path, template: str, seconds: float, said: str) -> None:
    assert render_bounded(tmp_path, template, seconds) == "services/s/templates/t.j2:2: node n1, service s: " + said


def test_set_filters_on_100000_hashable_items_render(tmp_path: Path) -> None:
    # Were 10**10 comparisons, minutes past the render's deadline.
    template = ("{% set a = range(100000) | map('string') | list %}{% set b = range(50000, 150000) | map('string') "
                "| list %}{{ a | intersect(b) | length }} {{ a | intersect(b) | first }} "
                "{{ a | difference(b) | length }} {{ a | union(b) | length }} {{ (a + a) | unique | length }}")
    assert render_bounded(tmp_path, template, 30) == "50000 50000 50000 150000 100000"


@FEW
@given(st.lists(st.one_of(st.integers(0, 3), st.lists(st.integers(0, 1), max_size=2)), max_size=6),
       st.lists(st.one_of(st.integers(0, 3), st.lists(st.integers(0, 1), max_size=2)), max_size=6))
def test_set_filters_on_unhashable_items_hold_ansibles_items(a: list[Any], b: list[Any]) -> None:
    assert OURS["unique"](ENV, a) == THEIRS["unique"](ENV, a)
    in_order = {"difference": first_seen(x for x in a if x not in b), "intersect": first_seen(x for x in a if x in b),
                "union": first_seen([*a, *b])}
    for name, expected in in_order.items():
        theirs = list(THEIRS[name](ENV, a, b))
        assert OURS[name](a, b) == expected and len(theirs) == len(expected) and all(x in theirs for x in expected)
        assert OURS[name](a, iter(b)) == expected  # Jinja's select() gives an iterator


def first_seen(items: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for x in items:
        if x not in out:
            out.append(x)
    return out


def test_password_hash_rounds_and_to_json_indent_within_their_bounds() -> None:
    assert password_hash("pw", "bcrypt", salt="abcdefghijklmnopqrstuu", rounds=4).startswith("$2b$04$")
    assert OURS["to_json"]([1], indent=16) == THEIRS["to_json"]([1], indent=16)
    refused: tuple[Any, ...] = (3, 15, True, "many")  # as a template may pass them
    for rounds in refused:
        with pytest.raises(RenderError, match="password_hash: rounds must be between 4 and 14"):
            password_hash("pw", "bcrypt", salt="abcdefghijklmnopqrstuu", rounds=rounds)
    with pytest.raises(RenderError, match="to_nice_json: indent must be between 0 and 16"):
        OURS["to_nice_json"]([1], indent=17)


def test_an_unknown_dialect_is_named_with_its_line(tmp_path: Path) -> None:
    files = repo("ansibel", "x")
    for rel, content in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(content)
    proc = subprocess.run([sys.executable, "-m", "reconciler", "validate", "--repo", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "reconciler.yaml:3: templates/dialect: 'ansibel' is not one of ['jinja', 'ansible']" in proc.stderr
