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
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from reconciler.core.model.facts import BadFacts, Facts

KiB = 1024
MAX_NOTE = 64 * KiB  # bytes of one note, checked before it is parsed
MAX_TEXT = 4 * KiB  # characters of one text: an error, a reason, a service's detail, an event
MAX_NAME = 256  # characters of a name: a key, a state, a service, a step, a time
MAX_DEPTH = 16  # arrays and objects inside each other
MAX_DIGITS = 18  # digits of an integer: any fits in 64 bits
MAX_TICKET = 2**53  # a claim's ticket: one higher is still exact, as a float too
MAX_HELD = 64  # services a note lists as held stopped
CLAIM_STATES = ("choosing", "queued", "free")

__all__ = ["CLAIM_STATES", "MAX_DEPTH", "MAX_DIGITS", "MAX_NAME", "MAX_NOTE", "MAX_TEXT", "MAX_TICKET", "check"]


class _Refused(ValueError):
    """Why a note is malformed (raised from inside json.loads' hooks, caught in ``check``)."""


def check(raw: str | bytes) -> dict[str, Any] | str:
    """The note's body, or why it is malformed (a short text naming the bound it broke)."""
    try:
        return _check(raw)
    except _Refused as exc:
        return str(exc)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc.msg} at character {exc.pos})"
    except (ValueError, TypeError, RecursionError, OverflowError) as exc:  # bounds above make these unexpected
        return f"not readable ({type(exc).__name__})"


def _check(raw: str | bytes) -> dict[str, Any]:
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
    values = not isinstance(raw, bytes | bytearray) or len(text) > MAX_TEXT or "\\u" in text
    data, sound = _parsed(text, values)
    if data is None:  # the careful order: how deep, on the text, before anything is built
        depth = _depth(text)
        if depth > MAX_DEPTH:
            raise _Refused(f"nested {depth} deep, more than {MAX_DEPTH}")
        data = json.loads(text, parse_int=_integer, parse_float=_float, parse_constant=_constant)
    if not isinstance(data, dict):
        raise _Refused(f"a JSON {_kind(data)}, not an object")
    if not sound:
        _texts(data, values)  # raises what it always said, in its order
    if "claim" in data:
        _claim(data["claim"])
    else:
        _fields(data, REPORT, "")
    return data


# Brackets a text may hold (in strings too) to be parsed before its depth is known: json.loads
# recurses once per level, and this many levels are far from any stack's end.
_PARSED_FIRST = 512


def _parsed(text: str, values: bool) -> tuple[Any, bool]:
    """The text parsed, when it holds few brackets and nothing in it is wrong: a sound note (a
    fleet's reader decodes 10,000) is parsed once, and its depth and strings read off what was
    built in one walk (``_sound``), a fraction of the cost of scanning the text for them first.
    (None, False) otherwise: ``_check`` then reads it the careful way, and says what it always
    said (the depth before any other complaint). The flag: every string within bounds (False:
    ``_texts`` says which is not)."""
    if text.count("[") + text.count("{") > _PARSED_FIRST:
        return None, False
    try:
        data = json.loads(text, parse_int=_integer, parse_float=_float, parse_constant=_constant)
    except (ValueError, TypeError, RecursionError, OverflowError):  # _Refused and JSONDecodeError are ValueErrors
        return None, False
    depth, sound = _sound(data, values)
    if not sound:  # some string out of bounds: the depth is said first, as on the careful path
        depth = _nesting(data)
    return (data, sound) if depth <= MAX_DEPTH else (None, False)


def _nesting(data: Any) -> int:
    """How deep arrays and objects nest in a parsed value: what ``_depth`` counts on its text."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = value.values()
        elif not isinstance(value, list):
            continue
        deepest = max(deepest, depth)
        stack.extend((v, depth + 1) for v in value if isinstance(v, dict | list))
    return deepest


def _sound(data: Any, values: bool) -> tuple[int, bool]:
    """How deep arrays and objects nest in a parsed value (what ``_depth`` counts on its text),
    and whether every key is a name and (``values``) every string a text, as ``_texts`` checks:
    one walk, a level at a time, each level's keys and strings measured by C loops (``max``,
    ``join``) rather than one by one. (0, False) at the first string out of bounds."""
    depth, level = 0, [data] if isinstance(data, dict | list) else []
    while level:
        depth += 1
        below: list[Any] = []
        for value in level:
            items: Iterable[Any] = value
            if isinstance(value, dict):
                if value and (max(map(len, value)) > MAX_NAME or values and not _encodes("".join(value))):
                    return 0, False
                items = value.values()
            texts = [v for v in items if type(v) is str] if values else ()  # json.loads makes exact types
            if texts and (max(map(len, texts)) > MAX_TEXT or not _encodes("".join(texts))):
                return 0, False
            below += [v for v in items if type(v) in _CONTAINERS]
        level = below
    return depth, True


_CONTAINERS = frozenset((dict, list))


def _encodes(text: str) -> bool:
    """No lone surrogate in it (no output encoding can carry one)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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


