"""The scheduler driver: where offers, retries, preemptions, resets and loads come from.

How it works and why: docs/internals.md, section impl/scheduler.py.
"""

from __future__ import annotations

import enum
import hashlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .base import STORES_SKIPPED, LookupResult, ReqContext, Stats, make_key

HASH_BYTES = 8


def block_hashes_of(tokens: Sequence[int], block_size: int, parent: bytes = b"") -> list[bytes]:
    """Chained hashes of the complete blocks of ``tokens``: h_i = H(h_{i-1}, block i)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size!r}")
    out: list[bytes] = []
    h = parent
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = tokens[start : start + block_size]
        payload = h + b"|" + ",".join(str(int(t)) for t in block).encode()
        h = hashlib.blake2b(payload, digest_size=HASH_BYTES).digest()
        out.append(h)
    return out


def hash_id_to_block_hash(hash_id: int) -> bytes:
    """A trace's prefix block id as a block hash (trace ids are already chained)."""
    return int(hash_id).to_bytes(HASH_BYTES, "big")


def chunk_keys(
    block_hashes: Sequence[bytes], blocks_per_chunk: int, group_idx: int = 0
) -> list[bytes]:
    """One key per complete chunk, named after the chunk's last block hash."""
    n = len(block_hashes) // blocks_per_chunk
    return [make_key(block_hashes[(i + 1) * blocks_per_chunk - 1], group_idx) for i in range(n)]


# --------------------------------------------------------------------------- requests


class RequestState(enum.Enum):
    WAITING = "waiting"  # queued (new, or preempted and resumable)
    HELD = "held"  # preempted, not resumable until ``resume``
    LOADING = "loading"  # scheduled, its load job in flight
    RUNNING = "running"
    FINISHING = "finishing"  # finished; its finish-time offer comes at the next step
    DONE = "done"  # on_request_finished called; jobs may still be in flight
    DROPPED = "dropped"  # no job left: context and GPU blocks released


class Request:
    """One request: prompt blocks (chained hashes), output length, and its scheduling state."""

    def __init__(
        self,
        req_id: str,
        block_hashes: Sequence[bytes],
        num_prompt_tokens: int,
        max_output_tokens: int | None = None,
    ):
        if num_prompt_tokens < 0:
            raise ValueError(f"num_prompt_tokens must be >= 0, got {num_prompt_tokens!r}")
        self.req_id = req_id
        self.tokens: list[int] | None = None  # the prompt, when the request was made from it
        self.block_hashes = list(block_hashes)
        self.num_prompt_tokens = num_prompt_tokens
        self.max_output_tokens = max_output_tokens
        self.keys: list[bytes] = []
        self.ctx: ReqContext | None = None
        self.state = RequestState.WAITING
        self.num_computed = 0  # tokens whose KV is on the GPU
        self.num_output = 0  # tokens generated so far
        self.store_pos = 0  # chunk index of the next key to offer
        self.block_table: list[int] = []
        self.jobs: set[int] = set()
        self.counted_lookup = False  # first lookup counted in the hit rate
        self.preemptions = 0
        self.last_offer_failed = False
        self.restarted: str | None = None  # "preemption" | "reset": stores restart at chunk 0

    @classmethod
    def from_tokens(
        cls,
        req_id: str,
        tokens: Sequence[int],
        block_size: int,
        max_output_tokens: int | None = None,
    ) -> Request:
        req = cls(req_id, block_hashes_of(tokens, block_size), len(tokens), max_output_tokens)
        req.tokens = list(tokens)
        return req

    def __repr__(self) -> str:
        return f"Request({self.req_id!r}, {self.state.value}, pos={self.store_pos})"


