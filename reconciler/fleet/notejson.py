"""A note's JSON read within bounds: the one decoder every reader of notes and claims uses.

A note is written by one node and read by every other node, by ``status --fleet`` and by the
review bot, so one compromised node must not be able to stop them: JSON nested past Python's
recursion limit, an integer of 5,000 digits, ``NaN`` or ``1e999``, a 20 MB error, a field of the
wrong type would each raise in every reader, or be copied fleet-wide. Here every bound is
checked on the raw text before ``json.loads`` builds anything deep or big, then the fields the
readers use are checked against their types. A note outside them is malformed: a reason, never
an exception; the readers count it as no note.

Pure: text in, a body or the reason out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from reconciler.fleet.noteschema import (
    CLAIM_STATES,
    MAX_DEPTH,
    MAX_DIGITS,
    MAX_HELD,
    MAX_NAME,
    MAX_NOTE,
    MAX_TEXT,
    MAX_TICKET,
    REPORT,
    KiB,
    _claim,
    _encodes,
    _fields,
    _kind,
    _Refused,
    _report_sound,
    _services_shaped,
)

__all__ = ["CLAIM_STATES", "MAX_DEPTH", "MAX_DIGITS", "MAX_HELD", "MAX_NAME", "MAX_NOTE", "MAX_TEXT", "MAX_TICKET",
           "check", "check_careful"]


def check(raw: str | bytes) -> dict[str, Any] | str:
    """The note's body, or why it is malformed (a short text naming the bound it broke)."""
    return _said(raw, fast=True)


def check_careful(raw: str | bytes) -> dict[str, Any] | str:
    """What ``check`` says, read the careful way only: the depth counted on the text before
    anything is built, then every string, then the fields in their order. The oracle ``check``'s
    fast path is held to (tests), and what it falls back to for any note it does not pass."""
    return _said(raw, fast=False)


def _said(raw: str | bytes, fast: bool) -> dict[str, Any] | str:
    try:
        text, values = _text_of(raw)
        data = _fast(text, values) if fast else None
        return data if data is not None else _careful(text, values)
    except _Refused as exc:
        return str(exc)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc.msg} at character {exc.pos})"
    except (ValueError, TypeError, RecursionError, OverflowError) as exc:  # bounds above make these unexpected
        return f"not readable ({type(exc).__name__})"


def _text_of(raw: str | bytes) -> tuple[str, bool]:
    """The note's text within the bound of bytes, and whether its strings can break a bound
    (False: only its keys can)."""
    if isinstance(raw, bytes | bytearray):
        if len(raw) > MAX_NOTE:
            raise _Refused(f"{len(raw)} bytes, more than {MAX_NOTE // KiB} KiB")
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise _Refused("not UTF-8") from None
    elif isinstance(raw, str):
        if len(raw) > MAX_NOTE or len(raw.encode("utf-8", "surrogatepass")) > MAX_NOTE:
            raise _Refused(f"{len(raw.encode('utf-8', 'surrogatepass'))} bytes, more than {MAX_NOTE // KiB} KiB")
        text = raw
    else:
        raise _Refused(f"a {type(raw).__name__}, not text")
    # Text decoded from UTF-8 bytes holds no surrogate but through a \u escape, and none of its
    # strings is longer than itself: then only the keys can break a bound.
    return text, not isinstance(raw, bytes | bytearray) or len(text) > MAX_TEXT or "\\u" in text


def _careful(text: str, values: bool) -> dict[str, Any]:
    depth = _depth(text)  # how deep, on the text, before anything is built
    if depth > MAX_DEPTH:
        raise _Refused(f"nested {depth} deep, more than {MAX_DEPTH}")
    data = json.loads(text, parse_int=_integer, parse_float=_float, parse_constant=_constant)
    if not isinstance(data, dict):
        raise _Refused(f"a JSON {_kind(data)}, not an object")
    _texts(data, values)  # raises what it always said, in its order
    if "claim" in data:
        _claim(data["claim"])
    else:
        _fields(data, REPORT, "")
    return data


# Brackets a text may hold (in strings too) to be parsed before its depth is known: json.loads
# recurses once per level, and this many levels are far from any stack's end.
_PARSED_FIRST = 512


def _fast(text: str, values: bool) -> dict[str, Any] | None:
    """The body of a sound note (a fleet's reader decodes 10,000), parsed once, its depth,
    strings and fields read off what was built in one walk (``_sound``, ``_report_sound``): a
    fraction of the careful path's cost. None for any note with something wrong, or not read
    here (few brackets only): ``_careful`` then reads it and says what it always said."""
    brackets = text.count("[") + text.count("{")
    if brackets > _PARSED_FIRST:
        return None
    try:
        data = _DECODER.decode(text)
        if type(data) is not dict:
            return None
        services = data.get("services")
        shaped = services is not None and _services_shaped(services, values)
        built, deepest = _sound(data, values, services if shaped else None)
        if not built:
            return None
        # A key said twice keeps its last value: the brackets of the values before it built
        # nothing walked here, but the careful path counts them on the text. As many of them as
        # brackets neither built (a shaped services': 1 + 2 a service, 4 deep) nor in a string
        # (or one that may be escaped) could nest past the bound: the depth counted as it does.
        if shaped:
            built, deepest = built + 1 + 2 * len(data["services"]), max(deepest, 4)
        if deepest + brackets - built > MAX_DEPTH \
                and (any(e in text for e in _ESCAPED) or built + _in_strings(data) < brackets) \
                and _depth(text) > MAX_DEPTH:
            return None
        if "claim" in data:
            _claim(data["claim"])
        elif not _report_sound(data, shaped):
            return None
    except Exception:  # noqa: BLE001  # anything wrong is the careful path's to say, in its order
        return None
    return data


