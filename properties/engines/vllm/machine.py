"""The machine over vLLM's own scheduling path (``properties.engines.vllm.engine``).

Each rule is an engine event, applied to the installed release's ``Scheduler`` (sync or async,
and KV events on or off, drawn per example) with the ``OffloadingConnector``'s scheduler side
and the target manager behind it, every manager call checked by the lockstep oracle:

- ``add_request(blocks, tail, max_tokens, max_load)``: a new request whose prompt is a string of
  block contents from a pool of three (``'A'``, ``'B'``, ``'C'``: requests share prefixes), plus
  ``tail`` tokens of a last, partial block; it generates ``max_tokens`` tokens and loads at most
  ``max_load`` tokens from the CPU tier (``None``: no cap; the connector's
  ``max_load_tokens``), or, with ``max_load='cpu'``, loads from the local CPU tier alone (no
  cap; ``kv_load_tiers`` names that tier, beside an entry naming no medium vLLM knows);
  ``repeat=n`` puts the blocks of the ``n``-th latest request's prompt
  first (up to 6 blocks in all), so that requests meet prefixes the CPU tier holds;
  ``repeat=-1`` sends the latest prompt again as it was (``blocks`` unused; ``tail`` drawn),
  the commonest hit there is;
- ``step(n)``: ``n`` engine-core steps (schedule, run, update; async keeps two batches);
- ``deliver(mask)``: the in-flight store and load jobs picked by ``mask`` complete (they are
  reported in the next step's output); jobs not picked stay in flight;
- ``fail_stores(mask)``: the in-flight store jobs picked by ``mask`` complete with their copy
  failed (where the release's worker can report it): the chunks keep what they held;
- ``stream(which, blocks, tail, max_tokens)``: a streaming-input session (vLLM's resumable
  requests, where the release has them): ``which`` 0 opens one whose first input is
  ``blocks``, 4 closes one, 1 to 3 send one its next input; vLLM appends each input to the
  session's prompt after the turn's output but its last sampled token, so the session's last
  block is hashed again and its chunks' keys change;
- ``abort(which)``: the client aborts a live request;
- ``take_gpu`` / ``give_gpu``: every free GPU block is taken from the scheduler's pool, so the
  next step that needs a block preempts a running request (the preempted request later
  resumes and re-offers its chunks through the same context); then given back;
- ``evict_gpu``: the same, given back at once: the GPU prefix cache forgets every block no
  request holds (so later requests find their prefix in the CPU tier);
- ``reset(running_too)``: the cache reset vLLM runs (``reset_prefix_cache`` with
  ``reset_connector=True``; ``running_too`` preempts the running requests first).

A request finishes when it has generated its tokens; the connector's finish-time offer
follows. Keys are named by the prompt they end: ``'AB'`` is the chunk whose last block
follows ``A`` and holds ``B``; blocks that are not pool contents print their tokens
(``'AB[5,7]'``). The oracle and the request-level checks of ``vllm_engine.Checks`` fail a step
at once; an invariant after every step runs the oracle's incremental state check and raises
what the request-level checks found.

``make_machine(target)`` gives the machine class for a ``vllm`` or ``vllm=MODULE:ATTR``
target; ``unavailable_reason()`` says why it cannot run here (no vLLM), or ``None``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from typing import Any

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ...adapters import TargetError, raised_at
from ...oracle import Divergence
from ...search.coverage import Recorded
from ...search.rule_choice import install as install_rule_choice
from ...targets import Target
from . import explicit_programs
from .configs import (
    BLOCK_SIZE,
    Setup,
    is_vllm_target,
    retentions,
    tiered_lookups,
    unavailable_reason,
)
from .engine import FAULTS, VllmEngine
from .layouts import (
    FULL_ATTENTION,
    NEEDS_MENDS,
    available,
    offload_key,
    streaming_sessions,
    sync_loads,
)

__all__ = [
    "DESCRIPTION",
    "LABELS",
    "NAME",
    "VllmSchedulerMachine",
    "make_machine",
    "unavailable_reason",
]

POOL = {"A": (1, 1), "B": (2, 2), "C": (3, 3)}  # block contents (BLOCK_SIZE tokens each)
TAIL_TOKEN = 5
CPU_ONLY = "cpu"  # a request that names the tiers it loads from (load_tiers.TIER_LISTS)
CPU_LAST = "cpu-last"  # the same tiers, the entry a release skips first
LETTERS: dict[tuple[int, ...], str] = {tokens: letter for letter, tokens in POOL.items()}
MAX_LIVE = 4
MAX_BLOCKS = 6  # blocks of a prompt that repeats an earlier one
RESET_REFUSED = "Failed to reset KV cache even when all the running requests are preempted"

NAME = "vllm-scheduler"
DESCRIPTION = (
    "requests through vLLM's own Scheduler (sync and async) and OffloadingConnector, "
    "every manager call checked"
)

LABELS = {
    "sync scheduling": lambda e: e["rule"] == "setup" and not e["async"],
    "async scheduling": lambda e: e["rule"] == "setup" and e["async"],
    "KV events on": lambda e: e["rule"] == "setup" and e["events"],
    "KV events off": lambda e: e["rule"] == "setup" and not e["events"],
    "sliding-window layout": lambda e: e["rule"] == "setup" and "swa" in e["layout"],
    "drafter (EAGLE) group": lambda e: e["rule"] == "setup" and "eagle" in e["layout"],
    "recurrent (Mamba) group": lambda e: e["rule"] == "setup" and "mamba" in e["layout"],
    "copy-on-write hand-off": lambda e: e.get("block copies", 0) > 0,
    "partial hit": lambda e: e.get("partial hits", 0) > 0,
    "allocation failure": lambda e: e.get("allocation failures", 0) > 0,
    "retry after None": lambda e: e.get("retries", 0) > 0,
    "finish-time offer": lambda e: e.get("finish-time offers", 0) > 0,
    "re-offer after preemption": lambda e: e.get("re-offers", 0) > 0,
    "preemption": lambda e: e.get("preemptions", 0) > 0,
    "eviction": lambda e: e.get("evictions", 0) > 0,
    "load": lambda e: e.get("loads", 0) > 0,
    "hit sources told": lambda e: e.get("hit sources told", 0) > 0,
    "CPU hit": lambda e: e.get("servable hits", 0) > 0,
    "lookup deferred": lambda e: e.get("deferred lookups timed", 0) > 0,
    "load capped by max_load_tokens": lambda e: e.get("capped hits", 0) > 0,
    "offload capped by max_offload_tokens": lambda e: e.get("capped offloads", 0) > 0,
    "manager without stats": lambda e: e["rule"] == "setup" and not e["stats"],
    "tiered manager's RETRY": lambda e: e.get("lookups answered RETRY", 0) > 0,
    "recurrent state handed off": lambda e: e.get("state hand-offs", 0) > 0,
    "hit beside a lookup neither hit nor miss": lambda e: (
        e.get("hits beside unsettled lookups", 0) > 0
    ),
    "stale completion dropped": lambda e: e.get("stale completions", 0) > 0,
    "flush": lambda e: e.get("flushes", 0) > 0,
    "reset": lambda e: e["rule"] == "reset",
    "abort": lambda e: e["rule"] == "abort",
    "streaming session's next input": lambda e: e.get("session inputs", 0) > 0,
    "failed store": lambda e: e.get("failed stores", 0) > 0,
    "sync load": lambda e: e.get("sync loads", 0) > 0,
    "store event payload": lambda e: e.get("event payloads", 0) > 0,
    "async batch overlap": lambda e: e.get("overlapped", 0) > 0,
}
# Labels a passing ci run must hit; the others are reported when they fire.
REQUIRED = (
    "sync scheduling",
    "async scheduling",
    "KV events on",
    "KV events off",
    "sliding-window layout",
    "drafter (EAGLE) group",
    "recurrent (Mamba) group",
    "copy-on-write hand-off",
    "partial hit",
    "allocation failure",
    "retry after None",
    "finish-time offer",
    "re-offer after preemption",
    "preemption",
    "eviction",
    "load",
    "reset",
    "abort",
    "streaming session's next input",
    "async batch overlap",
)


class VllmSchedulerMachine(Recorded, RuleBasedStateMachine):
    """Set ``target`` (a resolved vLLM target), ``fault`` and ``lockstep`` on a subclass
    (``make_machine``)."""

    target: Target | None = None
    fault: str | None = None
    lockstep: bool = True
    LABELS = LABELS
    RULE_WEIGHTS = {
        "step": 8,
        "add_request": 6,
        "deliver": 6,
        "abort": 1,
        "take_gpu": 1,
        "give_gpu": 2,
        "evict_gpu": 3,
        "fail_stores": 2,
        "reset": 1,
        "stream": 2,
    }
    SWARM_ALWAYS = ("step", "add_request", "deliver")

    @classmethod
    def expected_labels(cls) -> tuple[str, ...]:
        return REQUIRED

    def __init__(self):
        super().__init__()
        self.engine: VllmEngine | None = None
        self.history: list[dict] = []
        self.names: dict[bytes, str] = {}
        self.live: list[str] = []
        self.prompts: list[str] = []  # each request's blocks, in the order added
        self.held: list = []
        self.next_id = 0
        self.streaming = False  # the release runs streaming-input sessions
        self.sessions: set[str] = set()  # sessions the client has not closed
        install_rule_choice(self)

    # ------------------------------------------------------------------ set-up
    def _configure(
        self,
        num_chunks,
        threshold,
        tracker,
        policy,
        async_scheduling,
        gpu_blocks,
        blocks_per_chunk,
        prompt_only,
        kv_events,
        layout=FULL_ATTENTION,
        sync_load=0,
        self_describing=False,
        retention=0,
        manager_stats=True,
        tiered=False,
    ):
        """The set-up rule (``make_machine`` declares it, with its strategies)."""
        self.setup_ = Setup(
            num_chunks=num_chunks,
            store_threshold=threshold,
            max_tracker_size=tracker,
            policy=policy,
            async_scheduling=async_scheduling,
            gpu_blocks=gpu_blocks,
            blocks_per_chunk=blocks_per_chunk,
            offload_prompt_only=prompt_only,
            kv_events=kv_events,
            layout=layout,
            sync_load_budget=sync_load,
            self_describing=self_describing and kv_events,
            retention=retention,
            manager_stats=manager_stats,
            tiered=tiered,
        )
        with vllm_raises("building the scheduler and its connector"):
            self.engine = VllmEngine(
                self.setup_,
                type(self).target,
                fault=type(self).fault,
                lockstep=type(self).lockstep,
                key_name=self._name,
                log=self.history,
            )
        self.engine.checks.is_finished = self._finished
        self.streaming = streaming_sessions()
        self.engine.describe = _prefix_name
        self.engine.engine_clock = False  # a divergence names the machine's step
        self.rule_no = 0
        self.record(
            "setup",
            **{
                "async": async_scheduling,
                "events": kv_events,
                "layout": layout.name,
                "stats": manager_stats,
                "tiered": tiered,
            },
        )

    # ------------------------------------------------------------------ names
    def _name(self, key: bytes) -> str:
        name = self.names.get(key)
        if name is None:
            self._learn_names()
            name = self.names.get(key, key[:-4].hex()[:8])
        return name

    def _learn_names(self) -> None:
        """Name every chunk key of every live request by the prompt it ends."""
        bpc = self.setup_.blocks_per_chunk
        assert self.engine is not None  # names are asked for once the set-up made it
        for req in self.engine.sched.requests.values():
            tokens = list(req.all_token_ids)
            for i, block_hash in enumerate(req.block_hashes):
                if (i + 1) % bpc or offload_key(block_hash, 0) in self.names:
                    continue
                name = "".join(
                    _block_name(tuple(tokens[j : j + BLOCK_SIZE]))
                    for j in range(0, (i + 1) * BLOCK_SIZE, BLOCK_SIZE)
                )
                for group in range(len(self.setup_.layout.windows)):  # 'AB', then 'AB@1'
                    key = offload_key(block_hash, group)
                    self.names[key] = name + (f"@{group}" if group else "")

    def _finished(self, req_id: str) -> bool:
        assert self.engine is not None  # a live request: the set-up made the engine
        req = self.engine.sched.requests.get(req_id)
        return req is None or req.is_finished()

    # ------------------------------------------------------------------ engine events
    @precondition(lambda self: self.engine is not None and len(self._live()) < MAX_LIVE)
    @rule(
        blocks=st.text(alphabet="ABC", min_size=1, max_size=4),
        tail=st.integers(0, 1),
        max_tokens=st.integers(1, 4),
        max_load=st.sampled_from([None, None, CPU_ONLY, 0, 2, 4, CPU_LAST]),
        repeat=st.sampled_from([0, 0, 1, 2, -1]),
        # its cap on the tokens offloaded (max_offload_tokens), where the release reads one
        max_offload=st.sampled_from([None, None, None, 0, 3, 4]),
    )
    def add_request(self, blocks, tail, max_tokens, max_load=None, repeat=0, max_offload=None):
        self._next_rule()
        self.next_id += 1
        req_id = f"r{self.next_id}"
        if repeat < 0 and self.prompts:  # the latest prompt again, as it was
            blocks = self.prompts[-1]
        elif repeat > 0 and len(self.prompts) >= repeat:  # an earlier prompt's blocks first
            blocks = (self.prompts[-repeat] + blocks)[:MAX_BLOCKS]
        self.prompts.append(blocks)
        tokens = [t for b in blocks for t in POOL[b]] + [TAIL_TOKEN] * tail
        if self.setup_.layout.recurrent is not None:
            # beside a recurrent group a cap makes 0.33.0 and 0.34.0 raise or offer past it
            # (docs/upstream.md, docs/repro/vllm_offload_cap_below_tail.py): drawn apart, as the
            # window reset, so that the releases as they are still meet their other defects
            max_offload = None
        with vllm_raises("add_request", self.engine.checks):
            self.engine.add_request(req_id, tokens, max_tokens, max_load, max_offload=max_offload)
        self.live.append(req_id)
        self._learn_names()
        self._record("add_request")

    @precondition(lambda self: self.engine is not None)
    @rule(n=st.integers(1, 3))
    def step(self, n):
        self._next_rule()
        for _ in range(n):
            if not self.engine.can_step():
                break
            with vllm_raises("an engine step", self.engine.checks):
                self.engine.step()
            self._learn_names()
        self._record("step")

    @precondition(lambda self: self.engine is not None and self.engine.worker.jobs())
    @rule(mask=st.integers(1, 15))
    def deliver(self, mask):
        self._next_rule()
        jobs = self.engine.worker.jobs()
        picked = [j for i, j in enumerate(jobs) if mask >> (i % 4) & 1] or jobs[:1]
        self.engine.worker.finish(picked)
        self._record("deliver")

    @precondition(
        lambda self: (
            self.engine is not None
            and self.engine.worker.can_fail
            and self.engine.worker.jobs("store")
        )
    )
    @rule(mask=st.integers(1, 15))
    def fail_stores(self, mask):
        """The in-flight store jobs picked by ``mask`` complete with their copy failed."""
        self._next_rule()
        jobs = self.engine.worker.jobs("store")
        picked = [j for i, j in enumerate(jobs) if mask >> (i % 4) & 1] or jobs[:1]
        self.engine.worker.fail(picked)
        self._record("fail_stores")

    @precondition(lambda self: self.engine is not None and self.streaming)
    @rule(
        which=st.integers(0, 4),
        blocks=st.text(alphabet="ABC", min_size=1, max_size=2),
        tail=st.integers(0, 1),
        max_tokens=st.integers(1, 3),
    )
    def stream(self, which, blocks, tail, max_tokens):
        """A streaming-input session: ``which`` 0 opens one with ``blocks`` as its first
        input, 4 closes one, else one gets ``blocks`` as its next input (vLLM appends it to
        the prompt after the turn's output but its last sampled token)."""
        self._next_rule()
        sessions = [r for r in self._live() if r in self.sessions]
        tokens = [t for b in blocks for t in POOL[b]] + [TAIL_TOKEN] * tail
        if which == 0 or not sessions:
            if len(self.live) >= MAX_LIVE:
                return self._record("stream")
            self.next_id += 1
            req_id = f"r{self.next_id}"
            self.sessions.add(req_id)
            self.live.append(req_id)
            with vllm_raises("opening a streaming session", self.engine.checks):
                self.engine.add_request(req_id, tokens, max_tokens, resumable=True)
        elif which == 4:
            with vllm_raises("closing a streaming session", self.engine.checks):
                self.engine.end_session(sessions[0])
            self.sessions.discard(sessions[0])
        else:
            with vllm_raises("a streaming session's next input", self.engine.checks):
                self.engine.add_request(
                    sessions[which % len(sessions)], tokens, max_tokens, resumable=True
                )
        self._learn_names()
        return self._record("stream")

    @precondition(lambda self: self.engine is not None and self._live())
    @rule(which=st.integers(0, 3))
    def abort(self, which):
        self._next_rule()
        live = self._live()
        with vllm_raises("abort", self.engine.checks):
            self.engine.abort(live[which % len(live)])
        self._record("abort")

    @precondition(lambda self: self.engine is not None and not self.held)
    @rule()
    def take_gpu(self):
        self._next_rule()
        with vllm_raises("taking the free GPU blocks", self.engine.checks):
            self.held = self.engine.hold_gpu_blocks()
        self._record("take_gpu")

    @precondition(lambda self: self.engine is not None and bool(self.held))
    @rule()
    def give_gpu(self):
        self._next_rule()
        with vllm_raises("giving the GPU blocks back", self.engine.checks):
            self.engine.release_gpu_blocks(self.held)
        self.held = []
        self._record("give_gpu")

    @precondition(lambda self: self.engine is not None and not self.held)
    @rule()
    def evict_gpu(self):
        """Other traffic takes every free GPU block and gives it back: the GPU prefix cache
        forgets every block no request holds, so a request can hit the CPU tier."""
        self._next_rule()
        with vllm_raises("evicting the GPU prefix cache", self.engine.checks):
            self.engine.release_gpu_blocks(self.engine.hold_gpu_blocks())
        self._record("evict_gpu")

    @precondition(lambda self: self.engine is not None)
    @rule(running_too=st.booleans())
    def reset(self, running_too):
        self._next_rule()
        # vLLM refuses to preempt the running requests first while their blocks cannot all
        # be freed (blocks taken, a load in flight, a batch still executing): it raises, the
        # engine answers the client with that error and runs on, and the connector was not
        # reset. The machine does what a client would see.
        if running_too and (self.held or self._loading() or self.engine.queue):
            running_too = False
        if self.setup_.layout.sliding and self._running() and not running_too:
            # A known defect (spec §7.2): a reset that leaves requests running sends
            # them back to chunk 0 with the block ids their sliding window already freed,
            # and they store blocks that now hold other KV. Drawn apart (tests/
            # test_vllm_scheduler.py reproduces it), so the machine looks past it.
            self.engine.counts["resets left out"] += 1
            self._record("reset")
            return
        try:
            with vllm_raises("reset_prefix_cache", self.engine.checks):
                self.engine.reset(running_too)
        except VllmRaised as exc:
            if not (
                running_too
                and isinstance(exc.__cause__, RuntimeError)
                and str(exc.__cause__).startswith(RESET_REFUSED)
            ):
                raise
            self.engine.counts["resets refused"] += 1
        self._record("reset")

    # ------------------------------------------------------------------ helpers
    def _live(self) -> list[str]:
        self.live = [r for r in self.live if not self._finished(r)]
        return self.live

    def _running(self) -> bool:
        assert self.engine is not None  # the rules run after the set-up made it
        return bool(self.engine.sched.running)

    def _loading(self) -> bool:
        from vllm.v1.request import RequestStatus

        assert self.engine is not None  # the rules run after the set-up made it
        return any(
            r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
            for r in self.engine.sched.requests.values()
        )

    def _next_rule(self) -> None:
        self.rule_no += 1
        assert self.engine is not None  # the rules run after the set-up made it
        self.engine.oracle.set_step(self.rule_no)

    def _record(self, rule_name: str) -> None:
        """One history entry per step: what grew since the previous one."""
        assert self.engine is not None  # the rules run after the set-up made it
        now = {**self.engine.checks.stats, **self.engine.worker.stats, **self.engine.counts}
        before = getattr(self, "_before", {})
        self._before = dict(now)
        self.record(rule_name, **{k: v - before.get(k, 0) for k, v in now.items()})

    # ------------------------------------------------------------------ checks
    @invariant()
    def request_level_checks(self):
        """The oracle's incremental state check, then what the request-level checks found
        (store jobs, cold admissions, events); the oracle's call checks run inside calls."""
        if self.engine is None:
            return
        if self.engine.checks.failure:
            raise AssertionError(self.engine.checks.failure)
        if type(self).lockstep:
            self.engine.oracle.check_state()

    def teardown(self):
        # the engine shuts down after an example that ran to its end (not while a failure
        # propagates: Hypothesis tears down in a ``finally``)
        if self.engine is not None and not self.engine.checks.failure and not sys.exc_info()[0]:
            with vllm_raises("shutdown", self.engine.checks):
                self.engine.shutdown()
            if self.engine.checks.failure:
                raise AssertionError(self.engine.checks.failure)
        if self.engine is not None:
            if currently_in_test_context():
                note(
                    f"setup: {self.setup_}; manager calls: {dict(self.engine.front.calls)}; "
                    f"unchecked: {sorted(self.engine.front.unchecked)}"
                )
            self.count_labels()


class VllmRaised(AssertionError):
    """vLLM itself raised (an assertion of the release, say) while the machine drove it."""


@contextlib.contextmanager
def vllm_raises(what: str, checks: Any = None):
    """A divergence passes as it is; anything else raised inside vLLM becomes one line that
    says what the step was doing and where in vLLM it was raised. Where a check of ``checks``
    had already failed in the step (a phantom hit the connector reported, say), that failure
    came first and vLLM's raise is its consequence: the check's line is raised instead. An
    exception raised in kvgate's own code passes as it is: no verdict (spec §9)."""
    try:
        yield
    except Divergence:
        raise
    except Exception as exc:
        if checks is not None and checks.failure:
            raise AssertionError(checks.failure) from exc
        if raised_at(exc)[1]:
            raise  # kvgate's own code: no verdict on vLLM (the runner says so, exit 2)
        frames = traceback.extract_tb(exc.__traceback__)
        inside = [f for f in frames if f"{os.sep}vllm{os.sep}" in f.filename] or frames
        where = inside[-1]
        path = where.filename.split(f"{os.sep}vllm{os.sep}", 1)[-1]
        text = str(exc).strip().splitlines()
        raise VllmRaised(
            f"vLLM raised {type(exc).__name__}{': ' + text[0] if text else ''} "
            f"during {what}, at vllm/{path}:{where.lineno} "
            f"({(where.line or '').strip()})"
        ) from exc


def _prefix_name(tokens: tuple[int, ...]) -> str:
    """A token prefix as the machine names prompts: ``'AB'``, ``'AB[5,7]'``."""
    return (
        "'"
        + "".join(
            _block_name(tuple(tokens[j : j + BLOCK_SIZE]))
            for j in range(0, len(tokens), BLOCK_SIZE)
        )
        + "'"
    )


def _block_name(tokens: tuple[int, ...]) -> str:
    letter = LETTERS.get(tokens)
    return letter if letter else "[" + ",".join(map(str, tokens)) + "]"


# The set-up rule's strategies; ``kv_events`` is drawn unless ``make_machine`` fixes it.
SETUP: dict[str, st.SearchStrategy[Any]] = dict(
    num_chunks=st.integers(1, 8),
    threshold=st.sampled_from([2, 2, 3, 1, 0]),
    tracker=st.sampled_from([64_000, 2, 1, 4]),
    policy=st.sampled_from(["lru", "arc"]),
    async_scheduling=st.booleans(),
    gpu_blocks=st.sampled_from([16, 10, 24]),
    blocks_per_chunk=st.sampled_from([1, 2]),
    prompt_only=st.booleans(),
)


def drawn_layouts(target: Target) -> tuple:
    """The layouts drawn for ``target``: every one the release has (layouts.available) for a
    target that carries the release's connector mends (releases/vllm_mends.py), and for the
    release as it is all but the two whose known connector defects (docs/upstream.md: the
    window of 4 keeping 2, a chunk stored with its first block unwritten; a drafter beside a
    recurrent group, a key offered twice in a step) would hide the others, as the reset that
    leaves a window's requests running is drawn apart."""
    layouts = available()
    if getattr(getattr(target, "factory", None), "mend_connector", None) is not None:
        return layouts
    return tuple(layout for layout in layouts if layout not in NEEDS_MENDS)


def _by_family(layouts) -> st.SearchStrategy:
    """A layout drawn family first (one full-attention group; sliding windows; a drafter's
    group; a recurrent group), then one of the family's: each family gets its share of a
    budget however many variants it has (full attention first: what a counterexample shrinks
    to)."""
    families: dict[tuple, list] = {}
    for layout in layouts:
        family = (layout.recurrent is not None, layout.eagle is not None, layout.sliding)
        families.setdefault(family, []).append(layout)
    return st.sampled_from(list(families.values())).flatmap(st.sampled_from)


def make_machine(
    target: Target,
    *,
    fault: str | None = None,
    lockstep: bool = True,
    kv_events: bool | None = None,
):
    """The machine class over vLLM's scheduling path with ``target``'s manager behind the
    connector: ``vllm`` (the manager the connector's spec builds) or ``vllm=MODULE:ATTR`` (that
    class, built with the example's sizes), either checked exactly or ``foreign=``. ``fault``
    (one of ``FAULTS``) and ``lockstep=False`` (no oracle: the request-level checks alone) are
    for tests of the checks; ``kv_events`` fixes vLLM's ``enable_kv_cache_events`` (drawn when
    ``None``; vLLM's default is off). ``TargetError`` (one line) for another target or where
    vLLM is not importable."""
    from ...manager_machine import machine_name

    why = unavailable_reason()
    if why:
        raise TargetError(why)
    if not is_vllm_target(target.spec):
        raise TargetError(
            f"the vLLM scheduler machine runs a vLLM manager; target "
            f"{target.spec!r} is not 'vllm' or 'vllm=MODULE:ATTR'"
        )
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"fault must be one of {FAULTS}, got {fault!r}")
    name = machine_name("VllmSchedulerMachine", target.spec)
    suffix = (
        (f"_{fault}" if fault else "")
        + ("" if lockstep else "_unchecked")
        + ("" if kv_events is None else f"_events_{'on' if kv_events else 'off'}")
    )
    events = st.booleans() if kv_events is None else st.just(kv_events)
    # the release's layouts (full attention first: what a counterexample shrinks to)
    layouts = _by_family(drawn_layouts(target))
    # a step's budget for synchronous loads, where the connector has one (0: none)
    sync = st.sampled_from([0, 0, 1 << 30]) if sync_loads() else st.just(0)
    # the prefix cache's retention interval, where the release has one (configs.retentions)
    retention = st.sampled_from(retentions())

    class Machine(VllmSchedulerMachine):
        # SETUP names no ``target`` or ``targets``, which mypy cannot see in a dict
        @initialize(  # type: ignore[call-overload]
            **SETUP,
            kv_events=events,
            layout=layouts,
            sync_load=sync,
            self_describing=st.booleans(),
            retention=retention,
            # a manager with its metrics off (get_stats answers None): the connector's own
            # stats, and the tier's configuration on the first payload, go on without them
            manager_stats=st.sampled_from([True, True, False]),
            # a tiered manager's lookups (RETRY, HIT_PENDING), where the release has them
            tiered=st.sampled_from([False, False, True]) if tiered_lookups() else st.just(False),
        )
        def setup(self, **drawn):
            self._configure(**drawn)

        @classmethod
        def explicit_programs(cls) -> list:
            """The paths the draws reach too rarely, on this target's layouts."""
            return explicit_programs.programs(drawn_layouts(target), sync_loads())

    Machine.target, Machine.fault, Machine.lockstep = target, fault, lockstep
    Machine.__name__ = Machine.__qualname__ = name + suffix
    return Machine


