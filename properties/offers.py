"""Who offered what: the one record of requests and their offers, read by the oracle (spec
A2's bound on a tracked count) and by the scheduler audit (cold admissions).

``Handles`` names request contexts: one int per context object, so that a new context is a new
request even when its ``req_id`` (or, after it is freed, its ``id``) is reused. It holds each
context by a weak reference, so it never keeps a finished request alive (a context type that
cannot be weakly referenced is held until ``release``). Machines that drive two managers over
the same requests share one ``Handles``.

``Offers`` counts, per key, the distinct (request, generation) pairs that offered it: since the
key last entered the tracker (``since_entry``) and ever (``ever``). A reset starts every
request's offers over (spec A7), so the pairs of a new generation are new offerers.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

Who = tuple[int, int]  # (request handle, generation)


def _holder(ctx: Any) -> Callable[[], Any]:
    try:
        return weakref.ref(ctx)
    except TypeError:  # no weak references to this type: hold it
        return lambda: ctx


class Handles:
    def __init__(self) -> None:
        # id(ctx) -> (a reference to ctx, handle, name)
        self._by_id: dict[int, tuple[Callable[[], Any], int, str]] = {}
        self._next = 0

    def _entry(self, ctx: Any):
        entry = self._by_id.get(id(ctx))
        return entry if entry is not None and entry[0]() is ctx else None

    def of(self, ctx: Any) -> int:
        entry = self._entry(ctx)
        if entry is None:
            entry = (_holder(ctx), self._next, "")
            self._next += 1
            self._by_id[id(ctx)] = entry
        return entry[1]

    def name(self, ctx: Any, text: str) -> None:
        """How ``ctx`` is written in a divergence (a machine's bundle name)."""
        handle = self.of(ctx)
        self._by_id[id(ctx)] = (self._by_id[id(ctx)][0], handle, text)

    def name_of(self, ctx: Any) -> str:
        entry = self._entry(ctx)
        return entry[2] if entry is not None and entry[2] else repr(ctx)

    def release(self, ctx: Any) -> None:
        if self._entry(ctx) is not None:
            del self._by_id[id(ctx)]


class Offers:
    def __init__(self) -> None:
        self.generation = 0
        self._ever: dict[bytes, set[Who]] = {}
        self._since_entry: dict[bytes, set[Who]] = {}

    def offered(self, keys: Iterable[bytes], req: int, tracked_before: set[bytes]) -> None:
        """``req`` offered ``keys``; ``tracked_before``: the keys tracked before the offer (a
        key outside it enters the tracker now, or tries to, so its offerers start over)."""
        who = (req, self.generation)
        for key in keys:
            self._ever.setdefault(key, set()).add(who)
            since = self._since_entry.get(key) if key in tracked_before else None
            if since is None:
                self._since_entry[key] = {who}
            else:
                since.add(who)

    def reset(self) -> None:
        self.generation += 1

    def ever(self, key: bytes) -> int:
        return len(self._ever.get(key, ()))

    def since_entry(self, key: bytes) -> int:
        return len(self._since_entry.get(key, ()))
