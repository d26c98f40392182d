"""The request-level machine: engine events drive the scheduler driver (impl/scheduler.py).

How it works and why: docs/internals.md, section properties/scheduler_machine.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvgate.impl.scheduler import Request, RequestState, Scheduler, block_hashes_of, chunk_keys

from .adapters import Config, Target, model_for
from .audit import Audit
from .null_worker import NullWorker
from .oracle import LockstepManager, fmt_key
from .search.coverage import Predicate, Recorded
from .search.rule_choice import install as install_rule_choice

VOCAB = (1, 2)
NAMES = ("a", "b", "c")
BLOCK_SIZE = 1
GPU_BLOCKS = 16
ACTIVE = (RequestState.WAITING, RequestState.HELD, RequestState.LOADING, RequestState.RUNNING)

# Situation -> the scheduler counter that shows it (a step earns the label when it grows).
COUNTED = {
    "allocation failure": "allocation_failures",
    "retry after None": "retries",
    "finish-time retry": "finish_retries",
    "re-offer after preemption": "reoffers_after_preemption",
    "offer across a reset": "reoffers_after_reset",
    "stale completion dropped": "stores_stale",
    "load": "load_jobs",
    "load deferred by HIT_PENDING": "lookups_deferred",
    "failed copy": "stores_failed",
    "eviction": "evictions",
    "skip": "skips",
    "preemption for GPU blocks": "preemptions",
}


def _grew(counter: str) -> Predicate:
    """Whether a step's entry shows ``counter`` grew."""
    return lambda e: counter in e.get("grew", ())


LABELS: dict[str, Predicate] = {
    **{label: _grew(counter) for label, counter in COUNTED.items()},
    "request id reused": lambda e: e.get("id_reused", False),
    "swarm: rules switched off": lambda e: e["rule"] == "swarm" and bool(e["off"]),
}


def _named(names: Callable[[Any], Sequence[str]]) -> st.SearchStrategy[str]:
    """One of the names the machine offers at this step (``names(machine)``), drawn as a name,
    so that a printed counterexample says which policy, request or recency it means instead of
    an index a reader must look up."""
    return st.runner().flatmap(lambda machine: st.sampled_from(list(names(machine))))


