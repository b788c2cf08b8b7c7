"""The review's file diffs: correct unified diffs (they patch the old file into the new one), the
same as difflib's wherever the files differ at both ends, and accepted by GNU patch."""

from __future__ import annotations

import difflib
import re
import subprocess
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.review.linediff import _ends, _grouped, _opcodes, unified

# Few distinct lines, so files repeat lines and share runs: the cases where a diff can go wrong.
LINES = st.lists(st.sampled_from(["a\n", "b\n", "c\n", "\n", "[x]\n", "k = 1\n"]), max_size=30)
HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@\n")


def patched(old: list[str], diff: str) -> list[str]:
    """``old`` with the hunks of ``diff`` applied, checking every context and removed line."""
    lines = diff.splitlines(keepends=True)
    assert lines[0].startswith("--- ") and lines[1].startswith("+++ ")
    out: list[str] = []
    at = 0  # next line of old not yet copied
    i = 2
    while i < len(lines):
        m = HUNK.fullmatch(lines[i])
        assert m, lines[i]
        start, length = int(m.group(1)), int(m.group(2) or 1)
        first = start - 1 if length else start  # an empty range names the line before it
        assert first >= at, "hunks out of order"
        out += old[at:first]
        at = first
        i += 1
        while i < len(lines) and not lines[i].startswith("@@ "):
            sign, text = lines[i][0], lines[i][1:]
            if sign in " -":
                assert old[at] == text, f"line {at + 1}: {old[at]!r} is not {text!r}"
                at += 1
            if sign in " +":
                out.append(text)
            i += 1
    return out + old[at:]


@settings(max_examples=400, deadline=None)
@given(LINES, LINES)
def test_a_diff_patches_the_old_file_into_the_new_one(old: list[str], new: list[str]) -> None:
    diff = unified(old, new, "a/f", "b/f")
    if old == new:
        assert diff == ""
    else:
        assert patched(old, diff) == new


@settings(max_examples=400, deadline=None)
@given(LINES, LINES)
def test_files_that_differ_at_both_ends_diff_exactly_as_difflib(old: list[str], new: list[str]) -> None:
    if old and new and old[0] != new[0] and old[-1] != new[-1]:
        assert unified(old, new, "a/f", "b/f") == "".join(difflib.unified_diff(old, new, "a/f", "b/f"))


def test_one_changed_line_in_a_long_file_is_one_hunk_with_three_lines_of_context() -> None:
    old = [f"line {i}\n" for i in range(40)]
    new = old[:20] + ["line twenty\n"] + old[21:]
    assert unified(old, new, "a/f", "b/f") == "".join([
        "--- a/f\n", "+++ b/f\n", "@@ -18,7 +18,7 @@\n",
        " line 17\n", " line 18\n", " line 19\n", "-line 20\n", "+line twenty\n",
        " line 21\n", " line 22\n", " line 23\n"])


def test_gnu_patch_applies_it(tmp_path: Path) -> None:
    old = [f"option{i} = {i}\n" for i in range(30)]
    new = old[:2] + ["added = 1\n"] + old[2:14] + old[16:27] + ["option27 = changed\n"] + old[28:]
    (tmp_path / "f").write_text("".join(old))
    (tmp_path / "f.diff").write_text(unified(old, new, "a/f", "b/f"))
    subprocess.run(["patch", "-p1", "--quiet", "-i", "f.diff"], cwd=tmp_path, check=True)
    assert (tmp_path / "f").read_text() == "".join(new)


def test_a_file_added_or_removed_diffs_exactly_as_difflib() -> None:
    lines = ["a\n", "b\n"]
    for old, new in (([], lines), (lines, [])):
        assert unified(old, new, "a/f", "b/f") == "".join(difflib.unified_diff(old, new, "a/f", "b/f"))
    assert "@@ -0,0 +1,2 @@" in unified([], lines, "a/f", "b/f")


@settings(max_examples=400, deadline=None)
@given(LINES, LINES, LINES, st.integers(0, 4))
def test_one_changed_region_is_the_hunk_the_general_grouping_makes(head: list[str], tail: list[str], middle: list[str],
                                                                   context: int) -> None:
    old, new = head + middle + tail, head + [f"new {line}" for line in middle[: len(middle) // 2]] + tail
    ends = _ends(old, new)
    assert unified(old, new, "a/f", "b/f", context) == _grouped(old, new, "a/f", "b/f", context,
                                                                _opcodes(old, new, ends))
