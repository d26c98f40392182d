"""A replay's records: its settings (one per command-line flag) and its report's figures. Both
replay paths (``kvgate.replay.engine``, ``kvgate.replay.vllm_path``) fill the same report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kvgate.impl.traces import TRACE_BLOCK_SIZE


@dataclass(frozen=True)
class ReplaySettings:
    """One run's parameters (each one a command-line flag)."""

    num_chunks: int = 1024  # CPU tier size, in chunks
    store_threshold: int = 2
    max_tracker_size: int = 64_000
    policy: str | None = None  # None: the target's first policy (lru for impl)
    blocks_per_chunk: int = 1
    block_size: int = TRACE_BLOCK_SIZE  # tokens per block (the trace's hash granularity)
    max_running: int = 16
    gpu_blocks: int = 1024
    prefill_tokens: int = 8192  # token budget per step
    store_delay: int = 2
    load_delay: int = 1
    reset_every: int = 0  # steps between cache resets; 0: never
    fail_every: int = 0  # every N-th store job's copy fails; 0: none (null worker)
    worker: str = "null"  # "null": no bytes, jobs complete after the delays; "copy": impl.worker
    device: str = "cpu"  # the copy worker's KV tensors
    verify: bool = False  # check data: loads bring their blocks, chunks hold their keys' blocks
    ms_per_step: float = 0.0  # > 0: arrivals by timestamp; 0: back-pressure
    limit: int | None = None  # first N requests of the trace
    scheduler: str = "kvgate"  # "kvgate": impl's driver; "vllm": vLLM's own (replay.vllm_path)


@dataclass
class ReplayReport:
    target: str
    settings: ReplaySettings
    requests: int = 0
    finished: int = 0
    steps: int = 0
    offers: int = 0
    admitted: int = 0
    cold_admissions: int = 0
    skips: int = 0
    allocation_failures: int = 0
    retries: int = 0
    finish_retries: int = 0
    preemptions: int = 0
    evictions: int = 0
    resets: int = 0
    stores_completed: int = 0
    stores_failed: int = 0
    stores_stale: int = 0
    stores_in_flight: int = 0
    loads: int = 0
    prefix_chunks: int = 0
    prefix_hits: int = 0
    hit_rate: float = 0.0
    seconds: float = 0.0
    checked: bool = False
    divergence: str | None = None
    data_errors: int | None = None  # None: data not verified
    data_error_examples: list[str] = field(default_factory=list)
    cold_examples: list[str] = field(default_factory=list)

    @property
    def policy(self) -> str:
        return self.settings.policy or "lru"

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["settings"] = asdict(self.settings)
        return d

    def accounting_ok(self) -> bool:
        return self.admitted == (
            self.stores_completed + self.stores_failed + self.stores_stale + self.stores_in_flight
        )
