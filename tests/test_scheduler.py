"""The scheduler driver: the seed's scheduler scenario, the driver's own rules, and the
request-level machine (properties/scheduler_machine.py) on impl and on the catalogue."""

from __future__ import annotations

import pytest

from kvgate.impl.base import (
    STORES_SKIPPED,
    LookupResult,
    ReqContext,
    Stats,
    TransferResult,
    make_key,
)
from kvgate.impl.manager import OffloadingManager
from kvgate.impl.scheduler import Request, RequestState, Scheduler, block_hashes_of, chunk_keys
from kvgate.model.cache import Model
from kvgate.properties.adapters import NativeAdapter
from kvgate.properties.audit import Audit, driver_hooks
from kvgate.properties.catalogue.managers import MUTANTS
from kvgate.properties.null_worker import NullWorker
from kvgate.properties.oracle import Divergence, LockstepManager
from kvgate.properties.profiles import FIRST_FAILURE
from kvgate.properties.runner import run_machine
from kvgate.properties.scheduler_machine import make_machine
from kvgate.properties.targets import resolve_target

EVERY_OFFER_COUNTS = MUTANTS["every_offer_counts"]
SCHEDULER_CAUGHT = sorted(name for name, m in MUTANTS.items() if m.admission)


def _impl(num_chunks, cache_policy="lru", store_threshold=1, max_tracker_size=64_000):
    return OffloadingManager(
        num_chunks,
        cache_policy=cache_policy,
        store_threshold=store_threshold,
        max_tracker_size=max_tracker_size,
    )


# --------------------------------------------------------------------------- the seed's scenario


def single_request_block_retry(factory) -> tuple[Scheduler, Request]:
    """The seed's scheduler run: num_chunks=2; request A (one block) is offered once; both
    chunks are filled with stores kept in flight; request B (A's block and one of its own)
    finishes in one step and its offer fails; the stores complete; B's finish-time retry
    stores A's block only, and B's own block is not in the CPU tier."""
    manager = factory(2, cache_policy="lru", store_threshold=2)
    sched = Scheduler(manager, NullWorker(delay=1), block_size=4)
    sched.add_request(Request.from_tokens("A", [1] * 4, 4, max_output_tokens=1))
    sched.run_until_idle()
    assert sched.counters.offers == 1 and sched.counters.admitted == 0

    pinned = [make_key(bytes([200 + i]) * 8) for i in range(2)]
    manager.prepare_store(pinned, ReqContext("pin-warmup"))
    pin = ReqContext("pin")
    out = manager.prepare_store(pinned, pin)
    assert out is not None and list(out.keys_to_store) == pinned

    b = sched.add_request(Request.from_tokens("B", [1] * 4 + [2] * 4, 4, max_output_tokens=1))
    sched.step()  # B's prefill and its sampled token: it finishes; its offer fails
    assert b.state is RequestState.FINISHING
    assert sched.counters.allocation_failures == 1
    manager.complete_store(pinned, pin)  # the stores complete
    sched.step()  # B's finish-time retry
    assert sched.counters.finish_retries == 1
    sched.run_until_idle()
    shared, own = b.keys
    assert manager.lookup(own) is LookupResult.MISS, "B's own block was stored by B's retry"
    assert manager.lookup(shared) is LookupResult.HIT  # offered by A and by B
    assert sched.counters.admitted == 1
    return sched, b


def test_finish_time_retry_stores_only_the_shared_block():
    single_request_block_retry(_impl)


def test_finish_time_retry_fails_on_every_offer_counts():
    with pytest.raises(AssertionError, match="own block was stored"):
        single_request_block_retry(EVERY_OFFER_COUNTS)


def preempted_request_reoffer(factory, natural: bool = False) -> tuple[Scheduler, Request]:
    """A request preempted once and resumed, with both of its blocks cold: its re-offer goes
    through the same context and stores neither. ``natural``: preempted because GPU blocks ran
    out, as the seed's run does, instead of by hand."""
    manager = factory(4, cache_policy="lru", store_threshold=2)
    if natural:  # R1 (first) and R (second) each need 3 blocks by their 5th token; 5 blocks
        sched = Scheduler(manager, NullWorker(delay=1), block_size=4, num_gpu_blocks=5)
        sched.add_request(Request.from_tokens("R1", [3] * 8, 4, max_output_tokens=3))
        r = sched.add_request(Request.from_tokens("R", [1] * 4 + [2] * 4, 4, max_output_tokens=3))
        sched.run_until_idle()
        assert r.preemptions == 1
    else:
        sched = Scheduler(manager, NullWorker(delay=1), block_size=4)
        r = sched.add_request(Request.from_tokens("R", [1] * 4 + [2] * 4, 4, max_output_tokens=3))
        sched.step()  # both blocks offered: both cold, skipped
        sched.preempt(r)
        sched.run_until_idle()
    assert sched.counters.reoffers_after_preemption == 1
    return sched, r


