"""``kvgate replay TRACE --scheduler vllm``: the trace through vLLM's own scheduler.

How it works and why: docs/internals.md, section kvgate/replay/vllm_path.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from kvgate.impl.traces import TRACE_BLOCK_SIZE, TraceRequest

from .records import ReplayReport, ReplaySettings

MAX_STEPS = 2_000_000  # a replay that never drains is stopped here and says so
UNSUPPORTED = (
    ("fail_every", 0, "--fail-every"),
    ("worker", "null", "--worker copy"),
    ("verify", False, "--verify"),
)


def unsupported(settings: ReplaySettings) -> str | None:
    """The flag ``--scheduler vllm`` cannot honour, in one line, or ``None``."""
    for field, default, flag in UNSUPPORTED:
        if getattr(settings, field) != default:
            return (
                f"--scheduler vllm: {flag} does not apply (both vLLM releases assert that "
                "every transfer succeeded; no bytes are copied)"
            )
    return None


def prompt_tokens(request: TraceRequest) -> list[int]:
    tokens: list[int] = []
    for h in request.hash_ids:
        tokens += [h + 1] * TRACE_BLOCK_SIZE
    tokens = tokens[: request.input_length]
    if len(tokens) < request.input_length:  # more tokens than hash ids cover: one more block
        tokens += [0] * (request.input_length - len(tokens))
    return tokens or [0]


def replay_vllm(
    trace: Sequence[TraceRequest],
    tgt: Any,
    settings: ReplaySettings,
    *,
    check: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayReport:
    from kvgate.properties.engines.vllm.configs import Setup
    from kvgate.properties.engines.vllm.engine import VllmEngine
    from kvgate.properties.oracle import Divergence

    policy: str = settings.policy or tgt.policies[0]
    s = replace(settings, policy=policy)
    if s.limit is not None:
        trace = trace[: s.limit]
    longest = max((r.input_length + max(1, r.output_length) for r in trace), default=1)
    setup = Setup(
        num_chunks=s.num_chunks,
        store_threshold=s.store_threshold,
        max_tracker_size=s.max_tracker_size,
        policy=policy,
        gpu_blocks=s.gpu_blocks,
        blocks_per_chunk=s.blocks_per_chunk,
        block_size=s.block_size,
        max_seqs=s.max_running,
        batched_tokens=s.prefill_tokens,
        max_model_len=longest + s.block_size,
    )
    engine = VllmEngine(setup, tgt, lockstep=check, move_bytes=False)
    sched = engine.sched
    engine.checks.is_finished = lambda req_id: (
        req_id not in sched.requests or sched.requests[req_id].is_finished()
    )
    report = ReplayReport(tgt.spec, s, checked=check)
    chunk_tokens = s.block_size * s.blocks_per_chunk
    added: list[str] = []
    total, nxt = len(trace), 0
    started = time.perf_counter()
    try:
        while True:
            if s.ms_per_step > 0:
                now_ms = engine.steps * s.ms_per_step
                while nxt < total and trace[nxt].timestamp <= now_ms:
                    nxt = _add(engine, trace, nxt, added, chunk_tokens, report)
            else:
                while nxt < total and sched.get_request_counts()[1] < s.max_running:
                    nxt = _add(engine, trace, nxt, added, chunk_tokens, report)
            if nxt >= total and not engine.can_step():
                break
            if engine.steps >= MAX_STEPS:
                report.divergence = f"stopped after {MAX_STEPS} engine steps: it never drained"
                break
            engine.worker.finish(engine.worker.due(s.store_delay, s.load_delay))
            engine.step()
            if engine.checks.failure and check:
                report.divergence = engine.checks.failure
                break
            if s.reset_every and engine.steps % s.reset_every == 0:
                engine.reset()
            if progress is not None and not engine.steps & 255:
                progress(_finished(sched, added), total)
        engine.drain()
    except Divergence as e:
        report.divergence = str(e)
    report.seconds = time.perf_counter() - started
    if progress is not None:
        progress(_finished(sched, added), total)
    _fill(report, engine, added)
    if report.divergence is None:  # cold admissions are counted; any other failure is one
        other = [p for p in engine.checks.problems if not p.startswith("cold admission")]
        if other:
            report.divergence = other[0]
    return report


def _add(engine, trace, nxt: int, added: list[str], chunk_tokens: int, report: ReplayReport) -> int:
    request = trace[nxt]
    req_id = f"r{nxt}"
    engine.add_request(req_id, prompt_tokens(request), max(1, request.output_length))
    added.append(req_id)
    report.prefix_chunks += request.input_length // chunk_tokens
    return nxt + 1


def _finished(sched, added: list[str]) -> int:
    return sum(1 for r in added if r not in sched.requests or sched.requests[r].is_finished())


def _fill(report: ReplayReport, engine, added: list[str]) -> None:
    stats = engine.checks.stats
    report.requests = len(added)
    report.finished = _finished(engine.sched, added)
    report.steps = engine.steps
    report.offers = stats["offers"]
    report.admitted = stats["admitted"]
    report.cold_admissions = stats["cold admissions"]
    report.cold_examples = engine.checks.cold[:5]
    report.skips = stats["skips"]
    report.allocation_failures = stats["allocation failures"]
    report.retries = stats["retries"]
    report.finish_retries = stats["finish-time retries"]
    report.preemptions = engine.counts["preemptions"]
    report.evictions = stats["evicted keys"]
    report.resets = stats["resets"]
    report.stores_completed = stats["completed keys"]
    report.stores_stale = stats["stale keys"]
    report.stores_in_flight = sum(len(keys) for keys in engine.checks.jobs.values())
    report.loads = stats["loads"]
    report.prefix_hits = stats["loaded keys"]
    report.hit_rate = report.prefix_hits / report.prefix_chunks if report.prefix_chunks else 0.0
