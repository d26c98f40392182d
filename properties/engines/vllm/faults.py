"""Every planted fault of the vLLM harness in one registry: what each breaks, and the small
wrapper or subclass of the broken part that plants it.

A fault is a known-bad variant of one part of the engine: the connector's scheduler side
(planted on the built connector, before the checks wrap it, so they judge what the faulted
connector does), the manager's front (front.py), the bytes worker (bytes_worker.py) or the
KV event publisher (event_payload.py) (each a subclass the engine builds instead). The check
modules hold no fault: each fault here is caught by a check there (tests/test_vllm_scheduler.py
names the failure each one gives). A fault that replaces a private vLLM name
(private_names.py) needs it on the connector: where the release lacks it, planting the fault
raises ``FaultTargetMissing`` naming it, never a fault that silently does nothing.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import private_names as pn
from .bytes_worker import BytesWorker
from .error_log import connector_logger
from .event_payload import Publisher
from .exact import ALLOCATION_FAILURE, CONFIG_INFO, TOKEN_COUNTS
from .front import Front
from .load_tiers import LOAD_TIERS
from .lookup_metrics import ASYNC_DELAY

CONNECTOR = "the connector's scheduler side"


class FaultTargetMissing(RuntimeError):
    """A fault's target is not in the installed vLLM: the fault would plant nothing."""


def _need(fault: str, obj: Any, *names: str) -> None:
    missing = [n for n in names if not hasattr(obj, n)]
    if missing:
        raise FaultTargetMissing(
            f"fault {fault!r} replaces {', '.join(missing)} on {type(obj).__name__}, which "
            "this vLLM lacks (properties/engines/vllm/private_names.py): it would plant nothing"
        )


# ---------------------------------------------------------------------------- the front
class _StoreFailureIgnored(Front):
    def complete_store(self, keys, req_context=None, success: bool = True):
        return super().complete_store(keys, req_context, success=True)


class _DropComplete(Front):
    dropped = False

    def complete_store(self, keys, req_context=None, success: bool = True):
        if not self.dropped:
            self.dropped = True
            return None
        return super().complete_store(keys, req_context, success=success)


class _DoubleComplete(Front):
    doubled = False

    def complete_store(self, keys, req_context=None, success: bool = True):
        keys = list(keys)
        super().complete_store(keys, req_context, success=success)
        if not self.doubled:
            self.doubled = True
            super().complete_store(keys, req_context, success=success)
        return None


class _SkipNewRequest(Front):
    def on_new_request(self, req_context):
        from vllm.v1.kv_offload import base

        make = getattr(base, "RequestOffloadingContext", None)
        return make() if make is not None else None


class _DropRemovals(Front):
    def take_events(self):
        return iter([e for e in super().take_events() if not getattr(e, "removed", False)])


# ---------------------------------------------------------------------------- the bytes worker
class _IgnoreFlush(BytesWorker):
    def receive(self, meta: Any) -> None:
        if meta is not None and getattr(meta, "jobs_to_flush", None):
            meta = _WithoutFlush(meta)
        super().receive(meta)


class _WithoutFlush:
    """The connector metadata with no jobs to flush."""

    def __init__(self, meta: Any):
        self._meta = meta
        self.jobs_to_flush: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._meta, name)


class _LoadWrongChunk(BytesWorker):
    def _load(self, job_id, req_id, gpu_ids, chunks, sizes, firsts, keys) -> None:
        if len(chunks) > 1:
            chunks = chunks[::-1]
        super()._load(job_id, req_id, gpu_ids, chunks, sizes, firsts, keys)


class _LoadOneGroup(BytesWorker):
    def _load(self, job_id, req_id, gpu_ids, chunks, sizes, firsts, keys) -> None:
        sizes = [size if group == 0 else 0 for group, size in enumerate(sizes)]
        super()._load(job_id, req_id, gpu_ids, chunks, sizes, firsts, keys)


class _SkipBlockCopies(BytesWorker):
    def copy_blocks(self, copies: Any) -> None:
        return None


