"""Eviction policies behind one small interface (``CachePolicy``), under either recency
semantics (spec section 4): ``touch`` (the classic rules) or ``request`` (request-scoped)."""

from .arc import ARCPolicy, RequestARCPolicy
from .base import CachePolicy
from .lru import LRUPolicy
from .ranked_lru import RankedLRUPolicy

RECENCIES = ("touch", "request")
POLICIES: dict[str, dict[str, type[CachePolicy]]] = {
    "lru": {"touch": LRUPolicy, "request": RankedLRUPolicy},
    "arc": {"touch": ARCPolicy, "request": RequestARCPolicy},
}


def make_policy(name: str, capacity: int, recency: str) -> CachePolicy:
    try:
        by_recency = POLICIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"cache_policy must be one of {sorted(POLICIES)}, got {name!r}") from None
    if recency not in RECENCIES:
        raise ValueError(f"recency must be one of {list(RECENCIES)}, got {recency!r}")
    return by_recency[recency](capacity)


__all__ = [
    "ARCPolicy",
    "CachePolicy",
    "LRUPolicy",
    "POLICIES",
    "RECENCIES",
    "RankedLRUPolicy",
    "RequestARCPolicy",
    "make_policy",
]
