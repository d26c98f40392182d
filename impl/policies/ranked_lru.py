"""LRU over ranks: request-scoped recency (spec R4), as vLLM 0.33.0 and 0.34.0 order chunks.

Every resident key has a rank, a pair compared as a pair; the lowest-ranked idle key outside the
offer is evicted first, ties broken by the key. One counter hands out both kinds of rank:
a *fresh* rank ``(counter, 0)`` is newer than everything so far, and a request's own rank
(taken when the request first needs one) places its keys at ``(request rank, -position)``, so
that within one request a tail goes before its head. Ranks are kept for pending and pinned
keys too: recency can change while a chunk cannot be evicted.

Victims are found in a heap of ``(rank, key)`` entries that is never updated in place: a rank
change pushes a new entry and the old one is recognised as stale when it comes up.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from .base import CachePolicy, Evictable, Position, RequestRank, Resident

Rank = tuple[int, int]


class RankedLRUPolicy(CachePolicy):
    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.entries: dict[bytes, Resident] = {}
        self.ranks: dict[bytes, Rank] = {}
        self._heap: list[tuple[Rank, bytes]] = []
        self._counter = 0

    # --- ranks
    def _set(self, key: bytes, rank: Rank) -> None:
        self.ranks[key] = rank
        heapq.heappush(self._heap, (rank, key))
        if len(self._heap) > 2 * len(self.ranks) + 64:  # mostly stale: rebuild
            self._heap = [(r, k) for k, r in self.ranks.items()]
            heapq.heapify(self._heap)

    def _fresh(self, key: bytes) -> None:
        self._counter += 1
        self._set(key, (self._counter, 0))

    def _request_rank(self, req: RequestRank) -> int:
        if req.rank is None:
            self._counter += 1
            req.rank = self._counter
        return req.rank

    # --- the policy interface
    def get(self, key: bytes) -> Resident | None:
        return self.entries.get(key)

    def _add(self, key: bytes, entry: Resident) -> None:
        self.entries[key] = entry
        self._fresh(key)

    def _add_at(self, key: bytes, entry: Resident, req: RequestRank, position: int) -> None:
        self.entries[key] = entry
        self._set(key, (self._request_rank(req), -position))

    def remove(self, key: bytes) -> Resident:
        del self.ranks[key]
        return self.entries.pop(key)

    def touch(self, keys: Sequence[bytes]) -> None:
        for key in reversed(keys):
            if key in self.entries:
                self._fresh(key)

    def first_sight(self, keys: Sequence[bytes], req: RequestRank, position: Position) -> None:
        rank = self._request_rank(req)
        for key in keys:
            pos = position(key)
            if pos is not None and key in self.entries and self.ranks[key] < (rank, -pos):
                self._set(key, (rank, -pos))

    def commit(
        self, order: Sequence[bytes], insertion_only: set[bytes], reused: set[bytes]
    ) -> None:
        for key in reversed(order):  # tail first: the head gets the newest rank
            if key in self.entries:
                self._fresh(key)

    def choose_victims(self, n: int, evictable: Evictable) -> list[bytes] | None:
        if n <= 0:
            return []
        looked: list[tuple[Rank, bytes]] = []
        seen: set[bytes] = set()
        victims: list[bytes] = []
        while self._heap and len(victims) < n:
            rank, key = heapq.heappop(self._heap)
            if self.ranks.get(key) != rank or key in seen:
                continue  # stale, or a second entry of the same rank
            seen.add(key)
            looked.append((rank, key))
            if evictable(key, self.entries[key]):
                victims.append(key)
        for item in looked:  # the choice changes nothing: every current entry goes back
            heapq.heappush(self._heap, item)
        return victims if len(victims) == n else None

    def evict(self, victims: Sequence[bytes]) -> list[Resident]:
        return [self.remove(key) for key in victims]

    def state(self) -> dict:
        return {"lru": sorted(self.ranks, key=lambda k: (self.ranks[k], k))}

    def clear(self) -> None:
        self.entries.clear()
        self.ranks.clear()
        self._heap.clear()
        self._counter = 0
