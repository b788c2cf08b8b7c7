"""A file's ``merge`` (service.yaml): the override files of the repo merged over its rendered
template, as kolla-ansible merges ``/etc/kolla/config`` into its role templates (see
``render.merge`` for the merge itself).

A path of ``from`` is repo-relative and may hold variables (``kolla-config/nova/{{
inventory_hostname }}/nova.conf``), rendered per node, one path part at a time. The repo is
hostile input, so a path stays in it: no absolute path, no ``..`` or ``.`` part, written or
rendered, and no part that renders with a ``/``. The files a path may name are read here, at
load, from the ``Tree`` (which never follows a symlink: one on the way is an error naming it):
each templated part matches the names of its directory by the part's literal text, so the
render reads only what the loader read, and never the disk.

Bounds, since this runs at load, before any render budget: at most ``MAX_SOURCES`` paths in a
``from``, at most ``MAX_BLOCKS`` templated blocks in a part, a part matched against a name in
linear time (``part_matches``, never a backtracking regex), each directory listed and each file
read once per service however many paths name it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from reconciler.core.errors import BadInput
from reconciler.core.limits import Limits
from reconciler.core.yamlfile import Problem
from reconciler.repo.definitions import Merge
from reconciler.repo.tree import Tree

_OPEN = ("{{", "{%", "{#")
_CLOSE = ("}}", "%}", "#}")
_BLOCK = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", re.S)
MAX_SOURCES = 16  # kolla's longest merge names 5; the schema's maxItems says the same
MAX_BLOCKS = 4  # templated blocks in one path part (kolla's have one: {{ inventory_hostname }})


def path_parts(text: str) -> list[str]:
    """``text`` split at each ``/`` outside a ``{{ }}``, ``{% %}`` or ``{# #}`` (a filter's
    argument may hold one)."""
    parts: list[str] = []
    cur: list[str] = []
    depth, i = 0, 0
    while i < len(text):
        two = text[i:i + 2]
        if two in _OPEN or (depth and two in _CLOSE):
            depth += 1 if two in _OPEN else -1
            cur.append(two)
            i += 2
            continue
        if text[i] == "/" and not depth:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(text[i])
        i += 1
    parts.append("".join(cur))
    return parts


def templated(part: str) -> bool:
    return any(o in part for o in _OPEN)


def bad_part(part: str) -> str | None:
    """Why a path part (as written, or as rendered) cannot name a file in the repo."""
    if part in ("", ".", ".."):
        return "an empty, '.' or '..' part" if part != ".." else "a '..' part (outside the repo)"
    if "/" in part or "\\" in part or "\0" in part:
        return f"a part {part!r} with a '/', '\\' or NUL"
    if part == ".git":  # a work tree's own git directory (its config may hold a remote's token)
        return "a '.git' part"
    return None


def part_matches(part: str, name: str) -> bool:
    """Whether a templated part may render to ``name``: its literal text around anything, as a
    glob of ``*`` only, matched left to right, each literal piece at its first place after the
    one before (the earliest place leaves the most room for the rest, so no other needs trying):
    linear in the name. With whitespace control (``{{-``) the literal text next to it may go
    too: any name."""
    if any(m in part for m in ("{{-", "-}}", "{%-", "-%}")):
        return True
    pieces, at = [], 0
    for m in _BLOCK.finditer(part):
        pieces.append(part[at:m.start()])
        at = m.end()
    pieces.append(part[at:])
    if len(pieces) == 1:
        return name == pieces[0]
    head, tail = pieces[0], pieces[-1]
    if len(name) < len(head) + len(tail) or not name.startswith(head) or not name.endswith(tail):
        return False
    at, end = len(head), len(name) - len(tail)
    for piece in pieces[1:-1]:
        found = name.find(piece, at, end)
        if found < 0:
            return False
        at = found + len(piece)
    return True


def parse_merge(spec: Mapping[str, Any], where: str) -> Merge | str:
    """The entry's ``merge`` (the schema checked its shape), or why it is wrong. ``where``: the
    entry, for the message."""
    fmt, first = str(spec.get("format", "")), bool(spec.get("first_found", False))
    if first == bool(fmt):
        return (f"{where}: merge: give `format` (ini or yaml) to merge the files over the template, or "
                "`first_found: true` to take the first file found instead of it, not both")
    if spec.get("extend_lists") and fmt != "yaml":
        return f"{where}: merge: extend_lists is for format: yaml"
    sources = tuple(str(s) for s in spec["from"])
    if len(sources) > MAX_SOURCES:
        return f"{where}: merge: more than {MAX_SOURCES} paths in `from` ({len(sources)})"
    for text in sources:
        parts = path_parts(text)
        if text.startswith("/"):
            return f"{where}: merge: {text!r} is absolute: a path of the repo is relative to its top"
        if any(len(_BLOCK.findall(p)) > MAX_BLOCKS for p in parts):
            return f"{where}: merge: {text!r} has a part with more than {MAX_BLOCKS} templated blocks"
        wrong = next((w for p in parts if not templated(p) and (w := bad_part(p))), None)
        if wrong:
            return f"{where}: merge: {text!r} has {wrong}"
    return Merge(fmt, sources, first, bool(spec.get("extend_lists", False)))


def load_merge(tree: Tree, f: Mapping[str, Any], i: int, tpl: str | None, templates: dict[str, str], limits: Limits,
               file: str, line: int | None, problems: list[Problem]) -> Merge | None:
    """The ``merge`` of files entry ``f`` (number ``i``, at ``file``:``line``); the files it may
    read join the service's ``templates``, so the render finds them by their repo path and never
    reads the disk."""
    if "merge" not in f:
        return None
    merge = parse_merge(f["merge"], f"files/{i}")
    if isinstance(merge, str) or tpl is None:
        problems.append(Problem(file, line, merge if isinstance(merge, str) else
                                f"files/{i}: merge: only a file rendered from a template merges overrides"))
        return None
    read_overrides(tree, merge, limits, file, line, problems, templates)
    return merge


def read_overrides(tree: Tree, merge: Merge, limits: Limits, file: str, line: int | None,
                   problems: list[Problem], out: dict[str, str]) -> None:
    """Every file of the repo a path of ``merge`` may name on some node, into ``out`` (repo path
    -> text; a path already there is not read again). A file not there is none (a missing
    override is skipped at render); one that cannot be read (a symlink on the way, too large,
    not UTF-8) is a problem naming it."""
    listed: dict[str, list[str] | None] = {}
    seen: set[str] = set()
    for text in dict.fromkeys(merge.sources):  # the same path twice is read once
        parts = path_parts(text)
        dirs = [""]
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            found: list[str] = []
            for d in dirs:
                if not templated(part):
                    found.append(f"{d}{part}")
                    continue
                names = _listdir(tree, d, listed, file, line, problems)
                found += [f"{d}{n}" for n in names or () if part_matches(part, n) and bad_part(n) is None]
            dirs = found if last else [f"{d}/" for d in found]
        for path in dirs:
            if path in out or path in seen:
                continue
            seen.add(path)
            body = _read(tree, path, limits, problems, exact=not any(templated(p) for p in parts))
            if body is not None:
                out[path] = body


def _listdir(tree: Tree, d: str, listed: dict[str, list[str] | None], file: str, line: int | None,
             problems: list[Problem]) -> list[str] | None:
    """The names in directory ``d`` (``""``: the top), listed once per merge."""
    if d in listed:
        return listed[d]
    listed[d] = None
    try:
        listed[d] = tree.listdir(d.rstrip("/") or ".")
    except BadInput as exc:  # a symlinked directory: refused, named
        where = exc.file or d
        problems.append(Problem(where, exc.line, f"{str(exc).removeprefix(f'{where}: ')} "
                                f"(a directory the merge of {file}:{line or '?'} reads)"))
    return listed[d]


def _read(tree: Tree, path: str, limits: Limits, problems: list[Problem], exact: bool) -> str | None:
    """The override's text; None when nothing is there, or a directory a templated part matched."""
    try:
        raw = tree.read(path, limits.file_bytes)
    except FileNotFoundError:
        return None
    except BadInput as exc:
        if not exact and exc.file == path and str(exc).endswith("a directory, not a file"):
            return None
        where = exc.file or path
        problems.append(Problem(where, exc.line, f"{str(exc).removeprefix(f'{where}: ')} (a file a merge names)"))
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        problems.append(Problem(path, None, "not UTF-8 text (a file a merge names)"))
        return None
