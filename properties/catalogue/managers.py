"""The catalogue of known-bad managers: each a small named variant of impl's manager.

Every property the machines check has at least one variant here that breaks it; the tests run
each variant and require the machine to catch it with a short counterexample. A variant's
docstring says what it breaks. ``MUTANTS`` maps a name to a ``Mutant`` (factory, the policies
under which the bug shows, and whether the scheduler path alone must catch it).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, replace

from kvgate.impl.base import HOST, LookupResult
from kvgate.impl.manager import PENDING, OffloadingManager, RequestRecord
from kvgate.impl.policies import ARCPolicy, CachePolicy, RankedLRUPolicy, RequestARCPolicy
from kvgate.impl.pool import ChunkPool
from kvgate.impl.tracker import AdmissionTracker


def _with_tracker(tracker_cls):
    """A manager class whose admission tracker is ``tracker_cls``."""

    class Manager(OffloadingManager):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if self.tracker is not None:
                self.tracker = tracker_cls(self.tracker.threshold, self.tracker.max_size)

    return Manager


# --- admission: counting, the skip metric, resets (the rule the project exists for) ---


class EveryOfferCounts(OffloadingManager):
    """Upstream before the fix: every offer counts (retries and re-offers too), and so does
    every skip and every ARC store miss."""

    def _record(self, ctx):
        return RequestRecord(self._token, self.generation)


class DedupFailedRetriesOnly(OffloadingManager):
    """The fix's first commit: only retries of failed offers are deduplicated; once an offer
    succeeds the request forgets what it counted, so its re-offers after preemption count."""

    def prepare_store(self, keys, ctx):
        out = super().prepare_store(keys, ctx)
        if out is not None:
            self._record(ctx).counted.clear()
        return out


class SkipMetricEveryOffer(OffloadingManager):
    """Counting is right but the skip metric counts a key's skip at every offer."""

    def _record(self, ctx):
        rec = super()._record(ctx)
        rec.skipped.clear()
        return rec


class _ContextRecordCheck(OffloadingManager):
    """Records in the context, kept while ``_still_valid`` says so (impl checks both the
    manager and the generation)."""

    def _still_valid(self, rec) -> bool:
        raise NotImplementedError

    def _record(self, ctx):
        rec = ctx.get_state(RequestRecord)
        if rec is None or not self._still_valid(rec):
            rec = RequestRecord(self._token, self.generation)
            ctx.set_state(rec)
        return rec


class ResetKeepsCounting(_ContextRecordCheck):
    """Per-request records ignore the generation: after a reset a request's offers of keys it
    counted before do not count again, and their skips are not counted again."""

    def _still_valid(self, rec):
        return rec.owner is self._token


class RecordsNotTiedToManager(_ContextRecordCheck):
    """Per-request records are checked for the generation only, not for their manager (spec A7): a
    context shown to a new manager brings the old manager's records, so its offers of keys it
    counted there do not count here."""

    def _still_valid(self, rec):
        return rec.generation == self.generation


class _RecordsInManager(OffloadingManager):
    """Records kept in the manager, under ``_key(ctx)``, instead of in the context."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._kept: dict[tuple, RequestRecord] = {}

    def _record(self, ctx):
        return self._kept.setdefault(
            (self._key(ctx), self.generation), RequestRecord(self._token, self.generation)
        )


class RecordsByReqId(_RecordsInManager):
    """Per-request records keyed by the ``req_id`` string instead of the context: a new request
    that reuses an id inherits the old one's records and its offers do not count."""

    @staticmethod
    def _key(ctx):
        return ctx.req_id


class RecordsByIdentity(_RecordsInManager):
    """Per-request records keyed by the context's identity (``id(ctx)``): once a finished
    request's context is freed, a new context at the same address inherits its records and
    its offers do not count."""

    @staticmethod
    def _key(ctx):
        return id(ctx)


class _NoRefreshTracker(AdmissionTracker):
    def _recount(self, key, counted):
        if key not in counted:
            super()._recount(key, counted)


ReofferNoRefresh = _with_tracker(_NoRefreshTracker)
ReofferNoRefresh.__name__ = ReofferNoRefresh.__qualname__ = "ReofferNoRefresh"
ReofferNoRefresh.__doc__ = """A re-offer of a key the request counted already does not move it
to the recent end of the tracker, so it is pushed out too early."""


