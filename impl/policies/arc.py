"""Adaptive Replacement Cache (Megiddo and Modha), as SPEC section 4 states it.

T1 holds keys seen once, T2 keys reused; B1 and B2 remember keys evicted from them. ``p`` is the
target size of T1, moved by hits in the ghost lists.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence

from .base import CachePolicy, Predicate


class ARCPolicy(CachePolicy):
    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.t1: OrderedDict[bytes, None] = OrderedDict()
        self.t2: OrderedDict[bytes, None] = OrderedDict()
        self.b1: OrderedDict[bytes, None] = OrderedDict()
        self.b2: OrderedDict[bytes, None] = OrderedDict()
        self.p: float = 0

    def insert(self, key: bytes) -> None:
        self.b1.pop(key, None)
        self.b2.pop(key, None)
        self.t1[key] = None

    def remove(self, key: bytes) -> None:
        self.t1.pop(key, None)
        self.t2.pop(key, None)

    def _adapt(self, key: bytes) -> None:
        if key in self.b1:
            self.p = min(self.capacity, self.p + max(1, len(self.b2) / len(self.b1)))
        elif key in self.b2:
            self.p = max(0, self.p - max(1, len(self.b1) / len(self.b2)))

    def touch(self, keys: Sequence[bytes], is_ready: Predicate) -> None:
        for key in reversed(keys):
            if key in self.t1:
                if is_ready(key):
                    del self.t1[key]
                    self.t2[key] = None
                else:
                    self.t1.move_to_end(key)
            elif key in self.t2:
                self.t2.move_to_end(key)
            else:
                self._adapt(key)

    def on_store_miss(self, key: bytes) -> None:
        self._adapt(key)

    def choose_victims(self, n: int, evictable: Predicate) -> list[bytes] | None:
        from_t1: Iterator[bytes] = (k for k in self.t1 if evictable(k))
        from_t2: Iterator[bytes] = (k for k in self.t2 if evictable(k))
        t1_len = len(self.t1)
        victims: list[bytes] = []
        for _ in range(n):
            first, second = (from_t1, from_t2) if t1_len >= self.p else (from_t2, from_t1)
            key = next(first, None)
            if key is None:
                key = next(second, None)
            if key is None:
                return None
            if key in self.t1:
                t1_len -= 1
            victims.append(key)
        return victims

    def evict(self, victims: Sequence[bytes]) -> None:
        for key in victims:
            if key in self.t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
        self._trim_ghosts()

    def _trim_ghosts(self) -> None:
        for ghosts in (self.b1, self.b2):
            while len(ghosts) > self.capacity:
                ghosts.popitem(last=False)

    def state(self) -> dict:
        return {"t1": list(self.t1), "t2": list(self.t2), "b1": list(self.b1),
                "b2": list(self.b2), "p": self.p}

    def clear(self) -> None:
        for lst in (self.t1, self.t2, self.b1, self.b2):
            lst.clear()
        self.p = 0
