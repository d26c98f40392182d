"""The CPU offloading manager: SPEC sections 2 to 5 and 8.

Chunks are ``pending`` (ref -1, store in flight), ``idle`` (ref 0, evictable) or ``pinned``
(ref n > 0, n loads in flight). The policy holds the resident keys in its order, each with its
``Resident`` entry (chunk id and ref count); the pool hands out chunk ids; the tracker decides
admission when ``store_threshold >= 2``.

Per-request records (keys counted, skips counted, store misses shown to the policy) live in
the request's context, tagged with this manager and its generation: a reset bumps the
generation, so every request starts counting over without any list to clean (A7).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from .base import (
    LookupResult,
    OffloadingEvent,
    OffloadProtocolError,
    PrepareStoreOutput,
    ReqContext,
    Stats,
)
from .policies import make_policy
from .policies.base import PENDING, Resident
from .pool import ChunkPool
from .tracker import AdmissionTracker


class RequestRecord:
    """What one request has done in one generation of one manager."""

    __slots__ = ("owner", "generation", "counted", "skipped", "missed")

    def __init__(self, owner: object, generation: int):
        self.owner = owner
        self.generation = generation
        self.counted: set[bytes] = set()  # keys counted toward the threshold
        self.skipped: set[bytes] = set()  # keys whose skip is in the metric
        self.missed: set[bytes] = set()  # store misses shown to the policy


def _check_keys(keys: Iterable[bytes]) -> list[bytes]:
    keys = list(keys)
    for key in keys:
        if not isinstance(key, bytes):
            raise TypeError(f"offload keys must be bytes, got {key!r}")
    return keys


class OffloadingManager:
    def __init__(self, num_chunks: int, cache_policy: str = "lru", enable_events: bool = True,
                 store_threshold: int = 1, max_tracker_size: int = 64_000):
        for name, value, low in (("num_chunks", num_chunks, 0),
                                 ("store_threshold", store_threshold, 0),
                                 ("max_tracker_size", max_tracker_size, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        self.num_chunks = num_chunks
        self.store_threshold = store_threshold
        self._policy = make_policy(cache_policy, num_chunks)
        self.cache_policy = cache_policy
        self._pool = ChunkPool(num_chunks)
        self._num_pending = 0
        self._num_pinned = 0
        self.tracker = (AdmissionTracker(store_threshold, max_tracker_size)
                        if store_threshold >= 2 else None)
        self.generation = 0
        self._token = object()
        self._events: list[OffloadingEvent] | None = [] if enable_events else None
        self._skipped = 0
        self._allocation_sizes: list[int] = []

    # --- per-request records ---

    def _record(self, ctx: ReqContext) -> RequestRecord:
        rec = ctx.get_state(RequestRecord)
        if rec is None or rec.owner is not self._token or rec.generation != self.generation:
            rec = RequestRecord(self._token, self.generation)
            ctx.set_state(rec)
        return rec

    # --- residency ---

    def _is_resident(self, key: bytes) -> bool:
        return self._policy.get(key) is not None

    @staticmethod
    def _evictable(entry: Resident) -> bool:
        return entry.ref == 0

    def _emit(self, keys: Sequence[bytes], removed: bool, metadata_only: bool = False) -> None:
        if keys and self._events is not None:
            self._events.append(OffloadingEvent(tuple(keys), removed, metadata_only))

    # --- OffloadingManager interface ---

    def on_new_request(self, ctx: ReqContext) -> None:
        self._record(ctx)

    def on_request_finished(self, ctx: ReqContext) -> None:
        pass  # the records go with the context

    def lookup(self, key: bytes, ctx: ReqContext | None = None) -> LookupResult:
        _check_keys([key])
        entry = self._policy.get(key)
        if entry is None:
            return LookupResult.MISS
        return LookupResult.HIT if entry.ready else LookupResult.HIT_PENDING

    def prepare_load(self, keys: Iterable[bytes], ctx: ReqContext | None = None) -> list[int]:
        keys = _check_keys(keys)
        entries = [self._policy.get(key) for key in keys]
        for key, entry in zip(keys, entries):
            if entry is None or not entry.ready:
                state = "not resident" if entry is None else "pending"
                raise OffloadProtocolError(f"prepare_load: key {key!r} is {state}")
        for entry in entries:
            if entry.ref == 0:
                self._num_pinned += 1
            entry.ref += 1
        return [entry.chunk for entry in entries]

    def complete_load(self, keys: Iterable[bytes], ctx: ReqContext | None = None) -> None:
        keys = _check_keys(keys)
        loads = Counter(keys)
        entries = {key: self._policy.get(key) for key in loads}
        for key, n in loads.items():
            if entries[key] is None or entries[key].ref < n:  # a pending entry's ref is -1
                raise OffloadProtocolError(f"complete_load: key {key!r} is not pinned")
        for key in keys:
            entry = entries[key]
            entry.ref -= 1
            if entry.ref == 0:
                self._num_pinned -= 1

    def touch(self, keys: Iterable[bytes], ctx: ReqContext | None = None) -> None:
        self._policy.touch(_check_keys(keys))

    def prepare_store(self, keys: Iterable[bytes], ctx: ReqContext) -> PrepareStoreOutput | None:
        offer = self._dedupe(_check_keys(keys))
        if not callable(getattr(ctx, "get_state", None)):
            raise TypeError(f"prepare_store needs a request context, got {ctx!r}")
        rec = self._record(ctx)
        if self.tracker is None:
            admitted = [k for k in offer if not self._is_resident(k)]
        else:
            admitted, new_skips = self.tracker.admit(
                offer, rec.counted, rec.skipped, self._is_resident)
            self._skipped += new_skips
        if not admitted:
            return PrepareStoreOutput([], [], [])
        self._allocation_sizes.append(len(admitted))
        for key in admitted:
            if key not in rec.missed:
                rec.missed.add(key)
                self._policy.on_store_miss(key)
        victims = self._choose_victims(len(admitted) - self._pool.free_count, offer)
        if victims is None:
            return None
        self._evict(victims)
        chunk_ids = self._pool.allocate(len(admitted))
        for key, chunk in zip(admitted, chunk_ids):
            self._policy.insert(key, Resident(chunk))
        self._num_pending += len(admitted)
        return PrepareStoreOutput(admitted, chunk_ids, victims)

    @staticmethod
    def _dedupe(keys: list[bytes]) -> list[bytes]:
        """A key repeated inside one offer is one offer of it."""
        return list(dict.fromkeys(keys))

    def _choose_victims(self, need: int, offer: Sequence[bytes]) -> list[bytes] | None:
        if need <= 0:
            return []
        protected = set(offer)
        return self._policy.choose_victims(
            need, lambda k, entry: self._evictable(entry) and k not in protected)

    def _evict(self, victims: Sequence[bytes]) -> None:
        for entry in self._policy.evict(victims):
            self._pool.release(entry.chunk)
        self._emit(victims, removed=True)

    def complete_store(self, keys: Iterable[bytes], ctx: ReqContext | None = None,
                       success: bool = True) -> None:
        keys = _check_keys(keys)
        entries = {key: self._policy.get(key) for key in keys}
        pending = [k for k, e in entries.items() if e is not None and e.ref == PENDING]
        self._num_pending -= len(pending)
        for key in pending:
            if success:
                entries[key].ref = 0
            else:
                self._drop_failed(key)
        self._emit(pending, removed=not success, metadata_only=not success)

    def _drop_failed(self, key: bytes) -> None:
        self._pool.release(self._policy.remove(key).chunk)

    def reset_cache(self) -> None:
        self._policy.clear()
        self._pool.reset()
        self._num_pending = self._num_pinned = 0
        self.generation += 1

    def take_events(self) -> list[OffloadingEvent]:
        if self._events is None:
            return []
        events, self._events = self._events, []
        return [drained for event in events if (drained := self._still_news(event))]

    def _still_news(self, event: OffloadingEvent) -> OffloadingEvent | None:
        """A metadata-only removal (a failed store) loses the keys that are resident again by
        the time the events are drained: a later offer re-admitted them (SPEC section 5)."""
        if not event.metadata_only:
            return event
        keys = tuple(k for k in event.keys if not self._is_resident(k))
        if len(keys) == len(event.keys):
            return event
        return OffloadingEvent(keys, event.removed, True) if keys else None

    def get_stats(self) -> Stats:
        n = self.num_chunks
        write = self._num_pending / n if n else 0.0
        read = self._num_pinned / n if n else 0.0
        stats = Stats(
            stores_skipped=self._skipped if self.tracker is not None else None,
            allocation_sizes=self._allocation_sizes,
            cache_usage=write + read, write_usage=write, read_usage=read)
        self._skipped = 0
        self._allocation_sizes = []
        return stats

    # --- inspection (for invariants and tests; not part of the protocol) ---

    def ref_count(self, key: bytes) -> int | None:
        entry = self._policy.get(key)
        return None if entry is None else entry.ref

    def chunk_of(self, key: bytes) -> int | None:
        entry = self._policy.get(key)
        return None if entry is None else entry.chunk

    def policy_state(self) -> dict:
        return self._policy.state()

    @property
    def free_chunks(self) -> int:
        return self._pool.free_count