class _EvictsOfferTracker(AdmissionTracker):
    def _make_room(self, protected):
        self.counts.popitem(last=False)
        return True


TrackerEvictsOfferKey = _with_tracker(_EvictsOfferTracker)
TrackerEvictsOfferKey.__name__ = TrackerEvictsOfferKey.__qualname__ = "TrackerEvictsOfferKey"
TrackerEvictsOfferKey.__doc__ = """A key entering a full tracker pushes out the least recent key
even when that key belongs to the current offer."""


class OldReentryTracker(AdmissionTracker):
    def record(self, offer, counted):
        dropped = {k for k in offer if k in counted and k not in self.counts}
        super().record([k for k in offer if k not in dropped], counted)


DroppedKeyNotRetracked = _with_tracker(OldReentryTracker)
DroppedKeyNotRetracked.__name__ = DroppedKeyNotRetracked.__qualname__ = "DroppedKeyNotRetracked"
DroppedKeyNotRetracked.__doc__ = """The first spec's re-entry rule: a key this request counted
before the tracker dropped it is not tracked again by the request's re-offer, where spec A2
(and vLLM 0.34.0) enter it again with count 1."""


class _SkipByCountedTracker(AdmissionTracker):
    def admit(self, offer, counted, skipped, is_resident):
        offered_before = set(counted)
        admitted, _ = super().admit(offer, counted, skipped, is_resident)
        stored = set(admitted)
        return admitted, sum(
            1 for k in offer if not is_resident(k) and k not in stored and k not in offered_before
        )


SkipUndercount = _with_tracker(_SkipByCountedTracker)
SkipUndercount.__name__ = SkipUndercount.__qualname__ = "SkipUndercount"
SkipUndercount.__doc__ = """The skip metric is deduplicated by the keys the request has counted
(as vLLM 0.34.0 does): a request's skip of a key that its earlier offer admitted (then the store
failed or was evicted, and the tracker dropped it) is never counted (spec A5)."""


class FailedOfferNotRecorded(OffloadingManager):
    """An offer that ends in ``None`` leaves no trace: its counts, records and skips are rolled
    back, as if the manager checked for space before recording."""

    def prepare_store(self, keys, ctx):
        rec = self._record(ctx)
        saved = (
            OrderedDict(self.tracker.counts) if self.tracker else None,
            set(rec.counted),
            set(rec.skipped),
            self._skipped,
        )
        out = super().prepare_store(keys, ctx)
        if out is None:
            if self.tracker:
                self.tracker.counts = saved[0]
            rec.counted, rec.skipped, self._skipped = saved[1], saved[2], saved[3]
        return out


class TrackerClearedOnReset(OffloadingManager):
    """``reset_cache()`` also empties the tracker, although counts must survive a reset."""

    def reset_cache(self):
        super().reset_cache()
        if self.tracker is not None:
            self.tracker.clear()


class _StrictTracker(AdmissionTracker):
    def passes(self, count):
        return count > self.threshold


StrictThreshold = _with_tracker(_StrictTracker)
StrictThreshold.__name__ = StrictThreshold.__qualname__ = "StrictThreshold"
StrictThreshold.__doc__ = """Admits with ``count > store_threshold`` instead of ``>=``."""


class ArcAdaptsEveryRetry(OffloadingManager):
    """ARC's ghost adaptation for a store miss runs at every offer of the key, retries
    included, instead of once per request."""

    def _record(self, ctx):
        rec = super()._record(ctx)
        rec.misses.clear()
        return rec


