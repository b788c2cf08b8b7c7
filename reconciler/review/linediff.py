"""Unified diffs of rendered files, quick for the usual case: a few changed lines in a file that
is otherwise the same.

``difflib.unified_diff`` indexes every line of the new file and searches the whole of both for
matching blocks: most of a fleet diff's printing time, for files whose first and last lines
match. Like git's xdiff, this takes the lines both files start and end with as they are, and
asks difflib only about the lines between. The hunks are a correct diff of the two files (the
test applies them); where a changed region could be matched more than one way they may pair
lines differently from difflib's own choice over the whole files.

A header names its path as git does (``quoted``): in double quotes with C escapes when the path
holds a control character, a line break, a quote or a backslash, so it stays one line.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence
from operator import ne

Opcode = tuple[str, int, int, int, int]


def visible(text: str) -> str:
    """``text`` on one line: each character that prints as nothing or moves the cursor (a line
    break, a tab, an escape, a right-to-left override) shown as its escape."""
    return text if text.isprintable() else "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def quoted(path: str) -> str:
    """A path in a diff header as git writes it: as it is, or quoted with its escapes."""
    if path.isprintable() and '"' not in path and "\\" not in path:
        return path
    return '"' + visible(path.replace("\\", "\\\\").replace('"', '\\"')) + '"'


def _ends(a: Sequence[str], b: Sequence[str]) -> tuple[int, int, int]:
    """How many lines both files start with, and where the lines both end with start in each."""
    if len(a) == len(b):  # most changes: lines rewritten in place; each pair compared in C, once
        differ = list(map(ne, a, b))
        if True not in differ:
            return len(a), len(a), len(b)
        head = differ.index(True)
        differ.reverse()
        tail = differ.index(True)
        return head, len(a) - tail, len(b) - tail
    head, limit = 0, min(len(a), len(b))
    while head < limit and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < limit - head and a[len(a) - 1 - tail] == b[len(b) - 1 - tail]:
        tail += 1
    return head, len(a) - tail, len(b) - tail


def _opcodes(a: Sequence[str], b: Sequence[str], ends: tuple[int, int, int]) -> list[Opcode]:
    head, a_end, b_end = ends
    codes: list[Opcode] = [("equal", 0, head, 0, head)] if head else []
    if head < a_end and head < b_end:
        old, new = a[head:a_end], b[head:b_end]
        if set(old).isdisjoint(new):  # nothing to match (one line for another, often): one replace
            codes.append(("replace", head, a_end, head, b_end))
        else:
            middle = difflib.SequenceMatcher(None, old, new)
            codes += [(tag, i1 + head, i2 + head, j1 + head, j2 + head) for tag, i1, i2, j1, j2 in middle.get_opcodes()]
    elif head < a_end:
        codes.append(("delete", head, a_end, head, head))
    elif head < b_end:
        codes.append(("insert", head, head, head, b_end))
    if a_end < len(a):
        codes.append(("equal", a_end, len(a), b_end, len(b)))
    return codes


def _hunks(codes: list[Opcode], n: int) -> Iterator[list[Opcode]]:
    """The opcodes in groups of changes with at most ``n`` lines of context around each, the
    grouping a unified diff prints (as ``SequenceMatcher.get_grouped_opcodes``)."""
    if not codes or all(tag == "equal" for tag, *_ in codes):
        return
    codes = list(codes)
    tag, i1, i2, j1, j2 = codes[0]
    if tag == "equal":  # only the last n lines of the leading context
        codes[0] = tag, max(i1, i2 - n), i2, max(j1, j2 - n), j2
    tag, i1, i2, j1, j2 = codes[-1]
    if tag == "equal":  # only the first n lines of the trailing context
        codes[-1] = tag, i1, min(i2, i1 + n), j1, min(j2, j1 + n)
    group: list[Opcode] = []
    for tag, i1, i2, j1, j2 in codes:
        if tag == "equal" and i2 - i1 > 2 * n:  # a long equal run splits two hunks
            group.append((tag, i1, min(i2, i1 + n), j1, min(j2, j1 + n)))
            yield group
            group = []
            i1, j1 = max(i1, i2 - n), max(j1, j2 - n)
        group.append((tag, i1, i2, j1, j2))
    if group and not (len(group) == 1 and group[0][0] == "equal"):
        yield group


def _span(start: int, stop: int) -> str:
    """A hunk's range as unified diffs write it: 1-based start, and the length unless it is 1;
    an empty range names the line before it."""
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start + 1 if length else start},{length}"


def unified(a: Sequence[str], b: Sequence[str], fromfile: str, tofile: str, n: int = 3) -> str:
    """The unified diff of two files' lines (each with its line end), "" when they are the same."""
    ends = head, a_end, b_end = _ends(a, b)
    if head == a_end and head == b_end:
        return ""
    old, new = a[head:a_end], b[head:b_end]
    if not old or not new or set(old).isdisjoint(new):
        # One changed region (most of a fleet's rendered changes): one hunk, its context the n
        # lines on either side, as the general case below would group it.
        start, stop_a, stop_b = max(0, head - n), min(len(a), a_end + n), min(len(b), b_end + n)
        # Each run of lines as one join: its mark before the first line and between each two.
        return "".join([f"--- {fromfile}\n", f"+++ {tofile}\n",
                        f"@@ -{_span(start, stop_a)} +{_span(start, stop_b)} @@\n",
                        " " + " ".join(a[start:head]) if head > start else "",
                        "-" + "-".join(old) if old else "", "+" + "+".join(new) if new else "",
                        " " + " ".join(a[a_end:stop_a]) if stop_a > a_end else ""])
    return _grouped(a, b, fromfile, tofile, n, _opcodes(a, b, ends))


def _grouped(a: Sequence[str], b: Sequence[str], fromfile: str, tofile: str, n: int, codes: list[Opcode]) -> str:
    out: list[str] = []
    for group in _hunks(codes, n):
        if not out:
            out += [f"--- {fromfile}\n", f"+++ {tofile}\n"]
        first, last = group[0], group[-1]
        out.append(f"@@ -{_span(first[1], last[2])} +{_span(first[3], last[4])} @@\n")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += [" " + line for line in a[i1:i2]]
                continue
            out += ["-" + line for line in a[i1:i2]]
            out += ["+" + line for line in b[j1:j2]]
    return "".join(out)
