"""How an INI-like file reads, line by line, the way oslo.config reads it: its values by key,
and which keys differ between two renders of one file. Pure: text in, keys and values out
(``core.compare`` decides actions from them)."""

from __future__ import annotations

import re
from collections.abc import Sequence

TOP = "\0top"  # the section of an INI-like file that has none

# A "[" that only whitespace separates from the start of the text or of a line (every line
# boundary ``str.splitlines`` knows is itself whitespace): one search, not a loop over lines.
_HEADER = re.compile(r"(?:\A|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029])\s*\[")


def has_header(content: bytes) -> bool:
    """Whether a line of the file starts with "[" (after whitespace): a sectioned INI file,
    whose keys print as "[section] key"."""
    # Most such files open with their first header: known from their first bytes, no decode
    # (bytes.lstrip strips only ASCII whitespace, each of which "\s" matches).
    if content[:256].lstrip()[:1] == b"[":
        return True
    return _HEADER.search(content.decode(errors="replace")) is not None


def _indent(line: str, first: str) -> int:
    """How far ``line`` is indented: a line is indented exactly when its first character is not
    ``first``, its first non-blank one."""
    return len(line) - len(line.lstrip()) if line[0] != first else 0


def _section(stripped: str) -> str | None:
    """The section a header line opens (None: not a header)."""
    return stripped[1:stripped.rindex("]")].strip() if stripped[0] == "[" and "]" in stripped else None


def _option(stripped: str) -> tuple[str, str] | None:
    """(name, value) of an option line: the first "=" or ":" ends the name (a ":" is looked for
    only before the "="). None: not an option."""
    eq = stripped.find("=")
    cut = stripped.find(":", 0, eq) if eq >= 0 else stripped.find(":")
    if cut < 0:
        cut = eq
    name = stripped[:cut].rstrip()
    return (name, stripped[cut + 1:].lstrip()) if cut >= 0 and name else None


_BLANK, _COMMENT, _SECTION, _OPTION, _OTHER = "blank", "comment", "section", "option", "other"


# How the INI parser reads one line on its own (whether it continues a value depends on the
# lines before it: its indent against the key's): (kind: one of the five above, _OTHER being
# not INI unless a continuation; indent; word: a section's key prefix, "section." or "" for TOP,
# or an option's name; value: an option's value; text: the line stripped, what a continuation
# adds to its key's value). A plain tuple: read for every line of a fleet diff.
_Line = tuple[str, int, str, str, str]


def _read(line: str) -> _Line:
    stripped = line.strip()
    if not stripped:
        return _BLANK, 0, "", "", ""
    first = stripped[0]
    if first == "#" or first == ";":
        return _COMMENT, 0, "", "", stripped
    indent = _indent(line, first)
    section = _section(stripped)
    if section is not None:
        return _SECTION, indent, "" if section == TOP else f"{section}.", "", stripped
    option = _option(stripped)
    if option is None:
        return _OTHER, indent, "", "", stripped
    return _OPTION, indent, option[0], option[1], stripped


# A line's text -> how it reads: the lines a template renders alike on every node are read
# once in a fleet diff.
_READ: dict[str, _Line] = {}


def _reading(line: str) -> _Line:
    return _kept(_READ, line, _read(line))


_LONGEST_KEPT = 512


def _kept(table: dict[str, _Line], line: str, seen: _Line) -> _Line:
    # A long line (a certificate, a key, a blob on one line) is a node's own: kept, a review or a
    # daemon would hold a copy of each, three times over, until the table starts over.
    if len(line) <= _LONGEST_KEPT:
        if len(table) >= 1 << 15:
            table.clear()
        table[line] = seen
    return seen


def _name_read(line: str) -> _Line:
    """A line both files have, read for its kind, indent and name: as its text up to its "=" or
    ":" (when it opens no section) reads. No node's own value ("port = 1003") is read or kept
    here (``_moves`` keeps the line, not its reading)."""
    cut = line.find("=") + 1 or line.find(":") + 1
    name = line[:cut] if cut and line[:cut].lstrip()[:1] != "[" else line  # not the whole line copied
    return _READ.get(name) or _reading(name)


# A line both files have -> how it moves the parser (``_name_read``): the lines a template
# renders alike on every node ("debug = False", "workers = 4"), and a node's own line on each of
# its services ("host = node0001"), are read by name once, not once a file.
_MOVES: dict[str, _Line] = {}


def _moves(line: str) -> _Line:
    return _kept(_MOVES, line, _name_read(line))