class TrackerUnbounded(OffloadingManager):
    """The tracker never pushes a key out: it grows past ``max_tracker_size``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.tracker is not None:
            self.tracker.max_size = 10**9


class RepeatedKeyStoredTwice(OffloadingManager):
    """A key repeated inside one offer is not deduplicated: it is admitted and given a chunk
    once per repeat (as upstream managers do; the scheduler never sends such offers)."""

    @staticmethod
    def _dedupe(keys):
        return list(keys)


class ResetDropsUnreportedStats(OffloadingManager):
    """``reset_cache()`` also drops the skips and allocation samples not yet read by
    ``get_stats()``, although they happened before the reset and must still be reported."""

    def reset_cache(self):
        super().reset_cache()
        self._skipped = 0
        self._allocation_sizes = []


# --- residency, eviction and chunks ---


class EvictsPinned(OffloadingManager):
    """Eviction may take a pinned chunk (a load is in flight from it)."""

    @staticmethod
    def _evictable(entry):
        return entry.ref >= 0


class PartialEvictionBeforeNone(OffloadingManager):
    """When too few chunks can be evicted, evicts what it can and then returns ``None``."""

    def _choose_victims(self, need, offer):
        victims = super()._choose_victims(need, offer)
        if victims is None:
            for n in range(need - 1, 0, -1):
                partial = super()._choose_victims(n, offer)
                if partial:
                    self._evict(partial)
                    break
        return victims


class EvictionEventFirstVictimOnly(OffloadingManager):
    """An offer that evicts several chunks announces only the first victim in its removal
    event, so a consumer replaying the events keeps the others as ready."""

    def _emit(self, keys, removed, metadata_only=False):
        super()._emit(keys[:1] if removed and not metadata_only else keys, removed, metadata_only)


class VictimChunksReleasedReversed(OffloadingManager):
    """The chunks of an offer's victims go back to the pool in reverse eviction order, so
    when several are reused at once the new keys get them swapped."""

    def _evict(self, victims):
        super()._evict(victims)
        freed, n = self._pool._freed, len(victims)
        freed[len(freed) - n :] = freed[len(freed) - n :][::-1]


def _with_policy_mixin(manager, mixin, only: type = ARCPolicy) -> None:
    """Put ``mixin`` over the manager's own policy class (either recency semantics), where
    that class is an ``only``."""
    if isinstance(manager._policy, only):
        cls = type(manager._policy)
        manager._policy = type(f"{mixin.__name__}{cls.__name__}", (mixin, cls), {})(
            manager.num_chunks
        )


def _policy_variant(mixin, only: type, name: str, doc: str) -> type:
    """A manager whose policy (of class ``only``) has ``mixin`` over it."""

    def __init__(self, *args, **kwargs):
        OffloadingManager.__init__(self, *args, **kwargs)
        _with_policy_mixin(self, mixin, only)

    return type(name, (OffloadingManager,), {"__init__": __init__, "__doc__": doc})


class _FallbackIgnoresPins(ARCPolicy):
    def choose_victims(self, n, evictable):
        busy_t1 = (
            self.t1
            and len(self.t1) >= self._t1_target()
            and not any(evictable(k, e) for k, e in self.t1.items())
        )
        if not busy_t1:
            return super().choose_victims(n, evictable)
        return super().choose_victims(
            n, lambda k, e: evictable(k, e) or (k in self.t2 and e.ref > 0)
        )


class ArcFallbackEvictsPinned(OffloadingManager):
    """ARC: when T1 is the list to evict from but has no idle victim, the fall-back to T2
    takes T2's least recent keys without skipping the pinned ones (a load is in flight)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _with_policy_mixin(self, _FallbackIgnoresPins)


class _FifoPool(ChunkPool):
    def release(self, chunk_id):
        self._freed.insert(0, chunk_id)