def _kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


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


# The schema of what the readers read: field -> its check; absent fields are allowed (an older
# writer), others unchecked beyond the bounds above (a newer writer's).
Check = Callable[[Any, str], None]


def _name(value: Any, where: str) -> None:
    if not isinstance(value, str) or len(value) > MAX_NAME:
        raise _Refused(f"{where}: not a name (a string of at most {MAX_NAME} characters)")


def _string(value: Any, where: str) -> None:
    if not isinstance(value, str):
        raise _Refused(f"{where}: a {_kind(value)}, not a string")


def _optional_name(value: Any, where: str) -> None:
    if value is not None:
        _name(value, where)


def _int(value: Any, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Refused(f"{where}: a {_kind(value)}, not an integer")


def _optional_int(value: Any, where: str) -> None:
    if value is not None:
        _int(value, where)


def _object(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise _Refused(f"{where}: a {_kind(value)}, not an object")


def _strings(value: Any, where: str) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Refused(f"{where}: not a list of strings")


def _names(most: int) -> Check:
    def check_names(value: Any, where: str) -> None:
        if not isinstance(value, list) or len(value) > most:
            raise _Refused(f"{where}: not a list of at most {most} names")
        for i, item in enumerate(value):
            _name(item, f"{where}[{i}]")
    return check_names


def _each(fields: Mapping[str, Check]) -> Check:
    def check_each(value: Any, where: str) -> None:
        if not isinstance(value, list):
            raise _Refused(f"{where}: a {_kind(value)}, not a list")
        for i, item in enumerate(value):
            _object(item, f"{where}[{i}]")
            _fields(item, fields, f"{where}[{i}].")
    return check_each


def _by_name(fields: Mapping[str, Check]) -> Check:
    def check_by_name(value: Any, where: str) -> None:
        _object(value, where)
        for key, item in value.items():
            _object(item, f"{where}.{key}")
            _fields(item, fields, f"{where}.{key}.")
    return check_by_name


def _with(fields: Mapping[str, Check]) -> Check:
    def check_with(value: Any, where: str) -> None:
        _object(value, where)
        _fields(value, fields, f"{where}.")
    return check_with


def _fields(data: Mapping[str, Any], fields: Mapping[str, Check], where: str) -> None:
    for key, check_field in fields.items():
        if key in data:
            value = data[key]
            # The common fields, sound, pass without a call or a name for the message (a fleet's
            # reader checks some fifty per note); anything else is checked and said as it was.
            if type(value) is str and (check_field is _string or check_field is _name and len(value) <= MAX_NAME):
                continue
            check_field(value, where + key)


def _facts(value: Any, where: str) -> None:
    """Within ``Facts.from_dict``'s bounds: at most 64 interfaces, 16 addresses each, short texts."""
    try:
        Facts.from_dict(value)
    except BadFacts as exc:
        raise _Refused(f"{where}: {exc}") from None


SERVICE: Mapping[str, Check] = {"result": _name, "action": _name, "reason": _string, "detail": _string,
                                "steps": _strings, "pid": _optional_int, "hash": _optional_name}
STEP: Mapping[str, Check] = {"service": _name, "step": _name, "scope": _name, "status": _name, "started": _name,
                             "ended": _name, "detail": _string}
REPORT: Mapping[str, Check] = {
    "format": _int, "node": _name, "commit": _name, "state": _name, "time": _name, "plan_hash": _name,
    "reason": _string, "error": _string, "services": _by_name(SERVICE), "upgrade": _each(STEP),
    "events": _strings, "pins": _object, "signer": _object, "verdicts": _each({}),
    "suspended": _object, "plane": _with({"vip": _name, "release": _name, "mode": _name}),
    "refused": _with({"head": _name, "reason": _name, "time": _name}),  # a rewind the node refused
    "held": _names(MAX_HELD),  # services held stopped by `reconciler stop`
    "facts": _facts,  # the node's facts its render read (``core.model.facts``: bounded there)
}



def _claim(claim: Any) -> None:
    _object(claim, "claim")
    _fields(claim, {"node": _name, "state": _name, "action": _string}, "claim.")
    if claim.get("state") not in CLAIM_STATES:
        raise _Refused(f"claim.state: not one of {', '.join(CLAIM_STATES)}")
    ticket = claim.get("ticket", 0)
    if not isinstance(ticket, int) or isinstance(ticket, bool) or not 0 <= ticket <= MAX_TICKET:
        raise _Refused("claim.ticket: not an integer from 0 to 2**53")
    when = claim.get("time", 0.0)
    if not isinstance(when, int | float) or isinstance(when, bool) or not math.isfinite(when):
        raise _Refused("claim.time: not a finite number")
