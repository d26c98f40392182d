"""Known-bad copy workers: each overrides one step of ``impl.worker.OffloadWorker``.

Every one of them must make ``properties.worker.machine`` fail (tests/test_worker.py checks
that it does, under the ci profile, with a shrunk counterexample). A check that none of them
trips is a check that cannot fail.
"""

from __future__ import annotations

import torch

from kvgate.impl.worker import OffloadWorker


class OffByOneOffset(OffloadWorker):
    """Reads the sub-block offset as 1-based: a range that starts inside a chunk lands one
    sub-block early (offset 0 still works, so only suffix / unaligned transfers show it)."""

    def _slot_rows(self, chunk_ids, offset, count):
        return super()._slot_rows(chunk_ids, max(offset - 1, 0), count)


class CopiesPaddedPage(OffloadWorker):
    """Sizes a layer's page by the tensor's block stride, so it copies a padded page with its
    padding (and its CPU chunks are that much too large)."""

    def _byte_view(self, tensor, layer):
        page = super()._byte_view(tensor, layer)
        stride_bytes = tensor.stride(0) * tensor.element_size()
        return torch.as_strided(page, (page.shape[0], stride_bytes), (stride_bytes, 1))


class ReportsBeforeCopy(OffloadWorker):
    """Reports each job done as soon as it is submitted and runs its copy only when the next
    job is submitted (the last job's copy never runs)."""

    _deferred = None

    def _launch(self, job):
        previous, self._deferred = self._deferred, job
        if previous is not None:
            super()._launch(previous)
        job.success = True


class ReportsOutOfOrder(OffloadWorker):
    """Hands out the finished jobs of one call newest first."""

    def get_finished(self):
        return list(reversed(super().get_finished()))


class WritesBeforeValidating(OffloadWorker):
    """Copies the first block of a transfer before it checks the arguments, so a refused
    transfer has already written one page."""

    def _submit(self, kind, job_id, gpu_blocks, chunk_ids, offset):
        try:
            first = self._slot_rows(list(chunk_ids)[:1], offset, 1)[0]
            block = list(gpu_blocks)[0]
            for gpu, cpu in zip(self._gpu_words, self._cpu_words):
                if kind == "store":
                    cpu[first].copy_(gpu[block])
                else:
                    gpu[block].copy_(cpu[first])
        except (IndexError, TypeError, RuntimeError):
            pass
        super()._submit(kind, job_id, gpu_blocks, chunk_ids, offset)


class FailsEitherDirection(OffloadWorker):
    """Queues every injected failure for either direction: ``fail_next(kind="load")`` fails
    the next job, even a store (checks its arguments as the worker does)."""

    def fail_next(self, n=1, kind=None):
        super().fail_next(n, kind)
        self._fail_budget[kind] -= n
        self._fail_budget[None] += n


BAD_WORKERS = (
    OffByOneOffset,
    CopiesPaddedPage,
    ReportsBeforeCopy,
    ReportsOutOfOrder,
    WritesBeforeValidating,
    FailsEitherDirection,
)

__all__ = [cls.__name__ for cls in BAD_WORKERS] + ["BAD_WORKERS"]