# ---------------------------------------------------------------------------- the publisher
class _ShiftedPayload(Publisher):
    def _payload(self, event: Any, keys: list[Any], group: int) -> None:
        prefix = self.prefix_of(keys[0], group) if len(keys) == 1 else None
        if getattr(event, "token_ids", None) and prefix is not None:
            start = (len(prefix) - 1) // self.chunk_tokens * self.chunk_tokens
            if start:
                import copy

                event = copy.copy(event)
                event.token_ids = list(prefix[max(0, start - self.chunk_tokens) : start])
        super()._payload(event, keys, group)


# ---------------------------------------------------------------------------- the connector
def _phantom_hit(conn: Any, engine: Any) -> None:
    _need("phantom_hit", conn, "get_num_new_matched_tokens")
    chunk = engine.setup.block_size * engine.setup.blocks_per_chunk
    _on_hits(conn, lambda hit: hit + chunk if hit else hit)


def _defer_always(conn: Any, engine: Any) -> None:
    _need("defer_always", conn, "get_num_new_matched_tokens")
    _on_hits(conn, lambda hit: hit if hit else None)


def _defer_for_others(conn: Any, engine: Any) -> None:
    """A lookup deferred while any request's transfer is in flight, not only its own or a
    load of a chunk its hit needs: requests wait on traffic they share nothing with."""
    _need("defer_for_others", conn, pn.JOBS, "get_num_new_matched_tokens")
    _on_hits(conn, lambda hit: None if getattr(conn, pn.JOBS) else hit)


def _reads_answer_as(fault: str, answer: str, read_as: str) -> Callable[[Any, Any], None]:
    """The fault by which the connector reads the manager's ``answer`` to a lookup as
    ``read_as`` (a tiered manager's answers: the engine draws one, front.tiered_answer)."""

    def plant(conn: Any, engine: Any) -> None:
        _need(fault, conn, "manager")
        front = conn.manager
        looked_up = front.lookup

        def lookup(key, req_context=None):
            out = looked_up(key, req_context)
            return getattr(type(out), read_as) if getattr(out, "name", None) == answer else out

        front.lookup = lookup

    return plant


def _partial_tail_unserved(conn: Any, engine: Any) -> None:
    """Beside a recurrent group the complete-chunk hit is served, never a partial tail past
    it (the tails are still stored)."""
    _need("partial_tail_unserved", conn, pn.PARTIAL_TAIL_HIT)
    extend = getattr(conn, pn.PARTIAL_TAIL_HIT)

    def complete_only(req_status, complete_hit, *args, **kwargs):
        extend(req_status, None, *args, **kwargs)  # what it resets, with nothing to extend
        return complete_hit

    setattr(conn, pn.PARTIAL_TAIL_HIT, complete_only)


def _handoffs_unstored(conn: Any, engine: Any) -> None:
    """The recurrent states the scheduler hands off at a boundary are never stored."""
    _need("handoffs_unstored", conn, pn.BUILD_PARTIAL_TAIL_STORE_JOBS)
    setattr(conn, pn.BUILD_PARTIAL_TAIL_STORE_JOBS, lambda *args, **kwargs: {})


def _on_hits(conn: Any, change: Callable[[Any], Any]) -> None:
    """``get_num_new_matched_tokens`` answers ``change(hit)`` for the hit it found."""
    matched = conn.get_num_new_matched_tokens

    def get_num_new_matched_tokens(*args, **kwargs):
        got = matched(*args, **kwargs)
        if isinstance(got, tuple):
            return (change(got[0]), *got[1:])
        return change(got)

    conn.get_num_new_matched_tokens = get_num_new_matched_tokens


def _idle_with_jobs(conn: Any, engine: Any) -> None:
    _need("idle_with_jobs", conn, "has_pending_push_work")
    conn.has_pending_push_work = lambda: False


def _push_work_unsaid(conn: Any, engine: Any) -> None:
    """``has_pending_push_work`` answers ``None``, not ``False``, while none is pending (a
    manager's ``has_pending_work`` that returns nothing, passed on)."""
    _need("push_work_unsaid", conn, "has_pending_push_work")
    said = conn.has_pending_push_work
    conn.has_pending_push_work = lambda: said() or None