def _sound(data: dict[str, Any], values: bool, skip: Any = None) -> tuple[int, int]:
    """How many arrays and objects ``data`` holds (itself too) and how deep they nest, when at
    most ``MAX_DEPTH`` (what ``_depth`` counts on the text, of what was built), every key a
    name and (``values``) every string a text, as ``_texts`` checks; (0, 0) where not. One walk, a
    level at a time, each level's keys and strings measured by C loops (``max``, ``join``)
    rather than one by one. ``skip``: a value below ``data`` sound already
    (``_services_shaped``: at most three levels deep, far within the bound), not walked."""
    depth, level, built = 0, [data], 0
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            return 0, 0
        built += len(level)
        below: list[Any] = []
        for value in level:
            items: Iterable[Any] = value
            if type(value) is dict:
                if value and (max(map(len, value)) > MAX_NAME or values and not _encodes("".join(value))):
                    return 0, 0
                items = value.values()
            if values:
                texts = [v for v in items if type(v) is str]  # json.loads makes exact types
                if texts and (max(map(len, texts)) > MAX_TEXT or not _encodes("".join(texts))):
                    return 0, 0
            below += [v for v in items if type(v) in _CONTAINERS and v is not skip]
        level = below
    return built, depth


_CONTAINERS = frozenset((dict, list))
_ESCAPED = ("\\u005b", "\\u005B", "\\u007b", "\\u007B")  # a bracket in a string, not one in the text


def _in_strings(data: dict[str, Any]) -> int:
    """Brackets in the keys and strings of ``data``: each one in the text too, where none is
    escaped (``_ESCAPED``)."""
    strings: list[str] = []
    stack: list[Any] = [data]
    while stack:
        value = stack.pop()
        items: Iterable[Any] = value
        if type(value) is dict:
            strings += value
            items = value.values()
        strings += [v for v in items if type(v) is str]
        stack += [v for v in items if type(v) in _CONTAINERS]
    joined = "".join(strings)
    return joined.count("[") + joined.count("{")


def _depth(text: str) -> int:
    """How deep arrays and objects nest, counted on the text (no recursion, nothing built), a
    bracket inside a string not counted. One pass over the pieces between quotes, each looked
    at once: a regex skipping strings backtracks on one never closed (64 KiB of escaped quotes
    cost 20 s of every reader's CPU, per note). A quote after an odd run of backslashes is an
    escaped one; a string never closed is malformed here, before anything else reads it."""
    depth = deepest = 0
    inside = False  # is this piece in a string
    at = start = 0  # where this piece starts; where the last string opened (for the message)
    *pieces, last = text.split('"')
    for piece in pieces:
        if inside:
            inside = (len(piece) - len(piece.rstrip("\\"))) % 2 == 1  # the quote after it escaped
        else:
            if "[" in piece or "{" in piece or "]" in piece or "}" in piece:
                depth, deepest = _brackets(piece, depth, deepest)
            inside, start = True, at + len(piece)
        at += len(piece) + 1
    if inside:
        raise _Refused(f"not JSON (a string never closed, from character {start})")
    return _brackets(last, depth, deepest)[1]


def _brackets(piece: str, depth: int, deepest: int) -> tuple[int, int]:
    """``depth`` and ``deepest`` after the brackets of ``piece`` (text outside strings): counted
    at once where they all open or all close, one by one only where both are mixed."""
    opened, closed = piece.count("[") + piece.count("{"), piece.count("]") + piece.count("}")
    if not closed:
        return depth + opened, max(deepest, depth + opened)
    if not opened:
        return depth - closed, deepest
    for c in piece:
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return depth, deepest


def _integer(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_DIGITS:
        raise _Refused(f"an integer of {digits} digits, more than {MAX_DIGITS}")
    return int(text)


def _float(text: str) -> float:
    if len(text) > 64:
        raise _Refused(f"a number of {len(text)} characters")
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"a number out of range ({text[:32]})")
    return value


def _constant(text: str) -> Any:
    raise _Refused(f"{text} is not a number a note may hold")


# json.loads with these hooks, made once (json.loads makes a decoder on every call).
_DECODER = json.JSONDecoder(parse_int=_integer, parse_float=_float, parse_constant=_constant)


def _texts(data: Any, values: bool = True) -> None:
    """Every string a text of at most ``MAX_TEXT`` characters, every key a name; no lone
    surrogate (no output encoding can carry one). A loop, not recursion: the depth is bounded
    already, but a reader's stack is not this function's to spend. ``values`` False: the keys
    only (the caller knows no value can break a bound)."""
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for k, v in value.items():
                _text(k, MAX_NAME, "a key")
                stack.append(v)
        elif isinstance(value, list):
            stack.extend(value)
        elif values and isinstance(value, str):
            _text(value, MAX_TEXT, "a text")


def _text(value: str, limit: int, what: str) -> None:
    if len(value) > limit:
        raise _Refused(f"{what} of {len(value)} characters, more than {limit}")
    try:
        value.encode("utf-8")  # fails on a surrogate, and only there: no regex over a writer's text
    except UnicodeEncodeError:
        raise _Refused(f"{what} holding a lone surrogate") from None