class FreedChunksFifo(OffloadingManager):
    """Freed chunk ids are reused first-freed-first instead of last-freed-first."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pool = _FifoPool(self.num_chunks)


class LruTouchForward(OffloadingManager):
    """``touch`` walks its keys first to last, so the last key ends up most recent."""

    def touch(self, keys, ctx=None):
        super().touch(list(reversed(list(keys))), ctx)


class LookupPendingIsHit(OffloadingManager):
    """``lookup`` answers ``HIT`` for a chunk whose store is still in flight."""

    def lookup(self, key, ctx=None):
        result = super().lookup(key, ctx)
        return type(result).HIT if result is type(result).HIT_PENDING else result


class FailedStoreKeepsChunk(OffloadingManager):
    """``complete_store(success=False)`` drops the key but never frees its chunk."""

    def _drop_failed(self, key):
        self._policy.remove(key)


class StoreEventMissing(OffloadingManager):
    """A successful ``complete_store`` announces no store event."""

    def _emit(self, keys, removed, metadata_only=False):
        if removed:
            super()._emit(keys, removed, metadata_only)


class UsageCountsIdle(OffloadingManager):
    """The cache-usage gauge counts every allocated chunk, idle ones too."""

    def get_stats(self):
        stats = super().get_stats()
        stats.cache_usage = (self.num_chunks - self.free_chunks) / self.num_chunks
        return stats


class NoSampleOnNone(OffloadingManager):
    """An offer that ends in ``None`` leaves no allocation-size sample."""

    def prepare_store(self, keys, ctx):
        before = len(self._allocation_sizes)
        out = super().prepare_store(keys, ctx)
        if out is None:
            del self._allocation_sizes[before:]
        return out


class LoadPinsBeforeChecking(OffloadingManager):
    """``prepare_load`` pins each key as it goes and raises at the first bad one, leaving the
    keys before it pinned (bad input changes state)."""

    def prepare_load(self, keys, ctx=None):
        keys = list(keys)
        for i, key in enumerate(keys):
            if self.ref_count(key) in (None, PENDING):
                if i:
                    super().prepare_load(keys[:i], ctx)
                break
        return super().prepare_load(keys, ctx)


class _UntrimmedARC(ARCPolicy):
    def _trim_ghosts(self):
        pass


class ArcGhostsUntrimmed(OffloadingManager):
    """ARC's ghost lists are never cut back to the capacity."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _with_policy_mixin(self, _UntrimmedARC)


# --- request-scoped recency (spec R1-R7), vLLM 0.33.0's and 0.34.0's design ---


class _CommitHeadFirst:
    def commit(self, order, insertion_only, reused):
        super().commit(list(reversed(order)), insertion_only, reused)


CommitHeadFirst = _policy_variant(
    _CommitHeadFirst,
    CachePolicy,
    "CommitHeadFirst",
    """A
finished request's keys are committed head first, so its head ends least recent and is evicted
before its tail (R3).""",
)


class CommitIgnoresPositions(OffloadingManager):
    """A finished request's keys are committed in the order the request first showed them,
    ignoring their positions in the request (R3)."""

    @staticmethod
    def _commit_order(rec, position):
        return list(rec.seen)


class CommitsStaleRecord(OffloadingManager):
    """A request that finishes after a reset commits the accesses it made before it, which
    belong to a cache that is gone (R3: a record of an older generation commits nothing)."""

    def _committable(self, rec):
        return rec.owner is self._token and not rec.committed


class NoCommit(OffloadingManager):
    """``on_request_finished`` commits nothing: a request's accesses never move its keys (R3)."""

    def _committable(self, rec):
        return False


class _InsertIgnoresPosition:
    def insert(self, key, entry, req=None, position=None):
        super().insert(key, entry)


InsertIgnoresPosition = _policy_variant(
    _InsertIgnoresPosition,
    RankedLRUPolicy,
    "InsertIgnoresPosition",
    """LRU: a stored key is ranked
newest, ignoring its position in the storing request, so a request's tail is not evicted
before its head (R4).""",
)


class _FirstSightLowersRank:
    def first_sight(self, keys, req, position):
        rank = self._request_rank(req)
        for key in keys:
            pos = position(key)
            if pos is not None and key in self.entries:
                self._set(key, (rank, -pos))


FirstSightLowersRank = _policy_variant(
    _FirstSightLowersRank,
    RankedLRUPolicy,
    "FirstSightLowersRank",
    """LRU: a request's first
sight of a resident key sets its rank to the request's, also when the key's rank was newer, so
an older request's access makes a recently used chunk look old (R4).""",
)


class _NoFirstSight:
    def first_sight(self, keys, req, position):
        pass


NoFirstSight = _policy_variant(
    _NoFirstSight,
    RankedLRUPolicy,
    "NoFirstSight",
    """LRU: the keys
a request shows are not shown to the policy until it finishes, so a resident key it is using
can be evicted as if nobody had touched it since its last commit (R2).""",
)


class _ArcInsertPromotes:
    def commit(self, order, insertion_only, reused):
        super().commit(order, set(), set(reused) | set(insertion_only))


ArcInsertPromotes = _policy_variant(
    _ArcInsertPromotes,
    ARCPolicy,
    "ArcInsertPromotes",
    """ARC:
a key the finished request only stored counts as reused and moves to T2, although a store is
not a second use (R5).""",
)