def ini_values(text: str) -> dict[str, tuple[str, ...]]:
    """``section.key`` -> every value it has, in order, the way oslo.config reads a
    file: a key may repeat (multi-valued options such as ``transport_url``) and so may a section
    (``[filter:x]`` blocks), so nothing is collapsed into its last occurrence. Lines indented
    below a key continue its value; ``#`` and ``;`` start comment lines; a file with no section
    header (sysctl.d, env files) has bare keys. Raises ValueError for a line that is none of these.
    """
    values: dict[str, list[str]] = {}
    prefix, key, key_indent = "", "", 0  # prefix: "section." ("" before any section header)
    for line in text.splitlines():
        kind, indent, word, value, stripped = _read(line)
        if kind == _BLANK:
            key = ""  # a blank line ends a value
        elif kind == _COMMENT:
            continue
        elif key and indent > key_indent:
            values[key][-1] += "\n" + stripped
        elif kind == _SECTION:
            key, prefix = "", word
        elif kind == _OPTION:
            key, key_indent = prefix + word, indent
            kept = values.get(key)
            if kept is None:
                values[key] = [value]
            else:
                kept.append(value)
        else:
            raise ValueError(f"not an option: {stripped!r}")
    return {k: tuple(v) for k, v in values.items()}


def ini_changes(la: Sequence[str], lb: Sequence[str], keep: bool = True) -> list[str] | None:
    """The keys whose values differ between two INI files of the same shape, read in one pass
    for both: line for line, each pair of differing lines is the same kind of line for the
    parser (an option of the same name at the same indent, a continuation, a comment, a blank,
    the same section), so both files have the same keys and only those lines' values differ.
    None when the shapes differ, or a line is not INI: then each file is parsed whole (``ini_values``).
    A one-value change to a rendered config, most of a fleet diff's, is half the parsing.

    A key's values are built from the same lines in both files, each value from an option line
    and its continuations (none of which holds a line break), so they differ exactly when one of
    those lines reads differently: an equal line only moves the parser along. ``la``, ``lb``:
    the files' lines, with their line ends or without (a line that differs only there reads the
    same). ``keep``: False for a file that holds a secret, none of whose lines (or their values)
    stay in the tables after the call (a daemon or a review bot lives long)."""
    if len(la) != len(lb):
        return None
    changed: set[str] = set()
    # The parser's place: the section's key prefix, and the option a line indented below
    # ``indent`` continues ("" after a header or a blank line: none). Its key is made only
    # when one of its values changed.
    prefix, option, indent = "", "", 0
    read, moves = _READ.get, _MOVES.get
    reading, moving = (_reading, _moves) if keep else (_read, _read)  # what is read afresh is kept, or not
    for a, b in zip(la, lb, strict=True):
        if a == b:  # most lines: read once per text (``_MOVES``), moving the parser along
            # A long line is not looked for (never kept): not hashed (a group's member list, a key).
            kind, at, word, _, _ = (moves(a) if len(a) <= _LONGEST_KEPT else None) or moving(a)
            if kind is _OPTION:  # most of them
                if not option or at <= indent:  # else it continues the option's value
                    option, indent = word, at
            elif kind is _BLANK:
                option = ""  # a blank line ends a value
            elif kind is _COMMENT or (option and at > indent):
                continue
            elif kind is _SECTION:
                option, prefix = "", word
            else:
                return None  # not an option: ``ini_values`` says which file does not parse
            continue
        # Kept too: a line a change rewrites alike on every node ("region = RegionTwo") is read
        # once in a fleet diff; one that is this node's own costs a table entry until it starts over.
        kind, at, word, value, text = read(a) or reading(a)
        other_kind, other_at, other_word, other_value, other_text = read(b) or reading(b)
        if kind is _BLANK or kind is _COMMENT or other_kind is _BLANK or other_kind is _COMMENT:
            if kind is not other_kind:
                return None  # a blank line (the end of a value) or a comment against a line that is not
            if kind is _BLANK:
                option = ""
            continue
        more, other_more = bool(option) and at > indent, bool(option) and other_at > indent
        if more != other_more:
            return None  # a continuation against a line that is not
        if more:
            if text != other_text:
                changed.add(prefix + option)
        elif kind is not other_kind or kind is _OTHER or word != other_word:
            return None  # another section, another option, or a line that is not INI
        elif kind is _SECTION:
            option, prefix = "", word
        elif at != other_at:
            return None  # the same option at another indent: what continues it differs
        else:
            option, indent = word, at
            if value != other_value:
                changed.add(prefix + word)
    return sorted(changed)
