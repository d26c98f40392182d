"""The CPU offloading manager: spec §2-§5 and §8.

Chunks are ``pending`` (ref -1, store in flight), ``idle`` (ref 0, evictable) or ``pinned``
(ref n > 0, n loads in flight). The policy holds the resident keys in its order, each with its
``Resident`` entry (chunk id and ref count); the pool hands out chunk ids; the tracker decides
admission when ``store_threshold >= 2``.

Per-request records (keys counted, skips counted, store misses shown to the policy, and under
request-scoped recency what the request saw, inserted and reused) live in the request's
context, tagged with this manager and its generation: a reset bumps the generation, so every
request starts counting over without any list to clean (spec A7).

Two recency semantics (spec section 4), a constructor choice: ``recency="touch"`` (the policy
learns from ``touch`` and inserts) and ``recency="request"`` (spec R1-R7: each request's
accesses are shown to the policy at first sight and committed, head to tail by the keys'
positions in the request, when it finishes; ``touch`` is still honoured).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from .base import (
    CHUNK_LEVEL,
    HOST,
    LookupResult,
    OffloadingEvent,
    OffloadProtocolError,
    PrepareStoreOutput,
    ReqContext,
    Stats,
    key_group,
)
from .policies import make_policy
from .policies.base import PENDING, Resident
from .pool import ChunkPool
from .tracker import AdmissionTracker


class RequestRecord:
    """What one request has done in one generation of one manager."""

    __slots__ = (
        "owner",
        "generation",
        "counted",
        "skipped",
        "misses",
        "seen",
        "inserted",
        "reused",
        "committed",
        "rank",
    )

    def __init__(self, owner: object, generation: int):
        self.owner = owner
        self.generation = generation
        self.counted: set[bytes] = set()  # keys counted toward the threshold
        self.skipped: set[bytes] = set()  # keys whose skip is in the metric
        self.misses: set[bytes] = set()  # admitted store misses shown to the policy
        # request-scoped recency (spec R1): first-sight order, what it stored and reused
        self.seen: dict[bytes, None] = {}
        self.inserted: set[bytes] = set()
        self.reused: set[bytes] = set()
        self.committed = False
        self.rank: int | None = None  # the policy's rank for this request, when it needs one


def _no_position(key: bytes) -> None:
    return None


def _positions(ctx: object):
    """The request's key positions (``ReqContext.get_offload_key_position``), if it has any."""
    return getattr(ctx, "get_offload_key_position", None) or _no_position


def _ordered(keys: list[bytes], position) -> list[bytes]:
    """``keys`` by position when every one has a position, else as they are (stable)."""
    positions = [position(k) for k in keys]
    if None in positions:
        return keys
    by_key = dict(zip(keys, positions))
    return sorted(keys, key=by_key.__getitem__)


def _check_keys(keys: Iterable[bytes]) -> list[bytes]:
    keys = list(keys)
    for key in keys:
        if not isinstance(key, bytes):
            raise TypeError(f"offload keys must be bytes, got {key!r}")
    return keys