class SelfRereadIsReuse(OffloadingManager):
    """A request that loads (or offers again) a chunk it stored itself counts that as a reuse,
    so under ARC its own store promotes the chunk to T2 at finish (R1)."""

    @staticmethod
    def _reuses(rec, keys):
        return list(keys)


class PendingOfferIsReuse(OffloadingManager):
    """An offer's keys whose stores are still in flight are recorded as seen and reused, as if
    they were ready (R1: only ready chunks are reuses)."""

    def _ready_in(self, offer):
        return [k for k in offer if self._policy.get(k) is not None]


class _ArcGhostStays:
    def _adapt(self, key):
        ARCPolicy._adapt(self, key)


ArcGhostStays = _policy_variant(
    _ArcGhostStays,
    RequestARCPolicy,
    "ArcGhostStays",
    """ARC under
request-scoped recency: a ghost hit adapts p but leaves the ghost where it was, so ghosts are cut
in the wrong order (R6).""",
)


class _ArcMissesInOfferOrder:
    def on_store_misses(self, keys):
        ARCPolicy.on_store_misses(self, keys)


ArcMissesInOfferOrder = _policy_variant(
    _ArcMissesInOfferOrder,
    RequestARCPolicy,
    "ArcMissesInOfferOrder",
    """ARC under request-scoped
recency: a request's new store misses adapt p first to last, so a B1 and a B2 hit in one offer
clamp p differently (R6).""",
)


class _ArcFractionalTarget:
    def _t1_target(self):
        return self.p


ArcFractionalTarget = _policy_variant(
    _ArcFractionalTarget,
    RequestARCPolicy,
    "ArcFractionalTarget",
    """ARC under request-scoped
recency: |T1| is compared with p itself rather than floor(p), so a fractional p sends an
eviction to the other list (R6). Not in ``MUTANTS``: a fractional p needs five ghosts of the
machine's six keys and an eviction after them, further than a machine's steps reach;
tests/test_manager.py breaks it by example.""",
)


# --- retained state (spec §4.8) ---


class _HeapNeverCompacted:
    def _set(self, key, rank):
        self.ranks[key] = rank
        heapq.heappush(self._heap, (rank, key))


HeapNeverCompacted = _policy_variant(
    _HeapNeverCompacted,
    RankedLRUPolicy,
    "HeapNeverCompacted",
    """LRU by rank:
the lazy heap is never rebuilt, so every rank change leaves a stale entry that stays until an
eviction happens to pop it; every answer is right, and the heap grows with the number of
touches, loads and commits instead of with the resident keys (spec §4.8).""",
)


# --- metrics never silent, events, the interface answers, construction (spec s5, s9) ---


class SkipMetricSilentAtZero(OffloadingManager):
    """The skip metric is left out of ``get_stats()`` while it is 0, so a build that stops
    counting skips looks the same as one with nothing to skip (spec section 5)."""

    def get_stats(self):
        stats = super().get_stats()
        if not stats.stores_skipped:
            stats.stores_skipped = None
        return stats


class StatsNoneWhenIdle(OffloadingManager):
    """``get_stats()`` returns nothing when no offer reached allocation since the last read,
    hiding the gauges and the skip counter (spec section 5)."""

    def get_stats(self):
        stats = super().get_stats()
        return stats if stats.allocation_sizes else None


class EventsWhenDisabled(OffloadingManager):
    """Events are queued and drained even when the manager was built with
    ``enable_events=False``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._events = []


class RefusesLargeTracker(OffloadingManager):
    """The constructor refuses a ``max_tracker_size`` above 1,000, a configuration the spec
    allows (spec section 9: a constructor that raises on it is a counterexample)."""

    def __init__(self, *args, max_tracker_size=64_000, **kwargs):
        if max_tracker_size > 1000:
            raise ValueError(f"max_tracker_size {max_tracker_size} is too large")
        super().__init__(*args, max_tracker_size=max_tracker_size, **kwargs)


class NewRequestAnswersNothing(OffloadingManager):
    """``on_new_request`` returns nothing instead of the request's offloading policy."""

    def on_new_request(self, ctx):
        super().on_new_request(ctx)


