"""The schema of a note (what its readers read: each field's check) and its bounds, for the
one decoder (``fleet.notejson``): the careful check of each field, said by name
(``_fields``, ``_claim``), and the one-walk check of a note as its writer writes it
(``_report_sound``, ``_services_shaped``), which says only whether the careful one passes.

Pure: values in, a reason raised (``_Refused``) or a yes/no out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from operator import itemgetter
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


class _Refused(ValueError):
    """Why a note is malformed (raised from inside json.loads' hooks, caught in ``check``)."""


def _kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def _encodes(text: str) -> bool:
    """No lone surrogate in it (no output encoding can carry one)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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


def _entry(item: Any, fields: Mapping[str, Check], where: str) -> None:
    """One object of a note (a service, an upgrade step, the plane) and its fields."""
    _object(item, where)
    _fields(item, fields, f"{where}.")


def _each(fields: Mapping[str, Check]) -> Check:
    def check_each(value: Any, where: str) -> None:
        if not isinstance(value, list):
            raise _Refused(f"{where}: a {_kind(value)}, not a list")
        for i, item in enumerate(value):
            _entry(item, fields, f"{where}[{i}]")
    return check_each


def _by_name(fields: Mapping[str, Check]) -> Check:
    def check_by_name(value: Any, where: str) -> None:
        _object(value, where)
        for key, item in value.items():
            _entry(item, fields, f"{where}.{key}")
    return check_by_name


def _with(fields: Mapping[str, Check]) -> Check:
    def check_with(value: Any, where: str) -> None:
        _entry(value, fields, where)
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


def _report_sound(data: dict[str, Any], shaped: bool) -> bool:
    """Whether ``_fields(data, REPORT, "")`` passes, the common fields told by their type, the
    services by ``_services_shaped`` (``shaped``), the rest by their own check: True only where
    it passes (False, or what a check raises: the careful path says what it always said, in
    its order)."""
    for key in data.keys() & REPORT.keys():
        value, rule = data[key], REPORT[key]
        if rule is _name or rule is _string:
            if type(value) is not str or rule is _name and len(value) > MAX_NAME:
                return False
        elif rule is _int or rule is _object:
            if type(value) is not (int if rule is _int else dict):  # json.loads makes exact types: no bool
                return False
        elif not (shaped and key == "services"):
            rule(value, key)  # raises on the fast path: caught in ``_fast``
    return True


# A service as this format's writer writes it (``Result.to_dict``): these seven fields, no other.
_SERVICE_KEYS = ("action", "detail", "hash", "pid", "reason", "result", "steps")
_SERVICE_FIELDS = itemgetter(*_SERVICE_KEYS)


def _services_shaped(services: Any, values: bool) -> bool:
    """Whether ``services`` is an object of services as the writer writes them, each within
    ``REPORT["services"]`` and the bounds ``_sound`` holds every key and (``values``) string
    to: its seven fields and no other, told by their types in one pass (no call per field).
    False for any other shape (an older writer's): then walked and checked as any field is."""
    if type(services) is not dict or not services or max(map(len, services)) > MAX_NAME:
        return False
    texts: list[str] = list(services) if values else []
    for item in services.values():
        if type(item) is not dict or len(item) != len(_SERVICE_KEYS):
            return False
        try:
            action, detail, hashed, pid, reason, result, steps = _SERVICE_FIELDS(item)
        except KeyError:
            return False
        if not (type(action) is str and type(result) is str and type(detail) is str and type(reason) is str
                and len(action) <= MAX_NAME and len(result) <= MAX_NAME
                and (hashed is None or type(hashed) is str and len(hashed) <= MAX_NAME)
                and (pid is None or type(pid) is int) and type(steps) is list
                and (not steps or all(type(step) is str for step in steps))):
            return False
        if values:
            texts += (action, result, detail, reason, *steps)
            if hashed is not None:
                texts.append(hashed)
    return not texts or max(map(len, texts)) <= MAX_TEXT and _encodes("".join(texts))


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
