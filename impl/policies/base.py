"""The interface between the manager and an eviction policy.

A policy holds the resident keys, in its order, each with its ``Resident`` entry (chunk id and
ref count). Keeping the entry in the policy's own ordered map means one large map per key: an
eviction reads the entry it walks over instead of looking the key up again in other maps,
whose entries are cold in a large cache (bench/manager_scaling.py). The manager decides which
entries may be evicted through a predicate; ``choose_victims`` has no side effects, so the
manager can give up (return ``None``) without having evicted anything.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Protocol

PENDING = -1
Position = Callable[[bytes], "int | None"]


class RequestRank(Protocol):
    """What a policy may keep of one request (the manager's per-request record): a rank, taken
    when the policy first needs one."""

    rank: int | None


class Resident:
    """One resident key's chunk id and ref count: ``PENDING`` (-1) while its store is in
    flight, 0 when idle, n > 0 while n loads read from it."""

    __slots__ = ("chunk", "ref")

    def __init__(self, chunk: int):
        self.chunk = chunk
        self.ref = PENDING

    @property
    def ready(self) -> bool:
        return self.ref != PENDING


Evictable = Callable[[bytes, Resident], bool]


class CachePolicy(ABC):
    def __init__(self, capacity: int):
        self.capacity = capacity

    @abstractmethod
    def get(self, key: bytes) -> Resident | None:
        """The entry of a resident key, or ``None``."""

    def insert(
        self,
        key: bytes,
        entry: Resident,
        req: RequestRank | None = None,
        position: int | None = None,
    ) -> None:
        """A newly stored (pending) key; ``req`` and ``position``: the storing request and the
        key's position in it (request-scoped recency only)."""
        if req is None or position is None:
            self._add(key, entry)
        else:
            self._add_at(key, entry, req, position)

    @abstractmethod
    def _add(self, key: bytes, entry: Resident) -> None:
        """Place a newly stored key as any store places it."""

    def _add_at(self, key: bytes, entry: Resident, req: RequestRank, position: int) -> None:
        """Place a newly stored key at ``position`` in ``req``; a policy that orders keys
        without positions places it as any store."""
        self._add(key, entry)

    @abstractmethod
    def remove(self, key: bytes) -> Resident:
        """Forget a resident key without remembering it (a failed store)."""

    @abstractmethod
    def touch(self, keys: Sequence[bytes]) -> None:
        """Recency hint for ``keys``, walked from last to first."""

    def on_store_misses(self, keys: Sequence[bytes]) -> None:
        """Admitted keys absent from the cache, each shown once per request."""

    def first_sight(self, keys: Sequence[bytes], req: RequestRank, position: Position) -> None:
        """Keys a request shows for the first time (request-scoped recency, spec R2)."""

    def commit(
        self, order: Sequence[bytes], insertion_only: set[bytes], reused: set[bytes]
    ) -> None:
        """A finished request's keys, head to tail (request-scoped recency, spec R3)."""

    @abstractmethod
    def choose_victims(self, n: int, evictable: Evictable) -> list[bytes] | None:
        """``n`` keys to evict, in eviction order, or ``None`` if there are fewer."""

    @abstractmethod
    def evict(self, victims: Sequence[bytes]) -> list[Resident]:
        """Apply a choice made by ``choose_victims``; the victims' entries, in order."""

    @abstractmethod
    def state(self) -> dict:
        """The policy's order as plain lists (least recent first), for inspection."""

    @abstractmethod
    def clear(self) -> None:
        """Forget everything (a cache reset)."""
