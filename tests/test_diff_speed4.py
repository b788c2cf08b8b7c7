"""Issue 40, a diff with every service changed near plain Jinja2: the quick paths a fleet diff
takes for most files (a service's action worked out without the planner, its text split at
"\\n", its diff printed a run of lines at a time) say exactly what the careful paths say, on a
fleet whose files are the same on every node and on one whose files are each node's own."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from test_diff_speedups import fleet

from reconciler.core.compare import decide, file_decision
from reconciler.core.inifile import _name_read, _read, ini_changes, ini_values
from reconciler.core.model import FileSpec, Rule
from reconciler.core.model.desired import ActionKind
from reconciler.plan.planner import plan
from reconciler.render.node import render_node
from reconciler.review.applied import as_applied
from reconciler.review.diff import diff_repos
from reconciler.review.linediff import _ends as ends_found
from reconciler.review.linediff import _grouped, _opcodes, unified

SERVICES = {
    # name: (on_change rules, template at A, template at B)
    "reload": ("[{file: s.conf, keys: [DEFAULT.level], action: reload}]",
               "[DEFAULT]\nhost = {{ node }}\nlevel = 1\n", "[DEFAULT]\nhost = {{ node }}\nlevel = 2\n"),
    "quiet": ("[{file: s.conf, keys: [DEFAULT.note], action: none}]",
              "[DEFAULT]\nnote = a\nport = {{ port }}\n", "[DEFAULT]\nnote = b\nport = {{ port }}\n"),
    "comment": ("[]", "[DEFAULT]\nport = {{ port }}\n", "# said\n[DEFAULT]\nport = {{ port }}\n"),
    "restart": ("[{file: s.conf, keys: [DEFAULT.level], action: reload}]",
                "[api]\nworkers = {{ port }}\n  more\n", "[api]\nworkers = {{ port }}\n  less\n"),
    "broken": ("[]", "[DEFAULT]\nx = {{ port }}\n", "[DEFAULT]\nnot an option {{ port }}\n"),
    "alike": ("[{file: s.conf, action: reload}]", "[DEFAULT]\nregion = one\n", "[DEFAULT]\nregion = two\n"),
    "same": ("[]", "[DEFAULT]\nport = {{ port }}\n", "[DEFAULT]\nport = {{ port }}\n"),
    "shaped": ("[]", "[DEFAULT]\nport = {{ port }}\n", "[DEFAULT]\n[more]\nport = {{ port }}\n"),
}


def files(at: int, own: bool) -> dict[str, str]:
    """A fleet of six nodes in two groups at commit ``at`` (0: A, 1: B); ``own``: each node's
    files hold its own values (the bench's), else every node renders the same bytes."""
    out = {"reconciler.yaml": "format: 1\nname: fleet\n",
           "inventory.yaml": f"groups:\n  one: {{services: [{', '.join(SERVICES)}]}}\n"
                             f"  two: {{services: [{', '.join(sorted(SERVICES))}]}}\nnodes:\n"
                             + "".join(f"  n{i}: {{groups: [{'one' if i % 2 else 'two'}], vars: {{port: {i}}}}}\n"
                                       for i in range(6))}
    for name, (rules, *templates) in SERVICES.items():
        text = templates[at] if own else templates[at].replace("{{ node }}", "n").replace("{{ port }}", "7")
        out[f"services/{name}/service.yaml"] = (f"runtime: {{command: [{name}]}}\n"
                                                "files: [{path: s.conf, template: s.conf.j2}]\n"
                                                f"on_change: {rules}\n")
        out[f"services/{name}/templates/s.conf.j2"] = text
    return out


@pytest.mark.parametrize("own", [True, False], ids=["each node its own files", "files alike on every node"])
def test_every_node_of_a_shape_plans_as_the_planner_plans_against_a_hashed(tmp_path: Path, own: bool) -> None:
    """A node whose shape was planned before has its rendered services' actions worked out
    without the planner (``review.applied``): each node's plan is the planner's against A's
    own hashes, whatever the change (a rule's reload or none, comments only, a file that stops
    parsing, a value continued on the next line, another shape), and the first node's too."""
    ra, rb = fleet(tmp_path / "a", files(0, own)), fleet(tmp_path / "b", files(1, own))
    diffs = diff_repos(ra, "a" * 40, rb, "b" * 40, jobs=1, every_service=True)
    for d in diffs:
        da, db = render_node(ra, d.node, "a" * 40), render_node(rb, d.node, "b" * 40)
        assert d.plan.to_dict() == plan(db, as_applied(da)).to_dict(), d.node
    kinds = {(a.service, str(a.kind), a.reason) for d in diffs for a in d.plan.actions}
    assert ("quiet", "none", "only [DEFAULT] note changed in s.conf: files updated, nothing restarted") in kinds
    assert ("reload", "reload", "only [DEFAULT] level changed in s.conf") in kinds
    assert ("broken", "restart", "only s.conf changed (no rule: restart)") in kinds
    assert ("same", "none", f"unchanged since {'a' * 12}") in kinds
    assert diffs == diff_repos(ra, "a" * 40, rb, "b" * 40, jobs=1)  # stand-ins for the unchanged


RULES = (Rule("*.conf", ActionKind.RELOAD, ("a.*",)),)
PAIRS = [
    (b"a.b = 1\n", b"a.b = 2\n"),  # no section: the key reads "a.b"
    (b"[a]\nb = 1\n", b"[a]\nb = 2\n"),  # the same key in a section: "[a] b"
    (b" [a]\r\nb = 1\r\n", b" [a]\r\nb = 3\r\n"),
    (b"\xc2\x85[a]\nb = 1\n", b"\xc2\x85[a]\nb = 2\n"),  # a header after a break only Unicode knows
    (b"x = 1\n", b"x = 2\n"), (b"x = 1\n", b"x = 1\n# note\n"), (b"x = 1\n", b"not INI\n"),
]


@pytest.mark.parametrize("default", [ActionKind.RESTART, ActionKind.REBOOT])
def test_a_file_change_judged_once_per_keys_says_what_decide_says(default: ActionKind) -> None:
    """``core.compare.file_decision`` keeps what ``decide`` says of a file's changed keys, for
    the next node with the same change: a key of the same name with a section and without
    one, another default, comments only or a file that stops parsing each get their own."""
    for path in ("s.conf", "s.txt"):
        for _ in range(2):  # the second time from what was kept
            for old, new in PAIRS:
                a, b = FileSpec(path, 0o644, old), FileSpec(path, 0o600 if old == new else 0o644, new)
                assert file_decision(a, b, RULES, default) == decide({"file"}, (a,), (b,), RULES, default), (old, new)


LINES = ["[DEFAULT]", "[api]", " [ api ]", "[x = 1]", "[a]:b", "a = 1", "a = 2", "a=2", "a: 1", "b = x: y", "b : c = d",
         "  a = 1", "\ta = 3", "  more", "  more = 2", "", "  ", "# c = 1", "; c", "not an option", "=x", " : y",
         "k = [v]", "a = " + "x" * 600, "\u00a0a = 1", "a =", ":"]


def test_a_line_both_files_have_reads_as_its_name_does() -> None:
    """A line the two versions of an INI file share moves the parser by its kind, indent and
    name, read off its text up to its "=" or ":" (``core.inifile._name_read``): as the whole
    line reads, for sections, options, continuations, comments and lines that are not INI."""
    for line in LINES:
        for end in ("", "\n", "\r\n"):
            assert _name_read(line + end)[:3] == _read(line + end)[:3], line


@pytest.mark.parametrize("seed", range(3))
def test_the_keys_an_ini_change_changes_are_the_keys_whose_values_differ(seed: int) -> None:
    """Two versions of an INI file, line for line: the changed keys found in one pass (the lines
    both have read by their names) are those whose values differ when each file is parsed whole."""
    rng = random.Random(seed)
    for _ in range(3000):
        la = [rng.choice(LINES) + "\n" for _ in range(rng.randint(0, 8))]
        lb = [rng.choice(LINES) + "\n" if rng.random() < 0.3 else line for line in la]
        found = ini_changes(la, lb)
        try:
            va, vb = ini_values("".join(la)), ini_values("".join(lb))
        except ValueError:
            continue  # not INI: the whole file is the change
        if found is not None:
            assert found == sorted(k for k in set(va) | set(vb) if va.get(k) != vb.get(k)), (la, lb)


def _ends(a: list[str], b: list[str]) -> tuple[int, int, int]:
    """The lines both files start and end with, counted one by one."""
    head, limit = 0, min(len(a), len(b))
    while head < limit and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < limit - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    return head, len(a) - tail, len(b) - tail


def test_the_lines_both_files_start_and_end_with_are_found_as_counted_one_by_one() -> None:
    """Found for two files of one length (lines rewritten in place, most changes) by comparing
    every pair at once; otherwise one by one from each end."""
    rng = random.Random(7)
    words = ["a\n", "b\n", "a", "\n", "port = 1\n"]
    for _ in range(5000):
        a = [rng.choice(words) for _ in range(rng.randint(0, 10))]
        b = [rng.choice(words) if rng.random() < 0.3 else line for line in a] if rng.random() < 0.7 else \
            [rng.choice(words) for _ in range(rng.randint(0, 10))]
        assert ends_found(a, b) == _ends(a, b), (a, b)


def test_one_changed_region_printed_a_run_at_a_time_is_the_general_grouping() -> None:
    """A change that rewrites one region (most of a fleet's) prints each run of lines (context,
    lines removed, lines added) in one join: the hunk is the general path's, a last line
    without its line end and a file added or emptied alike."""
    rng = random.Random(5)
    words = ["a\n", "b\n", "c\n", "d\n", "e", "port = 1\n", "port = 2\n"]
    for _ in range(5000):
        a = [rng.choice(words) for _ in range(rng.randint(0, 12))]
        b = [rng.choice(words) if rng.random() < 0.2 else line for line in a]
        if rng.random() < 0.2:
            a, b = (a, []) if rng.random() < 0.5 else (b[:rng.randint(0, len(b))], a)
        ends = _ends(a, b)
        expected = "" if a == b else _grouped(a, b, "a/f", "b/f", 3, _opcodes(a, b, ends))
        assert unified(a, b, "a/f", "b/f") == expected, (a, b)
