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
