"""A worker that moves no bytes, for the scheduler machine, the replay and the tests.

It fits the worker interface the scheduler driver uses (``submit_store``, ``submit_load``,
``get_finished``, ``wait``; ``advance`` once per step; ``write_gpu`` when compute writes a block)
and adds test controls: jobs complete a set number of steps after submission or when released,
a job can be made to fail, and with ``track_data`` each GPU block and chunk sub-block carries one
tag, copied when a job completes, so that a test checks the data path without torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kvgate.impl.base import TransferResult


class NullWorker:
    """An in-process worker that moves no bytes: a job completes ``delay`` steps after it was
    submitted (``delay=None``: when ``release``d or waited for; loads take ``load_delay`` when
    it is given). ``advance()`` is one step; the
    scheduler calls it at the start of each of its steps.

    With ``track_data=True`` it keeps one tag per GPU block and per chunk sub-block and copies
    tags when a job completes, so a test can check that every chunk holds the data of its key.
    """

    def __init__(
        self,
        delay: int | None = 1,
        blocks_per_chunk: int = 1,
        track_data: bool = False,
        load_delay: int | None = None,
        fail_every: int = 0,
    ):
        for name, value in (("delay", delay), ("load_delay", load_delay)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")
        if not isinstance(fail_every, int) or fail_every < 0:
            raise ValueError(f"fail_every must be an int >= 0, got {fail_every!r}")
        self.delay = delay
        self.load_delay = load_delay  # None: the same as ``delay``
        self.fail_every = fail_every  # > 0: every fail_every-th store job's copy fails
        self._stores = 0
        self.blocks_per_chunk = blocks_per_chunk
        self.track_data = track_data
        self.now = 0
        self._jobs: dict[int, list] = {}  # job id -> [due step or None, kind, gpu, chunks, offset]
        self._done: list[int] = []
        self._fail: set[int] = set()
        self.gpu: dict[int, Any] = {}
        self.cpu: dict[tuple[int, int], Any] = {}

    # --- the worker interface
    def submit_store(
        self, job_id: int, gpu_blocks: Sequence[int], chunk_ids: Sequence[int], offset: int = 0
    ) -> None:
        self._submit(job_id, "store", gpu_blocks, chunk_ids, offset)
        self._stores += 1
        if self.fail_every and self._stores % self.fail_every == 0:
            self._fail.add(job_id)

    def submit_load(
        self, job_id: int, chunk_ids: Sequence[int], gpu_blocks: Sequence[int], offset: int = 0
    ) -> None:
        self._submit(job_id, "load", gpu_blocks, chunk_ids, offset)

    def _submit(self, job_id, kind, gpu_blocks, chunk_ids, offset) -> None:
        if job_id in self._jobs:
            raise ValueError(f"job {job_id} submitted twice")
        gpu_blocks, chunk_ids = list(gpu_blocks), list(chunk_ids)
        if len(gpu_blocks) != len(chunk_ids) * self.blocks_per_chunk - offset:
            raise ValueError(
                f"job {job_id}: {len(gpu_blocks)} GPU blocks for {len(chunk_ids)} "
                f"chunks of {self.blocks_per_chunk} blocks at offset {offset}"
            )
        delay = self.load_delay if kind == "load" and self.load_delay is not None else self.delay
        due = None if delay is None else self.now + delay
        self._jobs[job_id] = [due, kind, gpu_blocks, chunk_ids, offset]

    def get_finished(self) -> list[TransferResult]:
        now = self.now
        due = [j for j, job in self._jobs.items() if job[0] is not None and job[0] <= now]
        out = []
        for job_id in sorted(set(self._done) | set(due)):
            if job_id in self._jobs:
                out.append(self._finish(job_id))
        self._done = []
        return out

    def wait(self, job_ids: Iterable[int]) -> None:
        for job_id in job_ids:
            if job_id in self._jobs:
                self._done.append(job_id)

    # --- test controls
    def advance(self) -> None:
        self.now += 1

    def release(self, job_ids: Iterable[int]) -> None:
        """Let these jobs complete at the next ``get_finished``."""
        self.wait(job_ids)

    def fail(self, job_id: int) -> None:
        """Make this job's copy fail: it is reported with ``success=False`` and copies nothing."""
        self._fail.add(job_id)

    def in_flight(self) -> list[int]:
        return sorted(self._jobs)

    def kind(self, job_id: int) -> str | None:
        job = self._jobs.get(job_id)
        return None if job is None else job[1]

    # --- data tags
    def write_gpu(self, block: int, tag: Any) -> None:
        if self.track_data:
            self.gpu[block] = tag

    def gpu_tag(self, block: int) -> Any:
        return self.gpu.get(block)

    def chunk_tags(self, chunk: int) -> list:
        return [self.cpu.get((chunk, j)) for j in range(self.blocks_per_chunk)]

    def _finish(self, job_id: int) -> TransferResult:
        _, kind, gpu_blocks, chunk_ids, offset = self._jobs.pop(job_id)
        ok = job_id not in self._fail
        self._fail.discard(job_id)
        if ok and self.track_data:
            slots = [(c, j) for c in chunk_ids for j in range(self.blocks_per_chunk)][offset:]
            for block, slot in zip(gpu_blocks, slots):
                if kind == "store":
                    self.cpu[slot] = self.gpu.get(block)
                else:
                    self.gpu[block] = self.cpu.get(slot)
        return TransferResult(job_id, ok, 0, 0.0)
