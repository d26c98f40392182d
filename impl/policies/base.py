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

PENDING = -1


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

    @abstractmethod
    def insert(self, key: bytes, entry: Resident) -> None:
        """A newly stored (pending) key."""

    @abstractmethod
    def remove(self, key: bytes) -> Resident:
        """Forget a resident key without remembering it (a failed store)."""

    @abstractmethod
    def touch(self, keys: Sequence[bytes]) -> None:
        """Recency hint for ``keys``, walked from last to first."""

    def on_store_miss(self, key: bytes) -> None:
        """An admitted key that is absent from the cache, shown once per request."""

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
