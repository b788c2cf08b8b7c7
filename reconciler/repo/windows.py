"""Maintenance windows: when each kind of disruption may happen on a node.

reconciler.yaml's ``windows`` list cron-like openings, each for some action kinds (the
disruption classes: ``restart``, ``reboot``...), a time zone, a duration and, optionally, a
group or node globs. An action kind no window names may happen any time (reloads, say); one
that windows name may happen only while one of the windows that name it for this node is open.

Pure: the windows and a time in, a verdict out. The clock is the caller's (the agent's, which a
test controls), so the same input always gives the same answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fnmatch import fnmatchcase
from typing import Any

from reconciler.core.model import ActionKind

__all__ = ["Closed", "Window", "WindowError", "closed", "parse_duration", "parse_windows"]

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?$")


class WindowError(ValueError):
    """A window that cannot be read: the message says what is wrong with it (no location)."""


@dataclass(frozen=True)
class Window:
    name: str
    actions: frozenset[ActionKind]
    schedule: str  # cron: minute hour day-of-month month day-of-week, in ``timezone``
    duration: timedelta
    timezone: str
    nodes: frozenset[str] | None = None  # None: every node

    def applies(self, kind: ActionKind, node: str) -> bool:
        return kind in self.actions and (self.nodes is None or node in self.nodes)

    def open_until(self, now: datetime) -> datetime | None:
        """The end of the opening ``now`` falls in, or None when the window is closed."""
        from zoneinfo import ZoneInfo

        from cronsim import CronSim

        local = now.astimezone(ZoneInfo(self.timezone))
        # cronsim's reverse walk starts below its start time: a second later finds an opening at ``now``
        last: datetime = next(CronSim(self.schedule, local + timedelta(seconds=1), reverse=True))
        end = last.astimezone(UTC) + self.duration
        return end if end > now.astimezone(UTC) else None

    def next_opening(self, now: datetime) -> datetime:
        from zoneinfo import ZoneInfo

        from cronsim import CronSim

        return next(CronSim(self.schedule, now.astimezone(ZoneInfo(self.timezone)))).astimezone(ZoneInfo(self.timezone))

    def describe(self) -> str:
        return f"{self.schedule} {self.timezone} for {_span(self.duration)}"


@dataclass(frozen=True)
class Closed:
    """An action held back: the windows it may happen in, and when the first of them opens."""

    windows: tuple[str, ...]
    opens: datetime

    def __str__(self) -> str:
        names = " or ".join(self.windows)
        return f"waiting (window): {names} opens {self.opens.isoformat(timespec='minutes')}"


def closed(kind: ActionKind, node: str, windows: Iterable[Window], now: datetime) -> Closed | None:
    """Why ``kind`` may not happen on ``node`` at ``now``; None when it may."""
    mine = [w for w in windows if w.applies(kind, node)]
    if not mine or any(w.open_until(now) is not None for w in mine):
        return None
    return Closed(tuple(w.name for w in mine), min(w.next_opening(now) for w in mine))


def parse_duration(text: str) -> timedelta:
    """``90m``, ``6h``, ``1h30m``, ``1d``: at least a minute, at most a week."""
    m = _DURATION.match(text.strip())
    if not m or not any(m.groups()):
        raise WindowError(f"duration {text!r} is not like 6h, 90m or 1h30m")
    days, hours, minutes = (int(g or 0) for g in m.groups())
    span = timedelta(days=days, hours=hours, minutes=minutes)
    if not timedelta(minutes=1) <= span <= timedelta(days=7):
        raise WindowError(f"duration {text!r} must be between 1m and 7d")
    return span


def parse_windows(spec: Iterable[Mapping[str, Any]], nodes: Iterable[str],
                  members: Mapping[str, Iterable[str]]) -> list[tuple[int, Window | WindowError]]:
    """Each entry of ``windows:`` (index, window or what is wrong with it). ``members``: group ->
    nodes; the schema has checked the shape already."""
    all_nodes = sorted(nodes)
    out: list[tuple[int, Window | WindowError]] = []
    for i, w in enumerate(spec):
        name = str(w.get("name", f"window {i + 1}"))
        try:
            out.append((i, _window(name, w, all_nodes, members)))
        except WindowError as exc:
            out.append((i, WindowError(f"window {name!r}: {exc}")))
    return out


def _window(name: str, w: Mapping[str, Any], nodes: list[str], members: Mapping[str, Iterable[str]]) -> Window:
    # Imported where a window is read: a repo without windows never loads them (zoneinfo and
    # cronsim are 4 ms of a change's first pass, issue 40).
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    from cronsim import CronSim, CronSimError

    tz = str(w.get("timezone", "UTC"))
    try:
        zone = ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise WindowError(f"unknown time zone {tz!r} (an IANA name such as Europe/Paris)") from None
    schedule = str(w["schedule"])
    try:
        next(CronSim(schedule, datetime(2000, 1, 1, tzinfo=zone)))
    except (CronSimError, StopIteration) as exc:
        raise WindowError(f"schedule {schedule!r}: {exc or 'never opens'} (cron: minute hour day month weekday)") \
            from None
    kinds = set()
    for a in w["actions"]:
        try:
            kinds.add(ActionKind(str(a)))
        except ValueError:
            known = ", ".join(k.value for k in ActionKind if k is not ActionKind.NONE)
            raise WindowError(f"{a!r} is not an action (one of: {known})") from None
    chosen: frozenset[str] | None = None
    if "group" in w:
        if w["group"] not in members:
            raise WindowError(f"unknown group {w['group']!r}")
        chosen = frozenset(members[w["group"]])
    elif "nodes" in w:
        picked = set()
        for pattern in w["nodes"]:
            hits = {n for n in nodes if fnmatchcase(n, str(pattern))}
            if not hits:
                raise WindowError(f"{pattern!r} names no node")
            picked |= hits
        chosen = frozenset(picked)
    return Window(name, frozenset(kinds), schedule, parse_duration(str(w["duration"])), tz, chosen)


def _span(d: timedelta) -> str:
    minutes = int(d.total_seconds()) // 60
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    return "".join(f"{v}{u}" for v, u in ((days, "d"), (hours, "h"), (mins, "m")) if v) or "0m"
