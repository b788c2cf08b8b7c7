"""What a template operation would build, measured before it is built (``sandbox`` refuses
what passes the value limit).

- ``result_size``: the string filters and methods that can build a lot from a small input
  (padding, format widths, replace, join);
- ``printed_size``: the text of a container once printed (``str``, ``repr``, ``json.dumps``).
  Sixty lists each holding the previous one twice take sixty lists of memory and print as
  2**60 items, built by C code no deadline interrupts: so the value is walked first, each
  list or dict measured once (by ``id``) and counted at its expanded size wherever it is
  shared, and the walk stops as soon as the total passes the limit.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from jinja2.utils import Namespace

# Widths and precisions in printf-style ("%-10.3s", "%*d") and format-style ("{:>{w}}") strings.
_PRINTF = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?")
_FIELD_SPEC = re.compile(r"\{[^{}]*?:((?:[^{}]|\{[^{}]*\})*)\}")


def _number(digits: str) -> int:
    return int(digits) if len(digits) <= 12 else 10**12  # int() refuses thousands of digits


def format_width(fmt: str, args: Iterable[Any]) -> int:
    """The widest padding or precision ``fmt`` asks for; with ``*`` or a nested field, the
    width comes from the arguments, so their integers count too."""
    widths = [0]
    from_args = False
    for m in _PRINTF.finditer(fmt):
        for digits in m.groups():
            from_args = from_args or digits == "*"
            widths += [_number(digits)] if digits and digits != "*" else []
    for m in _FIELD_SPEC.finditer(fmt):
        from_args = from_args or "{" in m.group(1)
        widths += [_number(d) for d in re.findall(r"\d+", m.group(1))]
    if from_args:
        widths += [a for a in args if isinstance(a, int)]
    return max(widths)


NUMBERS = frozenset({int, float, bool})
_SIZED = (str, bytes, list, tuple)  # a tuple, not ``str | bytes ...``: that builds a union per call


def length(value: Any) -> int:
    return len(value) if isinstance(value, _SIZED) else 0


def weight(value: Any) -> int:
    """``length``, but a list or tuple weighs its items (one level down, 1 at least each): a
    list of one 10 MB string repeated a thousand times is short, and joins into 10 GB."""
    if isinstance(value, (list, tuple)):
        return sum([length(item) or 1 for item in value])
    return length(value)


MOST_BITS = 65536  # a number past 2**65536 cannot even be printed (Python stops int -> str at 4300 digits)


def result_size(name: str, value: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> int:
    """What a string filter or method would build, for the few that can build a lot from a
    small input; 0 for the rest (their results are checked once built)."""
    n = length(value)
    if name in ("center", "ljust", "rjust", "zfill", "expandtabs", "batch", "slice"):
        return max([n, *(a for a in (*args, *kwargs.values()) if isinstance(a, int))])
    if name == "indent" and isinstance(value, str):
        width = args[0] if args else kwargs.get("width", 4)
        return n + (value.count("\n") + 1) * (length(width) or (width if isinstance(width, int) else 0))
    if name == "replace" and isinstance(value, str) and len(args) >= 2:
        old, new = str(args[0]), str(args[1])
        return n + (value.count(old) if old else n + 1) * len(new)
    if name == "join" and isinstance(value, str) and args and isinstance(args[0], Sequence):
        return len(value) * len(args[0])
    if name == "format" and isinstance(value, str):
        return n + format_width(value, (*args, *kwargs.values()))
    if name == "translate" and isinstance(value, str) and args and isinstance(args[0], Mapping):
        return n * max([1, *(length(v) for v in args[0].values())])  # each character to a string
    return 0


# The filters and methods ``result_size`` can say more than 0 of.
GROWING = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs", "batch", "slice", "indent", "replace",
                     "join", "format", "translate"})

# Values whose text is their parts' text: what ``printed_size`` walks. A ``namespace()`` prints
# its attributes' dict.
CONTAINERS = (list, tuple, dict, set, frozenset, Namespace)
CONTAINER_TYPES = frozenset(CONTAINERS)


class _Passed(Exception):
    pass


def printed_size(value: Any, limit: int) -> int:
    """About the characters of ``value`` printed (``str``, ``repr``, JSON or YAML), or more than
    ``limit`` once it passes it: a value that contains itself, which Python prints as ``[...]``
    and a serializer refuses or loops on, counts as ``sys.maxsize``."""
    if not isinstance(value, CONTAINERS):
        return len(value) if isinstance(value, str) else 0
    sizes: dict[int, int] = {}
    walking: set[int] = set()

    def walk(v: Any) -> int:
        if isinstance(v, str):
            return len(v) + 2  # its quotes
        if not isinstance(v, CONTAINERS):
            # A number prints as its digits (a huge integer would rather fail to print at all).
            return v.bit_length() // 3 + 1 if type(v) is int else 8
        key = id(v)
        known = sizes.get(key)
        if known is not None:
            return known
        if key in walking:
            raise _Passed
        walking.add(key)
        parts: Iterable[Any] = v._Namespace__attrs if isinstance(v, Namespace) else v
        total = 2
        for item in parts:
            total += walk(item) + 2
            if isinstance(parts, dict):
                total += walk(parts[item])
            if total > limit:
                raise _Passed
        walking.discard(key)
        sizes[key] = total
        return total

    try:
        return walk(value)
    except _Passed:
        return sys.maxsize