@pytest.mark.parametrize("natural", [False, True])
def test_resumed_request_reoffer_stores_neither(natural):
    sched, r = preempted_request_reoffer(_impl, natural)
    for key in r.keys:
        assert sched.manager.lookup(key) is LookupResult.MISS
    assert sched.counters.admitted == 0  # nothing was ever stored
    assert sched.counters.skips == (4 if natural else 2)  # R1's two, R's two: once each


@pytest.mark.parametrize("name", ["every_offer_counts", "dedup_failed_retries_only"])
@pytest.mark.parametrize("natural", [False, True])
def test_resumed_request_reoffer_fails_on_recounting_variants(name, natural):
    sched, r = preempted_request_reoffer(MUTANTS[name], natural)
    assert [sched.manager.lookup(k) for k in r.keys] == [LookupResult.HIT] * 2


# --------------------------------------------------------------------------- the driver's rules


def _checked(num_chunks=4, threshold=1, policy="lru", tracker=64_000, **kw):
    oracle = LockstepManager(
        NativeAdapter(_impl(num_chunks, policy, threshold, tracker)),
        Model(num_chunks, store_threshold=threshold, max_tracker_size=tracker, policy=policy),
    )
    worker = kw.pop("worker", None) or NullWorker(
        delay=kw.pop("delay", 1), blocks_per_chunk=kw.get("blocks_per_chunk", 1), track_data=True
    )
    sched = Scheduler(oracle, worker, on_step=oracle.set_step, **driver_hooks(oracle), **kw)
    return sched, oracle, worker


def test_block_hashes_are_chained_and_keys_name_the_last_block_of_each_chunk():
    a = block_hashes_of([1, 2, 3, 4, 5], 2)
    b = block_hashes_of([9, 9, 3, 4], 2)
    assert len(a) == 2 and a[0] != b[0] and a[1] != b[1]  # same block, different prefix
    assert block_hashes_of([1, 2, 3, 4, 7], 2) == a
    assert chunk_keys(a + a, 2) == [make_key(a[1]), make_key(a[1])]
    assert chunk_keys(a[:1], 2) == []


def test_offer_covers_store_position_to_last_complete_chunk_under_chunked_prefill():
    sched, oracle, worker = _checked(block_size=2, max_tokens_per_step=3)
    r = sched.add_request(Request.from_tokens("r", list(range(9)), 2, max_output_tokens=2))
    offers = []
    real = oracle.prepare_store
    oracle.prepare_store = lambda keys, ctx: offers.append(list(keys)) or real(keys, ctx)
    sched.run_until_idle()
    k = r.keys
    assert offers == [[k[0]], [k[1], k[2]], [k[3]]]  # 3, 6, 9 tokens computed
    assert sched.counters.stores_completed == 4


def test_a_failed_offer_is_retried_at_the_next_step_with_newer_keys():
    sched, oracle, worker = _checked(num_chunks=2, block_size=2, max_tokens_per_step=2, delay=None)
    pin, pinned = ReqContext("pin"), [make_key(b"p" * 8), make_key(b"q" * 8)]
    oracle.on_new_request(pin)
    oracle.prepare_store(pinned, pin)  # both chunks: stores in flight
    r = sched.add_request(Request.from_tokens("r", [1, 2, 3, 4, 5], 2, max_output_tokens=3))
    offers = []
    real = oracle.prepare_store

    def spy(keys, ctx):
        out = real(keys, ctx)
        offers.append((list(keys), None if out is None else list(out[0])))
        return out

    oracle.prepare_store = spy
    sched.step()  # 2 tokens
    sched.step()  # 4 tokens
    assert r.store_pos == 0 and sched.counters.allocation_failures == 2
    oracle.complete_store(pinned, pin)
    sched.step()  # 5 tokens and a sample: the retry fits now
    k = r.keys
    assert offers == [([k[0]], None), ([k[0], k[1]], None), ([k[0], k[1]], [k[0], k[1]])]
    assert r.store_pos == 2 and sched.counters.retries == 2
    worker.release(worker.in_flight())
    sched.run_until_idle()
    assert sched.counters.stores_completed == 2


