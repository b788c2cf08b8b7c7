"""The agents' clock in tests that move time by hand (windows, rollout waits)."""

from __future__ import annotations

from datetime import UTC, datetime


class Clock:
    """Returns ``now``, which the test sets."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now or datetime(2026, 11, 24, 9, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now
