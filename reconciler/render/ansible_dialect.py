"""Ansible's template dialect, for a repo that opts in (``reconciler.yaml``:
``templates: {dialect: ansible}``): the filters and tests of ansible-core that templates written
for Ansible use, with Ansible's semantics (``tests/test_ansible_dialect.py`` holds them to
ansible-core's own plugins), inside the same sandbox and limits as every template.

Where this differs from ansible-core, on purpose:

- ``bool`` refuses a value Ansible only coerces with a deprecation warning (``'maybe'``, ``2``):
  Ansible 2.23 refuses it too, and a typo in a flag should not silently read as false;
- ``difference``/``intersect``/``union`` keep the order of their inputs (Ansible's come in the
  order of a Python set, which changes from one process to the next for strings): the same
  commit must render the same bytes on every run;
- ``zip`` returns a list (a template can print or loop it), not Python's one-shot iterator.

The ``ipaddr`` family, kolla's filters, ``password_hash`` and ``lookup`` are in
``ansible_extras``, the tests (``version``, ``match``...) in ``ansible_tests``. A filter's
bad input is a ``RenderError`` naming the filter; the renderer
adds the template, line, node and service.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import posixpath
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jinja2
import jinja2.filters
import yaml

from reconciler.core.errors import BadInput, RenderError
from reconciler.core.limits import LIMITS
from reconciler.core.yamlfile import safe_load
from reconciler.render.bounded import BoundedText, Members, Pace

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def refuse(name: str, why: str) -> RenderError:
    return RenderError(f"{name}: {why}")


def as_text(value: Any) -> str:
    """Ansible's ``to_text(value, nonstring='simplerepr')``: a string as it is, else ``str()``."""
    return value if isinstance(value, str) else str(value)


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else as_text(value).encode("utf-8", "surrogateescape")


def to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    key = str(value).lower() if isinstance(value, (str, int)) else None
    if key in _TRUE:
        return True
    if key in _FALSE:
        return False
    raise refuse("bool", f"{value!r} is not a boolean (yes/no, true/false, on/off, 1/0)")


def ternary(value: Any, true_val: Any, false_val: Any, none_val: Any = None) -> Any:
    if value is None and none_val is not None:
        return none_val
    return true_val if value else false_val


def re_flags(ignorecase: bool, multiline: bool) -> int:
    return (re.I if ignorecase else 0) | (re.M if multiline else 0)


def regex_replace(value: Any = "", pattern: str = "", replacement: str = "", ignorecase: bool = False,
                  multiline: bool = False, count: int = 0, mandatory_count: int = 0) -> str:
    text = as_text(value)
    out, subs = re.compile(pattern, re_flags(ignorecase, multiline)).subn(replacement, text, count=count)
    if mandatory_count and mandatory_count != subs:
        raise refuse("regex_replace", f"{pattern!r} should match {mandatory_count} times, but matches {subs} times")
    return out


def regex_search(value: Any, regex: str, *args: str, ignorecase: bool = False, multiline: bool = False) -> Any:
    groups: list[str | int] = []
    for arg in args:
        named = re.match(r"\\g<(\S+)>", arg)
        numbered = re.match(r"\\(\d+)", arg)
        if named:
            groups.append(named.group(1))
        elif numbered:
            groups.append(int(numbered.group(1)))
        else:
            raise refuse("regex_search", f"unknown argument {arg!r} (a group: '\\\\1' or '\\\\g<name>')")
    match = re.search(regex, as_text(value), re_flags(ignorecase, multiline))
    if match is None:
        return None
    return [match.group(g) for g in groups] if groups else match.group()


def regex_escape(value: Any, re_type: str = "python") -> str:
    text = as_text(value)
    if re_type == "python":
        return re.escape(text)
    if re_type == "posix_basic":
        return re.sub(r"([].[^$*\\])", r"\\\1", text)
    raise refuse("regex_escape", f"regex type {re_type!r} is not supported (python, posix_basic)")


_JSON_OPTIONS = frozenset({"indent", "sort_keys", "separators", "ensure_ascii", "skipkeys", "allow_nan"})
_MAX_INDENT = 16


def _indent(name: str, indent: Any) -> None:
    # An indent is repeated on every line, once per level: 5,000,000 made 205 MB of four ones.
    ok = indent is None or (isinstance(indent, int) and not isinstance(indent, bool) and 0 <= indent <= _MAX_INDENT) \
        or (isinstance(indent, str) and len(indent) <= _MAX_INDENT)
    if not ok:
        raise refuse(name, f"indent must be between 0 and {_MAX_INDENT}, got {indent!r}")