class LoadSourceDevice(OffloadingManager):
    """``get_load_source`` says a CPU hit comes from the device (GPU) tier."""

    def get_load_source(self, key, ctx=None):
        super().get_load_source(key, ctx)
        return "device"


class LoadSourceForAMiss(OffloadingManager):
    """``get_load_source`` answers the host tier for any key, a miss or a pending one too,
    instead of refusing a key that is not a hit (spec section 8)."""

    def get_load_source(self, key, ctx=None):
        return HOST


class ContextErrorUnnamed(OffloadingManager):
    """A call given something that is not a request context says what it got but not which
    call needed the context (spec section 8)."""

    @staticmethod
    def _context(ctx, call):
        if not callable(getattr(ctx, "get_state", None)):
            raise TypeError(f"a request context is needed, got {ctx!r}")
        return ctx


class StoreDefaultsToFailure(OffloadingManager):
    """``complete_store`` without ``success`` takes the store as failed: the interface's default
    is a success (spec section 2)."""

    def complete_store(self, keys, ctx=None, success=False):
        super().complete_store(keys, ctx, success=success)


class FinishForgetsRequest(OffloadingManager):
    """Request-scoped: a finished request's record is replaced by a fresh one after its
    commit, so the finished request may offer and load again, and a second finish commits
    again (spec R3, section 8)."""

    def on_request_finished(self, ctx):
        super().on_request_finished(ctx)
        if self._request_scoped:
            ctx.set_state(RequestRecord(self._token, self.generation))


class PendingWorkWhileStoring(OffloadingManager):
    """``has_pending_work`` answers ``True`` while stores are in flight, so an engine keeps
    stepping for work the scheduler owns, not the manager."""

    def has_pending_work(self):
        return self._num_pending > 0


REQUEST = ("request",)


@dataclass(frozen=True)
class Mutant:
    cls: type
    policies: tuple[str, ...] = ("lru", "arc")
    admission: bool = False  # a variant of the counting / skip-metric / reset rule
    recencies: tuple[str, ...] = ("touch", "request")  # where the bug shows (spec section 4)

    @property
    def doc(self) -> str:
        return " ".join((self.cls.__doc__ or "").split())

    def __call__(
        self,
        num_chunks,
        cache_policy="lru",
        store_threshold=1,
        max_tracker_size=64_000,
        enable_events=True,
        recency="touch",
    ):
        return self.cls(
            num_chunks,
            cache_policy=cache_policy,
            enable_events=enable_events,
            store_threshold=store_threshold,
            max_tracker_size=max_tracker_size,
            recency=recency,
        )


