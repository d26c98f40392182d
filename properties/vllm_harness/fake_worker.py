"""The connector's worker side, faked: it reads each step's connector metadata, holds jobs in
flight until the machine delivers them, and reports completions the way the real worker does."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from .checks import Checks


# ---------------------------------------------------------------------------- the worker side
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

    def receive(self, meta: Any) -> None:
        """One step's connector metadata, as the worker gets it before the forward pass."""
        if meta is None:
            return
        from .bytes_worker import extents, group_spans

        for job_id, job in (getattr(meta, "store_jobs", None) or {}).items():
            sizes, firsts = group_spans(job.src_spec)
            reach = sum(extents(sizes, firsts, self.blocks_per_chunk))
            self.checks.issued(job_id, job.dst_spec, sum(sizes), self.blocks_per_chunk, reach)
            self._start(job_id, "store", job.req_id)
        for job_id, job in (getattr(meta, "load_jobs", None) or {}).items():
            self._start(job_id, "load", job.req_id)
            if getattr(job, "sync", False):  # waited for within the step: no finished_recving
                self.stats["sync loads"] += 1
                self.in_flight[job_id] = ("sync load", job.req_id)
                self.finish([job_id])
        flush = [j for j in (getattr(meta, "jobs_to_flush", None) or ()) if j in self.in_flight]
        if flush:
            self.stats["flushes"] += 1
            self.finish(flush)

    def _start(self, job_id: int, kind: str, req_id: str) -> None:
        if job_id in self.in_flight or job_id in self.reported or job_id in self.done:
            self.checks.fail(f"job id {job_id} issued twice")
        self.in_flight[job_id] = (kind, req_id)
        self.started[job_id] = self.clock

    def finish(self, jobs: Iterable[int]) -> None:
        for job in jobs:
            if job in self.in_flight and job not in self.done:
                self.done.append(job)

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
