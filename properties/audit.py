"""Checks around the scheduler driver, made from outside it: no cold admission, and data that
arrives where the manager says.

``Audit(manager, worker, threshold, blocks_per_chunk, data=True)`` wraps the manager the driver talks to (``audit.manager``)
and, when the worker carries data tags (``gpu_tag``, ``chunk_tags``: ``NullWorker(track_data=True)``
or ``TaggedCopyWorker``), the worker too (``audit.worker``); hand both to the ``Scheduler``.

- **Cold admissions.** Per key, the distinct (request, generation) pairs that offered it; an
  admission of a key that fewer than ``threshold`` of them had offered is cold. A reset starts
  every request's offers over, as SPEC A7 starts its counting over. A request is its context
  object (a new context with a reused ``req_id`` is a new request).
- **Data** (tags only). Every chunk a load reads holds its key's blocks when the load is
  prepared; every load job that completes has brought those blocks to its GPU blocks; every
  chunk whose store completed holds its key's blocks (``stored_data_errors()``). Register the
  blocks of each request with ``expect(request)`` after adding it to the scheduler.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

MAX_EXAMPLES = 100


class Audit:
    def __init__(self, manager: Any, worker: Any, threshold: int, blocks_per_chunk: int = 1,
                 data: bool = True):
        self.threshold = threshold
        self.blocks_per_chunk = blocks_per_chunk
        self.step = 0
        self.cold: list[tuple[int, bytes, int]] = []  # (step, key, distinct offerers), the first
        self.cold_admissions = 0
        self.data_errors: list[str] = []
        self._generation = 0
        self._offerers: dict[bytes, set[tuple[int, int]]] = {}
        self._handles: dict[int, tuple[Any, int]] = {}  # id(ctx) -> (ctx, handle)
        self._next_handle = 0
        self.data = data and callable(getattr(worker, "chunk_tags", None)) and callable(
            getattr(worker, "gpu_tag", None))
        self._expected: dict[bytes, tuple] = {}  # key -> its blocks' tags
        self._stored: dict[bytes, int] = {}  # key -> chunk, store completed
        self._pending: dict[bytes, int] = {}  # key -> chunk, store in flight
        self._loads: dict[int, tuple[list[int], list, list[int]]] = {}
        self._tags = worker
        self.manager = _AuditedManager(self, manager)
        self.worker = _AuditedWorker(self, worker) if self.data else worker

    def set_step(self, step: int) -> None:
        self.step = step

    def expect(self, request: Any) -> None:
        """Register the blocks of ``request`` (one the scheduler has added: its keys are set)."""
        if self.data:
            bpc = self.blocks_per_chunk
            for i, key in enumerate(request.keys):
                self._expected[key] = tuple(request.block_hashes[i * bpc:(i + 1) * bpc])

    def stored_data_errors(self) -> list[str]:
        """Every chunk whose store completed holds its key's blocks."""
        errors = []
        for key, chunk in self._stored.items():
            held = tuple(self._tags.chunk_tags(chunk))
            if held != self._expected.get(key, held):
                errors.append(f"chunk {chunk} of key {key.hex()} holds {held!r}")
        return errors

    # --- what the facets report
    def _handle(self, ctx: Any) -> int:
        entry = self._handles.get(id(ctx))
        if entry is None or entry[0] is not ctx:
            entry = (ctx, self._next_handle)
            self._next_handle += 1
            self._handles[id(ctx)] = entry
        return entry[1]

    def _offered(self, keys: Sequence[bytes], ctx: Any) -> None:
        who = (self._handle(ctx), self._generation)
        for key in keys:
            offerers = self._offerers.get(key)
            if offerers is None:
                self._offerers[key] = {who}
            else:
                offerers.add(who)

    def _admitted(self, keys: Sequence[bytes], chunk_ids: Sequence[int],
                  evicted: Iterable[bytes]) -> None:
        for key in evicted:
            self._stored.pop(key, None)
        for key, chunk in zip(keys, chunk_ids):
            n = len(self._offerers.get(key, ()))
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
        self._generation += 1
        self._stored.clear()
        self._pending.clear()

    def _error(self, text: str) -> None:
        if len(self.data_errors) < MAX_EXAMPLES:
            self.data_errors.append(f"step {self.step}: {text}")

    def _load_prepared(self, keys: Sequence[bytes], chunk_ids: Sequence[int]) -> None:
        for key, chunk in zip(keys, chunk_ids):
            held = tuple(self._tags.chunk_tags(chunk))
            if key in self._expected and held != self._expected[key]:
                self._error(f"chunk {chunk} of key {key.hex()} holds {held!r} when its load "
                            "is prepared")

    def _load_submitted(self, job_id: int, chunk_ids: Sequence[int], gpu_blocks: Sequence[int],
                        offset: int) -> None:
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

    @property
    def _manager(self) -> Any:
        return self._inner

    def prepare_store(self, keys, ctx):
        keys = list(keys)
        self._audit._offered(keys, ctx)
        out = self._manager.prepare_store(keys, ctx)
        if out is not None:
            self._audit._admitted(out[0], out[1], out[2])
        return out

    def complete_store(self, keys, ctx=None, success: bool = True):
        keys = list(keys)
        self._manager.complete_store(keys, ctx, success=success)
        self._audit._completed(keys, success)

    def prepare_load(self, keys, ctx=None):
        keys = list(keys)
        ids = self._manager.prepare_load(keys, ctx)
        if self._audit.data:
            self._audit._load_prepared(keys, list(ids))
        return ids

    def on_request_finished(self, ctx) -> None:
        self._manager.on_request_finished(ctx)
        self._audit._handles.pop(id(ctx), None)  # no more offers come for it

    def reset_cache(self) -> None:
        self._manager.reset_cache()
        self._audit._reset()


class _AuditedWorker(_Audited):
    """The worker, with load jobs checked when they complete."""

    @property
    def _worker(self) -> Any:
        return self._inner

    def submit_load(self, job_id, chunk_ids, gpu_blocks, offset: int = 0):
        self._audit._load_submitted(job_id, chunk_ids, gpu_blocks, offset)
        return self._worker.submit_load(job_id, chunk_ids, gpu_blocks, offset)

    def get_finished(self):
        results = self._worker.get_finished()
        for result in results:
            self._audit._load_finished(result.job_id, result.success)
        return results