def to_json(value: Any, **kwargs: Any) -> str:
    unknown = set(kwargs) - _JSON_OPTIONS
    if unknown:  # json.dumps's ``cls`` or ``default`` would run what a template hands them
        raise refuse("to_json", f"unknown option {sorted(unknown)[0]!r}")
    _indent("to_json", kwargs.get("indent"))
    out = BoundedText()
    # The same text as json.dumps, a chunk at a time (json.dumps builds it all in one C call).
    for chunk in json.JSONEncoder(**kwargs).iterencode(value):
        out.write(chunk)
    return out.text()


def to_nice_json(value: Any, indent: int = 4, sort_keys: bool = True, **kwargs: Any) -> str:
    kwargs.pop("separators", None)
    _indent("to_nice_json", indent)
    return to_json(value, indent=indent, sort_keys=sort_keys, separators=(",", ": "), **kwargs)


_YAML_OPTIONS = frozenset({"indent", "width", "sort_keys", "explicit_start", "explicit_end", "canonical",
                           "line_break", "allow_unicode"})


# Ansible's: libyaml's where there is one (it writes a lone scalar without the "..." end marker).
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def to_yaml(value: Any, *_args: Any, default_flow_style: bool | None = None, **kwargs: Any) -> str:
    unknown = set(kwargs) - _YAML_OPTIONS
    if unknown:
        raise refuse("to_yaml", f"unknown option {sorted(unknown)[0]!r}")
    kwargs.setdefault("allow_unicode", True)
    out = BoundedText()  # shared lists and mappings are anchors, but a shared string is printed each time
    try:
        yaml.dump(value, out, Dumper=_DUMPER, default_flow_style=default_flow_style, **kwargs)
    except yaml.representer.RepresenterError as exc:
        raise refuse("to_yaml", f"cannot represent {type(value).__name__} values") from exc
    return out.text()


def to_nice_yaml(value: Any, indent: int = 4, *_args: Any, default_flow_style: bool = False, **kwargs: Any) -> str:
    return to_yaml(value, indent=indent, default_flow_style=default_flow_style, **kwargs)


def from_json(value: Any) -> Any:
    return json.loads(value)


def from_yaml(value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, str):
        raise refuse("from_yaml", f"needs a string, got {type(value).__name__}")
    try:  # bounded like the repo's own YAML: no alias bomb through a template
        return safe_load(value.encode("utf-8", "surrogateescape"), "from_yaml", LIMITS.yaml_nodes)
    except BadInput as exc:
        raise refuse("from_yaml", str(exc).removeprefix("from_yaml: ")) from exc


_LIST_MERGE = ("replace", "keep", "append", "prepend", "append_rp", "prepend_rp")


def _merge(low: Mapping[Any, Any], high: Mapping[Any, Any], recursive: bool, list_merge: str) -> dict[Any, Any]:
    """Ansible's ``merge_hash``: ``high``'s keys over ``low``'s, neither modified."""
    if not low or low == high:  # Ansible's shortcuts, which skip list_merge: equal lists stay single
        return dict(high)
    if not high:
        return dict(low)
    out = dict(low)
    for key, new in high.items():
        old = out.get(key)
        if key not in out:
            out[key] = new
        elif isinstance(old, Mapping) and isinstance(new, Mapping):
            out[key] = _merge(old, new, recursive, list_merge) if recursive else new
        elif isinstance(old, list) and isinstance(new, list):
            out[key] = {"replace": new, "keep": old, "append": old + new, "prepend": new + old,
                        "append_rp": [x for x in old if x not in new] + new,
                        "prepend_rp": new + [x for x in old if x not in new]}[list_merge]
        else:
            out[key] = new
    return out


def combine(*terms: Any, recursive: bool = False, list_merge: str = "replace") -> Any:
    dicts = flatten(terms, levels=1)
    if len(dicts) <= 1:
        return dicts[0] if dicts else {}
    if list_merge not in _LIST_MERGE:
        raise refuse("combine", f"list_merge must be one of {', '.join(_LIST_MERGE)}")
    for d in dicts:
        if not isinstance(d, Mapping):
            raise refuse("combine", f"needs dictionaries, got {type(d).__name__}")
    # Merged from the right, as Ansible does: with list_merge the grouping shows in the result.
    result: Mapping[Any, Any] = dicts[-1]
    for d in reversed(dicts[:-1]):
        result = _merge(d, result, recursive, list_merge)
    return result


def dict2items(value: Any, key_name: str = "key", value_name: str = "value") -> list[dict[str, Any]]:
    if not isinstance(value, Mapping):
        raise refuse("dict2items", f"needs a dictionary, got {type(value).__name__}")
    return [{key_name: k, value_name: v} for k, v in value.items()]


def items2dict(value: Any, key_name: str = "key", value_name: str = "value") -> dict[Any, Any]:
    if not _is_sequence(value):
        raise refuse("items2dict", f"needs a list, got {type(value).__name__}")
    try:
        return {item[key_name]: item[value_name] for item in value}
    except (KeyError, TypeError) as exc:
        raise refuse("items2dict", f"needs a list of dictionaries with the keys {key_name!r} and "
                     f"{value_name!r}") from exc


