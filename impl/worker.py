"""The GPU-copy worker: moves KV-cache pages between GPU blocks and CPU chunks (spec §6).

How it works and why: docs/internals.md, section impl/worker.py.
"""

from __future__ import annotations

import collections
import dataclasses
import operator
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from .base import TransferResult

STORE = "store"
LOAD = "load"
KINDS = (STORE, LOAD)

_WORD_DTYPES = (torch.int64, torch.int32, torch.int16)  # the widest first
_SLICE_RUN = 4  # runs this long are copied as one slice; shorter ones row by row


@dataclasses.dataclass(eq=False)
class _Job:
    seq: int
    job_id: int
    kind: str
    gpu_blocks: list[int]
    slots: list[int]  # rows of the flat CPU view [num_chunks * blocks_per_chunk, page]
    nbytes: int
    success: bool | None = None
    seconds: float = 0.0
    start_event: Any = None
    end_event: Any = None
    keep: list = dataclasses.field(default_factory=list)  # tensors alive until done
    error: BaseException | None = None


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{what} must be an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{what} must be an int, got {value!r}") from None


def _as_int_list(values: Any, what: str) -> list[int]:
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{what} must be a sequence of ints, got {values!r}")
    return [_as_int(v, f"{what}[{i}]") for i, v in enumerate(values)]


def _first_repeat(values: list[int]) -> int | None:
    seen: set[int] = set()
    for v in values:
        if v in seen:
            return v
        seen.add(v)
    return None


def _long_runs(src: list[int], dst: list[int]) -> tuple[list[tuple[int, int]], list[int] | None]:
    """``(runs, rest)``: the maximal runs of at least ``_SLICE_RUN`` positions where both ids go
    up by one, as ``(first position, length)``, and the other positions (None: all of them)."""
    n = len(src)
    if n and src == list(range(src[0], src[0] + n)) and dst == list(range(dst[0], dst[0] + n)):
        return ([(0, n)] if n >= _SLICE_RUN else []), ([] if n >= _SLICE_RUN else None)
    edges = [
        0,
        *[
            i
            for i, (a, b, c, d) in enumerate(zip(src, src[1:], dst, dst[1:]), 1)
            if b - a != 1 or d - c != 1
        ],
        n,
    ]
    if len(edges) == n + 1:  # no two neighbours continue each other (scattered ids)
        return [], None
    runs: list[tuple[int, int]] = []
    rest: list[int] = []
    for p, q in zip(edges, edges[1:]):
        if q - p >= _SLICE_RUN:
            runs.append((p, q - p))
        else:
            rest.extend(range(p, q))
    return runs, rest


def _picker(ids: list[int]):
    """``rows -> (rows[i] for i in ids)`` as a tuple, at C speed (``itemgetter``)."""
    return operator.itemgetter(*ids) if len(ids) > 1 else (lambda rows: (rows[ids[0]],))