def _tiers_ignored(conn: Any, engine: Any) -> None:
    """The connector builds each request's context as if the request named no load tiers."""
    _need("tiers_ignored", conn, "on_new_request")
    new_request = conn.on_new_request

    def on_new_request(request):
        params = request.kv_transfer_params
        if not params or LOAD_TIERS not in params:
            return new_request(request)
        request.kv_transfer_params = {k: v for k, v in params.items() if k != LOAD_TIERS}
        try:
            return new_request(request)
        finally:
            request.kv_transfer_params = params

    conn.on_new_request = on_new_request


def _after_new_request(fault: str, conn: Any, act: Callable[[Any, Any], None]) -> None:
    """Plant ``fault`` by ``act(request, status)`` right after the connector hears of each new
    request (``status``: the state it then keeps for it)."""
    _need(fault, conn, pn.REQ_STATUS, "on_new_request")
    new_request = conn.on_new_request

    def on_new_request(request, *args, **kwargs):
        out = new_request(request, *args, **kwargs)
        status = getattr(conn, pn.REQ_STATUS).get(request.request_id)
        if status is not None:
            act(request, status)
        return out

    conn.on_new_request = on_new_request


def _recount(ctx: Any, name: str, read: Callable[[str], Callable[[Any], Any]]) -> None:
    """Give ``ctx`` a class of its own whose token counts (those its class has) are read by
    ``read(field)``."""
    kind = type(ctx)
    fields = {f: property(read(f)) for f in TOKEN_COUNTS if hasattr(kind, f)}
    ctx.__class__ = type(f"{name}{kind.__name__}", (kind,), fields)


def _context_frozen(conn: Any, engine: Any) -> None:
    """Each request's context says the token counts its request had when it arrived."""

    def freeze(request, status):  # untyped, as the wrappers of the other faults
        ctx = getattr(status, "req_context", None)
        if ctx is not None:
            then = {f: getattr(ctx, f) for f in TOKEN_COUNTS if hasattr(type(ctx), f)}
            _recount(ctx, "Frozen", lambda f: lambda _self: then[f])

    _after_new_request("context_frozen", conn, freeze)


def _tier_filter_unset(conn: Any, engine: Any) -> None:
    """Each request's context built with no tier filter (``None``) where its request names
    the tiers it may load from."""

    def unset(request, status):  # untyped, as the wrappers of the other faults
        ctx = getattr(status, "req_context", None)
        if ctx is not None and LOAD_TIERS in (request.kv_transfer_params or {}):
            _need("tier_filter_unset", ctx, "load_tier_filter")
            ctx.load_tier_filter = None

    _after_new_request("tier_filter_unset", conn, unset)


def _context_dies_with_request(conn: Any, engine: Any) -> None:
    """Each request's context reads its token counts from the connector's state of the
    request, live, with nothing kept at its finish: once the connector drops the request, a
    read raises."""

    def live(request, status):  # untyped, as the wrappers of the other faults
        _need("context_dies_with_request", status, "req")
        ctx, req_id = getattr(status, "req_context", None), request.request_id
        if ctx is None:
            return
        _recount(ctx, "Live", lambda f: lambda _self: getattr(live_request(), f))

        def live_request():
            return getattr(conn, pn.REQ_STATUS)[req_id].req

    _after_new_request("context_dies_with_request", conn, live)


def _session_keys_frozen(conn: Any, engine: Any) -> None:
    """A streaming session keyed by its first input alone: once a later input grows its
    prompt, the connector stops taking its block hashes as keys."""
    _need("session_keys_frozen", conn, pn.REQ_STATUS, "on_new_request")
    new_request = conn.on_new_request

    def on_new_request(request, *args, **kwargs):
        out = new_request(request, *args, **kwargs)
        status = getattr(conn, pn.REQ_STATUS).get(request.request_id)
        kind = type(status)
        if getattr(request, "resumable", False) and hasattr(kind, "update_offload_keys"):
            first = request.num_prompt_tokens

            def update_offload_keys(self):
                if self.req.num_prompt_tokens <= first:
                    kind.update_offload_keys(self)

            # the release's state may have slots: a subclass with none of its own
            body = {"__slots__": (), "update_offload_keys": update_offload_keys}
            status.__class__ = type(f"FirstInput{kind.__name__}", (kind,), body)
        return out

    conn.on_new_request = on_new_request