def _is_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def flatten(value: Any, levels: int | None = None, skip_nulls: bool = True) -> list[Any]:
    out: list[Any] = []
    for item in value:
        if skip_nulls and item in (None, "None", "null"):
            continue
        if _is_sequence(item) and (levels is None or levels >= 1):
            out.extend(flatten(item, None if levels is None else int(levels) - 1, skip_nulls))
        else:
            out.append(item)
    return out


def _unique(items: Iterable[Any]) -> list[Any]:
    """The items, each once, in the order first seen."""
    items = list(items)
    try:
        return list(dict.fromkeys(items))  # a dict keeps the first of equal keys, as the loop does
    except TypeError:
        pass
    pace = Pace()
    out: list[Any] = []
    for x in items:
        pace.step(len(out))
        if x not in out:
            out.append(x)
    return out


@jinja2.pass_environment
def unique(env: jinja2.Environment, value: Any, case_sensitive: bool | None = None,
           attribute: str | int | None = None) -> list[Any]:
    try:  # Ansible's own asks Jinja's first, and falls back to a loop for unhashable items
        return list(jinja2.filters.do_unique(env, value, case_sensitive=bool(case_sensitive), attribute=attribute))
    except TypeError:
        if case_sensitive is False or attribute:
            raise refuse("unique", "case_sensitive=false and attribute need hashable items") from None
        return _unique(value)


def difference(a: Any, b: Any) -> list[Any]:
    members = Members(b)
    return _unique(x for x in a if x not in members)


def intersect(a: Any, b: Any) -> list[Any]:
    members = Members(b)
    return _unique(x for x in a if x in members)


def union(a: Any, b: Any) -> list[Any]:
    return _unique([*a, *b])


def zip_(*lists: Any) -> list[tuple[Any, ...]]:
    return list(zip(*lists, strict=False))  # Ansible's: as long as the shortest


def basename(path: Any) -> str:
    return posixpath.basename(as_text(path))


def dirname(path: Any) -> str:
    return posixpath.dirname(as_text(path))


def b64encode(value: Any, encoding: str = "utf-8", urlsafe: bool = False) -> str:
    raw = as_text(value).encode(encoding, "surrogateescape")
    return (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(raw).decode("ascii")


def b64decode(value: Any, encoding: str = "utf-8", urlsafe: bool = False) -> str:
    raw = (base64.urlsafe_b64decode if urlsafe else base64.b64decode)(_bytes(value))
    return raw.decode(encoding, "surrogateescape")


def get_hash(data: Any, hashtype: str = "sha1") -> str:
    try:
        h = hashlib.new(hashtype)
    except ValueError as exc:
        raise refuse("hash", f"unsupported hash type {hashtype!r}") from exc
    h.update(_bytes(data))
    return h.hexdigest()  # a shake's needs a length: a TypeError, refused by ``_named``


def mandatory(value: Any, msg: str | None = None) -> Any:
    if isinstance(value, jinja2.Undefined):
        name = value._undefined_name
        raise RenderError(str(msg) if msg is not None else
                          f"Mandatory variable {repr(name) + ' ' if name else ''}not defined.")
    return value


def quote(value: Any) -> str:
    return shlex.quote("" if value is None else as_text(value))


def _named(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """A mistake in a filter's input is the filter's own error, not Python's."""
    @functools.wraps(func)  # keeps jinja_pass_arg
    def named(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except RenderError:
            raise
        except jinja2.UndefinedError:
            raise
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, LookupError, re.error,
                binascii.Error, yaml.YAMLError, RecursionError) as exc:
            raise refuse(name, f"{type(exc).__name__}: {exc}") from exc

    return named


FILTERS: dict[str, Callable[..., Any]] = {
    "bool": to_bool, "ternary": ternary, "regex_replace": regex_replace, "regex_search": regex_search,
    "regex_escape": regex_escape, "to_json": to_json, "to_nice_json": to_nice_json, "to_yaml": to_yaml,
    "to_nice_yaml": to_nice_yaml, "from_json": from_json, "from_yaml": from_yaml, "combine": combine,
    "dict2items": dict2items, "items2dict": items2dict, "zip": zip_, "basename": basename, "dirname": dirname,
    "b64encode": b64encode, "b64decode": b64decode, "hash": get_hash, "mandatory": mandatory, "quote": quote,
    "flatten": flatten, "unique": unique, "difference": difference, "intersect": intersect, "union": union,
}

def named_filters(filters: Mapping[str, Callable[..., Any]], prefix: str | None) -> dict[str, Callable[..., Any]]:
    """Each filter (or test) under its name and its fully qualified one (``ansible.builtin.bool``)."""
    wrapped = {name: _named(name, f) for name, f in filters.items()}
    return {**wrapped, **({f"{prefix}.{name}": f for name, f in wrapped.items()} if prefix else {})}
