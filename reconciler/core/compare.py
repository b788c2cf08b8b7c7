"""Which action a changed service needs: the least disruptive one that every changed domain
allows. Pure: file contents in, an action and its reason out.

A domain is a file, or a key inside an INI, YAML, JSON or TOML file (``section.key`` for INI,
a dotted path otherwise). Each changed domain takes the action of the first ``on_change`` rule
that matches it (file glob, and key globs if the rule names keys); a domain no rule explains
takes the service's safe default (restart). The service's action is the highest of them. A
file that is missing on one side or does not parse is one file-level domain: only a rule for
the whole file can make it less than the default.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from reconciler.core.errors import BadInput
from reconciler.core.inifile import has_header, ini_changes, ini_values
from reconciler.core.memo import ByIdentity
from reconciler.core.model import ActionKind, FileSpec, Rule, rank

DEFAULT = ActionKind.RESTART
FORMATS = {".ini": "ini", ".conf": "ini", ".cfg": "ini", ".yaml": "yaml", ".yml": "yaml",
           ".json": "json", ".toml": "toml"}


@dataclass(frozen=True)
class Domain:
    file: str
    key: str | None  # None: the whole file
    what: str  # changed | added | removed
    ini: bool = False

    @property
    def label(self) -> str:
        if self.key is None:
            return self.file
        if self.ini:
            section, _, option = self.key.partition(".")
            return f"[{section}] {option}"
        return self.key


def _format(path: str) -> str | None:
    dot = path.rfind(".")
    return FORMATS.get(path[dot:].lower()) if dot >= 0 else None


def _walk(value: Any, prefix: str, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _walk(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _walk(v, f"{prefix}.{i}" if prefix else str(i), out)
    else:
        out[prefix] = json.dumps(value, sort_keys=True, default=str)



def flatten(path: str, content: bytes) -> Mapping[str, object] | None:
    """Leaf values by key (compared, never shown), or None when the file is not a structured
    config or does not parse."""
    kind = _format(path)
    if kind is None:
        return None
    try:
        if kind == "ini":
            return ini_values(content.decode("utf-8"))
        import tomllib  # here: a no-op poll compares nothing (issue 40: what it needs only)

        from reconciler.core.yamlfile import safe_load
        # A rendered YAML file is loaded with the repo's bounds: ten lines of aliases must not
        # expand to gigabytes in the walk below.
        data = (safe_load(content, path) if kind == "yaml" else json.loads(content) if kind == "json"
                else tomllib.loads(content.decode("utf-8")))
    except (BadInput, UnicodeDecodeError, ValueError, RecursionError):
        return None
    out: dict[str, str] = {}
    _walk(data, "", out)
    return out


def domains(old: Iterable[FileSpec], new: Iterable[FileSpec]) -> list[Domain]:
    was, now = tuple(old), tuple(new)
    if len(was) == 1 and len(now) == 1 and was[0].path == now[0].path:
        # One file on both sides (most services): no tables to pair it (30,000 in a fleet diff).
        return _file_domains(was[0].path, was[0], now[0])
    before = {f.path: f for f in was}
    after = {f.path: f for f in now}
    out: list[Domain] = []
    for path in sorted(set(before) | set(after)):
        out += _file_domains(path, before.get(path), after.get(path))
    return out


def _file_domains(path: str, a: FileSpec | None, b: FileSpec | None) -> list[Domain]:
    if a is not None and b is not None and a.content == b.content:
        return [Domain(path, None, "mode changed")] if a.mode != b.mode else []
    if a is None or b is None:
        return [Domain(path, None, "added" if a is None else "removed")]
    keys = _changes(a, b)
    if keys is None:
        return [Domain(path, None, "changed")]
    if not keys:  # same keys and values: comments or layout only
        return [Domain(path, None, "changed (comments or layout only)")]
    ini = _format(path) == "ini" and has_header(b.content)
    return [Domain(path, key, what, ini) for key, what in keys]


def _changes(a: FileSpec, b: FileSpec) -> list[tuple[str, str]] | None:
    """(key, added | removed | changed) of each key whose values differ between two versions of
    a file, in key order; None when it is not a structured config or does not parse."""
    return _changes_as(_format(a.path), a, b)


def _changes_as(kind: str | None, a: FileSpec, b: FileSpec) -> list[tuple[str, str]] | None:
    """``_changes`` of a file whose format (``_format``) the caller has found."""
    if kind == "ini":
        la, lb = a.lines, b.lines
        if la is None or lb is None:
            return None  # not UTF-8
        same_shape = ini_changes(la, lb, keep=not (a.secret or b.secret))
        if same_shape is not None:
            return [(key, "changed") for key in same_shape]
    fa, fb = flatten(a.path, a.content), flatten(b.path, b.content)
    if fa is None or fb is None:
        return None
    return [(key, "added" if key not in fa else "removed" if key not in fb else "changed")
            for key in sorted(set(fa) | set(fb)) if fa.get(key) != fb.get(key)]


def action_for(domain: Domain, rules: Iterable[Rule], default: ActionKind = DEFAULT) -> tuple[ActionKind, bool]:
    """(action, whether a rule said so)."""
    for rule in rules:
        if not fnmatchcase(domain.file, rule.file):
            continue
        if not rule.keys:
            return rule.action, True
        if domain.key is not None and any(fnmatchcase(domain.key, k) for k in rule.keys):
            return rule.action, True
    return default, False


# What ``action_for`` says of a changed key, by (rules, file, key, default): a service's rules
# are one tuple on every node and its changed keys mostly the same ones, so a fleet diff
# matches each against the globs once.
_JUDGED: ByIdentity[tuple[ActionKind, bool]] = ByIdentity(1 << 14)


def _judged(domain: Domain, rules: tuple[Rule, ...], default: ActionKind) -> tuple[ActionKind, bool]:
    key = (id(rules), domain.file, domain.key, default)
    said = _JUDGED.get(key)
    return said if said is not None else _JUDGED.put(key, action_for(domain, rules, default), rules)


def decide(changed_parts: Iterable[str], old: Iterable[FileSpec], new: Iterable[FileSpec],
           rules: Iterable[Rule], default: ActionKind = DEFAULT) -> tuple[ActionKind, str]:
    """The action for a service whose ``changed_parts`` (runtime, networks, health, file) differ.
    ``default``: what a file change no rule explains needs (restart; reboot for host files)."""
    parts = frozenset(changed_parts)
    rules = tuple(rules)
    found = tuple(domains(old, new)) if "file" in parts else ()
    # A service's rules are one tuple on every node, and a change mostly changes the same keys of
    # its files on each: the action and its reason are worked out once per such change.
    key = (id(rules), found, default, parts)
    said = _DECIDED.get(key)
    return said if said is not None else _DECIDED.put(key, _decide(parts, found, rules, default), rules)


_DECIDED: ByIdentity[tuple[ActionKind, str]] = ByIdentity(1 << 12)
_FILE_DECIDED: ByIdentity[tuple[ActionKind, str]] = ByIdentity(1 << 12)
_PARTS = frozenset({"file"})


def file_decision(a: FileSpec, b: FileSpec, rules: tuple[Rule, ...],
                  default: ActionKind = DEFAULT) -> tuple[ActionKind, str]:
    """``decide({"file"}, (a,), (b,), rules, default)`` for one file at one path at both sides,
    kept per (rules, path, changed keys): a change alike on every node is judged once."""
    kind = _format(b.path)
    if a.content == b.content or not (keys := _changes_as(kind, a, b)):  # its mode, the whole file, comments only
        return decide(_PARTS, (a,), (b,), rules, default)
    key = (id(rules), b.path, tuple(keys), kind == "ini" and has_header(b.content), id(default))
    said = _FILE_DECIDED.get(key)
    return said if said is not None else _FILE_DECIDED.put(key, decide(_PARTS, (a,), (b,), rules, default), rules)


def _decide(parts: frozenset[str], found: tuple[Domain, ...], rules: tuple[Rule, ...],
            default: ActionKind) -> tuple[ActionKind, str]:
    judged: list[tuple[Domain, ActionKind, bool]] = []
    if "file" in parts:
        judged = [(d, *_judged(d, rules, default)) for d in found]
    if "runtime" in parts:
        files = ", ".join(f"{d.label} {d.what}" + (f" in {d.file}" if d.key else "") for d, _, _ in judged)
        return ActionKind.RECREATE, "runtime changed (image, command, ports...)" + (f"; {files}" if files else "")
    kinds = [k for _, k, _ in judged]
    if "health" in parts:
        kinds.append(ActionKind.RESTART)
    if "file" in parts and not judged:
        # The record says the files changed but they already match (a run stopped between
        # writing them and restarting): the program may not have read them yet.
        return ActionKind.RESTART, "files already written by an interrupted run; restart to load them"
    if not kinds:
        return ActionKind.CONNECT, "networks changed"
    final = max(kinds, key=rank)
    return final, _reason(judged, final, "health" in parts, default)


def _reason(judged: list[tuple[Domain, ActionKind, bool]], final: ActionKind, health: bool,
            default: ActionKind = DEFAULT) -> str:
    texts = []
    for d, kind, by_rule in judged:
        text = f"{d.label} {d.what}" + (f" in {d.file}" if d.key is not None else "")
        if not by_rule:
            text += f" (no rule: {default})"
        elif kind is not final and len(judged) > 1:
            text += f" ({kind})"
        texts.append(text)
    if health:
        texts.append("health check changed")
    if len(texts) == 1:
        return "only " + texts[0]
    return ", ".join(texts)

