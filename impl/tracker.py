"""The admission tracker: spec §3, A2-A6.

``AdmissionTracker`` holds key -> count in recency order (least recent first), at most
``max_size`` keys. ``admit`` records one offer for one request and says which absent keys pass
the threshold. The per-request records (``counted``, ``skipped``) belong to the caller: the
manager keeps them in the request's context, per generation.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence


class AdmissionTracker:
    def __init__(self, threshold: int, max_size: int):
        self.threshold = threshold
        self.max_size = max_size
        self.counts: OrderedDict[bytes, int] = OrderedDict()

    def count(self, key: bytes) -> int:
        return self.counts.get(key, 0)

    def passes(self, count: int) -> bool:
        return count >= self.threshold

    def record(self, offer: Sequence[bytes], counted: set[bytes]) -> None:
        """Spec A2 and A4: ``offer`` is deduplicated; ``counted`` is this request's record."""
        for key in offer:  # tracked keys first: count once per request, refresh always
            if key in self.counts:
                self._recount(key, counted)
        protected = set(offer)
        for key in offer:  # then untracked keys, in order: each enters with count 1, also when
            if key not in self.counts:  # this request counted it before the tracker dropped it
                counted.add(key)
                self._enter(key, protected)

    def _recount(self, key: bytes, counted: set[bytes]) -> None:
        if key not in counted:
            counted.add(key)
            self.counts[key] += 1
        self.counts.move_to_end(key)

    def _enter(self, key: bytes, protected: set[bytes]) -> None:
        if len(self.counts) >= self.max_size and not self._make_room(protected):
            return  # every tracked key belongs to the offer: the new key stays untracked
        self.counts[key] = 1

    def _make_room(self, protected: set[bytes]) -> bool:
        """Push out the least recent key outside the offer; False if every key is in it."""
        # Every key of the offer that is tracked sits at the recent end by now, so the
        # least recent key is unprotected unless all of them are.
        oldest = next(iter(self.counts))
        if oldest in protected:
            return False
        del self.counts[oldest]
        return True

    def admit(
        self,
        offer: Sequence[bytes],
        counted: set[bytes],
        skipped: set[bytes],
        is_resident: Callable[[bytes], bool],
    ) -> tuple[list[bytes], int]:
        """Record ``offer`` and filter its absent keys: (admitted keys, new skips). Spec A5, A6."""
        self.record(offer, counted)
        admitted: list[bytes] = []
        new_skips = 0
        for key in offer:
            if is_resident(key):
                continue
            if self.passes(self.count(key)):
                admitted.append(key)
            elif key not in skipped:
                skipped.add(key)
                new_skips += 1
        return admitted, new_skips

    def clear(self) -> None:
        self.counts.clear()