def _sources_unattributed(conn: Any, engine: Any) -> None:
    """The connector tells the engine every hit came from no known tier."""
    _need("sources_unattributed", conn, "get_external_cache_hit_sources")
    sources = conn.get_external_cache_hit_sources

    def get_external_cache_hit_sources(request, num_external_tokens, *args, **kwargs):
        got = sources(request, num_external_tokens, *args, **kwargs)
        kind = type(next(iter(got))) if got else None
        return {kind("external_unspecified"): num_external_tokens} if kind else got

    conn.get_external_cache_hit_sources = get_external_cache_hit_sources


def _shutdown_lost(conn: Any, engine: Any) -> None:
    _need("shutdown_lost", conn, "shutdown")
    conn.shutdown = lambda: None


def _reset_lost(conn: Any, engine: Any) -> None:
    _need("reset_lost", conn, pn.RESET_CACHE)
    setattr(conn, pn.RESET_CACHE, lambda: None)


def _reset_keeps_progress(conn: Any, engine: Any) -> None:
    _need("reset_keeps_progress", conn, pn.RESET_CACHE, pn.REQ_STATUS)
    reset = getattr(conn, pn.RESET_CACHE)

    def reset_cache():
        kept = {
            (req_id, i): group.next_stored_chunk_idx
            for req_id, status in getattr(conn, pn.REQ_STATUS).items()
            for i, group in enumerate(getattr(status, "group_states", ()))
        }
        reset()
        for req_id, status in getattr(conn, pn.REQ_STATUS).items():
            for i, group in enumerate(getattr(status, "group_states", ())):
                group.next_stored_chunk_idx = kept.get((req_id, i), 0)

    setattr(conn, pn.RESET_CACHE, reset_cache)


def _reoffer(conn: Any, engine: Any) -> None:
    _need("reoffer", conn, pn.REQ_STATUS, pn.BUILD_STORE_JOBS)
    build = getattr(conn, pn.BUILD_STORE_JOBS)

    def build_store_jobs(scheduler_output):
        out = build(scheduler_output)
        for status in getattr(conn, pn.REQ_STATUS).values():
            for group in getattr(status, "group_states", ()):
                group.next_stored_chunk_idx = 0
        return out

    setattr(conn, pn.BUILD_STORE_JOBS, build_store_jobs)


def _info_every_time(conn: Any, engine: Any) -> None:
    _need("info_every_time", conn, pn.INFO_SENT, "get_stats")
    get_stats = conn.get_stats

    def forgetting_get_stats():
        setattr(conn, pn.INFO_SENT, False)
        return get_stats()

    conn.get_stats = forgetting_get_stats


def _info_needs_stats(conn: Any, engine: Any) -> None:
    """The tier's configuration sent only beside the manager's own stats: with a manager
    that reports none, the first payload goes out without it (and it is never sent)."""
    _need("info_needs_stats", conn, pn.INFO_SENT, "get_stats")
    get_stats = conn.get_stats

    def info_beside_manager_stats():
        stats = get_stats()
        if not engine.front.reports_stats:
            (getattr(stats, "data", None) or {}).pop(CONFIG_INFO, None)
        return stats

    conn.get_stats = info_beside_manager_stats


def _drop_failure_metric(conn: Any, engine: Any) -> None:
    _need("drop_failure_metric", conn, "get_stats")
    get_stats = conn.get_stats

    def get_stats_one_short():
        stats = get_stats()
        reduce = getattr(stats, "reduce", None)
        if reduce is not None:

            def one_short() -> dict:
                out = dict(reduce())
                for name, value in out.items():
                    if name.startswith(ALLOCATION_FAILURE) and value:
                        out[name] = value - 1
                        break
                return out

            stats.reduce = one_short
        return stats

    conn.get_stats = get_stats_one_short


def _lock_left_held(conn: Any, engine: Any) -> None:
    _need("lock_left_held", conn, pn.RELEASE_STEP)
    setattr(conn, pn.RELEASE_STEP, lambda: None)


