"""Checks around the scheduler driver, made from outside it: no cold admission, and data that
arrives where the manager says.

How it works and why: docs/internals.md, section properties/audit.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kvgate.impl.scheduler import Scheduler

from .offers import Handles, Offers

MAX_EXAMPLES = 100


def driver_hooks(manager: Any) -> dict[str, Any]:
    """What the driver takes beside the protocol calls, from an adapter (or the oracle, which
    has an adapter's face): contexts of the target's own type, key positions set through the
    adapter (which translates keys), stats already a metric-name dict, and ``touch`` only where
    the target has it."""
    return {
        "new_context": manager.new_context,
        "set_position": manager.set_position,
        "stats_dict": dict,
        "touch": "touch" not in manager.missing,
    }


class Audit:
    def __init__(
        self,
        manager: Any,
        worker: Any,
        threshold: int,
        blocks_per_chunk: int = 1,
        *,
        data: bool,
        offers: Offers | None = None,
    ):
        if data and not all(callable(getattr(worker, n, None)) for n in ("gpu_tag", "chunk_tags")):
            raise TypeError(
                f"the data checks need a worker with data tags (gpu_tag, chunk_tags); "
                f"{type(worker).__name__} has none"
            )
        self.threshold = threshold
        self.blocks_per_chunk = blocks_per_chunk
        self.data = data
        self.step = 0
        self.cold: list[tuple[int, bytes, int]] = []  # (step, key, distinct offerers), the first
        self.cold_admissions = 0
        self.data_errors: list[str] = []
        self._records = offers is None  # else the oracle records every offer, and resets
        self.offers = offers if offers is not None else Offers()
        self.handles = Handles()
        self._expected: dict[bytes, tuple] = {}  # key -> its blocks' tags
        self._stored: dict[bytes, int] = {}  # key -> chunk, store completed
        self._pending: dict[bytes, int] = {}  # key -> chunk, store in flight
        self._loads: dict[int, tuple[list[int], list, list[int]]] = {}
        self._tags = worker
        self._hooks = driver_hooks(manager)
        self.manager = _AuditedManager(self, manager)
        self.worker = _AuditedWorker(self, worker) if data else worker

    def driver(self, **settings: Any) -> Scheduler:
        """The scheduler driver over the audited manager and worker (``settings``: the
        ``Scheduler``'s own: block sizes, GPU blocks, running slots, budget, ``on_step``)."""
        return Scheduler(self.manager, self.worker, **self._hooks, **settings)

    def set_step(self, step: int) -> None:
        self.step = step

    def expect(self, request: Any) -> None:
        """Register the blocks of ``request`` (one the scheduler has added: its keys are set)."""
        if self.data:
            bpc = self.blocks_per_chunk
            for i, key in enumerate(request.keys):
                self._expected[key] = tuple(request.block_hashes[i * bpc : (i + 1) * bpc])

    def expected_tags(self, key: bytes) -> tuple:
        """The tags of the blocks ``key`` stands for (registered with ``expect``)."""
        return self._expected[key]

    def stored_data_errors(self) -> list[str]:
        """Every chunk whose store completed holds its key's blocks."""
        errors = []
        for key, chunk in self._stored.items():
            held = tuple(self._tags.chunk_tags(chunk))
            if held != self._expected.get(key, held):
                errors.append(f"chunk {chunk} of key {key.hex()} holds {held!r}")
        return errors

    # --- what the facets report
    def _offered(self, keys: Sequence[bytes], ctx: Any) -> None:
        # The audit reads only ``ever``: which keys the tracker held is not its business.
        if self._records:
            self.offers.offered(keys, self.handles.of(ctx), tracked_before=set())

    def _admitted(
        self, keys: Sequence[bytes], chunk_ids: Sequence[int], evicted: Iterable[bytes]
    ) -> None:
        for key in evicted:
            self._stored.pop(key, None)
        for key, chunk in zip(keys, chunk_ids):
            n = self.offers.ever(key)
            if n < self.threshold:
                self.cold_admissions += 1
                if len(self.cold) < MAX_EXAMPLES:
                    self.cold.append((self.step, key, n))
            if self.data:
                self._pending[key] = chunk

    def _completed(self, keys: Iterable[bytes], success: bool) -> None:
        for key in keys:
            chunk = self._pending.pop(key, None)
            if chunk is not None and success:
                self._stored[key] = chunk

    def _reset(self) -> None:
        if self._records:
            self.offers.reset()
        self._stored.clear()
        self._pending.clear()

    def _error(self, text: str) -> None:
        if len(self.data_errors) < MAX_EXAMPLES:
            self.data_errors.append(f"step {self.step}: {text}")

    def _load_prepared(self, keys: Sequence[bytes], chunk_ids: Sequence[int]) -> None:
        for key, chunk in zip(keys, chunk_ids):
            held = tuple(self._tags.chunk_tags(chunk))
            if key in self._expected and held != self._expected[key]:
                self._error(
                    f"chunk {chunk} of key {key.hex()} holds {held!r} when its load is prepared"
                )

    def _load_submitted(
        self, job_id: int, chunk_ids: Sequence[int], gpu_blocks: Sequence[int], offset: int
    ) -> None:
        tags = [t for c in chunk_ids for t in self._tags.chunk_tags(c)][offset:]
        self._loads[job_id] = (list(gpu_blocks), tags, list(chunk_ids))

    def _load_finished(self, job_id: int, success: bool) -> None:
        load = self._loads.pop(job_id, None)
        if load is None or not success:
            return
        blocks, tags, chunk_ids = load
        for block, tag in zip(blocks, tags):
            got = self._tags.gpu_tag(block)
            if got != tag:
                self._error(f"GPU block {block} loaded from chunk(s) {chunk_ids} holds {got!r}")
                return


class _Audited:
    """What it wraps, with every call it does not override passed through."""

    def __init__(self, audit: Audit, inner: Any):
        self._audit = audit
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _AuditedManager(_Audited):
    """The manager, with offers, admissions, completions, loads and resets reported."""

    def prepare_store(self, keys, ctx):
        keys = list(keys)
        self._audit._offered(keys, ctx)
        out = self._inner.prepare_store(keys, ctx)
        if out is not None:
            self._audit._admitted(out[0], out[1], out[2])
        return out

    def complete_store(self, keys, ctx=None, success: bool = True):
        keys = list(keys)
        self._inner.complete_store(keys, ctx, success=success)
        self._audit._completed(keys, success)

    def prepare_load(self, keys, ctx=None):
        keys = list(keys)
        ids = self._inner.prepare_load(keys, ctx)
        if self._audit.data:
            self._audit._load_prepared(keys, list(ids))
        return ids

    def on_request_finished(self, ctx) -> None:
        self._inner.on_request_finished(ctx)
        self._audit.handles.release(ctx)  # no more offers come for it

    def reset_cache(self) -> None:
        self._inner.reset_cache()
        self._audit._reset()


class _AuditedWorker(_Audited):
    """The worker, with load jobs checked when they complete."""

    def submit_load(self, job_id, chunk_ids, gpu_blocks, offset: int = 0):
        self._audit._load_submitted(job_id, chunk_ids, gpu_blocks, offset)
        return self._inner.submit_load(job_id, chunk_ids, gpu_blocks, offset)

    def get_finished(self):
        results = self._inner.get_finished()
        for result in results:
            self._audit._load_finished(result.job_id, result.success)
        return results
