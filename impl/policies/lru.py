"""Least-recently-used order over the resident keys."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import islice

from .base import CachePolicy, Predicate


class LRUPolicy(CachePolicy):
    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.order: OrderedDict[bytes, None] = OrderedDict()  # least recent first

    def insert(self, key: bytes) -> None:
        self.order[key] = None

    def remove(self, key: bytes) -> None:
        self.order.pop(key, None)

    def touch(self, keys: Sequence[bytes], is_ready: Predicate) -> None:
        for key in reversed(keys):
            if key in self.order:
                self.order.move_to_end(key)

    def choose_victims(self, n: int, evictable: Predicate) -> list[bytes] | None:
        victims = list(islice((k for k in self.order if evictable(k)), n))
        return victims if len(victims) == n else None

    def evict(self, victims: Sequence[bytes]) -> None:
        for key in victims:
            del self.order[key]

    def state(self) -> dict:
        return {"lru": list(self.order)}

    def clear(self) -> None:
        self.order.clear()
