"""The two merges of a file's ``merge`` (``render.merge``), as kolla-ansible's action plugins
make them, so a repo imported from kolla renders the very bytes kolla writes. Pure.

- ``IniMerge``: kolla's ``merge_configs`` (its ``OverrideConfigParser`` over oslo.config's
  ``iniparser``): each file parsed line by line; a line that starts with a space or a tab
  continues the value above (a blank line ends it); ``#`` and ``;`` lines are comments and
  dropped; a value in matching quotes loses them; a key given twice in one file keeps both
  values, a key of a later file replaces the earlier file's. Written back as ``key = value``,
  sections in the order first seen, each followed by a blank line; keys before any section
  come first, without a header.
- ``yaml_merge``: kolla's ``merge_yaml``: each document a mapping (empty: none), merged
  recursively (a later value wins; a later list extends the earlier one with ``extend_lists``),
  dumped as kolla dumps it: ``yaml.dump`` with its default ``Dumper`` (keys sorted, block
  style; a ``!!omap`` or ``!!pairs`` entry written as ``!!python/tuple``, as kolla writes it).
  A document nested deeper than ``MAX_DEPTH`` is refused (the merge and the dump recurse).

Errors are ``MergeError`` with the line of the file being read, where there is one; they never
quote the file's text (an override may hold a password, and a quoted piece of one is a piece
the node's redactor no longer recognises).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

# kolla's name for the section of keys written before any section header.
ORPHAN = "TEMPORARY_ORPHAN_VARIABLE_SECTION"

MAX_DEPTH = 100  # mappings and lists in one YAML document, one inside the other
Values = list[list[str]]  # a key's values in one file: each a first line and its continuations


class MergeError(Exception):
    """Why a source would not merge: at ``line`` of its text, or (``yaml_merge``) the
    document at ``index``."""

    def __init__(self, message: str, line: int | None = None, index: int | None = None) -> None:
        super().__init__(message)
        self.line = line
        self.index = index


class IniMerge:
    """The files merged so far; ``add`` one more, ``text`` the result."""

    def __init__(self, tick: Callable[[], None] = lambda: None) -> None:
        self.sections: dict[str, dict[str, Values]] = {}
        self._tick = tick

    def add(self, text: str) -> None:
        """Parse ``text`` and merge it over what is there; ``MergeError`` at the first bad line
        (nothing of this file is merged then)."""
        found: dict[str, dict[str, Values]] = {}
        current: dict[str, Values] | None = None
        key: str | None = None
        value: list[str] = []

        def section(name: str) -> dict[str, Values]:
            # As kolla's new_section: a section seen again and still empty starts afresh.
            got = found.get(name)
            if not got:
                got = found[name] = {}
            return got

        def assign(k: str, v: list[str]) -> None:
            nonlocal current
            if current is None:
                current = section(ORPHAN)
            if len(v) == 1 and v[0] == "":
                v = []
            if not current.get(k):
                current[k] = [v]
            else:
                current[k].append(v)

        # kolla reads the text through StringIO: lines end at "\n" only.
        for number, raw in enumerate(text.split("\n"), 1):
            self._tick()
            line = raw.rstrip()
            if not line:
                if key:
                    assign(key, value)
                    key, value = None, []
                continue
            if line.startswith((" ", "\t")):
                if key is None:
                    raise MergeError("unexpected continuation line (it starts with a space or a tab, no key above it)",
                                     number)
                value.append(line.lstrip())
                continue
            if key:
                assign(key, value)
                key, value = None, []
            if line.startswith("["):
                if not line.endswith("]"):
                    raise MergeError("invalid section (must end with ])", number)
                if len(line) <= 2:
                    raise MergeError("empty section name", number)
                current = section(line[1:-1])
            elif line.startswith(("#", ";")):
                continue
            else:
                key, value = _key_value(line, number)
        if key:
            assign(key, value)
        for name, keys in found.items():
            target = self.sections.setdefault(name, {})
            target.update(keys)

    def text(self) -> str:
        out: list[str] = []
        for name, keys in self.sections.items():
            if name != ORPHAN:
                out.append(f"[{name}]\n")
            for key, values in keys.items():
                for v in values:
                    if not v:
                        out.append(f"{key} =\n")
                    for i, item in enumerate(v):
                        # Further lines under the first value, indented past "key = ".
                        out.append(f"{key} = {item}\n" if i == 0 else f"{' ' * (len(key) + 3)}{item}\n")
            out.append("\n")
        return "".join(out)


def _key_value(line: str, number: int) -> tuple[str, list[str]]:
    colon, equal = line.find(":"), line.find("=")
    if colon < 0 and equal < 0:
        raise MergeError("no ':' or '=' in the line", number)
    at = equal if colon < 0 or 0 <= equal < colon else colon
    key, value = line[:at].strip(), line[at + 1:].strip()
    if value and value[0] == value[-1] and value.startswith(('"', "'")):
        value = value[1:-1]
    if not key:
        raise MergeError("empty key before its ':' or '='", number)
    return key, [value]


def yaml_merge(docs: list[Any], extend_lists: bool, tick: Callable[[], None] = lambda: None) -> str:
    """``docs`` (each as ``yaml.safe_load`` gives it) merged in order and dumped; ``MergeError``
    (with the document's index) for one that is not a mapping, or a value kolla's merge cannot
    take."""
    output: dict[Any, Any] = {}
    for i, doc in enumerate(docs):
        doc = doc or {}
        if not isinstance(doc, dict):
            raise MergeError(f"a YAML {type(doc).__name__}, not a mapping", index=i)
        if _deeper(doc, MAX_DEPTH, tick):
            raise MergeError(f"nested deeper than {MAX_DEPTH} levels", index=i)
        try:
            _update(output, doc, extend_lists, tick)
        except (TypeError, AttributeError, IndexError, KeyError) as exc:
            raise MergeError(f"cannot merge it over the files before ({type(exc).__name__}: {exc})", index=i) from exc
    return yaml.dump(output, Dumper=yaml.Dumper, default_flow_style=False)  # kolla's: the values are safe_load's


def _deeper(doc: Any, limit: int, tick: Callable[[], None]) -> bool:
    """Whether ``doc`` nests mappings and lists more than ``limit`` deep (a document whose
    aliases make it hold itself is endless: deeper), walked without recursion."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > limit:
                return True
            tick()
            stack += [(v, depth + 1) for v in (value.values() if isinstance(value, dict) else value)]
    return False


def _update(conf: Any, update: Any, extend_lists: bool, tick: Callable[[], None]) -> Any:
    """kolla's ``update_nested_conf``, operation for operation: a later mapping is merged into
    the earlier value whatever that is (which fails for most), a list extended in place."""
    for k, v in update.items():
        tick()
        if isinstance(v, dict):
            conf[k] = _update(conf.get(k, {}), v, extend_lists, tick)
        elif k in conf and isinstance(conf[k], list) and extend_lists:
            if not isinstance(v, list):
                raise TypeError(f"key {k!r}: a list extends only with a list, not a {type(v).__name__}")
            conf[k].extend(v)
        else:
            conf[k] = v
    return conf
