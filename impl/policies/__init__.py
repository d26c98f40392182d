"""Eviction policies behind one small interface (``CachePolicy``)."""
from .arc import ARCPolicy
from .base import CachePolicy
from .lru import LRUPolicy

POLICIES: dict[str, type[CachePolicy]] = {"lru": LRUPolicy, "arc": ARCPolicy}


def make_policy(name: str, capacity: int) -> CachePolicy:
    try:
        cls = POLICIES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"cache_policy must be one of {sorted(POLICIES)}, got {name!r}") from None
    return cls(capacity)


__all__ = ["ARCPolicy", "CachePolicy", "LRUPolicy", "POLICIES", "make_policy"]
