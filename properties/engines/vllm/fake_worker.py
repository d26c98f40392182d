"""The connector's worker side, faked: it reads each step's connector metadata, holds jobs in
flight until the machine delivers them, and reports completions the way the real worker does."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from .checks import Checks

SPECS = ("src_spec", "dst_spec")  # a transfer job's two ends


def formed_jobs(meta: Any, kind: str, checks: Checks) -> dict[int, Any]:
    """The step's ``kind`` jobs (``store`` or ``load``) whose two specs name blocks. A job
    whose spec does not is the connector's ill-formed answer (vLLM's worker cannot run it): a
    counterexample of the target, never an error of kvgate's; the job is left out."""
    formed = {}
    for job_id, job in (getattr(meta, f"{kind}_jobs", None) or {}).items():
        bad = next((s for s in SPECS if not hasattr(getattr(job, s, None), "block_ids")), None)
        if bad is None:
            formed[job_id] = job
        else:
            checks.fail(
                f"the connector's {kind} job {job_id} ({getattr(job, 'req_id', '?')}) names "
                f"no blocks in its {bad} ({getattr(job, bad, None)!r}): vLLM's worker cannot "
                "run it"
            )
    return formed


class FakeWorker:
    """The connector's worker side, as the machine drives it (see the module docstring)."""

    def __init__(self, checks: Checks, blocks_per_chunk: int):
        self.checks = checks
        self.blocks_per_chunk = blocks_per_chunk
        self.in_flight: dict[int, tuple[str, str]] = {}  # job -> ("store" | "load", req_id)
        self.done: list[int] = []  # completed, not reported yet
        self.reported: set[int] = set()
        self.started: dict[int, int] = {}  # job -> the engine step that issued it
        self.clock = 0  # the engine step now (the engine sets it)
        self.stats: Counter[str] = Counter()
        self.failed: set[int] = set()  # completed jobs whose copy failed (reported so)
        self.reported_failed: set[int] = set()  # jobs reported to the connector as failed
        self.can_fail = _reports_failures()  # the release's worker metadata carries failures

    def receive(self, meta: Any) -> None:
        """One step's connector metadata, as the worker gets it before the forward pass."""
        if meta is None:
            return
        for job_id, job in formed_jobs(meta, "store", self.checks).items():
            sizes, firsts = group_spans(job.src_spec)
            reach = sum(extents(sizes, firsts, self.blocks_per_chunk))
            self.checks.issued(job_id, job.dst_spec, sum(sizes), self.blocks_per_chunk, reach)
            self._start(job_id, "store", job.req_id)
        sync = []
        for job_id, job in formed_jobs(meta, "load", self.checks).items():
            self._start(job_id, "load", job.req_id)
            if getattr(job, "sync", False):  # waited for within the step: no finished_recving
                self.stats["sync loads"] += 1
                self.in_flight[job_id] = ("sync load", job.req_id)
                sync.append(job_id)
        # as vLLM's worker side: the stores to flush first (their blocks are about to be
        # reused), then the loads this step waits for
        flush = [j for j in (getattr(meta, "jobs_to_flush", None) or ()) if j in self.in_flight]
        if flush:
            self.stats["flushes"] += 1
            self.finish(flush)
        self.finish(sync)

    def _start(self, job_id: int, kind: str, req_id: str) -> None:
        if job_id in self.in_flight or job_id in self.reported or job_id in self.done:
            self.checks.fail(f"job id {job_id} issued twice")
        self.in_flight[job_id] = (kind, req_id)
        self.started[job_id] = self.clock

    def finish(self, jobs: Iterable[int]) -> None:
        for job in jobs:
            if job in self.in_flight and job not in self.done:
                self.done.append(job)

    def fail(self, jobs: Iterable[int]) -> None:
        """Store jobs complete with their copy failed (where the release can say so)."""
        jobs = [j for j in jobs if self.in_flight.get(j, ("",))[0] == "store"]
        self.failed.update(jobs)
        self.stats["failed stores"] += len(jobs)
        self.finish(jobs)

    def jobs(self, kind: str | None = None) -> list[int]:
        """In-flight jobs not completed yet, oldest first."""
        done = set(self.done)
        return [
            j
            for j, (k, _) in self.in_flight.items()
            if j not in done and (kind is None or k == kind)
        ]

    def due(self, store_delay: int, load_delay: int) -> list[int]:
        """In-flight jobs issued at least that many engine steps ago (a replay's delays)."""
        return [
            j
            for j in self.jobs()
            if self.clock + 1 - self.started[j]
            >= (store_delay if self.in_flight[j][0] == "store" else load_delay)
        ]

    def copy_blocks(self, copies: Any) -> None:
        """The scheduler's block copies before a batch: no data here (``BytesWorker``)."""
        return None

    def forward(self, scheduled: dict[str, int], computed: dict[str, int]) -> None:
        """A step's forward pass: no data here (``BytesWorker`` writes and checks KV)."""
        return None

    def check_ready(self, is_ready: Callable[[bytes], bool]) -> None:
        """What the ready chunks hold: no data here (``BytesWorker`` checks it)."""
        return None

    def report(self) -> tuple[Any, list[int]]:
        """The ``KVConnectorOutput`` of everything completed since the last report, and the
        store jobs in it."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingWorkerMetadata,
        )
        from vllm.v1.outputs import KVConnectorOutput

        meta = OffloadingWorkerMetadata()
        recving, stores = set(), []
        for job in self.done:
            kind, req_id = self.in_flight.pop(job)
            self.started.pop(job, None)
            if job in self.failed:
                self.failed.discard(job)
                self.reported_failed.add(job)
                meta.mark_completed(job, success=False)
            else:
                meta.mark_completed(job)
            self.reported.add(job)
            if kind == "load":
                recving.add(req_id)
            elif kind == "store":
                stores.append(job)
        self.done = []
        output = KVConnectorOutput(
            finished_sending=set(),
            finished_recving=recving,
            kv_connector_worker_meta=meta if meta.completed_jobs else None,
        )
        return output, stores


def group_spans(gpu_spec: Any) -> tuple[list[int], list[int]]:
    """A GPU spec's blocks per group and each group's first block index (one group where the
    spec names none)."""
    ids = getattr(gpu_spec, "block_ids", ())
    sizes = [int(n) for n in (getattr(gpu_spec, "group_sizes", None) or [len(ids)])]
    firsts = [int(i) for i in (getattr(gpu_spec, "block_indices", None) or [0] * len(sizes))]
    return sizes, firsts


def extents(sizes: list[int], firsts: list[int], blocks_per_chunk: int) -> list[int]:
    """The chunk blocks each group's blocks reach, from its first chunk's start (the blocks a
    release left out before its first block count: its chunks are whole from there)."""
    return [first % blocks_per_chunk + size if size else 0 for size, first in zip(sizes, firsts)]


def _reports_failures() -> bool:
    """Whether the release's worker metadata reports a job whose copy failed."""
    import inspect

    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
        OffloadingWorkerMetadata,
    )

    mark = getattr(OffloadingWorkerMetadata, "mark_completed", None)
    return mark is not None and "success" in inspect.signature(mark).parameters