def _region_split(conn: Any, engine: Any) -> None:
    """The step's region closed and opened again before each allocation's load."""
    _need("region_split", conn, pn.ACQUIRE_STEP, pn.RELEASE_STEP, "update_state_after_alloc")
    after_alloc = conn.update_state_after_alloc

    def update_state_after_alloc(*args, **kwargs):
        getattr(conn, pn.RELEASE_STEP)()
        getattr(conn, pn.ACQUIRE_STEP)()
        return after_alloc(*args, **kwargs)

    conn.update_state_after_alloc = update_state_after_alloc


def _offers_a_step_late(conn: Any, engine: Any) -> None:
    """Each step's stores built as if its batch had not run: a chunk is offered a step after
    the batch that completes it (a finishing request's last ones at its finish)."""
    _need("offers_a_step_late", conn, pn.BUILD_STORE_JOBS)
    build = getattr(conn, pn.BUILD_STORE_JOBS)

    def build_store_jobs(scheduler_output):
        before = dict(scheduler_output.num_scheduled_tokens)
        scheduler_output.num_scheduled_tokens = dict.fromkeys(before, 0)
        try:
            return build(scheduler_output)
        finally:
            scheduler_output.num_scheduled_tokens = before

    setattr(conn, pn.BUILD_STORE_JOBS, build_store_jobs)


def _fence_never_drains(conn: Any, engine: Any) -> None:
    """A cache reset's fence keeps the jobs it flushed after the worker reports them."""
    _need("fence_never_drains", conn, pn.RESET_FENCE, "update_connector_output")
    update = conn.update_connector_output

    def update_connector_output(*args, **kwargs):
        fence = getattr(conn, pn.RESET_FENCE)
        before = dict(fence)
        out = update(*args, **kwargs)
        for job, count in before.items():
            fence.setdefault(job, count)
        return out

    conn.update_connector_output = update_connector_output


def _fence_warns_at_once(conn: Any, engine: Any) -> None:
    """A cache reset's wait for its flushed jobs timed from an hour earlier (its start read on
    another clock): the connector warns them overdue at the next step."""
    _need("fence_warns_at_once", conn, pn.RESET_FENCE_SINCE, "reset_cache")
    reset_cache = conn.reset_cache

    def reset_cache_an_hour_early(*args, **kwargs):
        out = reset_cache(*args, **kwargs)
        setattr(conn, pn.RESET_FENCE_SINCE, getattr(conn, pn.RESET_FENCE_SINCE) - 3600.0)
        return out

    conn.reset_cache = reset_cache_an_hour_early


def _success_warned_as_failure(conn: Any, engine: Any) -> None:
    """Every job the worker reports done is logged as failed (a success flag read inverted
    in the warning's branch alone)."""
    _need("success_warned_as_failure", conn, "update_connector_output")
    update = conn.update_connector_output
    logger = connector_logger(conn)

    def update_warning_each(connector_output, *args, **kwargs):
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        for job in sorted(getattr(meta, "completed_jobs", None) or ()):
            if logger is not None and job not in engine.worker.reported_failed:
                logger.warning("KV offload store job %d failed; dropping its chunks", job)
        return update(connector_output, *args, **kwargs)

    conn.update_connector_output = update_warning_each


def _positions_unrecorded(conn: Any, engine: Any) -> None:
    """Each request's context records no key's position."""

    def unrecorded(request: Any, status: Any) -> None:
        ctx = getattr(status, "req_context", None)
        if ctx is not None and hasattr(ctx, "set_offload_key_position"):
            ctx.set_offload_key_position = lambda key, end_token: None

    _after_new_request("positions_unrecorded", conn, unrecorded)


def _load_blocks_unnamed(conn: Any, engine: Any) -> None:
    """Each load job sent to the worker with no GPU spec (the blocks it loads into)."""
    _need("load_blocks_unnamed", conn, "build_connector_meta")
    build = conn.build_connector_meta

    def build_connector_meta(*args, **kwargs):
        meta = build(*args, **kwargs)
        for job in (getattr(meta, "load_jobs", None) or {}).values():
            job.dst_spec = None
        return meta

    conn.build_connector_meta = build_connector_meta


