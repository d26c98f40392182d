"""Replay a request trace through the scheduler driver, against any target of the gate.

``kvgate replay TRACE [--target SPEC ...] [--threshold T ...] [--num-chunks N ...] [--check]``
(the same as ``python -m kvgate replay TRACE ...``).

How it works and why: docs/internals.md, section kvgate/replay/engine.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from kvgate.impl.traces import TraceRequest
from kvgate.properties.adapters import Config, TargetError
from kvgate.properties.audit import Audit
from kvgate.properties.null_worker import NullWorker
from kvgate.properties.oracle import Divergence, LockstepManager, fmt_key
from kvgate.properties.targets import resolve_target

from .records import ReplayReport, ReplaySettings

DEFAULT_SETTINGS = ReplaySettings()

__all__ = ["ReplayReport", "ReplaySettings", "ReplayTargetError", "replay", "resolve"]

# --------------------------------------------------------------------------- targets


class ReplayTargetError(Exception):
    """A target that cannot be resolved or built."""


def resolve(spec: str):
    """The gate's target (``properties.targets.resolve_target``), errors as ReplayTargetError."""
    try:
        return resolve_target(spec)
    except TargetError as e:
        raise ReplayTargetError(str(e)) from None


# --------------------------------------------------------------------------- the replay


def make_worker(s: ReplaySettings, verify: bool):
    """The worker ``s.worker`` names: the copy worker on ``s.device``, else the null worker."""
    if s.worker == "copy":
        from kvgate.properties.worker.tagged import TaggedCopyWorker

        return TaggedCopyWorker(s.gpu_blocks, s.num_chunks, s.blocks_per_chunk, device=s.device)
    return NullWorker(
        delay=s.store_delay,
        blocks_per_chunk=s.blocks_per_chunk,
        load_delay=s.load_delay,
        fail_every=s.fail_every,
        track_data=verify,
    )


def replay(
    trace: Sequence[TraceRequest],
    target: str | Any = "impl",
    settings: ReplaySettings = DEFAULT_SETTINGS,
    *,
    check: bool = False,
    progress: Callable[[int, int], None] | None = None,
    worker: Any | None = None,
) -> ReplayReport:
    """Replay ``trace`` against ``target`` (a spec or a resolved target) under ``settings``.
    ``worker``: a worker to use instead of the one ``settings.worker`` names."""
    s = settings
    tgt = resolve(target) if isinstance(target, str) else target
    if s.scheduler == "vllm":
        from .vllm_path import replay_vllm

        return replay_vllm(trace, tgt, s, check=check, progress=progress)
    policy = s.policy or tgt.policies[0]
    s = replace(s, policy=policy)
    if s.limit is not None:
        trace = trace[: s.limit]
    recency = tgt.recencies[0]
    manager = tgt.make(
        Config(
            num_chunks=s.num_chunks,
            store_threshold=s.store_threshold,
            max_tracker_size=s.max_tracker_size,
            cache_policy=policy,
            recency=recency,
        )
    )
    oracle = None
    if check:
        from kvgate.model.cache import Model

        oracle = LockstepManager(
            manager,
            Model(
                s.num_chunks,
                store_threshold=s.store_threshold,
                max_tracker_size=s.max_tracker_size,
                policy=policy,
                recency=recency,
            ),
            foreign=getattr(tgt, "foreign", False),
        )
        manager = oracle
    verify = s.verify or s.worker == "copy"
    if worker is None:
        worker = make_worker(s, verify)
    audit = Audit(
        manager,
        worker,
        s.store_threshold,
        s.blocks_per_chunk,
        data=verify,
        offers=None if oracle is None else oracle.offers,
    )

    def on_step(step: int) -> None:
        audit.set_step(step)
        if oracle is not None:
            oracle.set_step(step)

    sched = audit.driver(
        block_size=s.block_size,
        blocks_per_chunk=s.blocks_per_chunk,
        num_gpu_blocks=s.gpu_blocks,
        max_running=s.max_running,
        max_tokens_per_step=s.prefill_tokens,
        on_step=on_step,
    )
    report = ReplayReport(getattr(tgt, "spec", str(target)), s, checked=check)
    total = len(trace)
    started = time.perf_counter()
    nxt = 0
    try:
        while True:
            if s.ms_per_step > 0:
                now_ms = sched.step_no * s.ms_per_step
                while nxt < total and trace[nxt].timestamp <= now_ms:
                    audit.expect(sched.add_request(trace[nxt].to_request(f"r{nxt}", s.block_size)))
                    nxt += 1
            else:
                while nxt < total and len(sched.waiting) < s.max_running:
                    audit.expect(sched.add_request(trace[nxt].to_request(f"r{nxt}", s.block_size)))
                    nxt += 1
            if nxt >= total and sched.idle:
                break
            sched.step()
            if s.reset_every and sched.step_no % s.reset_every == 0:
                sched.reset()
            if progress is not None and not sched.step_no & 255:
                progress(sched.counters.finished, total)
    except Divergence as e:
        report.divergence = str(e)
    report.seconds = time.perf_counter() - started
    if progress is not None:
        progress(sched.counters.finished, total)
    c = sched.counters
    report.cold_admissions = audit.cold_admissions
    for name in (
        "requests",
        "finished",
        "steps",
        "offers",
        "admitted",
        "skips",
        "allocation_failures",
        "retries",
        "finish_retries",
        "preemptions",
        "evictions",
        "resets",
        "stores_completed",
        "stores_failed",
        "stores_stale",
        "loads",
        "prefix_chunks",
        "prefix_hits",
    ):
        setattr(report, name, getattr(c, name))
    report.stores_in_flight = c.stores_in_flight()
    if verify:
        errors = audit.data_errors + audit.stored_data_errors()
        report.data_errors = len(errors)
        report.data_error_examples = errors[:5]
    report.hit_rate = c.hit_rate
    report.cold_examples = [
        f"step {st}: {fmt_key(k)} offered by {n}" for st, k, n in audit.cold[:5]
    ]
    return report
