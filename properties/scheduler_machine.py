"""The request-level machine: engine events drive the scheduler driver (impl/scheduler.py).

Rules are engine events: add a request (tokens from a two-letter vocabulary, so prefixes are
shared; request ids from a pool of three, so a new request may reuse a finished one's id), step
the scheduler, let copies complete, make a copy fail, preempt a request, resume it, finish it,
reset the cache. Retries after ``None``, re-offers after preemption, finish-time retries and
offers across a reset all come from the driver, as they do in an engine.

Checked:

- every manager call the driver makes, against the reference model, in lockstep
  (``properties.lockstep.LockstepManager``: admitted keys, chunk ids, evictions, lookups, load
  specs, events, stats);
- end to end: every ready chunk holds the data of its key's blocks, and every block a running
  request computed or loaded holds its data (``NullWorker`` carries one tag per block);
- no chunk is ever stored for a key that fewer than ``store_threshold`` requests offered (a
  reset starts every request's offers over, as SPEC A7 starts its counting over);
- the store accounting adds up: admitted = completed + failed + dropped by a reset + in flight;
- for native targets, the tracker (keys, counts, recency) and the policy's order equal the
  model's after every step, so a difference shows before it changes an admission or eviction.

``machine_for(factory)`` builds the machine for any manager factory ``(num_chunks,
cache_policy=..., store_threshold=..., max_tracker_size=...)``: impl, a catalogued mutant, or
a target's ``make``. ``SchedulerMachine.seen`` collects, across runs, which situations occurred.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from hypothesis import event, note, settings as Settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule, run_state_machine_as_test)

from kvgate.impl.scheduler import Request, RequestState, Scheduler
from kvgate.model.cache import Model

from .audit import Audit
from .oracle import LockstepManager, fmt_key
from .null_worker import NullWorker

VOCAB = (1, 2)
NAMES = ("a", "b", "c")
BLOCK_SIZE = 1
GPU_BLOCKS = 16
ACTIVE = (RequestState.WAITING, RequestState.HELD, RequestState.LOADING, RequestState.RUNNING)

# Situations a run can reach; tests require each to occur under the ci profile.
SITUATIONS = ("allocation failure", "retry after None", "finish-time retry",
              "re-offer after preemption", "offer across a reset", "stale completion dropped",
              "load", "load deferred by HIT_PENDING", "failed copy", "eviction", "skip",
              "preemption for GPU blocks", "request id reused")


class SchedulerMachineBase(RuleBasedStateMachine):
    factory: Callable[..., object]
    foreign: bool = False
    compare_state: bool = True
    policies: tuple[str, ...] = ("lru", "arc")
    seen: Counter = Counter()
    last_history: list = []

    def __init__(self):
        super().__init__()
        self.sched: Scheduler | None = None
        self.expected: dict[bytes, tuple[bytes, ...]] = {}
        self.used_names: set[str] = set()
        self.situations: set[str] = set()
        self.history: list[dict] = []

    # ------------------------------------------------------------------ set-up
    @initialize(num_chunks=st.integers(1, 3), threshold=st.sampled_from([2, 2, 3, 1, 0]),
                tracker=st.sampled_from([64_000, 2, 4]), policy_index=st.integers(0, 1),
                blocks_per_chunk=st.sampled_from([1, 2]), delay=st.sampled_from([None, 1, 2]),
                budget=st.sampled_from([None, 3]))
    def setup(self, num_chunks, threshold, tracker, policy_index, blocks_per_chunk, delay,
              budget):
        policy = self.policies[policy_index % len(self.policies)]
        target = type(self).factory(num_chunks, cache_policy=policy, store_threshold=threshold,
                                    max_tracker_size=tracker)
        self.threshold = threshold
        self.model = Model(num_chunks, policy, threshold, tracker)
        self.proxy = LockstepManager(target, self.model, foreign=self.foreign, log=self.history)
        self.worker = NullWorker(delay=delay, blocks_per_chunk=blocks_per_chunk, track_data=True)
        self.bpc = blocks_per_chunk
        self.audit = Audit(self.proxy, self.worker, threshold, blocks_per_chunk)
        self.sched = Scheduler(self.audit.manager, self.worker, block_size=BLOCK_SIZE,
                               blocks_per_chunk=blocks_per_chunk, num_gpu_blocks=GPU_BLOCKS,
                               max_running=4, max_tokens_per_step=budget,
                               on_step=self._on_step)

    def _on_step(self, step: int) -> None:
        self.proxy.set_step(step)
        self.audit.set_step(step)

    # ------------------------------------------------------------------ helpers
    def _pick(self, which: int, states) -> Request:
        """The ``which``-th (cyclically) live request in one of ``states``, in arrival order."""
        reqs = [r for r in self.sched.requests.values() if r.state in states]
        return reqs[which % len(reqs)]

    def _has(self, *states) -> bool:
        return self.sched is not None and any(r.state in states
                                              for r in self.sched.requests.values())

    def _label(self, name: str) -> None:
        if name not in self.situations:
            self.situations.add(name)
            if currently_in_test_context():  # a printed program may run outside Hypothesis
                event(name)

    def _after(self, before: dict) -> None:
        c = self.sched.counters.as_dict()
        for name, counter in (("allocation failure", "allocation_failures"),
                              ("retry after None", "retries"),
                              ("finish-time retry", "finish_retries"),
                              ("re-offer after preemption", "reoffers_after_preemption"),
                              ("offer across a reset", "reoffers_after_reset"),
                              ("stale completion dropped", "stores_stale"),
                              ("load", "load_jobs"),
                              ("load deferred by HIT_PENDING", "lookups_deferred"),
                              ("failed copy", "stores_failed"), ("eviction", "evictions"),
                              ("skip", "skips"), ("preemption for GPU blocks", "preemptions")):
            if c[counter] > before[counter]:
                self._label(name)

    # ------------------------------------------------------------------ engine events
    @precondition(lambda self: self.sched is not None
                  and sum(r.state in ACTIVE for r in self.sched.requests.values()) < 4
                  and any(n not in self.sched.requests for n in NAMES))
    @rule(name=st.sampled_from(NAMES),
          tokens=st.lists(st.sampled_from(VOCAB), min_size=1, max_size=8),
          max_output=st.integers(1, 6))
    def add_request(self, name, tokens, max_output):
        """``name``, or the next free id after it when it is live."""
        i = NAMES.index(name)
        name = next(n for n in NAMES[i:] + NAMES[:i] if n not in self.sched.requests)
        if name in self.used_names:
            self._label("request id reused")
        self.used_names.add(name)
        req = self.sched.add_request(Request.from_tokens(name, tokens, BLOCK_SIZE, max_output))
        for i, key in enumerate(req.keys):
            self.expected[key] = tuple(req.block_hashes[i * self.bpc:(i + 1) * self.bpc])

    @precondition(lambda self: self.sched is not None)
    @rule(n=st.integers(1, 3))
    def step(self, n):
        before = self.sched.counters.as_dict()
        for _ in range(n):
            self.sched.step()
        self._after(before)

    @precondition(lambda self: self.sched is not None and self.worker.in_flight())
    @rule(mask=st.integers(1, 63))
    def complete_copies(self, mask):
        """Let the in-flight jobs picked by the bits of ``mask`` complete (at least one)."""
        jobs = self.worker.in_flight()
        picked = [j for i, j in enumerate(jobs) if mask >> (i % 6) & 1] or jobs[:1]
        self.worker.release(picked)

    @precondition(lambda self: self.sched is not None
                  and any(self.worker.kind(j) == "store" for j in self.worker.in_flight()))
    @rule(which=st.integers(0, 3))
    def fail_copy(self, which):
        stores = [j for j in self.worker.in_flight() if self.worker.kind(j) == "store"]
        job = stores[which % len(stores)]
        self.worker.fail(job)
        self.worker.release([job])

    @precondition(lambda self: self._has(RequestState.RUNNING, RequestState.LOADING))
    @rule(which=st.integers(0, 3), hold=st.booleans())
    def preempt(self, which, hold):
        """``hold``: stays preempted until ``resume``; else resumable at the next step."""
        req = self._pick(which, (RequestState.RUNNING, RequestState.LOADING))
        before = self.sched.counters.as_dict()
        self.sched.preempt(req, hold=hold)
        self._after({**before, "preemptions": before["preemptions"] + 1})

    @precondition(lambda self: self._has(RequestState.HELD))
    @rule(which=st.integers(0, 3))
    def resume(self, which):
        self.sched.resume(self._pick(which, (RequestState.HELD,)))

    @precondition(lambda self: self._has(*ACTIVE))
    @rule(which=st.integers(0, 3))
    def finish(self, which):
        self.sched.finish(self._pick(which, ACTIVE))

    @precondition(lambda self: self.sched is not None)
    @rule()
    def reset(self):
        before = self.sched.counters.as_dict()
        self.sched.reset()
        self._after(before)

    # ------------------------------------------------------------------ checks
    @invariant()
    def end_to_end(self):
        """Cold admissions, data in chunks and GPU blocks, store accounting (one check line per
        step in a printed counterexample; the lockstep checks run inside every call)."""
        if self.sched is None:
            return
        self._no_chunk_for_a_key_too_few_requests_offered()
        self._ready_chunks_hold_their_keys_data()
        self._computed_blocks_hold_their_data()
        self._store_accounting_adds_up()
        if self.compare_state and not self.foreign:
            self._tracker_and_policy_order_agree()

    def _no_chunk_for_a_key_too_few_requests_offered(self):
        if self.audit.cold_admissions:
            step, key, n = self.audit.cold[0]
            raise AssertionError(
                f"step {step}: {fmt_key(key)} admitted after {n} distinct request(s) offered "
                f"it, store_threshold={self.threshold}")

    def _ready_chunks_hold_their_keys_data(self):
        for key, entry in self.model.resident.items():
            if entry["ref"] >= 0:
                held = tuple(self.worker.chunk_tags(entry["chunk"]))
                assert held == self.expected[key], (
                    f"chunk {entry['chunk']} of {fmt_key(key)} holds the wrong data")

    def _computed_blocks_hold_their_data(self):
        for req in self.sched.requests.values():
            if req.state is not RequestState.RUNNING:
                continue
            n = min(req.num_computed // BLOCK_SIZE, len(req.block_hashes))
            for b in range(n):
                assert self.worker.gpu_tag(req.block_table[b]) == req.block_hashes[b], (
                    f"{req!r}: GPU block {req.block_table[b]} (block {b}) holds the wrong data")

    def _tracker_and_policy_order_agree(self):
        """Native targets only: what shows later as a different admission or eviction."""
        target, m = self.proxy.target, self.model
        got = _tracker_of(target)
        if got is not None or m.tracker_items():
            assert [(fmt_key(k), c) for k, c in got or []] == \
                [(fmt_key(k), c) for k, c in m.tracker_items()], "tracker (key, count) differs"
        order = _policy_of(target)
        if order is not None:
            want = {"lru": m.lru} if m.policy == "lru" else {
                "t1": m.t1, "t2": m.t2, "b1": m.b1, "b2": m.b2, "p": m.p}
            show = lambda st: {k: v if k == "p" else [fmt_key(x) for x in v]  # noqa: E731
                               for k, v in st.items()}
            assert show(order) == show(want), "policy order differs"

    def _store_accounting_adds_up(self):
        c = self.sched.counters
        in_flight = sum(len(keys) for kind, _, keys in self.sched.jobs_in_flight().values()
                        if kind == "store")
        assert c.admitted == c.stores_completed + c.stores_failed + c.stores_stale + in_flight, (
            f"store accounting: {c.as_dict()}, {in_flight} in flight")

    def teardown(self):
        if self.sched is not None and currently_in_test_context():
            note(f"counters: {self.sched.counters.as_dict()}")
        type(self).seen.update(self.situations)
        type(self).last_history = self.history


def _tracker_of(target) -> list | None:
    fn = getattr(target, "tracker_items", None)
    if callable(fn):
        return fn()
    tracker = getattr(target, "tracker", None)
    return None if tracker is None else list(tracker.counts.items())


def _policy_of(target) -> dict | None:
    fn = getattr(target, "policy_state", None)
    return fn() if callable(fn) else None


def machine_for(factory: Callable[..., object], *, foreign: bool = False,
                policies: tuple[str, ...] = ("lru", "arc"),
                compare_state: bool = True) -> type[SchedulerMachineBase]:
    """The scheduler machine for one manager factory. ``compare_state=False``: only the calls'
    answers and the end-to-end checks, no inspection of the target's tracker or policy."""
    name = getattr(getattr(factory, "cls", factory), "__name__", type(factory).__name__)
    cls = type(f"SchedulerMachine_{name}", (SchedulerMachineBase,),
               {"factory": staticmethod(factory), "foreign": foreign,
                "policies": tuple(policies), "compare_state": compare_state,
                "seen": Counter()})
    return cls


def run_machine(machine: type[SchedulerMachineBase], settings: Settings | None = None) -> None:
    run_state_machine_as_test(machine, settings=settings)