MUTANTS: dict[str, Mutant] = {
    "every_offer_counts": Mutant(EveryOfferCounts, admission=True),
    "dedup_failed_retries_only": Mutant(DedupFailedRetriesOnly, admission=True),
    "skip_metric_every_offer": Mutant(SkipMetricEveryOffer, admission=True),
    "reset_keeps_counting": Mutant(ResetKeepsCounting, admission=True),
    "records_by_req_id": Mutant(RecordsByReqId, admission=True),
    "records_by_identity": Mutant(
        RecordsByIdentity
    ),  # needs the manager machine's dropped contexts
    "records_not_tied_to_manager": Mutant(RecordsNotTiedToManager),
    "reoffer_no_refresh": Mutant(ReofferNoRefresh),
    "tracker_evicts_offer_key": Mutant(TrackerEvictsOfferKey),
    "dropped_key_not_retracked": Mutant(DroppedKeyNotRetracked),
    "skip_undercount": Mutant(SkipUndercount, admission=True),
    "failed_offer_not_recorded": Mutant(FailedOfferNotRecorded, admission=True),
    "tracker_cleared_on_reset": Mutant(TrackerClearedOnReset, admission=True),
    "strict_threshold": Mutant(StrictThreshold, admission=True),
    "evicts_pinned": Mutant(EvictsPinned),
    "partial_eviction_before_none": Mutant(PartialEvictionBeforeNone),
    "arc_adapts_every_retry": Mutant(ArcAdaptsEveryRetry, policies=("arc",)),
    "tracker_unbounded": Mutant(TrackerUnbounded),
    "repeated_key_stored_twice": Mutant(RepeatedKeyStoredTwice),
    "freed_chunks_fifo": Mutant(FreedChunksFifo),
    "lru_touch_forward": Mutant(LruTouchForward, policies=("lru",)),
    "lookup_pending_is_hit": Mutant(LookupPendingIsHit),
    "failed_store_keeps_chunk": Mutant(FailedStoreKeepsChunk),
    "store_event_missing": Mutant(StoreEventMissing),
    "usage_counts_idle": Mutant(UsageCountsIdle),
    "no_sample_on_none": Mutant(NoSampleOnNone),
    "reset_drops_unreported_stats": Mutant(ResetDropsUnreportedStats),
    "eviction_event_first_victim_only": Mutant(EvictionEventFirstVictimOnly),
    "arc_fallback_evicts_pinned": Mutant(ArcFallbackEvictsPinned, policies=("arc",)),
    "victim_chunks_released_reversed": Mutant(VictimChunksReleasedReversed),
    "load_pins_before_checking": Mutant(LoadPinsBeforeChecking),
    "load_source_for_a_miss": Mutant(LoadSourceForAMiss),
    "context_error_unnamed": Mutant(ContextErrorUnnamed),
    "store_defaults_to_failure": Mutant(StoreDefaultsToFailure),
    "finish_forgets_request": Mutant(FinishForgetsRequest, recencies=REQUEST),
    "arc_ghosts_untrimmed": Mutant(ArcGhostsUntrimmed, policies=("arc",)),
    # request-scoped recency (R1-R7)
    "commit_head_first": Mutant(CommitHeadFirst, recencies=REQUEST),
    "commit_ignores_positions": Mutant(CommitIgnoresPositions, recencies=REQUEST),
    "commits_stale_record": Mutant(CommitsStaleRecord, recencies=REQUEST),
    "no_commit": Mutant(NoCommit, recencies=REQUEST),
    "insert_ignores_position": Mutant(InsertIgnoresPosition, ("lru",), recencies=REQUEST),
    "first_sight_lowers_rank": Mutant(FirstSightLowersRank, ("lru",), recencies=REQUEST),
    "no_first_sight": Mutant(NoFirstSight, ("lru",), recencies=REQUEST),
    "arc_insert_promotes": Mutant(ArcInsertPromotes, ("arc",), recencies=REQUEST),
    "self_reread_is_reuse": Mutant(SelfRereadIsReuse, ("arc",), recencies=REQUEST),
    "pending_offer_is_reuse": Mutant(PendingOfferIsReuse, ("arc",), recencies=REQUEST),
    "arc_ghost_stays": Mutant(ArcGhostStays, ("arc",), recencies=REQUEST),
    "arc_misses_in_offer_order": Mutant(ArcMissesInOfferOrder, ("arc",), recencies=REQUEST),
    # retained state
    "heap_never_compacted": Mutant(HeapNeverCompacted, ("lru",), recencies=REQUEST),
    # metrics, events, interface answers, construction
    "skip_metric_silent_at_zero": Mutant(SkipMetricSilentAtZero),
    "stats_none_when_idle": Mutant(StatsNoneWhenIdle),
    "events_when_disabled": Mutant(EventsWhenDisabled),
    "refuses_large_tracker": Mutant(RefusesLargeTracker),
    "new_request_answers_nothing": Mutant(NewRequestAnswersNothing),
    "load_source_device": Mutant(LoadSourceDevice),
    "pending_work_while_storing": Mutant(PendingWorkWhileStoring),
}


# --- ill-formed answers (issue 48, spec §10.1): on some reachable step each answers a call with
# what the interface does not allow; the adapter's check makes that the target's divergence,
# never an error inside kvgate ---


def _ill_formed(call: str, spoil, name: str, doc: str) -> type:
    """A manager whose ``call`` answers ``spoil(manager, answer, *args)``: impl's answer, or,
    on the steps where the bug shows, one the interface does not allow."""

    def method(self, *args, **kwargs):
        return spoil(self, getattr(OffloadingManager, call)(self, *args, **kwargs), *args)

    method.__name__ = method.__qualname__ = call
    return type(name, (OffloadingManager,), {call: method, "__doc__": doc})


def _runs(ids) -> bool:
    return all(b == a + 1 for a, b in zip(ids, ids[1:]))


