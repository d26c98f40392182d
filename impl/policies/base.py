"""The interface between the manager and an eviction policy.

A policy orders resident keys; the manager owns chunks, ref counts and readiness and tells the
policy which keys may be evicted through a predicate. ``choose_victims`` has no side effects, so
the manager can give up (return ``None``) without having evicted anything.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

Predicate = Callable[[bytes], bool]


class CachePolicy(ABC):
    def __init__(self, capacity: int):
        self.capacity = capacity

    @abstractmethod
    def insert(self, key: bytes) -> None:
        """A newly stored (pending) key."""

    @abstractmethod
    def remove(self, key: bytes) -> None:
        """Forget a resident key without remembering it (a failed store)."""

    @abstractmethod
    def touch(self, keys: Sequence[bytes], is_ready: Predicate) -> None:
        """Recency hint for ``keys``, walked from last to first."""

    def on_store_miss(self, key: bytes) -> None:
        """An admitted key that is absent from the cache, shown once per request."""

    @abstractmethod
    def choose_victims(self, n: int, evictable: Predicate) -> list[bytes] | None:
        """``n`` keys to evict, in eviction order, or ``None`` if there are fewer."""

    @abstractmethod
    def evict(self, victims: Sequence[bytes]) -> None:
        """Apply a choice made by ``choose_victims``."""

    @abstractmethod
    def state(self) -> dict:
        """The policy's order as plain lists (least recent first), for inspection."""

    @abstractmethod
    def clear(self) -> None:
        """Forget everything (a cache reset)."""