@dataclass
class Counters:
    """What the scheduler did, in keys (chunks) unless named otherwise."""

    requests: int = 0
    finished: int = 0
    steps: int = 0
    offers: int = 0  # prepare_store calls
    offered_keys: int = 0
    allocation_failures: int = 0  # prepare_store returned None
    retries: int = 0  # offers that follow a None for the same request
    finish_retries: int = 0  # offers made in the step after a request finished
    reoffers_after_preemption: int = 0  # first offers of resumed requests (from chunk 0)
    reoffers_after_reset: int = 0  # first offers of requests restarted by a reset
    admitted: int = 0  # keys in keys_to_store
    store_jobs: int = 0
    stores_completed: int = 0  # keys whose store succeeded
    stores_failed: int = 0  # keys whose copy failed
    stores_stale: int = 0  # keys of store jobs dropped by a reset
    skips: int = 0  # the manager's skip metric, summed
    evictions: int = 0
    load_jobs: int = 0
    loads: int = 0  # keys loaded
    loads_stale: int = 0
    lookups_deferred: int = 0  # HIT_PENDING deferrals
    prefix_chunks: int = 0  # loadable prompt chunks at each request's first lookup
    prefix_hits: int = 0  # of which hit in the CPU tier
    preemptions: int = 0
    resets: int = 0

    def stores_in_flight(self) -> int:
        return self.admitted - self.stores_completed - self.stores_failed - self.stores_stale

    @property
    def hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_chunks if self.prefix_chunks else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["stores_in_flight"] = self.stores_in_flight()
        d["hit_rate"] = self.hit_rate
        return d


@dataclass
class _Job:
    kind: str  # "store" | "load"
    req: Request
    keys: list[bytes]
    chunk_ids: list[int] = field(default_factory=list)


def set_on_context(ctx: ReqContext, key: bytes, end_token: int) -> None:
    """Record ``key``'s position on an impl context (the driver's default ``set_position``)."""
    ctx.set_offload_key_position(key, end_token)


