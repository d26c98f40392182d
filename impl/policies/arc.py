"""Adaptive Replacement Cache (Megiddo and Modha), as spec §4 states it.

T1 holds keys seen once, T2 keys reused; B1 and B2 remember keys evicted from them. ``p`` is the
target size of T1, moved by hits in the ghost lists.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence

from .base import CachePolicy, Evictable, Resident


class ARCPolicy(CachePolicy):
    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.t1: OrderedDict[bytes, Resident] = OrderedDict()
        self.t2: OrderedDict[bytes, Resident] = OrderedDict()
        self.b1: OrderedDict[bytes, None] = OrderedDict()
        self.b2: OrderedDict[bytes, None] = OrderedDict()
        self.p: float = 0

    def get(self, key: bytes) -> Resident | None:
        entry = self.t1.get(key)
        return entry if entry is not None else self.t2.get(key)

    def _add(self, key: bytes, entry: Resident) -> None:
        self.b1.pop(key, None)
        self.b2.pop(key, None)
        self.t1[key] = entry

    def remove(self, key: bytes) -> Resident:
        return self.t1.pop(key) if key in self.t1 else self.t2.pop(key)

    def _adapt(self, key: bytes) -> None:
        if key in self.b1:
            self.p = min(self.capacity, self.p + max(1, len(self.b2) / len(self.b1)))
        elif key in self.b2:
            self.p = max(0, self.p - max(1, len(self.b1) / len(self.b2)))

    def touch(self, keys: Sequence[bytes]) -> None:
        for key in reversed(keys):
            if key in self.t1:
                if self.t1[key].ready:
                    self.t2[key] = self.t1.pop(key)
                else:
                    self.t1.move_to_end(key)
            elif key in self.t2:
                self.t2.move_to_end(key)
            else:
                self._adapt(key)

    def on_store_misses(self, keys: Sequence[bytes]) -> None:
        for key in keys:
            self._adapt(key)

    def _t1_target(self) -> float:
        """What |T1| is compared with when choosing the list to evict from."""
        return self.p

    def choose_victims(self, n: int, evictable: Evictable) -> list[bytes] | None:
        from_t1: Iterator[bytes] = (k for k, e in self.t1.items() if evictable(k, e))
        from_t2: Iterator[bytes] = (k for k, e in self.t2.items() if evictable(k, e))
        t1_len, target = len(self.t1), self._t1_target()
        victims: list[bytes] = []
        for _ in range(n):
            first, second = (from_t1, from_t2) if t1_len >= target else (from_t2, from_t1)
            key = next(first, None)
            if key is None:
                key = next(second, None)
            if key is None:
                return None
            if key in self.t1:
                t1_len -= 1
            victims.append(key)
        return victims

    def evict(self, victims: Sequence[bytes]) -> list[Resident]:
        entries = []
        for key in victims:
            src, ghosts = (self.t1, self.b1) if key in self.t1 else (self.t2, self.b2)
            entries.append(src.pop(key))
            ghosts[key] = None
        self._trim_ghosts()
        return entries

    def _trim_ghosts(self) -> None:
        for ghosts in (self.b1, self.b2):
            while len(ghosts) > self.capacity:
                ghosts.popitem(last=False)

    def state(self) -> dict:
        return {
            "t1": list(self.t1),
            "t2": list(self.t2),
            "b1": list(self.b1),
            "b2": list(self.b2),
            "p": self.p,
        }

    def clear(self) -> None:
        for lst in (self.t1, self.t2, self.b1, self.b2):
            lst.clear()
        self.p = 0


class RequestARCPolicy(ARCPolicy):
    """ARC under request-scoped recency (spec R5, R6): reuse is committed when the request
    finishes; a ghost hit also moves the ghost to its list's recent end; a request's new store
    misses are shown last to first; |T1| is compared with floor(p)."""

    def _adapt(self, key: bytes) -> None:
        ghosts = self.b1 if key in self.b1 else self.b2 if key in self.b2 else None
        super()._adapt(key)
        if ghosts is not None:
            ghosts.move_to_end(key)

    def on_store_misses(self, keys: Sequence[bytes]) -> None:
        super().on_store_misses(list(reversed(keys)))

    def _t1_target(self) -> float:
        return int(self.p)

    def commit(
        self, order: Sequence[bytes], insertion_only: set[bytes], reused: set[bytes]
    ) -> None:
        for key in reversed(order):  # tail first: the head ends most recent
            if key in insertion_only:  # a store is not a reuse: it keeps its list
                lst = self.t1 if key in self.t1 else self.t2 if key in self.t2 else None
                if lst is not None:
                    lst.move_to_end(key)
            elif key in reused:
                if key in self.t1:
                    self.t2[key] = self.t1.pop(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