def _runs(rows: list[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of consecutive rows: ``(first position, first row, length)``."""
    runs: list[tuple[int, int, int]] = []
    for i, r in enumerate(rows):
        if runs and runs[-1][1] + runs[-1][2] == r:
            pos, row, n = runs[-1]
            runs[-1] = (pos, row, n + 1)
        else:
            runs.append((i, r, 1))
    return runs


def _word_view(*byte_views: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The same rows seen as the widest integer words that every view allows (faster copies)."""
    for dtype in _WORD_DTYPES:
        try:
            return tuple(v.view(dtype) for v in byte_views)
        except RuntimeError:
            continue
    return byte_views


class OffloadWorker:
    """Copies KV pages between GPU blocks and CPU chunks; see the module docstring."""

    def __init__(
        self,
        gpu_tensors: Sequence[torch.Tensor],
        num_chunks: int,
        blocks_per_chunk: int = 1,
        *,
        check_hazards: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ):
        if isinstance(gpu_tensors, torch.Tensor) or not isinstance(gpu_tensors, Sequence):
            raise ValueError("gpu_tensors must be a list with one tensor per layer")
        if not gpu_tensors:
            raise ValueError("gpu_tensors must hold at least one layer")
        num_chunks = _as_int(num_chunks, "num_chunks")
        if num_chunks < 0:
            raise ValueError(f"num_chunks must be >= 0, got {num_chunks}")
        blocks_per_chunk = _as_int(blocks_per_chunk, "blocks_per_chunk")
        if blocks_per_chunk < 1:
            raise ValueError(f"blocks_per_chunk must be >= 1, got {blocks_per_chunk}")
        for i, t in enumerate(gpu_tensors):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"gpu_tensors[{i}] is not a tensor: {type(t).__name__}")
            if t.dim() < 1:
                raise ValueError(f"gpu_tensors[{i}] needs a first dimension (blocks)")
        num_gpu_blocks = gpu_tensors[0].shape[0]
        device = gpu_tensors[0].device
        for i, t in enumerate(gpu_tensors):
            if t.shape[0] != num_gpu_blocks:
                raise ValueError(
                    f"gpu_tensors[{i}] has {t.shape[0]} blocks, layer 0 has {num_gpu_blocks}"
                )
            if t.device != device:
                raise ValueError(f"gpu_tensors[{i}] is on {t.device}, layer 0 on {device}")

        self.num_gpu_blocks = int(num_gpu_blocks)
        self.num_chunks = num_chunks
        self.blocks_per_chunk = blocks_per_chunk
        self.device = device
        self.is_cuda = device.type == "cuda"
        self.check_hazards = check_hazards
        self.clock = clock  # seconds, read before and after a CPU copy

        self.gpu_pages: list[torch.Tensor] = [
            self._byte_view(t, i) for i, t in enumerate(gpu_tensors)
        ]
        self.page_bytes: list[int] = [int(v.shape[1]) for v in self.gpu_pages]
        self.cpu_tensors: list[torch.Tensor] = [
            torch.zeros(
                (num_chunks, page * blocks_per_chunk), dtype=torch.uint8, pin_memory=self.is_cuda
            )
            for page in self.page_bytes
        ]
        # Copies run on word views of the flat rows: GPU [blocks, words], CPU [slots, words].
        self._gpu_words: list[torch.Tensor] = []
        self._cpu_words: list[torch.Tensor] = []
        for gpu, cpu, page in zip(self.gpu_pages, self.cpu_tensors, self.page_bytes):
            g, c = _word_view(gpu, cpu.view(num_chunks * blocks_per_chunk, page))
            self._gpu_words.append(g)
            self._cpu_words.append(c)
        # One view per row, made once: a scattered copy then costs a list lookup per row.
        self._gpu_rows = [g.unbind(0) for g in self._gpu_words]
        self._cpu_rows = [c.unbind(0) for c in self._cpu_words]
        self.bytes_per_block = sum(self.page_bytes)

        self._seq = 0
        self._used_ids: set[int] = set()
        self._queues: dict[str, collections.deque[_Job]] = {k: collections.deque() for k in KINDS}
        self._by_id: dict[int, _Job] = {}
        self._fail_budget: dict[str | None, int] = {STORE: 0, LOAD: 0, None: 0}
        # What unreported jobs touch: resource -> ids of the jobs touching it.
        self._slot_writers: dict[int, set[int]] = {}  # stores
        self._slot_readers: dict[int, set[int]] = {}  # loads
        self._block_writers: dict[int, set[int]] = {}  # loads
        self._block_readers: dict[int, set[int]] = {}  # stores
        self.last_error: BaseException | None = None  # why the last copy that raised failed
        self._streams: dict[str, Any] = {}
        if self.is_cuda:
            self._streams = {k: torch.cuda.Stream(device=device) for k in KINDS}

    # ------------------------------------------------------------------ layout

    def _byte_view(self, tensor: torch.Tensor, layer: int) -> torch.Tensor:
        """``tensor`` as ``uint8 [num_blocks, page_bytes]`` sharing its memory (page only)."""
        n = tensor.shape[0]
        if n == 0:
            raise ValueError(f"gpu_tensors[{layer}] has no blocks")
        block_numel = tensor[0].numel()
        if block_numel == 0:
            raise ValueError(f"gpu_tensors[{layer}] has empty pages")
        if not tensor[0].is_contiguous():
            raise ValueError(f"gpu_tensors[{layer}]: the data of one block is not contiguous")
        if n > 1 and tensor.stride(0) < block_numel:
            raise ValueError(
                f"gpu_tensors[{layer}]: blocks overlap (stride {tensor.stride(0)} "
                f"< page of {block_numel} elements)"
            )
        try:
            rows = tensor.view(n, block_numel) if tensor.dim() > 1 else tensor.view(n, 1)
            if rows.dtype != torch.uint8:
                rows = rows.view(torch.uint8)
        except RuntimeError as exc:
            raise ValueError(f"gpu_tensors[{layer}] cannot be seen as page bytes: {exc}") from exc
        return rows

    def _slot_rows(self, chunk_ids: list[int], offset: int, count: int) -> list[int]:
        """Flat CPU rows of the ``count`` sub-blocks that start at ``offset`` in ``chunk_ids``."""
        bpc = self.blocks_per_chunk
        return [chunk_ids[k // bpc] * bpc + k % bpc for k in range(offset, offset + count)]

    # ------------------------------------------------------------------ API

    def submit_store(
        self, job_id: int, gpu_blocks: Sequence[int], chunk_ids: Sequence[int], offset: int = 0
    ) -> None:
        """Copy ``gpu_blocks`` into sub-blocks of ``chunk_ids`` starting at ``offset``."""
        self._submit(STORE, job_id, gpu_blocks, chunk_ids, offset)

    def submit_load(
        self, job_id: int, chunk_ids: Sequence[int], gpu_blocks: Sequence[int], offset: int = 0
    ) -> None:
        """Copy sub-blocks of ``chunk_ids`` starting at ``offset`` into ``gpu_blocks``."""
        self._submit(LOAD, job_id, gpu_blocks, chunk_ids, offset)

    def fail_next(self, n: int = 1, kind: str | None = None) -> None:
        """Make the next ``n`` accepted jobs (of ``kind``, or any) fail without writing."""
        n = _as_int(n, "n")
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if kind not in (STORE, LOAD, None):
            raise ValueError(f"kind must be 'store', 'load' or None, got {kind!r}")
        self._fail_budget[kind] += n

    def pending_job_ids(self) -> list[int]:
        jobs = sorted((j for q in self._queues.values() for j in q), key=lambda j: j.seq)
        return [j.job_id for j in jobs]

    def get_finished(self) -> list[TransferResult]:
        """Done jobs, each once, in submission order per direction."""
        ready: list[_Job] = []
        for kind in KINDS:
            queue = self._queues[kind]
            while queue and self._is_done(queue[0]):
                ready.append(queue.popleft())
        ready.sort(key=lambda j: j.seq)
        results = []
        for job in ready:
            results.append(self._result(job))
            self._release(job)
        return results

    def wait(self, job_ids: Iterable[int]) -> None:
        """Block until the named jobs are done; unknown or reported ids are ignored."""
        for job_id in job_ids:
            try:
                job = self._by_id.get(job_id)
            except TypeError:  # unhashable: certainly not one of ours
                job = None
            if job is not None:
                self._wait_job(job)

    # ------------------------------------------------------------------ submission

    def _submit(self, kind: str, job_id: Any, gpu_blocks: Any, chunk_ids: Any, offset: Any) -> None:
        job_id, gpu_blocks, chunk_ids, offset = self._validate(
            kind, job_id, gpu_blocks, chunk_ids, offset
        )
        slots = self._slot_rows(chunk_ids, offset, len(gpu_blocks))
        if self.check_hazards:
            self._check_hazards(kind, gpu_blocks, slots)
        job = _Job(
            self._seq, job_id, kind, gpu_blocks, slots, len(gpu_blocks) * self.bytes_per_block
        )
        self._seq += 1
        self._register(job)
        if self._take_failure(kind):
            job.success = False
        else:
            self._launch(job)

    def _validate(
        self, kind: str, job_id: Any, gpu_blocks: Any, chunk_ids: Any, offset: Any
    ) -> tuple[int, list[int], list[int], int]:
        """Normalized arguments, or ``ValueError`` naming what is wrong. Touches nothing."""
        job_id = _as_int(job_id, "job_id")
        if job_id in self._used_ids:
            raise ValueError(f"job_id {job_id} was already used")
        offset = _as_int(offset, "offset")
        bpc = self.blocks_per_chunk
        if not 0 <= offset < bpc:
            raise ValueError(f"offset must be in [0, {bpc}), got {offset}")
        blocks = _as_int_list(gpu_blocks, "gpu_blocks")
        chunks = _as_int_list(chunk_ids, "chunk_ids")
        for i, b in enumerate(blocks):
            if not 0 <= b < self.num_gpu_blocks:
                raise ValueError(
                    f"gpu_blocks[{i}] = {b} is out of range [0, {self.num_gpu_blocks})"
                )
        for i, c in enumerate(chunks):
            if not 0 <= c < self.num_chunks:
                raise ValueError(f"chunk_ids[{i}] = {c} is out of range [0, {self.num_chunks})")
        if (dup := _first_repeat(blocks)) is not None:
            raise ValueError(f"gpu block {dup} is listed twice in gpu_blocks")
        if (dup := _first_repeat(chunks)) is not None:
            raise ValueError(f"chunk {dup} is listed twice in chunk_ids")
        need = -(-(offset + len(blocks)) // bpc) if blocks else 0
        if len(chunks) != need:
            raise ValueError(
                f"{kind} of {len(blocks)} gpu blocks at offset {offset} with "
                f"blocks_per_chunk={bpc} needs {need} chunk ids, got {len(chunks)}"
            )
        return job_id, blocks, chunks, offset

    def _check_hazards(self, kind: str, blocks: list[int], slots: list[int]) -> None:
        bpc = self.blocks_per_chunk

        def where(slot: int) -> str:
            return f"sub-block {slot % bpc} of chunk {slot // bpc}"

        def clash(table: dict[int, set[int]], keys: list[int]) -> tuple[int, int] | None:
            for key in keys:
                if table.get(key):
                    return key, min(table[key])
            return None

        if kind == STORE:
            checks = [
                (self._slot_writers, slots, where, "is being written by store job"),
                (self._slot_readers, slots, where, "is being read by load job"),
                (
                    self._block_writers,
                    blocks,
                    "gpu block {}".format,
                    "is being written by load job",
                ),
            ]
        else:
            checks = [
                (self._slot_writers, slots, where, "is being written by store job"),
                (self._block_readers, blocks, "gpu block {}".format, "is being read by store job"),
                (
                    self._block_writers,
                    blocks,
                    "gpu block {}".format,
                    "is being written by load job",
                ),
            ]
        for table, keys, name, verb in checks:
            if (hit := clash(table, keys)) is not None:
                raise ValueError(
                    f"{kind} refused: {name(hit[0])} {verb} {hit[1]}, which is not reported yet"
                )

    def _register(self, job: _Job) -> None:
        self._used_ids.add(job.job_id)
        self._by_id[job.job_id] = job
        self._queues[job.kind].append(job)
        for table, keys in self._touches(job):
            for key in keys:
                table.setdefault(key, set()).add(job.job_id)

    def _release(self, job: _Job) -> None:
        del self._by_id[job.job_id]
        for table, keys in self._touches(job):
            for key in keys:
                owners = table[key]
                owners.discard(job.job_id)
                if not owners:
                    del table[key]
        job.keep.clear()

    def _touches(self, job: _Job):
        if job.kind == STORE:
            return ((self._slot_writers, job.slots), (self._block_readers, job.gpu_blocks))
        return ((self._slot_readers, job.slots), (self._block_writers, job.gpu_blocks))

    def _take_failure(self, kind: str) -> bool:
        for key in (kind, None):
            if self._fail_budget[key] > 0:
                self._fail_budget[key] -= 1
                return True
        return False

    # ------------------------------------------------------------------ copying

    def _launch(self, job: _Job) -> None:
        """Start the copy of ``job``; a copy that raises makes the job fail."""
        try:
            if self.is_cuda:
                self._copy_cuda(job)
                job.success = True
            else:
                start = self.clock()
                self._copy_cpu(job)
                job.seconds = self.clock() - start
                job.success = True
        except Exception as exc:  # reported as success=False, never raised to the caller
            if self.is_cuda:  # copies enqueued before the error must end before we report
                try:
                    self._streams[job.kind].synchronize()
                except RuntimeError:
                    pass
            self._mark_failed(job, exc)

    def _is_done(self, job: _Job) -> bool:
        if job.end_event is None:
            return True
        try:
            return job.end_event.query()
        except RuntimeError as exc:
            self._mark_failed(job, exc)
            return True

    def _wait_job(self, job: _Job) -> None:
        if job.end_event is not None:
            try:
                job.end_event.synchronize()
            except RuntimeError as exc:
                self._mark_failed(job, exc)

    def _mark_failed(self, job: _Job, exc: BaseException) -> None:
        job.success, job.error = False, exc
        self.last_error = exc
        job.start_event = job.end_event = None

    def _result(self, job: _Job) -> TransferResult:
        if job.success and job.end_event is not None and job.start_event is not None:
            try:
                job.seconds = job.start_event.elapsed_time(job.end_event) / 1000.0
            except RuntimeError:
                pass
        ok = bool(job.success)
        return TransferResult(job.job_id, ok, job.nbytes if ok else 0, float(job.seconds))

    def _copy_cpu(self, job: _Job) -> None:
        """Synchronous copy, one ``_foreach_copy_`` over every layer: a run of at least
        ``_SLICE_RUN`` consecutive (block, sub-block) pairs is one slice, any other row is one of
        the row views made once in ``__init__`` (no index tensor, no staging pass)."""
        gpu = (job.gpu_blocks, self._gpu_words, self._gpu_rows)
        cpu = (job.slots, self._cpu_words, self._cpu_rows)
        (src_ids, srcs_w, srcs_r), (dst_ids, dsts_w, dsts_r) = (
            (gpu, cpu) if job.kind == STORE else (cpu, gpu)
        )
        srcs: list[torch.Tensor] = []
        dsts: list[torch.Tensor] = []
        runs, rest = _long_runs(src_ids, dst_ids)
        for pos, length in runs:
            s, d = src_ids[pos], dst_ids[pos]
            for src, dst in zip(srcs_w, dsts_w):
                srcs.append(src[s : s + length])
                dsts.append(dst[d : d + length])
        if rest is None:
            rest_src, rest_dst = src_ids, dst_ids
        else:
            rest_src, rest_dst = [src_ids[i] for i in rest], [dst_ids[i] for i in rest]
        if rest_src:
            pick_src, pick_dst = _picker(rest_src), _picker(rest_dst)
            for src_rows, dst_rows in zip(srcs_r, dsts_r):
                srcs.extend(pick_src(src_rows))
                dsts.extend(pick_dst(dst_rows))
        if srcs:
            torch._foreach_copy_(dsts, srcs)

    def _copy_cuda(self, job: _Job) -> None:
        n = len(job.gpu_blocks)
        stream = self._streams[job.kind]
        job.start_event = torch.cuda.Event(enable_timing=True)
        job.end_event = torch.cuda.Event(enable_timing=True)
        host_idx = torch.tensor(job.gpu_blocks, dtype=torch.long).pin_memory()
        job.keep.append(host_idx)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            job.start_event.record(stream)
            if n:
                block_idx = host_idx.to(self.device, non_blocking=True)
                job.keep.append(block_idx)
                runs = _runs(job.slots)
                for gpu, cpu in zip(self._gpu_words, self._cpu_words):
                    if job.kind == STORE:
                        staged = gpu.index_select(0, block_idx)
                        for pos, row, length in runs:
                            cpu[row : row + length].copy_(
                                staged[pos : pos + length], non_blocking=True
                            )
                    else:
                        staged = torch.empty((n, gpu.shape[1]), dtype=gpu.dtype, device=self.device)
                        for pos, row, length in runs:
                            staged[pos : pos + length].copy_(
                                cpu[row : row + length], non_blocking=True
                            )
                        gpu.index_copy_(0, block_idx, staged)
                    job.keep.append(staged)
            job.end_event.record(stream)


__all__ = ["KINDS", "LOAD", "STORE", "OffloadWorker", "TransferResult"]