class SchedulerMachineBase(Recorded, RuleBasedStateMachine):
    TARGET: Target  # set by make_machine
    worker_cls: Callable[..., NullWorker] = NullWorker  # NullWorker's interface, data tags on
    foreign: bool = False
    compare_state: bool = True
    policies: tuple[str, ...] = ("lru", "arc")
    recencies: tuple[str, ...] = ("touch",)  # the target's recency semantics (spec section 4)
    LABELS = LABELS
    RULE_WEIGHTS = {
        "step": 3,
        "add_request": 2,
        "complete_copies": 2,
        "fail_copy": 1,
        "preempt": 1,
        "resume": 1,
        "finish": 1,
        "reset": 1,
    }
    SWARM_ALWAYS = ("step", "add_request")

    def __init__(self):
        super().__init__()
        self.sched: Scheduler | None = None
        self.used_names: set[str] = set()
        self.history: list[dict] = []
        self.key_names: dict[bytes, str] = {}  # a chunk's key -> its tokens ('t12': [1, 2])
        self.blocks_per_chunk = 1
        install_rule_choice(self)

    def _key_name(self, key) -> str:
        """A key by the prompt tokens its chunk ends ('t12': tokens 1, 2), as the steps say
        them; a key the machine never made keeps the oracle's short form."""
        return self.key_names.get(key) or fmt_key(key)

    def _name_keys(self, tokens) -> None:
        hashes = block_hashes_of(tokens, BLOCK_SIZE)
        tokens_per_chunk = self.blocks_per_chunk * BLOCK_SIZE
        for i, key in enumerate(chunk_keys(hashes, self.blocks_per_chunk)):
            end = (i + 1) * tokens_per_chunk
            self.key_names.setdefault(key, "t" + "".join(map(str, tokens[:end])))

    # ------------------------------------------------------------------ set-up
    @initialize(
        num_chunks=st.integers(1, 3),
        threshold=st.sampled_from([2, 2, 3, 1, 0]),
        tracker=st.sampled_from([64_000, 2, 4]),
        policy=_named(lambda m: m.policies),
        blocks_per_chunk=st.sampled_from([1, 2]),
        delay=st.sampled_from([None, 1, 2]),
        budget=st.sampled_from([None, 3]),
        recency=_named(lambda m: m.recencies),
    )
    def setup(
        self, num_chunks, threshold, tracker, policy, blocks_per_chunk, delay, budget, recency
    ):
        self.blocks_per_chunk = blocks_per_chunk
        config = Config(
            num_chunks=num_chunks,
            store_threshold=threshold,
            max_tracker_size=tracker,
            cache_policy=policy,
            recency=recency,
        )
        target = self.TARGET.make(config)  # an adapter
        self.threshold = threshold
        self.model = model_for(config)
        self.oracle = LockstepManager(
            target, self.model, foreign=self.foreign, log=self.history, key_name=self._key_name
        )
        self.worker = self.worker_cls(
            delay=delay, blocks_per_chunk=blocks_per_chunk, track_data=True
        )
        self.audit = Audit(
            self.oracle,
            self.worker,
            threshold,
            blocks_per_chunk,
            data=True,
            offers=self.oracle.offers,
        )
        self.sched = self.audit.driver(
            block_size=BLOCK_SIZE,
            blocks_per_chunk=blocks_per_chunk,
            num_gpu_blocks=GPU_BLOCKS,
            max_running=4,
            max_tokens_per_step=budget,
            on_step=self._on_step,
        )

    def _on_step(self, step: int) -> None:
        self.oracle.set_step(step)
        self.audit.set_step(step)

    # ------------------------------------------------------------------ helpers
    def _ids(self, *states) -> list[str]:
        """The live requests in one of ``states``, in arrival order (what a rule may pick)."""
        assert self.sched is not None  # the rules that pick run after set-up made it
        return [r.req_id for r in self.sched.requests.values() if r.state in states]

    def _free_ids(self) -> list[str]:
        assert self.sched is not None
        return [n for n in NAMES if n not in self.sched.requests]

    def _has(self, *states) -> bool:
        return self.sched is not None and any(
            r.state in states for r in self.sched.requests.values()
        )

    def _after(self, rule: str, before: dict, **facts) -> None:
        """Record the step: which of the scheduler's counters grew."""
        assert self.sched is not None  # the rules that record run after set-up made it
        c = self.sched.counters.as_dict()
        grew = [counter for counter in COUNTED.values() if c[counter] > before[counter]]
        self.record(rule, grew=grew, **facts)

    # ------------------------------------------------------------------ engine events
    @precondition(
        lambda self: (
            self.sched is not None
            and sum(r.state in ACTIVE for r in self.sched.requests.values()) < 4
            and any(n not in self.sched.requests for n in NAMES)
        )
    )
    @rule(
        name=_named(lambda m: m._free_ids()),
        tokens=st.lists(st.sampled_from(VOCAB), min_size=1, max_size=8),
        max_output=st.integers(1, 6),
    )
    def add_request(self, name, tokens, max_output):
        """A new request under an id no live request has (a finished one's may come back)."""
        self._name_keys(tokens)
        reused = name in self.used_names
        self.used_names.add(name)
        self.audit.expect(
            self.sched.add_request(Request.from_tokens(name, tokens, BLOCK_SIZE, max_output))
        )
        self.record("add_request", id_reused=reused)

    @precondition(lambda self: self.sched is not None)
    @rule(n=st.integers(1, 3))
    def step(self, n):
        before = self.sched.counters.as_dict()
        for _ in range(n):
            self.sched.step()
        self._after("step", before)

    @precondition(lambda self: self.sched is not None and self.worker.in_flight())
    @rule(mask=st.integers(1, 63))
    def complete_copies(self, mask):
        """Let the in-flight jobs picked by the bits of ``mask`` complete (at least one)."""
        jobs = self.worker.in_flight()
        picked = [j for i, j in enumerate(jobs) if mask >> (i % 6) & 1] or jobs[:1]
        self.worker.release(picked)
        self.record("complete_copies", jobs=len(picked))

    @precondition(
        lambda self: (
            self.sched is not None
            and any(self.worker.kind(j) == "store" for j in self.worker.in_flight())
        )
    )
    @rule(which=st.integers(0, 3))
    def fail_copy(self, which):
        stores = [j for j in self.worker.in_flight() if self.worker.kind(j) == "store"]
        job = stores[which % len(stores)]
        self.worker.fail(job)
        self.worker.release([job])
        self.record("fail_copy")

    @precondition(lambda self: self._has(RequestState.RUNNING, RequestState.LOADING))
    @rule(
        req=_named(lambda m: m._ids(RequestState.RUNNING, RequestState.LOADING)), hold=st.booleans()
    )
    def preempt(self, req, hold):
        """``hold``: stays preempted until ``resume``; else resumable at the next step."""
        req = self.sched.requests[req]
        before = self.sched.counters.as_dict()
        self.sched.preempt(req, hold=hold)
        self._after("preempt", {**before, "preemptions": before["preemptions"] + 1})

    @precondition(lambda self: self._has(RequestState.HELD))
    @rule(req=_named(lambda m: m._ids(RequestState.HELD)))
    def resume(self, req):
        self.sched.resume(self.sched.requests[req])
        self.record("resume")

    @precondition(lambda self: self._has(*ACTIVE))
    @rule(req=_named(lambda m: m._ids(*ACTIVE)))
    def finish(self, req):
        self.sched.finish(self.sched.requests[req])
        self.record("finish")

    @precondition(lambda self: self.sched is not None)
    @rule()
    def reset(self):
        before = self.sched.counters.as_dict()
        self.sched.reset()
        self._after("reset", before)

    # ------------------------------------------------------------------ checks
    @invariant()
    def end_to_end(self):
        """Cold admissions, data in chunks and GPU blocks, store accounting (one check line per
        step in a printed counterexample; the lockstep checks run inside every call)."""
        if self.sched is None:
            return
        self._no_chunk_for_a_key_too_few_requests_offered()
        self._loads_and_stores_moved_their_data()
        self._ready_chunks_hold_their_keys_data()
        self._computed_blocks_hold_their_data()
        self._store_accounting_adds_up()
        if self.compare_state:
            self.oracle.check_state()

    def _no_chunk_for_a_key_too_few_requests_offered(self):
        if self.audit.cold_admissions:
            step, key, n = self.audit.cold[0]
            raise AssertionError(
                f"step {step}: {fmt_key(key)} admitted after {n} distinct request(s) offered "
                f"it, store_threshold={self.threshold}"
            )

    def _loads_and_stores_moved_their_data(self):
        errors = self.audit.data_errors + self.audit.stored_data_errors()
        assert not errors, f"data: {errors[0]}" + (
            f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        )

    def _ready_chunks_hold_their_keys_data(self):
        for key, entry in self.model.resident.items():
            if entry["ref"] >= 0:
                held = tuple(self.worker.chunk_tags(entry["chunk"]))
                assert held == self.audit.expected_tags(key), (
                    f"chunk {entry['chunk']} of {fmt_key(key)} holds the wrong data"
                )

    def _computed_blocks_hold_their_data(self):
        for req in self.sched.requests.values():
            if req.state is not RequestState.RUNNING:
                continue
            n = min(req.num_computed // BLOCK_SIZE, len(req.block_hashes))
            for b in range(n):
                assert self.worker.gpu_tag(req.block_table[b]) == req.block_hashes[b], (
                    f"{req!r}: GPU block {req.block_table[b]} (block {b}) holds the wrong data"
                )

    def _store_accounting_adds_up(self):
        c = self.sched.counters
        in_flight = sum(
            len(keys) for kind, _, keys in self.sched.jobs_in_flight().values() if kind == "store"
        )
        assert c.admitted == c.stores_completed + c.stores_failed + c.stores_stale + in_flight, (
            f"store accounting: {c.as_dict()}, {in_flight} in flight"
        )

    def teardown(self):
        if self.sched is not None:
            if currently_in_test_context():
                note(f"counters: {self.sched.counters.as_dict()}")
            self.count_labels()


def make_machine(
    target: Target,
    *,
    compare_state: bool = True,
    worker_cls: Callable[..., NullWorker] = NullWorker,
) -> type[SchedulerMachineBase]:
    """The scheduler machine checking ``target``, named as Hypothesis prints it.
    ``compare_state=False``: only the calls' answers and the end-to-end checks, no inspection of
    the target's tracker or policy. ``worker_cls``: the worker, built as ``NullWorker`` is (a
    variant of it, to show that the end-to-end checks fail)."""
    from .manager_machine import machine_name

    name = machine_name("SchedulerMachine", target.spec)
    return type(
        name,
        (SchedulerMachineBase,),
        {
            "TARGET": target,
            "foreign": target.foreign,
            "policies": tuple(target.policies),
            "recencies": tuple(target.recencies),
            "compare_state": compare_state,
            "worker_cls": staticmethod(worker_cls),
            "__qualname__": name,
        },
    )