def test_completions_of_jobs_issued_before_a_reset_never_reach_the_manager():
    sched, oracle, worker = _checked(num_chunks=4, block_size=2, delay=3)
    r = sched.add_request(Request.from_tokens("r", [1, 2, 3, 4], 2, max_output_tokens=5))
    sched.step()
    assert sched.counters.store_jobs == 1
    calls = []
    real = oracle.complete_store
    oracle.complete_store = lambda keys, ctx=None, success=True: (
        calls.append(keys) or real(keys, ctx, success)
    )
    sched.reset()
    assert calls == [] and sched.counters.stores_stale == 2
    assert r.store_pos == 0
    sched.step()  # r restarts its stores at chunk 0 through the same context
    assert sched.counters.reoffers_after_reset == 1
    sched.run_until_idle()
    assert len(calls) == 1
    c = sched.counters
    assert c.admitted == c.stores_completed + c.stores_failed + c.stores_stale == 4


def test_loads_stop_at_the_first_miss_wait_on_pending_and_pin_hits():
    sched, oracle, worker = _checked(num_chunks=8, block_size=2, delay=2)
    a = sched.add_request(Request.from_tokens("a", [1, 2, 3, 4, 5, 6], 2, max_output_tokens=1))
    sched.step()
    b = sched.add_request(Request.from_tokens("b", [1, 2, 3, 4, 5, 6, 7], 2, max_output_tokens=1))
    sched.step()  # a's stores pending: b is deferred
    assert b.state is RequestState.WAITING and sched.counters.lookups_deferred == 1
    sched.step()
    assert b.state is RequestState.LOADING
    assert [oracle.model.resident[k]["ref"] for k in a.keys] == [1, 1, 1]
    sched.run_until_idle()
    assert sched.counters.loads == 3 and sched.counters.prefix_hits == 3
    assert [oracle.model.resident[k]["ref"] for k in a.keys] == [0, 0, 0]
    c = sched.manager.target if hasattr(sched.manager, "target") else sched.manager
    assert c.lookup(b.keys[0]) is LookupResult.HIT
    # a request whose prefix differs after block 1 loads one chunk only
    d = sched.add_request(Request.from_tokens("d", [1, 2, 9, 9, 5, 6, 7], 2, max_output_tokens=1))
    sched.run_until_idle()
    assert sched.counters.loads == 4 and d.preemptions == 0


def test_a_failed_copy_completes_the_store_unsuccessfully():
    sched, oracle, worker = _checked(num_chunks=4, block_size=2, delay=2)
    r = sched.add_request(Request.from_tokens("r", [1, 2, 3, 4], 2, max_output_tokens=3))
    sched.step()
    (job,) = worker.in_flight()
    worker.fail(job)
    sched.run_until_idle()
    assert sched.counters.stores_failed == 2 and sched.counters.stores_completed == 0
    assert all(k not in oracle.model.resident for k in r.keys)


def test_preemption_when_gpu_blocks_run_out_restarts_the_last_request():
    sched, oracle, worker = _checked(num_chunks=16, block_size=2, num_gpu_blocks=6)
    first = sched.add_request(Request.from_tokens("p", [1, 2, 3, 4], 2, max_output_tokens=4))
    second = sched.add_request(Request.from_tokens("q", [5, 6, 7, 8], 2, max_output_tokens=4))
    sched.run_until_idle()
    assert first.preemptions == 0 and second.preemptions >= 1
    assert sched.counters.finished == 2 and not sched.requests


def test_stored_chunks_hold_their_keys_data():
    sched, oracle, worker = _checked(num_chunks=3, block_size=2, blocks_per_chunk=2, delay=2)
    reqs = [
        sched.add_request(
            Request.from_tokens(f"r{i}", [1, 2, i, 3, 4, 5, 6, 7, 8], 2, max_output_tokens=2)
        )
        for i in range(4)
    ]
    sched.run_until_idle()
    seen = 0
    for r in reqs:
        for i, key in enumerate(r.keys):
            entry = oracle.model.resident.get(key)
            if entry is not None and entry["ref"] >= 0:
                seen += 1
                assert worker.chunk_tags(entry["chunk"]) == r.block_hashes[2 * i : 2 * i + 2]
    assert seen == 3


