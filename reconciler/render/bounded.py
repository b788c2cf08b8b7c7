"""Work a template filter does in one call, held to the render's budget (``sandbox.Budget``)
as it goes: the sandbox checks the time and sizes between the steps of a template, not inside
a filter's own loop, and some loops can run for hours or build gigabytes in a single step.

- ``BoundedText``: a serializer's text (``to_json``, ``to_yaml``), charged as it is written;
- ``Members`` and ``Pace``: ``difference``/``intersect``/``union``'s comparisons, through a set
  when the items are hashable, with the deadline checked between the comparisons otherwise.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from reconciler.core.errors import RenderLimit
from reconciler.render.sandbox import budget_now

_BATCH = 1024  # chunks joined at a time: the text's memory stays its size, not an object per chunk
_WORK_PER_CHECK = 100_000  # comparisons between two reads of the clock: a few milliseconds


class BoundedText:
    """A serializer's text, charged to the render's budget as it is produced: a value sharing
    its parts (a list holding another twice, 40 levels deep) is small in memory but prints as
    terabytes, and must stop at the value limit or the deadline, not after building them.
    Without a render under way (a direct call), unbounded."""

    encoding = "utf-8"  # libyaml's emitter writes str, not bytes, to a stream that has one

    def __init__(self) -> None:
        self.budget = budget_now()
        self.limit = self.budget.limits.file_bytes if self.budget is not None else None
        self.parts: list[str] = []
        self.batch: list[str] = []
        self.size = 0

    def write(self, chunk: str) -> None:
        self.batch.append(chunk)
        self.size += len(chunk)  # every chunk: one can be a whole 10 MB string shared by many items
        if len(self.batch) >= _BATCH or (self.limit is not None and self.size > self.limit):
            self.parts.append("".join(self.batch))
            self.batch.clear()
            if self.budget is not None:
                self.budget.value(self.size)
                if time.monotonic() > self.budget.deadline:
                    raise RenderLimit(self.budget.too_late)

    def text(self) -> str:
        return "".join(self.parts) + "".join(self.batch)


class Pace:
    """The render's deadline, for a loop each step of which runs a loop in C (a list's ``in``)
    that the sandbox's own checks cannot see into."""

    __slots__ = ("budget", "work")

    def __init__(self) -> None:
        self.budget = budget_now()
        self.work = 0

    def step(self, cost: int) -> None:
        if self.budget is None:
            return
        self.work += cost + 1
        if self.work >= _WORK_PER_CHECK:
            self.work = 0
            if time.monotonic() > self.budget.deadline:
                raise RenderLimit(self.budget.too_late)


class Members:
    """``x in items``: through a set when the items are hashable (a list's ``in`` reads every
    item: two lists of 100,000 were 10**10 comparisons), one by one, paced, otherwise."""

    __slots__ = ("hashed", "items", "pace")

    def __init__(self, items: Any) -> None:
        if isinstance(items, Iterator):  # Jinja's ``select`` gives one: ``in`` would consume it
            items = list(items)
        self.items = items
        self.hashed: set[Any] | None = None
        self.pace = Pace()
        if isinstance(items, (list, tuple)):  # a string's ``in`` is a substring's, a dict's a key's
            with contextlib.suppress(TypeError):
                self.hashed = set(items)

    def __contains__(self, x: Any) -> bool:
        if self.hashed is not None:
            try:
                return x in self.hashed
            except TypeError:  # x itself is not hashable: compared with each item, as below
                pass
        self.pace.step(len(self.items) if isinstance(self.items, (list, tuple)) else 0)
        return x in self.items
