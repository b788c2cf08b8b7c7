"""Values kept for objects the loop builds once and reads many times (a service definition, its
runtime and health check, its rules, a sandbox), found by the objects' identity: a lookup by
value hashes every field of a frozen dataclass each time, ``id`` does not. A key holds its
objects' ids, and the entry keeps the objects alive, so no other object can take one of those
ids while it stands; past ``limit`` entries the table starts over (what is dropped is computed
again)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class ByIdentity(Generic[V]):
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._entries: dict[Hashable, tuple[V, tuple[object, ...]]] = {}

    def get(self, key: Hashable) -> V | None:
        hit = self._entries.get(key)
        return None if hit is None else hit[0]

    def put(self, key: Hashable, value: V, *owners: object) -> V:
        """Keep ``value`` under ``key``, which holds the ids of ``owners``."""
        if len(self._entries) >= self.limit:
            self._entries.clear()
        self._entries[key] = (value, owners)
        return value


K = TypeVar("K", bound=Hashable)


class Bounded(Generic[K, V]):
    """A table of values computed once per key (a note's decoding, its verdict), bounded by count
    and, where values differ much in size, by their summed weight: past either it starts over
    (what is dropped is computed again). ``lookup`` tells a miss from a value that is None."""

    def __init__(self, limit: int, most_weight: int | None = None) -> None:
        self.limit = limit
        self.most_weight = most_weight
        self._entries: dict[K, V] = {}
        self._weight = 0

    def lookup(self, key: K) -> tuple[bool, V | None]:
        if key in self._entries:
            return True, self._entries[key]
        return False, None

    def put(self, key: K, value: V, weight: int = 1) -> V:
        if len(self._entries) >= self.limit or (self.most_weight is not None
                                               and self._weight + weight > self.most_weight):
            self.clear()
        self._entries[key] = value
        self._weight += weight
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def clear(self) -> None:
        self._entries.clear()
        self._weight = 0