def test_lockstep_names_the_step_and_the_call():
    oracle = LockstepManager(
        NativeAdapter(EVERY_OFFER_COUNTS(4, store_threshold=2)), Model(4, store_threshold=2)
    )
    sched = Scheduler(
        oracle, NullWorker(delay=1), block_size=2, on_step=oracle.set_step, **driver_hooks(oracle)
    )
    r = sched.add_request(Request.from_tokens("r", [1, 2], 2, max_output_tokens=3))
    sched.step()
    sched.preempt(r)
    with pytest.raises(Divergence) as info:
        sched.run_until_idle()
    assert info.value.step == 2 and "prepare_store" in info.value.call
    assert "step 2" in str(info.value) and "ReqContext('r')" in str(info.value)


class _NoSkipMetric(OffloadingManager):
    """Reports every metric but the skip count (as a build that stopped emitting it would)."""

    def get_stats(self):
        stats = super().get_stats().as_dict()
        stats.pop("vllm:kv_offload_stores_skipped", None)
        return stats


class _NoWriteGauge(OffloadingManager):
    """Never reports the write-usage gauge (an adapter that cannot see it, say)."""

    def get_stats(self):
        stats = super().get_stats().as_dict()
        stats.pop("vllm:kv_offload_cpu_cache_write_usage_perc")
        return stats


class _WriteGaugeGoesMissing(OffloadingManager):
    """Reports the write-usage gauge at its first read only."""

    reads = 0

    def get_stats(self):
        stats = super().get_stats().as_dict()
        self.reads += 1
        if self.reads > 1:
            stats.pop("vllm:kv_offload_cpu_cache_write_usage_perc")
        return stats


class _InventsSkips(OffloadingManager):
    def get_stats(self):
        return {**super().get_stats().as_dict(), "vllm:kv_offload_stores_skipped": 1}


@pytest.mark.parametrize(
    "cls, foreign, agrees",
    [
        (_NoSkipMetric, True, False),  # no target may leave out the skip metric at threshold >= 2
        (_NoSkipMetric, False, False),
        (_NoWriteGauge, True, True),  # a foreign target reports a fixed set: its first read's
        (_NoWriteGauge, False, False),  # an exact one reports the model's
        (_WriteGaugeGoesMissing, True, False),  # and a metric that goes missing later diverges
        (_InventsSkips, True, False),  # none may report skips at store_threshold < 2
        (_InventsSkips, False, False),
    ],
)
def test_lockstep_stats_no_metric_is_optional_by_silence(cls, foreign, agrees):
    """Spec §5: a metric is never optional by silence (each row: what the oracle says)."""
    threshold = 1 if cls is _InventsSkips else 2
    oracle = LockstepManager(
        NativeAdapter(cls(2, store_threshold=threshold)),
        Model(2, store_threshold=threshold),
        foreign=foreign,
    )
    ctx = ReqContext("r")
    oracle.on_new_request(ctx)
    oracle.prepare_store([make_key(b"a")], ctx)
    if agrees:
        oracle.get_stats()
        oracle.get_stats()
        return
    with pytest.raises(Divergence, match="get_stats"):
        oracle.get_stats()
        oracle.get_stats()


def test_each_key_gets_its_position_on_the_requests_context():
    """As an engine's scheduler does: the token index just past the key's chunk."""
    sched = Scheduler(_impl(4), NullWorker(), block_size=2, blocks_per_chunk=2)
    r = sched.add_request(Request.from_tokens("r", list(range(13)), 2, max_output_tokens=1))
    assert len(r.keys) == 3  # 13 tokens: 6 complete blocks, 3 chunks of 4 tokens
    assert [r.ctx.get_offload_key_position(k) for k in r.keys] == [4, 8, 12]


class _Face:
    """A manager with an adapter's face (``new_context``, ``set_position``, ``missing``) that
    answers impl's ``Stats``: the driver must use what it is handed, never look for these."""

    def __init__(self):
        self.inner = _impl(4)
        self.missing = frozenset({"touch"})
        self.touched = 0

    def new_context(self, req_id):
        raise AssertionError("the driver looked for new_context on the manager")

    def set_position(self, ctx, key, position):
        raise AssertionError("the driver looked for set_position on the manager")

    def touch(self, keys, ctx=None):
        self.touched += 1
        self.inner.touch(keys, ctx)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _loads_once(sched):
    sched.add_request(Request.from_tokens("a", [1, 2, 3], 1, max_output_tokens=1))
    sched.run_until_idle()
    sched.add_request(Request.from_tokens("b", [1, 2, 3], 1, max_output_tokens=1))
    sched.run_until_idle()
    assert sched.counters.load_jobs == 1