class OffloadingManager:
    def __init__(
        self,
        num_chunks: int,
        *,
        store_threshold: int = 1,
        max_tracker_size: int = 64_000,
        cache_policy: str = "lru",
        enable_events: bool = True,
        recency: str = "touch",
    ):
        for name, value, low in (
            ("num_chunks", num_chunks, 0),
            ("store_threshold", store_threshold, 0),
            ("max_tracker_size", max_tracker_size, 1),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        self.num_chunks = num_chunks
        self.store_threshold = store_threshold
        self._policy = make_policy(cache_policy, num_chunks, recency)
        self.cache_policy = cache_policy
        self.recency = recency
        self._request_scoped = recency == "request"
        self._pool = ChunkPool(num_chunks)
        self._num_pending = 0
        self._num_pinned = 0
        self.tracker = (
            AdmissionTracker(store_threshold, max_tracker_size) if store_threshold >= 2 else None
        )
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

    def on_new_request(self, ctx: ReqContext) -> str:
        self._record(ctx)
        return CHUNK_LEVEL

    def on_request_finished(self, ctx: ReqContext) -> None:
        """Request-scoped recency: commit the request's accesses once, head to tail (spec R3);
        a record of another manager or an older generation commits nothing."""
        rec = ctx.get_state(RequestRecord)
        if not self._request_scoped or rec is None or not self._committable(rec):
            return
        rec.committed = True
        order = self._commit_order(rec, _positions(ctx))
        self._policy.commit(order, rec.inserted - rec.reused, rec.reused)

    def _committable(self, rec: RequestRecord) -> bool:
        return rec.owner is self._token and rec.generation == self.generation and not rec.committed

    @staticmethod
    def _commit_order(rec: RequestRecord, position) -> list[bytes]:
        """The request's keys head to tail: per group (in group order) by position, then all
        of them by position, each sort only where every key has a position (spec R3)."""
        groups: dict[int, list[bytes]] = {}
        for key in rec.seen:
            groups.setdefault(key_group(key), []).append(key)
        return _ordered(
            [k for g in sorted(groups) for k in _ordered(groups[g], position)], position
        )

    def _access(
        self, rec: RequestRecord, keys: Sequence[bytes], reused: Sequence[bytes], ctx: ReqContext
    ) -> None:
        """Spec R1, R2: what the request saw (new keys shown to the policy) and reused. Its
        callers have refused a recording that would show a finished request a new key (R3)."""
        new = [key for key in keys if key not in rec.seen]
        if new:
            rec.seen.update(dict.fromkeys(new))
            self._policy.first_sight(new, rec, _positions(ctx))
        rec.reused.update(self._reuses(rec, reused))

    @staticmethod
    def _reuses(rec: RequestRecord, keys: Sequence[bytes]) -> list[bytes]:
        """Of the ready keys a request read, those that are reuses: not the ones it inserted
        itself (re-reading its own store is not a second use, spec R1)."""
        return [key for key in keys if key not in rec.inserted]

    def get_load_source(self, key: bytes, ctx: ReqContext | None = None) -> str:
        """Where a hit comes from: this manager's one tier, the CPU (host) memory."""
        if self.lookup(key, ctx) is not LookupResult.HIT:
            raise OffloadProtocolError(f"get_load_source: key {key!r} is not a hit")
        return HOST

    def config_info(self) -> list[dict]:
        return [{}]

    def has_pending_work(self) -> bool:
        return False

    def lookup(self, key: bytes, ctx: ReqContext | None = None) -> LookupResult:
        _check_keys([key])
        entry = self._policy.get(key)
        if entry is None:
            return LookupResult.MISS
        return LookupResult.HIT if entry.ready else LookupResult.HIT_PENDING

    def prepare_load(self, keys: Iterable[bytes], ctx: ReqContext | None = None) -> list[int]:
        keys = _check_keys(keys)
        entries: list[Resident] = []
        for key in keys:
            entry = self._policy.get(key)
            if entry is None or not entry.ready:
                state = "not resident" if entry is None else "pending"
                raise OffloadProtocolError(f"prepare_load: key {key!r} is {state}")
            entries.append(entry)
        rec = None
        if self._request_scoped:
            # checked first: a refused load changes nothing
            ctx = self._context(ctx, "prepare_load")
            rec = self._record(ctx)
            if rec.committed and any(key not in rec.seen for key in keys):
                raise OffloadProtocolError(f"prepare_load: {ctx!r} has finished")
        for entry in entries:
            if entry.ref == 0:
                self._num_pinned += 1
            entry.ref += 1
        if rec is not None and ctx is not None:
            self._access(rec, keys, keys, ctx)
        return [entry.chunk for entry in entries]

    @staticmethod
    def _context(ctx: object, call: str) -> ReqContext:
        if not callable(getattr(ctx, "get_state", None)):
            raise TypeError(f"{call} needs a request context, got {ctx!r}")
        return ctx  # type: ignore[return-value]

    def complete_load(self, keys: Iterable[bytes], ctx: ReqContext | None = None) -> None:
        keys = _check_keys(keys)
        loads = Counter(keys)
        entries: dict[bytes, Resident] = {}
        for key, n in loads.items():
            entry = self._policy.get(key)
            if entry is None or entry.ref < n:  # a pending entry's ref is -1
                raise OffloadProtocolError(f"complete_load: key {key!r} is not pinned")
            entries[key] = entry
        for key in keys:
            entry = entries[key]
            entry.ref -= 1
            if entry.ref == 0:
                self._num_pinned -= 1

    def touch(self, keys: Iterable[bytes], ctx: ReqContext | None = None) -> None:
        self._policy.touch(_check_keys(keys))

    def prepare_store(self, keys: Iterable[bytes], ctx: ReqContext) -> PrepareStoreOutput | None:
        offer = self._dedupe(_check_keys(keys))
        rec = self._record(self._context(ctx, "prepare_store"))
        if self._request_scoped and rec.committed:
            raise OffloadProtocolError(f"prepare_store: {ctx!r} has finished")
        if self.tracker is None:
            admitted = [k for k in offer if not self._is_resident(k)]
        else:
            admitted, new_skips = self.tracker.admit(
                offer, rec.counted, rec.skipped, self._is_resident
            )
            self._skipped += new_skips
        misses = [key for key in admitted if key not in rec.misses]  # once per request
        rec.misses.update(misses)
        self._policy.on_store_misses(misses)
        if self._request_scoped:  # recorded before the allocation check: a None keeps it
            ready = self._ready_in(offer)
            recorded = set(admitted).union(ready)
            self._access(rec, [k for k in offer if k in recorded], ready, ctx)
        if not admitted:
            return PrepareStoreOutput([], [], [])
        self._allocation_sizes.append(len(admitted))
        victims = self._choose_victims(len(admitted) - self._pool.free_count, offer)
        if victims is None:
            return None
        self._evict(victims)
        chunk_ids = self._pool.allocate(len(admitted))
        position = _positions(ctx) if self._request_scoped else _no_position
        req = rec if self._request_scoped else None
        for key, chunk in zip(admitted, chunk_ids):
            self._policy.insert(key, Resident(chunk), req, position(key))
        rec.inserted.update(admitted)
        self._num_pending += len(admitted)
        return PrepareStoreOutput(admitted, chunk_ids, victims)

    def _ready_in(self, offer: Sequence[bytes]) -> list[bytes]:
        """The offer's keys that are resident and ready: reuses (spec R1)."""
        return [k for k in offer if (e := self._policy.get(k)) is not None and e.ready]

    @staticmethod
    def _dedupe(keys: list[bytes]) -> list[bytes]:
        """A key repeated inside one offer is one offer of it."""
        return list(dict.fromkeys(keys))

    def _choose_victims(self, need: int, offer: Sequence[bytes]) -> list[bytes] | None:
        if need <= 0:
            return []
        protected = set(offer)
        return self._policy.choose_victims(
            need, lambda k, entry: self._evictable(entry) and k not in protected
        )

    def _evict(self, victims: Sequence[bytes]) -> None:
        for entry in self._policy.evict(victims):
            self._pool.release(entry.chunk)
        self._emit(victims, removed=True)

    def complete_store(
        self, keys: Iterable[bytes], ctx: ReqContext | None = None, success: bool = True
    ) -> None:
        keys = _check_keys(keys)
        pending: dict[bytes, Resident] = {}
        for key in keys:
            entry = self._policy.get(key)
            if entry is not None and entry.ref == PENDING:
                pending[key] = entry
        self._num_pending -= len(pending)
        for key, entry in pending.items():
            if success:
                entry.ref = 0
            else:
                self._drop_failed(key)
        self._emit(list(pending), removed=not success, metadata_only=not success)

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
        the time the events are drained: a later offer re-admitted them (spec §5)."""
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
            cache_usage=write + read,
            write_usage=write,
            read_usage=read,
        )
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
