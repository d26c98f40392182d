"""The catalogue of known-bad managers: each a small named variant of impl's manager.

Every property the machines check has at least one variant here that breaks it; the tests run
each variant and require the machine to catch it with a short counterexample. A variant's
docstring says what it breaks. ``MUTANTS`` maps a name to a ``Mutant`` (factory, the policies
under which the bug shows, and whether the scheduler path alone must catch it).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from kvgate.impl.manager import PENDING, OffloadingManager, RequestRecord
from kvgate.impl.policies import ARCPolicy
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
    """Per-request records are checked for the generation only, not for their manager (A7): a
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
        return self._kept.setdefault((self._key(ctx), self.generation),
                                     RequestRecord(self._token, self.generation))


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
before the tracker dropped it is not tracked again by the request's re-offer, where amended A2
(and vLLM 0.34.0) enter it again with count 1."""


class _SkipByCountedTracker(AdmissionTracker):
    def admit(self, offer, counted, skipped, is_resident):
        offered_before = set(counted)
        admitted, _ = super().admit(offer, counted, skipped, is_resident)
        stored = set(admitted)
        return admitted, sum(1 for k in offer if not is_resident(k) and k not in stored
                             and k not in offered_before)


SkipUndercount = _with_tracker(_SkipByCountedTracker)
SkipUndercount.__name__ = SkipUndercount.__qualname__ = "SkipUndercount"
SkipUndercount.__doc__ = """The skip metric is deduplicated by the keys the request has counted
(as vLLM 0.34.0 does): a request's skip of a key that its earlier offer admitted (then the store
failed or was evicted, and the tracker dropped it) is never counted (amended A5)."""


class FailedOfferNotRecorded(OffloadingManager):
    """An offer that ends in ``None`` leaves no trace: its counts, records and skips are rolled
    back, as if the manager checked for space before recording."""

    def prepare_store(self, keys, ctx):
        rec = self._record(ctx)
        saved = (OrderedDict(self.tracker.counts) if self.tracker else None,
                 set(rec.counted), set(rec.skipped), self._skipped)
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
        rec.missed.clear()
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
        super()._emit(keys[:1] if removed and not metadata_only else keys, removed,
                      metadata_only)


class VictimChunksReleasedReversed(OffloadingManager):
    """The chunks of an offer's victims go back to the pool in reverse eviction order, so
    when several are reused at once the new keys get them swapped."""

    def _evict(self, victims):
        super()._evict(victims)
        freed, n = self._pool._freed, len(victims)
        freed[len(freed) - n:] = freed[len(freed) - n:][::-1]


class _FallbackIgnoresPins(ARCPolicy):
    def choose_victims(self, n, evictable):
        busy_t1 = self.t1 and len(self.t1) >= self.p and not any(
            evictable(k, e) for k, e in self.t1.items())
        if not busy_t1:
            return super().choose_victims(n, evictable)
        return super().choose_victims(
            n, lambda k, e: evictable(k, e) or (k in self.t2 and e.ref > 0))


class ArcFallbackEvictsPinned(OffloadingManager):
    """ARC: when T1 is the list to evict from but has no idle victim, the fall-back to T2
    takes T2's least recent keys without skipping the pinned ones (a load is in flight)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if isinstance(self._policy, ARCPolicy):
            self._policy = _FallbackIgnoresPins(self.num_chunks)


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
        if isinstance(self._policy, ARCPolicy):
            self._policy = _UntrimmedARC(self.num_chunks)


@dataclass(frozen=True)
class Mutant:
    cls: type
    policies: tuple[str, ...] = ("lru", "arc")
    admission: bool = False  # a variant of the counting / skip-metric / reset rule

    @property
    def doc(self) -> str:
        return " ".join((self.cls.__doc__ or "").split())

    def __call__(self, num_chunks, cache_policy="lru", store_threshold=1,
                 max_tracker_size=64_000):
        return self.cls(num_chunks, cache_policy=cache_policy,
                        store_threshold=store_threshold, max_tracker_size=max_tracker_size)


MUTANTS: dict[str, Mutant] = {
    "every_offer_counts": Mutant(EveryOfferCounts, admission=True),
    "dedup_failed_retries_only": Mutant(DedupFailedRetriesOnly, admission=True),
    "skip_metric_every_offer": Mutant(SkipMetricEveryOffer, admission=True),
    "reset_keeps_counting": Mutant(ResetKeepsCounting, admission=True),
    "records_by_req_id": Mutant(RecordsByReqId, admission=True),
    "records_by_identity": Mutant(RecordsByIdentity),  # needs the manager machine's dropped contexts
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
    "arc_ghosts_untrimmed": Mutant(ArcGhostsUntrimmed, policies=("arc",)),
}