def _cap_ignored(fault: str, cap: str) -> Callable[[Any, Any], None]:
    """The fault that drops each new request's ``cap`` (a field of its state) once read."""

    def plant(conn: Any, engine: Any) -> None:
        def drop(request: Any, status: Any) -> None:
            _need(fault, status, cap)
            setattr(status, cap, None)

        _after_new_request(fault, conn, drop)

    return plant


def _window_last_token(conn: Any, engine: Any) -> None:
    _need("window_last_token", conn, pn.SLIDING_WINDOW_GROUPS, pn.LOOKUP_COMPLETE_CHUNKS)
    lookup = getattr(conn, pn.LOOKUP_COMPLETE_CHUNKS)

    def lookup_complete_chunks(*args, **kwargs):
        groups = getattr(conn, pn.SLIDING_WINDOW_GROUPS)
        setattr(conn, pn.SLIDING_WINDOW_GROUPS, ())
        try:  # the cap a window needs (the last token left to recompute) is lost
            return lookup(*args, **kwargs)
        finally:
            setattr(conn, pn.SLIDING_WINDOW_GROUPS, groups)

    setattr(conn, pn.LOOKUP_COMPLETE_CHUNKS, lookup_complete_chunks)


def _drafter_unproven(conn: Any, engine: Any) -> None:
    _need("drafter_unproven", conn, "config")
    groups = getattr(conn.config, "kv_group_configs", ())
    conn.config = conn.config._replace(
        kv_group_configs=tuple(
            g._replace(is_eagle_group=False) if getattr(g, "is_eagle_group", False) else g
            for g in groups
        )
    )


def _keep_finished(conn: Any, engine: Any) -> None:
    _need("keep_finished", conn, pn.REQ_STATUS)
    setattr(conn, pn.REQ_STATUS, _NeverForgets(getattr(conn, pn.REQ_STATUS)))


class _NeverForgets(dict):
    """The connector's per-request map that drops nothing."""

    def __delitem__(self, key):
        return None


def _drop_async_delay(conn: Any, engine: Any) -> None:
    _need("drop_async_delay", conn, pn.OBSERVE_ASYNC_DELAY)

    def forget_deferral(req_status: Any) -> None:
        req_status.deferred_lookup_start_time = None

    setattr(conn, pn.OBSERVE_ASYNC_DELAY, forget_deferral)


def _delay_added_to_clock(conn: Any, engine: Any) -> None:
    """A deferral's delay computed as the clock plus its start, not minus."""
    _need("delay_added_to_clock", conn, pn.OBSERVE_ASYNC_DELAY)
    observe = getattr(conn, pn.OBSERVE_ASYNC_DELAY)

    def observe_from_negated_start(req_status: Any) -> Any:
        start = getattr(req_status, "deferred_lookup_start_time", None)
        if start is not None:
            req_status.deferred_lookup_start_time = -start
        return observe(req_status)

    setattr(conn, pn.OBSERVE_ASYNC_DELAY, observe_from_negated_start)


def _false_recovery(conn: Any, engine: Any) -> None:
    _need("false_recovery", conn, pn.MANAGER_LOCKED)
    logger = getattr(sys.modules.get(type(conn).__module__), "logger", None)
    if not isinstance(logger, logging.Logger):
        raise FaultTargetMissing(
            f"fault 'false_recovery' logs through {type(conn).__module__}.logger, which this "
            "vLLM lacks: it would plant nothing"
        )
    locked = getattr(conn, pn.MANAGER_LOCKED)

    @contextlib.contextmanager
    def manager_locked():
        logger.error("manager lock left held by a previous schedule(); releasing it")
        with locked():
            yield

    setattr(conn, pn.MANAGER_LOCKED, manager_locked)


# ---------------------------------------------------------------------------- the registry
@dataclass(frozen=True)
class Fault:
    """One planted fault: what it breaks, the part it breaks (``CONNECTOR`` or the class the
    engine builds), and how: a subclass of that class, or ``plant(connector, engine)``."""

    breaks: str
    part: Any
    how: Any