def test_the_driver_takes_what_it_needs_as_arguments_and_sniffs_nothing():
    face = _Face()
    _loads_once(Scheduler(face, NullWorker(), block_size=1))  # the defaults: impl's types
    assert face.touched == 1, "missing on the manager must not switch touch off"
    made, positions, read = [], [], []
    face = _Face()
    sched = Scheduler(
        face,
        NullWorker(),
        block_size=1,
        new_context=lambda req_id: made.append(req_id) or ReqContext(req_id),
        set_position=lambda ctx, key, end: positions.append(end),
        stats_dict=lambda stats: read.append(stats) or Stats.as_dict(stats),
        touch=False,
    )
    _loads_once(sched)
    assert made == ["a", "b"] and positions == [1, 2, 3, 1, 2, 3]
    assert face.touched == 0 and read and all(isinstance(s, Stats) for s in read)
    assert sched.counters.skips == sum(Stats.as_dict(s).get(STORES_SKIPPED, 0) for s in read)


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="blocks_per_chunk"):
        Scheduler(_impl(2), NullWorker(), blocks_per_chunk=0)
    sched = Scheduler(_impl(2), NullWorker(), block_size=2, num_gpu_blocks=2)
    with pytest.raises(ValueError, match="needs 3 GPU blocks; there are 2"):
        sched.add_request(Request.from_tokens("big", [1] * 6, 2, max_output_tokens=1))


# --------------------------------------------------------------------------- the machine


def test_scheduler_machine_passes_on_impl_and_reaches_every_situation():
    # The ci profile (derandomized) whatever profile the suite runs under: a coverage claim
    # must not depend on the seed.
    machine = make_machine(resolve_target("impl"))
    result = run_machine(machine, "ci")
    assert result.passed, result.message + "\n" + "\n".join(result.program)
    missing = [s for s in machine.expected_labels() if not result.labels.get(s)]
    assert not missing, f"never reached: {missing}; reached {result.labels}"


@pytest.mark.parametrize("name", SCHEDULER_CAUGHT)
def test_scheduler_machine_catches_admission_variant(name):
    """Through the scheduler path alone: engine events only, and only the answers of the calls
    the driver makes and the end-to-end checks (no look at the tracker or the policy's order).
    Shrinking is skipped here for time, so the failure is the first one found."""
    result = run_machine(
        make_machine(resolve_target(f"mutant:{name}"), compare_state=False),
        "ci",
        phases=FIRST_FAILURE,
    )
    assert not result.passed, f"{name} was not caught through the scheduler"
    assert isinstance(result.error, AssertionError), result.message


class _LoadsNothing(NullWorker):
    """Its loads report success without copying: the GPU blocks keep what they held."""

    def _finish(self, job_id):
        if self._jobs[job_id][1] != "load":
            return super()._finish(job_id)
        del self._jobs[job_id]
        return TransferResult(job_id, True, 0, 0.0)


def test_scheduler_machine_checks_that_loads_bring_their_data():
    """The audit's data checks are built in the machine and read by it: a worker whose loads
    bring nothing is caught by them (no manager answer differs)."""
    machine = make_machine(resolve_target("impl"), worker_cls=_LoadsNothing)
    result = run_machine(machine, "ci", phases=FIRST_FAILURE)
    assert not result.passed
    assert "data: step" in result.message and "loaded from chunk" in result.message, result.message


def test_the_audit_reads_the_oracles_record_of_offers_and_keeps_none_of_its_own():
    """One record of who offered what per machine: the audit over the oracle reads the
    oracle's; were it to record too, it would start the key's since-entry offerers over."""
    oracle = LockstepManager(
        NativeAdapter(_impl(4, store_threshold=3)), Model(4, store_threshold=3)
    )
    audit = Audit(oracle, NullWorker(track_data=True), 3, data=True, offers=oracle.offers)
    key = make_key(b"a")
    for name in ("r", "s", "r"):
        ctx = ReqContext(name)
        audit.manager.on_new_request(ctx)
        audit.manager.prepare_store([key], ctx)
    assert audit.offers is oracle.offers
    assert (oracle.offers.ever(key), oracle.offers.since_entry(key)) == (3, 3)
    assert audit.cold_admissions == 0
