"""Patches to vLLM releases, as a maintainer would offer them for review: each release's known
defect put right, everything else left as it is.

0.34.0 (``SkipCountedOnce``): 0.34.0 counts a skip only when the request had not *counted* the
key before. A request whose earlier offer admitted the key (the store then failed, or the key
was evicted, and the tracker dropped it) skips it on a later offer, and that skip is never
counted. Spec A5 counts the request's first *skip* of a key, per generation. ``SkipCountedOnce``
keeps its own record of the keys each request has skipped, tied to this manager and its cache
generation the way upstream's own per-request record is, and adds the skips upstream left out.

0.33.0 (``CountedOncePerRequest``): the seed's bug, every offer counts. The patch is the seed's
fix backported: each key counts once per request and generation (spec A2, A7), and its skip
once (spec A5).

Neither is vLLM's code: each wraps the release's ``prepare_store`` (and, for 0.33.0, its
``_record_accesses``) and reads only its public calls and its tracker (``counts``).

Where a gate only has to pass the release despite a known defect, it declares the defect
instead (``--known-defect vllm:kv_offload_stores_skipped``, properties/known.py; the ci gate of
0.34.0 in tests/test_upstream.py does): a patch is kept where the defect must be *put right* and
checked, not left out: the mutation suites, whose mutants of the skip counting a declared metric
would let through, and 0.33.0, whose defect is the admission rule, which no declaration can
leave out.

Use: ``kvgate check --target vllm=releases.vllm_mends:SkipCountedOnce`` with vLLM 0.34.0
installed, ``vllm=releases.vllm_mends:CountedOncePerRequest`` with 0.33.0 (the module
imports vLLM when it is loaded). These are the targets of the mutation suites over each
release's own code (bench/mutation.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.v1.kv_offload.base import LookupResult
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager


@dataclass
class _SkippedByRequest:
    """The keys one request has skipped, in one generation of one manager."""

    owner: object
    generation: int
    keys: set = field(default_factory=set)


def _record_of(manager, req_context, kind):
    """The request's record of type ``kind`` for this manager and its cache generation (a new
    one where the context holds another manager's, or an older generation's)."""
    generation = getattr(manager, "_cache_generation", 0)
    record = req_context.get_state(kind)
    if record is None or record.owner is not manager or record.generation != generation:
        record = kind(manager, generation)
        req_context.set_state(record)
    return record


def whole_window_chunks(connector) -> None:
    """The mend of the window defect both releases share (docs/upstream.md, "a window chunk
    stored with its first block unwritten"): on a sliding-window group the store mask names a
    chunk's blocks all or none, so a chunk whose window reaches only its later blocks is
    refused by the connector's own rule (a masked-in null block is not stored) instead of
    stored with its first block unwritten and later loaded whole."""
    reachable = connector._reachable_store_block_mask
    per = connector.config.blocks_per_chunk

    def whole(group_config, *args, **kwargs):
        mask = reachable(group_config, *args, **kwargs)
        if mask is None or group_config.sliding_window_size_in_chunks is None:
            return mask
        chunks = [any(mask[i : i + per]) for i in range(0, len(mask), per)]
        return [chunk for chunk in chunks for _ in range(per)][: len(mask)]

    connector._reachable_store_block_mask = whole


def one_offer_a_step(connector) -> None:
    """The mend of the double offer both releases share (docs/upstream.md, "one key offered
    twice in a step"): beside a recurrent group, a drafter's partial-tail key can be the key of
    a whole chunk, and the step's whole-chunk store jobs, built after the partial tails',
    offer it again for the same request. The whole-chunk jobs leave out the keys the
    request's partial-tail jobs had accepted earlier in the step (as a manager leaves out a
    key it already holds); the partial tails' own jobs are left as they are."""
    partial, whole = connector._build_partial_tail_store_jobs, connector._build_store_jobs
    accepted: dict[str, set] = {}

    def offering(build, record: bool):
        def built(scheduler_output):
            manager = connector.manager

            class _Once:
                def __getattr__(self, name):
                    return getattr(manager, name)

                def prepare_store(self, keys, req_context):
                    done = accepted.setdefault(req_context.req_id, set())
                    if not record:
                        keys = [k for k in keys if k not in done]
                    out = manager.prepare_store(keys, req_context)
                    if record and out is not None:
                        done.update(keys)
                    return out

            if record:
                accepted.clear()  # a new step's metadata
            connector.manager = _Once()
            try:
                return build(scheduler_output)
            finally:
                connector.manager = manager

        return built

    connector._build_partial_tail_store_jobs = offering(partial, record=True)
    connector._build_store_jobs = offering(whole, record=False)


def offload_cap_on_tails(connector) -> None:
    """The mend of the cap defect both releases share (docs/upstream.md, "a request's offload
    cap before its recurrent state's hand-off raises"): a recurrent group's state handed off
    at a boundary past the request's ``max_offload_tokens`` is left unstored, as the
    full-attention stores leave the chunks past the cap, instead of tripping the connector's
    assertion that no such boundary comes."""
    build = connector._build_partial_tail_store_jobs

    def within_cap(scheduler_output):
        state = scheduler_output.kv_connector_block_state
        handoffs = getattr(state, "boundary_state_offloads", None)
        if not handoffs:
            return build(scheduler_output)
        kept = {}
        for req_id, entries in handoffs.items():
            status = connector._req_status.get(req_id)
            cap = getattr(status, "max_offload_tokens", None)
            entries = [e for e in entries if cap is None or e[2] <= cap]
            if entries:
                kept[req_id] = entries
        state.boundary_state_offloads = kept
        try:
            return build(scheduler_output)
        finally:
            state.boundary_state_offloads = handoffs

    connector._build_partial_tail_store_jobs = within_cap


def shared_mends(connector) -> None:
    """The mends of the connector defects 0.33.0 and 0.34.0 share."""
    whole_window_chunks(connector)
    one_offer_a_step(connector)
    offload_cap_on_tails(connector)


def external_state_counted(scheduler) -> None:
    """The mend of the recurrent-group count both releases share (docs/upstream.md, "a
    connector hit on a recurrent group counted one block short"): in ``align`` mode a request
    admitted with tokens the connector loads, holding no block of the group yet, takes a block
    for the loaded state and one for its running state, where the group's count reserves one;
    so ``allocate_slots`` raised on the pool's last block instead of answering ``None``. The
    count reserves the loaded state's block too."""
    coordinator = scheduler.kv_cache_manager.coordinator
    for manager in coordinator.single_type_managers:
        if getattr(manager, "mamba_cache_mode", None) != "align":
            continue
        count = manager.get_num_blocks_to_allocate

        def counted(
            request_id,
            num_tokens,
            new_computed_blocks,
            total_computed_tokens,
            num_local_computed_tokens,
            *args,
            _count=count,
            _manager=manager,
            **kwargs,
        ):
            need = _count(
                request_id,
                num_tokens,
                new_computed_blocks,
                total_computed_tokens,
                num_local_computed_tokens,
                *args,
                **kwargs,
            )
            loaded = total_computed_tokens > num_local_computed_tokens
            fresh = not _manager.req_to_blocks.get(request_id)
            if loaded and fresh and need <= _manager.block_pool.num_gpu_blocks:
                need += 1
            return need

        manager.get_num_blocks_to_allocate = counted


class SkipCountedOnce(CPUOffloadingManager):
    """vLLM's CPU manager, counting each request's first skip of a key (spec A5); it carries
    the mend of the window defect both releases share beside it (``mend_connector``)."""

    mend_connector = staticmethod(shared_mends)
    mend_scheduler = staticmethod(external_state_counted)

    def _skipped_by(self, req_context) -> _SkippedByRequest:
        return _record_of(self, req_context, _SkippedByRequest)

    def _keys_counted_by(self, req_context) -> set:
        # What upstream dedups its skip metric by; read before the call changes it.
        return set(self._get_request_cache_access(req_context).counted_keys)

    def prepare_store(self, keys, req_context):
        keys = list(keys)
        if self.counts is None:
            return super().prepare_store(keys, req_context)
        counted_before = self._keys_counted_by(req_context)
        absent = [
            k for k in dict.fromkeys(keys) if self.lookup(k, req_context) == LookupResult.MISS
        ]
        out = super().prepare_store(keys, req_context)
        skipped = self._skipped_by(req_context)
        for key in absent:
            if self.counts.get(key, 0) >= self.store_threshold or key in skipped.keys:
                continue  # admitted, or this request's skip of it was counted already
            skipped.keys.add(key)
            if key in counted_before:  # upstream did not count this first skip
                self.stores_skipped_in_current_batch += 1
        return out


@dataclass
class _OffersByRequest:
    """The keys one request has counted and skipped, in one generation of one manager."""

    owner: object
    generation: int
    counted: set = field(default_factory=set)
    skipped: set = field(default_factory=set)


class CountedOncePerRequest(CPUOffloadingManager):
    """vLLM 0.33.0's CPU manager with the seed's fix put back, as a backport would offer it:
    a request counts each key once per generation (spec A2, A7) and its skip of a key once
    (spec A5). Everything else is the release's own code, run unchanged: the release's
    ``_record_accesses`` and its skip counter still do their work, and this class takes back
    only what they add for a request's repeated offer, so a change to the release's own
    counting stays visible (the mutation suite over 0.33.0 relies on that).

    For 0.33.0 only: 0.34.0 already carries the counting fix (use ``SkipCountedOnce`` there).
    It carries 0.34.0's other fix to the connector beside it, and the mend of the window
    defect both releases share (``mend_connector``).
    """

    _current: _OffersByRequest | None = None
    mend_scheduler = staticmethod(external_state_counted)

    @staticmethod
    def mend_connector(connector) -> None:
        """0.33.0's connector refuses a second cache reset before a step has run while jobs
        were in flight at the first (``reset_cache`` asserts that no flush is pending, and the
        first reset left its flush set for the next step to deliver); 0.34.0 merges the new
        flush set into the pending one. Put back the same way."""
        shared_mends(connector)
        reset = connector.reset_cache

        def reset_cache():
            pending = connector._current_batch_jobs_to_flush
            connector._current_batch_jobs_to_flush = set()
            try:
                reset()
            finally:
                connector._current_batch_jobs_to_flush |= pending

        connector.reset_cache = reset_cache

    def _record_accesses(self, keys):
        counted = self._current.counted if self._current is not None else set()
        again = [k for k in dict.fromkeys(keys) if k in self.counts and k in counted]
        super()._record_accesses(keys)
        for key in again:  # tracked, and counted by this request already: no second count
            self.counts[key] -= 1

    def prepare_store(self, keys, req_context):
        keys = list(keys)
        if self.counts is None:
            return super().prepare_store(keys, req_context)
        record = _record_of(self, req_context, _OffersByRequest)
        absent = [
            k for k in dict.fromkeys(keys) if self.lookup(k, req_context) == LookupResult.MISS
        ]
        self._current = record
        try:
            out = super().prepare_store(keys, req_context)
        finally:
            self._current = None
        record.counted.update(keys)
        skipped = [k for k in absent if self.counts.get(k, 0) < self.store_threshold]
        # The release counted every skip of this offer; a skip this request made before is
        # taken back, so each key's skip counts once per request.
        self.stores_skipped_in_current_batch -= sum(k in record.skipped for k in skipped)
        record.skipped.update(skipped)
        return out