FAULTS: dict[str, Fault] = {
    # the manager's front (front.py): what the connector tells the manager
    "double_complete": Fault("a store job completed twice", Front, _DoubleComplete),
    "drop_complete": Fault("one store job's completion dropped", Front, _DropComplete),
    "drop_removals": Fault("the manager's removal events lost", Front, _DropRemovals),
    "store_failure_ignored": Fault(
        "a failed store's chunks completed as stored (published ready)",
        Front,
        _StoreFailureIgnored,
    ),
    "skip_new_request": Fault("on_new_request never reaches the manager", Front, _SkipNewRequest),
    # the bytes worker (bytes_worker.py)
    "ignore_flush": Fault(
        "a flushed store runs only when delivered, as if jobs_to_flush were empty",
        BytesWorker,
        _IgnoreFlush,
    ),
    "load_wrong_chunk": Fault(
        "a load reads the chunks in reverse (another than named, where it has more than one)",
        BytesWorker,
        _LoadWrongChunk,
    ),
    "load_one_group": Fault(
        "a load fills only the first KV-cache group's blocks: a later group computes with KV "
        "it never got",
        BytesWorker,
        _LoadOneGroup,
    ),
    "skip_block_copies": Fault(
        "the scheduler's copy-on-write copies never run: a recurrent state handed off inside a "
        "block is not in the block the connector stores it from",
        BytesWorker,
        _SkipBlockCopies,
    ),
    # the event publisher (event_payload.py)
    "shifted_payload": Fault(
        "each store event carries the tokens of the chunk before its own",
        Publisher,
        _ShiftedPayload,
    ),
    # the connector's scheduler side (exact.py, lookup_metrics.py, error_log.py)
    "phantom_hit": Fault("one chunk more reported than the tier holds", CONNECTOR, _phantom_hit),
    "defer_always": Fault(
        "a lookup with no hit is deferred: the request waits for nothing", CONNECTOR, _defer_always
    ),
    "defer_for_others": Fault(
        "a lookup deferred while another request's transfer runs", CONNECTOR, _defer_for_others
    ),
    "retry_read_as_miss": Fault(
        "a tier's RETRY read as a miss: a shorter hit, not a wait",
        CONNECTOR,
        _reads_answer_as("retry_read_as_miss", "RETRY", "MISS"),
    ),
    "pending_read_as_hit": Fault(
        "a chunk the tier still promotes (HIT_PENDING) read as readable: no wait",
        CONNECTOR,
        _reads_answer_as("pending_read_as_hit", "HIT_PENDING", "HIT"),
    ),
    "partial_tail_unserved": Fault(
        "beside a recurrent group no partial tail served: the complete-chunk hit below it",
        CONNECTOR,
        _partial_tail_unserved,
    ),
    "handoffs_unstored": Fault(
        "a recurrent state handed off at a boundary never stored", CONNECTOR, _handoffs_unstored
    ),
    "reoffer": Fault(
        "the stored-chunk index never advances: every chunk offered again each step",
        CONNECTOR,
        _reoffer,
    ),
    "keep_finished": Fault("a finished request's state never dropped", CONNECTOR, _keep_finished),
    "region_split": Fault(
        "the step's region of the manager's lock let go and taken again before each "
        "allocation's load",
        CONNECTOR,
        _region_split,
    ),
    "offers_a_step_late": Fault(
        "each chunk offered a step after the batch that completes it",
        CONNECTOR,
        _offers_a_step_late,
    ),
    "fence_never_drains": Fault(
        "a cache reset waits for its flushed jobs after the worker reported them",
        CONNECTOR,
        _fence_never_drains,
    ),
    "fence_warns_at_once": Fault(
        "a reset's flushed jobs warned overdue at once", CONNECTOR, _fence_warns_at_once
    ),
    "success_warned_as_failure": Fault(
        "every job reported done logged as failed", CONNECTOR, _success_warned_as_failure
    ),
    "positions_unrecorded": Fault(
        "no request context records its keys' positions", CONNECTOR, _positions_unrecorded
    ),
    "load_blocks_unnamed": Fault(
        "each load job sent to the worker naming no GPU blocks", CONNECTOR, _load_blocks_unnamed
    ),
    "ignore_max_load": Fault(
        "a request's max_load_tokens never read",
        CONNECTOR,
        _cap_ignored("ignore_max_load", "max_load_tokens"),
    ),
    "ignore_max_offload": Fault(
        "a request's max_offload_tokens never read",
        CONNECTOR,
        _cap_ignored("ignore_max_offload", "max_offload_tokens"),
    ),
    "drop_failure_metric": Fault(
        "one failed store allocation never reaches the connector's metric",
        CONNECTOR,
        _drop_failure_metric,
    ),
    "lock_left_held": Fault(
        "the step's region of the manager's lock never closed", CONNECTOR, _lock_left_held
    ),
    "window_last_token": Fault(
        "a sliding window's hit reaches the request's last token, which the window needs "
        "recomputed",
        CONNECTOR,
        _window_last_token,
    ),
    "drafter_unproven": Fault(
        "a drafter's (EAGLE) group taken for a target group", CONNECTOR, _drafter_unproven
    ),
    "reset_lost": Fault("a cache reset never reaches the manager", CONNECTOR, _reset_lost),
    "reset_keeps_progress": Fault(
        "a cache reset leaves the running requests' store progress: the emptied tier never "
        "hears their chunks again",
        CONNECTOR,
        _reset_keeps_progress,
    ),
    "info_every_time": Fault(
        "the tier's configuration asked of the manager for every stats payload",
        CONNECTOR,
        _info_every_time,
    ),
    "idle_with_jobs": Fault(
        "the connector never says it has work pending: idle with jobs in flight",
        CONNECTOR,
        _idle_with_jobs,
    ),
    "info_needs_stats": Fault(
        "the configuration sent only beside the manager's stats", CONNECTOR, _info_needs_stats
    ),
    "push_work_unsaid": Fault(
        "no pending push work said as None, not False", CONNECTOR, _push_work_unsaid
    ),
    "context_frozen": Fault(
        "each request's context keeps its arrival's token counts", CONNECTOR, _context_frozen
    ),
    "tier_filter_unset": Fault(
        "a context with no tier filter for a request that names tiers",
        CONNECTOR,
        _tier_filter_unset,
    ),
    "context_dies_with_request": Fault(
        "a finished request's context unreadable once the connector drops it",
        CONNECTOR,
        _context_dies_with_request,
    ),
    "session_keys_frozen": Fault(
        "a streaming session keyed by its first input alone", CONNECTOR, _session_keys_frozen
    ),
    "sources_unattributed": Fault(
        "every hit told to the engine as of no known tier", CONNECTOR, _sources_unattributed
    ),
    "shutdown_lost": Fault(
        "the connector's shutdown never reaches the manager", CONNECTOR, _shutdown_lost
    ),
    "tiers_ignored": Fault(
        "a request's kv_load_tiers never read: every tier allowed", CONNECTOR, _tiers_ignored
    ),
    "drop_async_delay": Fault(
        f"a deferral closes without its {ASYNC_DELAY} observation", CONNECTOR, _drop_async_delay
    ),
    "delay_added_to_clock": Fault(
        "a deferral's delay added to the clock", CONNECTOR, _delay_added_to_clock
    ),
    "false_recovery": Fault(
        "every hook outside the step logs recovering a lock no step left held",
        CONNECTOR,
        _false_recovery,
    ),
}


def built(fault: str | None, part: type) -> type:
    """The class to build for ``part`` (``Front``, ``BytesWorker``, ``Publisher``): the
    fault's subclass where ``fault`` breaks that part, else ``part`` itself."""
    planted = FAULTS.get(fault) if fault is not None else None
    return planted.how if planted is not None and planted.part is part else part


def plant_on_connector(fault: str | None, conn: Any, engine: Any) -> None:
    """Plant ``fault`` on the built connector where it breaks the connector (before the
    checks wrap it); ``FaultTargetMissing`` where the release lacks what it replaces."""
    planted = FAULTS.get(fault) if fault is not None else None
    if planted is not None and planted.part == CONNECTOR:
        planted.how(conn, engine)