def summary(
    spec: str = "vllm",
    profile: str = "ci",
    *,
    fault: str | None = None,
    lockstep: bool = True,
    max_examples: int | None = None,
    find_only: bool = False,
    kv_events: bool | None = None,
) -> dict:
    """One run of the machine on ``spec`` under ``profile``, as plain values (what the tests and
    the bench read in a release environment): verdict, the shrunk counterexample and its step
    count, why it failed, examples, machine steps executed, seconds and steps per second, the
    labels hit. ``find_only``: stop at the first failure, unshrunk (the seconds to find it)."""
    import re

    from hypothesis import Phase

    from ...runner import run_machine
    from ...targets import resolve_target
    from .configs import configs

    configs()  # built once, before the clock starts
    cls = make_machine(resolve_target(spec), fault=fault, lockstep=lockstep, kv_events=kv_events)
    kwargs: dict[str, Any] = {}
    if find_only:
        kwargs["phases"] = [Phase.explicit, Phase.reuse, Phase.generate]
    result = run_machine(cls, profile, max_examples=max_examples, database=None, **kwargs)
    message = result.message
    why = re.search(r"^  \((.*)\)$", message, re.MULTILINE)
    first = message.split("\n", 1)[0]
    return {
        "spec": spec,
        "profile": profile,
        "passed": result.passed,
        "steps": result.shrunk_steps if not result.passed else None,
        "why": why.group(1) if why else first.split(": ", 1)[-1],
        "message": message,
        "program": result.program,
        "examples": result.examples,
        "machine_steps": result.steps,
        "seconds": round(result.seconds, 2),
        "steps_per_s": round(result.steps / result.seconds) if result.seconds else 0,
        "labels": dict(result.labels),
        "required": list(result.expected),
        "phases": result.phases,
    }


__all__ += ["summary"]
