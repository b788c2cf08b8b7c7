"""Whether a document is valid against one of the repo's JSON Schemas, without jsonschema.

jsonschema is about 60 ms of imports: the most of a node's cost to load a commit once its
no-op poll is over (issue 40). A valid repo is the common case, so ``check_schema`` asks here
first, and only a document this does not call valid goes to jsonschema, which says what is
wrong, in its own words. So this may only ever err towards "not valid": it knows the keywords
the repo's schemas use (draft 2020-12), and anything else (another keyword, a remote ``$ref``,
a value that is no JSON type) is "not valid" here, to be judged by jsonschema. Pure.
"""

from __future__ import annotations

import re
from typing import Any

# Keywords that do not constrain: annotations.
_ANNOTATIONS = frozenset({"$schema", "$id", "title", "description", "$defs", "default", "examples", "$comment"})
_JSON = (dict, list, str, int, float, bool, type(None))


def valid(instance: Any, schema: dict[str, Any]) -> bool:
    """True only when ``instance`` is certainly valid against ``schema`` (see the docstring)."""
    try:
        return _valid(instance, schema, schema)
    except (_Unknown, re.error, RecursionError):
        return False


class _Unknown(Exception):
    """Something this checker does not judge: jsonschema will."""


def _is_type(value: Any, name: str) -> bool:
    if not isinstance(value, _JSON):
        raise _Unknown
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "string":
        return isinstance(value, str)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "null":
        return value is None
    if isinstance(value, bool):
        return False
    if name == "number":
        return isinstance(value, int | float)
    if name == "integer":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    raise _Unknown


def _equal(a: Any, b: Any) -> bool:
    """JSON equality as jsonschema has it: true is not 1, 1 is 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | dict) or isinstance(b, list | dict):
        return False
    if not isinstance(a, _JSON) or not isinstance(b, _JSON):
        raise _Unknown
    return bool(a == b)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _valid(value: Any, schema: Any, root: dict[str, Any]) -> bool:  # noqa: C901 - one keyword a branch
    if schema is True:
        return True
    if schema is False or not isinstance(schema, dict):
        return False if schema is False else _raise()
    for key, arg in schema.items():
        if key in _ANNOTATIONS:
            continue
        if key == "type":
            if not any(_is_type(value, t) for t in ([arg] if isinstance(arg, str) else arg)):
                return False
        elif key == "enum":
            if not any(_equal(value, v) for v in arg):
                return False
        elif key == "const":
            if not _equal(value, arg):
                return False
        elif key == "$ref":
            if not isinstance(arg, str) or not arg.startswith("#/$defs/") or "/" in arg[8:] or "~" in arg:
                raise _Unknown
            if not _valid(value, root.get("$defs", {})[arg[8:]], root):
                return False
        elif key in ("oneOf", "anyOf"):
            passed = sum(1 for s in arg if _valid(value, s, root))
            if passed == 0 or (key == "oneOf" and passed > 1):
                return False
        elif key == "not":
            if _valid(value, arg, root):
                return False
        elif key in ("properties", "patternProperties", "additionalProperties", "required", "propertyNames",
                     "minProperties"):
            if isinstance(value, dict) and not _object(key, value, schema, root):
                return False
        elif key in ("items", "minItems", "uniqueItems"):
            if isinstance(value, list) and not _array(key, value, arg, root):
                return False
        elif key in ("pattern", "minLength", "maxLength"):
            if isinstance(value, str) and not _string(key, value, arg):
                return False
        elif key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if _number(value) and not _bound(key, value, arg):
                return False
        else:
            raise _Unknown
    return True


def _raise() -> bool:
    raise _Unknown


def _object(key: str, value: dict[Any, Any], schema: dict[str, Any], root: dict[str, Any]) -> bool:
    if any(not isinstance(k, str) for k in value):
        raise _Unknown  # a YAML key that is no string: jsonschema judges it
    if key == "required":
        return all(k in value for k in schema[key])
    if key == "minProperties":
        return bool(len(value) >= schema[key])
    if key == "propertyNames":
        return all(_valid(k, schema[key], root) for k in value)
    props, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
    if key == "properties":
        return all(_valid(value[k], s, root) for k, s in props.items() if k in value)
    if key == "patternProperties":
        return all(_valid(v, s, root) for p, s in patterns.items() for k, v in value.items() if re.search(p, k))
    return all(_valid(v, schema[key], root) for k, v in value.items()
               if k not in props and not any(re.search(p, k) for p in patterns))


def _array(key: str, value: list[Any], arg: Any, root: dict[str, Any]) -> bool:
    if key == "items":
        if isinstance(arg, list):
            raise _Unknown  # an older draft's tuple form
        return all(_valid(v, arg, root) for v in value)
    if key == "minItems":
        return bool(len(value) >= arg)
    return not arg or all(not _equal(a, b) for i, a in enumerate(value) for b in value[i + 1:])


def _string(key: str, value: str, arg: Any) -> bool:
    if key == "pattern":
        return re.search(arg, value) is not None
    return bool(len(value) >= arg if key == "minLength" else len(value) <= arg)


def _bound(key: str, value: float, arg: float) -> bool:
    if key == "minimum":
        return value >= arg
    if key == "maximum":
        return value <= arg
    return value > arg if key == "exclusiveMinimum" else value < arg
