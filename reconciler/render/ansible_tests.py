"""The tests of the Ansible template dialect (see ``ansible_dialect``): a task result's
(``failed``, ``succeeded``, ``changed``, ``skipped``, for results a repo's variables hold),
``match``/``search``/``regex``, and ``version`` with distutils' loose and strict versions,
which Ansible's test compares with (its ``semver`` and ``pep440`` kinds are an error here).
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable, Mapping, MutableSequence
from typing import Any

from reconciler.render.ansible_dialect import as_text, re_flags, refuse


def _result(name: str, result: Any) -> Mapping[str, Any]:
    if not isinstance(result, Mapping):
        raise refuse(name, f"the {name!r} test expects a dictionary (a task's result)")
    return result


def failed(result: Any) -> bool:
    return bool(_result("failed", result).get("failed"))


def succeeded(result: Any) -> bool:
    return not failed(result)


def changed(result: Any) -> bool:
    res = _result("changed", result)
    if "changed" in res:
        return bool(res["changed"])
    items = res.get("results")
    return isinstance(items, MutableSequence) and any(isinstance(r, Mapping) and r.get("changed") for r in items)


def skipped(result: Any) -> bool:
    return bool(_result("skipped", result).get("skipped"))


def regex(value: Any = "", pattern: str = "", ignorecase: bool = False, multiline: bool = False,
          match_type: str = "search") -> bool:
    compiled = re.compile(pattern, re_flags(ignorecase, multiline))
    how = getattr(compiled, match_type) if match_type in ("search", "match", "fullmatch") else compiled.search
    return bool(how(as_text(value)))


def _loose(text: str) -> list[int | str]:
    """distutils' LooseVersion, which Ansible's ``version`` test uses by default."""
    parts = [p for p in re.split(r"(\d+|[a-z]+|\.)", text) if p and p != "."]
    return [int(p) if p.isdigit() else p for p in parts]


_STRICT = re.compile(r"^(\d+)\.(\d+)(\.(\d+))?([ab](\d+))?$", re.ASCII)


def _strict(text: str) -> tuple[Any, ...]:
    m = _STRICT.match(text)
    if m is None:
        raise ValueError(f"invalid version number '{text}'")
    major, minor, patch, pre = int(m.group(1)), int(m.group(2)), int(m.group(4) or 0), m.group(5)
    # StrictVersion: a release sorts after its pre-releases
    return (major, minor, patch, (1,) if pre is None else (0, pre[0], int(m.group(6))))


_OPS = {"==": "eq", "=": "eq", "eq": "eq", "<": "lt", "lt": "lt", "<=": "le", "le": "le", ">": "gt", "gt": "gt",
        ">=": "ge", "ge": "ge", "!=": "ne", "<>": "ne", "ne": "ne"}


def version(value: Any, other: Any, op: str = "eq", strict: bool | None = None,
            version_type: str | None = None) -> bool:
    if not value:
        raise refuse("version", "input version value cannot be empty")
    if not other:
        raise refuse("version", "version parameter to compare against cannot be empty")
    kind = "strict" if strict else (version_type or "loose")
    parse: Callable[[str], Any] | None = {"loose": _loose, "strict": _strict}.get(kind)
    if parse is None:
        raise refuse("version", f"version type {kind!r} is not supported here (loose, strict)")
    if op not in _OPS:
        raise refuse("version", f"invalid operator {op!r}; one of {', '.join(map(repr, _OPS))}")
    try:
        a, b = parse(as_text(value)), parse(as_text(other))
        # As distutils' versions compare: equal, else ordered (a text part against a number: refused)
        return bool(getattr(operator, _OPS[op])(0 if a == b else -1 if a < b else 1, 0))
    except (TypeError, ValueError) as exc:
        raise refuse("version", f"version comparison failed: {exc}") from exc

TESTS: dict[str, Callable[..., bool]] = {
    "failed": failed, "failure": failed, "succeeded": succeeded, "success": succeeded, "successful": succeeded,
    "changed": changed, "change": changed, "skipped": skipped, "skip": skipped,
    "match": functools.partial(regex, match_type="match"), "search": functools.partial(regex, match_type="search"),
    "regex": regex, "version": version, "version_compare": version,
}
