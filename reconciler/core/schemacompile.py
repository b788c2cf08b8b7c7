"""``schemacheck.valid``, with each schema compiled once into closures.

A 10,000-node inventory is 90,000 values, and ``schemacheck`` walks the schema's keywords by
name for every one of them (most of its check's 0.16 s: issue 40's ``status --fleet``). Here
each keyword is compiled once into the branch of ``schemacheck._valid`` it stands for, in the
schema's order and stopping where that stops, so a check says False, or raises ``_Unknown``
(anything ``schemacheck`` leaves to jsonschema), exactly where ``_valid`` would: the verdict is
``schemacheck.valid``'s (tests/test_load_speed.py holds them together). A keyword whose argument
has a shape the repo's schemas do not give it, or that is rare and cheap, is ``_valid``'s own
branch, called as it is. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from reconciler.core.schemacheck import _ANNOTATIONS, _JSON, _equal, _object, _Unknown, _valid

Check = Callable[[Any], bool]
_COMPILED: dict[int, tuple[dict[str, Any], Check]] = {}
_TYPES: dict[str, Check] = {
    "object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": lambda v: not isinstance(v, bool) and isinstance(v, int | float),
    "integer": lambda v: not isinstance(v, bool) and (
        isinstance(v, int) or (isinstance(v, float) and v.is_integer())),
}
_OBJECT = ("properties", "patternProperties", "additionalProperties", "required", "propertyNames", "minProperties")


def valid(instance: Any, schema: dict[str, Any]) -> bool:
    """``schemacheck.valid(instance, schema)``, by the schema compiled."""
    try:
        return compiled(schema)(instance)
    except (_Unknown, re.error, RecursionError):
        return False


def compiled(schema: dict[str, Any]) -> Check:
    """``schema`` as one function of the instance, compiled at its first use (the repo's
    schemas are cached for the process, so each is compiled once)."""
    found = _COMPILED.get(id(schema))
    if found is None or found[0] is not schema:
        if len(_COMPILED) > 32:
            _COMPILED.clear()  # schemas made on the fly (tests): kept alive here, so bounded
        found = _COMPILED[id(schema)] = (schema, _Compiler(schema).of(schema))
    return found[1]


def _raise(_: Any = None) -> bool:
    raise _Unknown


class _Compiler:
    def __init__(self, root: dict[str, Any]) -> None:
        self.root: dict[str, Any] = root
        self.refs: dict[str, Check] = {}
        self.open: set[str] = set()

    def of(self, schema: Any) -> Check:
        if schema is True:
            return lambda v: True
        if schema is False:
            return lambda v: False
        if not isinstance(schema, dict):
            return _raise
        if [k for k in schema if k not in _ANNOTATIONS] == ["type", "pattern"] and schema["type"] == "string" \
                and isinstance(schema["pattern"], str):
            return _string_matching(schema["pattern"])  # a name: the commonest schema of all
        checks = []
        first_object = True
        for key, arg in schema.items():
            if key in _ANNOTATIONS:
                continue
            check = self._keyword(key, arg, schema)
            if check is None:
                check = self._careful(key, arg, schema)
            elif key in _OBJECT:
                check = _on_objects(check, first_object)
                first_object = False
            checks.append(check)
        return _all_of(tuple(checks))

    def _careful(self, key: str, arg: Any, schema: dict[str, Any]) -> Check:
        """``_valid``'s branch for this keyword alone (an object keyword reads its siblings)."""
        root = self.root
        if key in _OBJECT:
            return lambda v: not isinstance(v, dict) or _object(key, v, schema, root)
        alone = {key: arg}
        return lambda v: _valid(v, alone, root)

    def _keyword(self, key: str, arg: Any, schema: dict[str, Any]) -> Check | None:  # noqa: C901 - one keyword a branch, as _valid
        if key == "type":
            names = [arg] if isinstance(arg, str) else arg
            return _type(names) if isinstance(names, list) and all(isinstance(n, str) for n in names) else None
        if key == "enum":
            return _enum(arg) if isinstance(arg, list) else None
        if key == "const":
            return lambda v: _equal(v, arg)
        if key == "$ref":
            return self._ref(arg)
        if key in ("oneOf", "anyOf"):
            return self._some(arg, key == "oneOf") if isinstance(arg, list) else None
        if key == "not":
            sub = self.of(arg)
            return lambda v: not sub(v)
        if key in _OBJECT:
            return self._object(key, arg, schema)
        if key in ("items", "minItems", "uniqueItems"):
            return _on(list, self._array(key, arg))
        if key == "pattern":
            return _on(str, _searcher(arg)) if isinstance(arg, str) else None
        if key in ("minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            return None  # rare in the repo's schemas, and cheap: the careful branch
        return _raise  # a keyword schemacheck does not know: jsonschema's to judge

    def _ref(self, arg: Any) -> Check:
        if not isinstance(arg, str) or not arg.startswith("#/$defs/") or "/" in arg[8:] or "~" in arg:
            return _raise
        name, refs, root = arg[8:], self.refs, self.root
        defs = root.get("$defs")
        if name in refs:
            return refs[name]
        if isinstance(defs, dict) and name in defs and name not in self.open:
            self.open.add(name)  # a definition that refers to itself meets the lazy ref below
            refs[name] = self.of(defs[name])
            return refs[name]

        def ref(v: Any) -> bool:
            target = refs.get(name)
            if target is None:  # compiled at its first use: a definition may refer to itself
                target = refs[name] = self.of(root.get("$defs", {})[name])
            return target(v)

        return ref

    def _some(self, arg: list[Any], one: bool) -> Check:
        subs = tuple(self.of(s) for s in arg)

        def some(v: Any) -> bool:
            passed = sum(1 for s in subs if s(v))  # each one asked, as _valid asks them
            return not (passed == 0 or (one and passed > 1))

        return some

    def _object(self, key: str, arg: Any, schema: dict[str, Any]) -> Check | None:
        props, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
        if not isinstance(props, dict) or not isinstance(patterns, dict) or key == "minProperties":
            return None
        if key == "required":
            return (lambda v: all(k in v for k in arg)) if isinstance(arg, list) else None
        if key == "propertyNames":
            sub = self.of(arg)
            return lambda v: all(sub(k) for k in v)
        if key == "properties":
            pairs = tuple((k, self.of(s)) for k, s in props.items())
            return lambda v: all(s(v[k]) for k, s in pairs if k in v)
        matchers = tuple((_searcher(p), self.of(s)) for p, s in patterns.items())
        if key == "patternProperties":
            return lambda v: all(s(x) for m, s in matchers for k, x in v.items() if m(k))
        known, rest = frozenset(props), self.of(arg)
        if matchers:
            return lambda v: all(rest(x) for k, x in v.items() if k not in known and not any(m(k) for m, _ in matchers))
        if arg is False:  # the common case: no key beyond the properties
            return lambda v: all(k in known for k in v)
        return lambda v: all(rest(x) for k, x in v.items() if k not in known)

    def _array(self, key: str, arg: Any) -> Check:
        if key == "items":
            if isinstance(arg, list):
                return _raise  # an older draft's tuple form
            sub = self.of(arg)
            return lambda v: all(sub(x) for x in v)
        if key == "minItems":
            return lambda v: bool(len(v) >= arg)
        return _unique if arg else lambda v: True


def _all_of(checks: tuple[Check, ...]) -> Check:
    if len(checks) == 1:
        return checks[0]

    def every(v: Any) -> bool:
        for check in checks:  # noqa: SIM110 - a loop, not all(): no generator made per value
            if not check(v):
                return False
        return True

    return every


def _on(kind: type, check: Check) -> Check:
    """A keyword for one kind of value (``_valid``'s isinstance guard): any other passes it."""
    return lambda v: not isinstance(v, kind) or check(v)


def _on_objects(check: Check, first: bool) -> Check:
    """An object keyword. A key that is no string is jsonschema's to judge (``_object``): asked
    at the schema's first object keyword only, since a later one is reached only past it."""
    if not first:
        return lambda v: not isinstance(v, dict) or check(v)

    def on_object(v: Any) -> bool:
        if not isinstance(v, dict):
            return True
        for k in v:
            if not isinstance(k, str):
                raise _Unknown
        return check(v)

    return on_object


def _type(names: list[str]) -> Check:
    """``_is_type``'s order: a value of no JSON type is refused at the first name; an unknown
    name says False of a boolean and is unknown for anything else."""
    preds = tuple(_TYPES.get(n) or _unknown_type for n in names)
    if not preds:
        return lambda v: False
    if len(preds) == 1:
        pred = preds[0]

        def is_type(v: Any) -> bool:
            if not isinstance(v, _JSON):
                raise _Unknown
            return pred(v)

        return is_type

    def is_any(v: Any) -> bool:
        if not isinstance(v, _JSON):
            raise _Unknown
        return any(p(v) for p in preds)

    return is_any


def _string_matching(pattern: str) -> Check:
    """``{"type": "string", "pattern": pattern}`` in one call."""
    search = _searcher(pattern)

    def matching(v: Any) -> bool:
        if isinstance(v, str):
            return search(v)
        if not isinstance(v, _JSON):
            raise _Unknown
        return False

    return matching


def _unknown_type(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    raise _Unknown


def _enum(arg: list[Any]) -> Check:
    if arg and all(type(x) is str for x in arg):
        strings = frozenset(arg)
        # a string equals only a string (``_equal``): anything else as _equal has it
        return lambda v: v in strings if type(v) is str else any(_equal(v, x) for x in arg)
    return lambda v: any(_equal(v, x) for x in arg)


def _searcher(pattern: str) -> Check:
    """``re.search(pattern, s) is not None``, compiled at its first use: a bad pattern raises
    ``re.error`` where ``_valid`` would, when a value reaches it."""
    found: list[Callable[[str], Any]] = []

    def search(s: str) -> bool:
        if not found:
            found.append(re.compile(pattern).search)
        return found[0](s) is not None

    return search


def _unique(v: list[Any]) -> bool:
    if all(type(x) is str for x in v):
        return len(set(v)) == len(v)  # strings: _equal is ==
    return all(not _equal(a, b) for i, a in enumerate(v) for b in v[i + 1:])