class Scheduler:
    """The engine's side of the manager protocol, one ``step()`` at a time."""

    def __init__(
        self,
        manager: Any,
        worker: Any,
        *,
        block_size: int = 16,
        blocks_per_chunk: int = 1,
        num_gpu_blocks: int = 1 << 20,
        max_running: int = 16,
        max_tokens_per_step: int | None = None,
        group_idx: int = 0,
        on_step: Callable[[int], None] | None = None,
        new_context: Callable[[str], Any] = ReqContext,
        set_position: Callable[[Any, bytes, int], None] = set_on_context,
        stats_dict: Callable[[Any], Mapping[str, Any]] = Stats.as_dict,
        touch: bool = True,
    ):
        for name, value in (
            ("block_size", block_size),
            ("blocks_per_chunk", blocks_per_chunk),
            ("num_gpu_blocks", num_gpu_blocks),
            ("max_running", max_running),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if max_tokens_per_step is not None and max_tokens_per_step < 1:
            raise ValueError(f"max_tokens_per_step must be >= 1, got {max_tokens_per_step!r}")
        self.manager = manager
        self.worker = worker
        self.block_size = block_size
        self.blocks_per_chunk = blocks_per_chunk
        self.chunk_tokens = block_size * blocks_per_chunk
        self.num_gpu_blocks = num_gpu_blocks
        self.max_running = max_running
        self.max_tokens_per_step = max_tokens_per_step
        self.group_idx = group_idx
        self.on_step = on_step
        self.counters = Counters()
        self.step_no = 0
        self.generation = 0  # resets so far
        self.requests: dict[str, Request] = {}  # live requests (not yet dropped), by id
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # LOADING and RUNNING, in scheduling order
        self._finishing: list[Request] = []
        self._free_blocks = list(range(num_gpu_blocks - 1, -1, -1))
        self._jobs: dict[int, _Job] = {}
        self._next_job = 0
        self._stale_below = 0
        self._advance = getattr(self.worker, "advance", None)
        self._write = getattr(self.worker, "write_gpu", None)
        self._new_context = new_context
        self._set_position = set_position
        self._stats_dict = stats_dict
        self._touch = touch

    # ------------------------------------------------------------------ requests
    def add_request(self, req: Request) -> Request:
        if req.req_id in self.requests:
            raise ValueError(f"request {req.req_id!r} is still live")
        tokens = req.num_prompt_tokens + max(0, (req.max_output_tokens or 1) - 1)
        if -(-tokens // self.block_size) > self.num_gpu_blocks:
            raise ValueError(
                f"request {req.req_id!r} needs {-(-tokens // self.block_size)} GPU "
                f"blocks; there are {self.num_gpu_blocks}"
            )
        req.keys = chunk_keys(req.block_hashes, self.blocks_per_chunk, self.group_idx)
        req.ctx = self._new_context(req.req_id)
        for i, key in enumerate(req.keys):
            self._set_position(req.ctx, key, (i + 1) * self.chunk_tokens)
        req.state = RequestState.WAITING
        self.requests[req.req_id] = req
        self.counters.requests += 1
        self.manager.on_new_request(req.ctx)
        self.waiting.append(req)
        return req

    def finish(self, req: Request) -> None:
        """End ``req`` now (EOS, abort): its finish-time offer comes at the next step."""
        if req.state in (RequestState.WAITING, RequestState.HELD):
            if req in self.waiting:
                self.waiting.remove(req)
        elif req.state in (RequestState.LOADING, RequestState.RUNNING):
            self.running.remove(req)
        else:
            return
        req.state = RequestState.FINISHING
        self._finishing.append(req)

    def preempt(self, req: Request, hold: bool = False) -> None:
        """Flush ``req``'s jobs, free its GPU blocks; it restarts at chunk 0 when it resumes."""
        if req.state not in (RequestState.LOADING, RequestState.RUNNING):
            raise ValueError(f"cannot preempt {req!r}")
        self._flush(list(req.jobs))
        self.running.remove(req)
        self._free(req)
        req.num_computed = 0
        req.store_pos = 0
        req.restarted = "preemption"
        req.preemptions += 1
        self.counters.preemptions += 1
        if hold:
            req.state = RequestState.HELD
        else:
            req.state = RequestState.WAITING
            self.waiting.appendleft(req)

    def resume(self, req: Request) -> None:
        if req.state is not RequestState.HELD:
            raise ValueError(f"{req!r} is not held")
        req.state = RequestState.WAITING
        self.waiting.appendleft(req)

    def reset(self) -> None:
        """Flush every job, reset the cache, drop every pre-reset completion."""
        self.worker.wait(list(self._jobs))
        self._stale_below = self._next_job
        self._collect(self.worker.get_finished())
        for job_id in list(self._jobs):  # a worker that reports late: still stale
            self._drop_stale(job_id, self._jobs.pop(job_id))
        self.manager.reset_cache()
        self.generation += 1
        self.counters.resets += 1
        for req in (*self.running, *self._finishing):  # waiting and held ones are at 0
            req.store_pos = 0
            req.restarted = "reset"

    @property
    def idle(self) -> bool:
        return not (self.waiting or self.running or self._finishing or self._jobs)

    def jobs_in_flight(self) -> dict[int, tuple[str, str, list[bytes]]]:
        return {j: (job.kind, job.req.req_id, list(job.keys)) for j, job in self._jobs.items()}

    # ------------------------------------------------------------------ one step
    def step(self) -> None:
        self.step_no += 1
        self.counters.steps += 1
        if self.on_step is not None:
            self.on_step(self.step_no)
        if self._advance is not None:
            self._advance()
        self._collect(self.worker.get_finished())
        finishing, self._finishing = self._finishing, []
        for req in finishing:  # the step after a request finished: one last offer, then done
            if self._offer(req):
                self.counters.finish_retries += 1
            self.manager.on_request_finished(req.ctx)
            req.state = RequestState.DONE
            self.counters.finished += 1
            self._maybe_drop(req)
        budget = self.max_tokens_per_step if self.max_tokens_per_step is not None else 1 << 62
        done: list[Request] = []
        preempted = self.counters.preemptions
        for req in list(self.running):
            if budget <= 0:
                break
            if req.state is not RequestState.RUNNING:
                continue
            budget -= self._compute(req, budget, done)
        if self.counters.preemptions == preempted:  # no admissions in a step that preempted
            self._schedule_waiting(budget, done)
        for req in self.running:
            if req.state is RequestState.RUNNING:
                self._offer(req)
        raw = self.manager.get_stats()  # None: metrics disabled, nothing to read
        stats = {} if raw is None else self._stats_dict(raw)
        self.counters.skips += stats.get(STORES_SKIPPED) or 0
        for _ in self.manager.take_events():  # drained, as an engine publishes them
            pass
        for req in done:
            if req.state is RequestState.RUNNING:
                self.finish(req)

    def run_until_idle(self, max_steps: int = 1_000_000) -> None:
        for _ in range(max_steps):
            if self.idle:
                return
            self.step()
        raise RuntimeError(f"not idle after {max_steps} steps")

    # ------------------------------------------------------------------ compute
    def _target_tokens(self, req: Request) -> int:
        """Tokens to compute before the next sample: prompt plus outputs (a resumed request
        recomputes its outputs too)."""
        return (
            req.num_prompt_tokens + max(0, req.num_output - 1)
            if req.num_output
            else req.num_prompt_tokens
        )

    def _plan(self, req: Request, budget: int) -> tuple[int, int]:
        """``req``'s next tokens (a prefill chunk, or one decode token) and the GPU blocks
        they need beyond those it holds."""
        target = self._target_tokens(req)
        n = min(target - req.num_computed, budget) if req.num_computed < target else 1
        need = -(-(req.num_computed + n) // self.block_size) - len(req.block_table)
        return n, need

    def _compute(self, req: Request, budget: int, done: list[Request]) -> int:
        """Schedule ``req``'s next tokens, preempting the lowest-priority running request while
        GPU blocks are short; returns the tokens used, 0 if ``req`` itself was preempted."""
        n, need = self._plan(req, budget)
        if len(req.block_table) + need > self.num_gpu_blocks:
            raise RuntimeError(f"{req!r} needs more than the {self.num_gpu_blocks} GPU blocks")
        while need > len(self._free_blocks):
            victim = self._preemption_victim()
            self.preempt(victim)
            if victim is req:
                return 0
        self._apply(req, n, need, done)
        return n

    def _apply(self, req: Request, n: int, need: int, done: list[Request]) -> None:
        for _ in range(max(0, need)):
            req.block_table.append(self._free_blocks.pop())
        before = req.num_computed
        req.num_computed += n
        if self._write is not None:
            hashes = req.block_hashes
            for b in range(
                before // self.block_size, min(req.num_computed // self.block_size, len(hashes))
            ):
                self._write(req.block_table[b], hashes[b])
        if req.num_computed >= self._target_tokens(req):  # a token is sampled
            req.num_output += 1
            if req.max_output_tokens is not None and req.num_output >= req.max_output_tokens:
                done.append(req)

    def _preemption_victim(self) -> Request:
        for req in reversed(self.running):
            if req.state is RequestState.RUNNING:
                return req
        return self.running[-1]

    def _schedule_waiting(self, budget: int, done: list[Request]) -> None:
        """Admit waiting requests in order while there are running slots, token budget and GPU
        blocks (a waiting request never preempts): each first looks its prefix up."""
        deferred: list[Request] = []
        free = self._free_blocks
        while self.waiting and len(self.running) < self.max_running and budget > 0:
            req = self.waiting[0]
            found = self._lookup(req)
            if found is None:  # HIT_PENDING: try again at a later step
                self.waiting.popleft()
                deferred.append(req)
                self.counters.lookups_deferred += 1
                continue
            hits, limit = found
            if hits:
                if len(hits) * self.blocks_per_chunk > len(free):
                    break
            else:
                n, need = self._plan(req, budget)
                if need > len(free):
                    break
            self.waiting.popleft()
            if not req.counted_lookup:
                req.counted_lookup = True
                self.counters.prefix_chunks += limit
                self.counters.prefix_hits += len(hits)
            self.running.append(req)
            if hits:
                self._start_load(req, hits)
                continue
            req.state = RequestState.RUNNING
            self._apply(req, n, need, done)
            budget -= n
        self.waiting.extendleft(reversed(deferred))

    # ------------------------------------------------------------------ loads
    def _lookup(self, req: Request) -> tuple[list[bytes], int] | None:
        """The request's loadable prefix hits and how many chunks could have hit, or None if
        one of them is still pending."""
        limit = min(len(req.keys), max(0, req.num_prompt_tokens - 1) // self.chunk_tokens)
        hits: list[bytes] = []
        lookup = self.manager.lookup
        for key in req.keys[:limit]:
            result = lookup(key, req.ctx)
            if result is LookupResult.HIT:
                hits.append(key)
            elif result is LookupResult.HIT_PENDING:
                return None
            else:
                break
        return hits, limit

    def _start_load(self, req: Request, hits: list[bytes]) -> None:
        if self._touch:  # a manager may lack touch (vLLM 0.34.0 does)
            self.manager.touch(hits, req.ctx)
        chunk_ids = list(self.manager.prepare_load(hits, req.ctx))
        blocks = [self._free_blocks.pop() for _ in range(len(hits) * self.blocks_per_chunk)]
        req.block_table.extend(blocks)
        req.state = RequestState.LOADING
        job_id = self._new_job(_Job("load", req, list(hits), chunk_ids))
        self.counters.load_jobs += 1
        self.worker.submit_load(job_id, chunk_ids, blocks)

    # ------------------------------------------------------------------ stores
    def _offer(self, req: Request) -> bool:
        """Offer the keys from the store position to the last complete chunk. True if offered."""
        end = min(len(req.keys), req.num_computed // self.chunk_tokens)
        if req.store_pos >= end:
            return False
        keys = req.keys[req.store_pos : end]
        c = self.counters
        c.offers += 1
        c.offered_keys += len(keys)
        if req.last_offer_failed:
            c.retries += 1
        if req.restarted == "preemption":
            c.reoffers_after_preemption += 1
        elif req.restarted == "reset":
            c.reoffers_after_reset += 1
        req.restarted = None
        out = self.manager.prepare_store(keys, req.ctx)
        if out is None:
            c.allocation_failures += 1
            req.last_offer_failed = True
            return True
        req.last_offer_failed = False
        start = req.store_pos
        req.store_pos = end
        to_store, chunk_ids, evicted = out
        c.evictions += len(evicted)
        if not to_store:
            return True
        c.admitted += len(to_store)
        index = {k: i for i, k in enumerate(keys, start)}
        bpc = self.blocks_per_chunk
        blocks: list[int] = []
        for key in to_store:
            i = index[key]
            blocks.extend(req.block_table[i * bpc : (i + 1) * bpc])
        job_id = self._new_job(_Job("store", req, to_store, chunk_ids))
        c.store_jobs += 1
        self.worker.submit_store(job_id, blocks, chunk_ids)
        return True

    # ------------------------------------------------------------------ jobs
    def _new_job(self, job: _Job) -> int:
        job_id = self._next_job
        self._next_job += 1
        self._jobs[job_id] = job
        job.req.jobs.add(job_id)
        return job_id

    def _flush(self, job_ids: list[int]) -> None:
        if job_ids:
            self.worker.wait(job_ids)
            self._collect(self.worker.get_finished())

    def _collect(self, results: Iterable[Any]) -> None:
        for result in results:
            job = self._jobs.pop(result.job_id, None)
            if job is None:
                continue
            if result.job_id < self._stale_below:
                self._drop_stale(result.job_id, job)
                continue
            req = job.req
            req.jobs.discard(result.job_id)
            if job.kind == "store":
                self.manager.complete_store(job.keys, req.ctx, success=bool(result.success))
                if result.success:
                    self.counters.stores_completed += len(job.keys)
                else:
                    self.counters.stores_failed += len(job.keys)
            else:
                self.manager.complete_load(job.keys, req.ctx)
                self._load_done(req, job, bool(result.success))
            self._maybe_drop(req)

    def _drop_stale(self, job_id: int, job: _Job) -> None:
        req = job.req
        req.jobs.discard(job_id)
        if job.kind == "store":
            self.counters.stores_stale += len(job.keys)
        else:
            self.counters.loads_stale += len(job.keys)
            self._load_done(req, job, True)
        self._maybe_drop(req)

    def _load_done(self, req: Request, job: _Job, success: bool) -> None:
        self.counters.loads += len(job.keys)
        if req.state is not RequestState.LOADING:
            return
        req.state = RequestState.RUNNING
        if success:
            req.num_computed = len(job.keys) * self.chunk_tokens
        # a failed load: the blocks are there but hold nothing; recompute from token 0

    def _free(self, req: Request) -> None:
        self._free_blocks.extend(reversed(req.block_table))
        req.block_table = []

    def _maybe_drop(self, req: Request) -> None:
        if req.state is RequestState.DONE and not req.jobs:
            self._free(req)
            req.state = RequestState.DROPPED
            if self.requests.get(req.req_id) is req:
                del self.requests[req.req_id]
