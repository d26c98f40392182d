"""Least-recently-used order over the resident keys."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import islice

from .base import CachePolicy, Evictable, Resident


class LRUPolicy(CachePolicy):
    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.order: OrderedDict[bytes, Resident] = OrderedDict()  # least recent first

    def get(self, key: bytes) -> Resident | None:
        return self.order.get(key)

    def _add(self, key: bytes, entry: Resident) -> None:
        self.order[key] = entry

    def remove(self, key: bytes) -> Resident:
        return self.order.pop(key)

    def touch(self, keys: Sequence[bytes]) -> None:
        for key in reversed(keys):
            if key in self.order:
                self.order.move_to_end(key)

    def choose_victims(self, n: int, evictable: Evictable) -> list[bytes] | None:
        victims = list(islice((k for k, e in self.order.items() if evictable(k, e)), n))
        return victims if len(victims) == n else None

    def evict(self, victims: Sequence[bytes]) -> list[Resident]:
        return [self.order.pop(key) for key in victims]

    def state(self) -> dict:
        return {"lru": list(self.order)}

    def clear(self) -> None:
        self.order.clear()