LookupHitAsBool = _ill_formed(
    "lookup",
    lambda m, answer, *_: True if answer is LookupResult.HIT else answer,
    "LookupHitAsBool",
    """``lookup`` answers ``True`` for a ready chunk (an older release's bool) where the
interface requires a ``LookupResult``; a miss and a pending chunk are answered right.""",
)

LoadAnswersNothing = _ill_formed(
    "prepare_load",
    lambda m, answer, *_: None,
    "LoadAnswersNothing",
    """``prepare_load`` pins the keys but returns nothing instead of their chunk ids (the
mutant of vLLM 0.34.0 whose return was dropped, issue 48).""",
)

StoreSpecNoneUnlessRun = _ill_formed(
    "prepare_store",
    lambda m, out, *_: (
        out if out is None or _runs(out.store_spec) else out._replace(store_spec=None)
    ),
    "StoreSpecNoneUnlessRun",
    """``prepare_store``'s spec helper builds a spec for a run of consecutive chunk ids only and
answers ``store_spec=None`` for any other allocation (freed chunks reused out of order).""",
)

EvictedKeyBare = _ill_formed(
    "prepare_store",
    lambda m, out, *_: (
        out._replace(evicted_keys=out.evicted_keys[0])
        if out is not None and len(out.evicted_keys) == 1
        else out
    ),
    "EvictedKeyBare",
    """``prepare_store`` answers a single victim as the key itself (``evicted_keys=b'...'``),
not a list of one key.""",
)

NothingNewKeysNone = _ill_formed(
    "prepare_store",
    lambda m, out, keys, *_: (
        out._replace(keys_to_store=None)
        if out is not None
        and not out.keys_to_store
        and keys
        and all(m.chunk_of(k) is not None for k in keys)
        else out
    ),
    "NothingNewKeysNone",
    """An offer whose keys are all resident already is answered with ``keys_to_store=None``
instead of an empty list.""",
)

RemovalEventBareKey = _ill_formed(
    "take_events",
    lambda m, events, *_: [
        e._replace(keys=e.keys[0]) if e.removed and len(e.keys) == 1 else e for e in events
    ],
    "RemovalEventBareKey",
    """``take_events`` gives a removal of one key with the key itself as the event's ``keys``,
not a sequence of keys.""",
)

SamplesAsText = _ill_formed(
    "get_stats",
    lambda m, stats, *_: replace(
        stats, allocation_sizes=[n if n == 1 else f"{n} chunks" for n in stats.allocation_sizes]
    ),
    "SamplesAsText",
    """``get_stats()`` reports an allocation of several chunks as text (``'2 chunks'``) in the
allocation-size samples, where each sample must be a number of chunks.""",
)

ConfigLostAtReset = _ill_formed(
    "config_info",
    lambda m, info, *_: None if m.generation else info,
    "ConfigLostAtReset",
    """``config_info()`` returns nothing after a ``reset_cache()``, as if the reset dropped the
configuration it describes.""",
)

PendingWorkAsCount = _ill_formed(
    "has_pending_work",
    lambda m, answer, *_: m._num_pending or answer,
    "PendingWorkAsCount",
    """``has_pending_work()`` answers the number of stores in flight (an int) while there are
any, where the interface requires a bool.""",
)

LoadSourceNoneWhileLoading = _ill_formed(
    "get_load_source",
    lambda m, source, key, *_: None if (m.ref_count(key) or 0) > 0 else source,
    "LoadSourceNoneWhileLoading",
    """``get_load_source`` answers ``None`` for a hit whose chunk a load is reading already,
where the interface requires the tier's name.""",
)

MUTANTS.update(
    {
        "lookup_hit_as_bool": Mutant(LookupHitAsBool),
        "load_answers_nothing": Mutant(LoadAnswersNothing),
        "store_spec_none_unless_run": Mutant(StoreSpecNoneUnlessRun),
        "evicted_key_bare": Mutant(EvictedKeyBare),
        "nothing_new_keys_none": Mutant(NothingNewKeysNone),
        "removal_event_bare_key": Mutant(RemovalEventBareKey),
        "samples_as_text": Mutant(SamplesAsText),
        "config_lost_at_reset": Mutant(ConfigLostAtReset),
        "pending_work_as_count": Mutant(PendingWorkAsCount),
        "load_source_none_while_loading": Mutant(LoadSourceNoneWhileLoading),
    }
)
