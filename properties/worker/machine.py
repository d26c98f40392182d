"""A state machine that drives one copy worker alone against a byte model (spec §6).

How it works and why: docs/internals.md, section properties/worker/machine.py.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import torch
from hypothesis import note as _hypothesis_note
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvgate.impl.worker import LOAD, STORE, OffloadWorker, TransferResult

from ..catalogue import workers as bad_workers
from ..search.coverage import Recorded
from . import defects as worker_defects
from .byte_model import ByteModel
from .defects import CTOR_ACCEPTED, CTOR_DEFECTS, DEFECTS, refused
from .layouts import LayerSpec, WorkerLayout, worker_layouts

PICKS = st.lists(st.integers(0, 63), max_size=4)
PICK = st.integers(0, 63)
RUN = st.one_of(st.just(0), st.integers(2, 9))  # a stretch of consecutive blocks (_choose)
_COPY_ROUTINES = ("_copy_cpu", "_copy_cuda")  # what copy_raises replaces on the instance
# How an accepted transfer passes its ids: a list, a tuple (then, at offset 0, without the
# offset argument: its default is 0), or a 1-d int64 tensor (as vLLM holds block ids).
ID_FORMS = ("list", "tuple", "tensor")
# What a store and a load submission each draw (``_submit``'s arguments).
_SUBMIT = rule(
    picks=PICKS,
    chunk_pick=PICK,
    offset_pick=st.integers(0, 7),
    run=RUN,
    form=st.sampled_from(ID_FORMS),
)


def note(text: str) -> None:
    """Hypothesis's ``note`` inside a test; outside one (a counterexample replayed by hand),
    a print."""
    if currently_in_test_context():
        _hypothesis_note(text)
    else:
        print(text)


class _Pending(NamedTuple):
    kind: str
    blocks: tuple[int, ...]
    slots: tuple[int, ...]
    effects: tuple[tuple[int, int], ...]  # (destination, label): slot for a store, block for a load
    fails: bool
    raises: bool = False  # the machine made this job's copy raise (copy_raises)
    call_seconds: float = math.inf  # how long submit_* took (bounds a synchronous CPU copy)


def _dedup(values):
    out = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _longest_run(blocks, slots) -> int:
    """The longest stretch of positions where the source and the destination ids (GPU block
    and flat sub-block) both go up by one."""
    best = cur = 1 if blocks else 0
    for i in range(1, len(blocks)):
        cur = cur + 1 if blocks[i] - blocks[i - 1] == 1 and slots[i] - slots[i - 1] == 1 else 1
        best = max(best, cur)
    return best


def _mixed(blocks, slots) -> bool:
    """A transfer with a run of at least 4 positions where both ids go up by one and also
    positions outside it (what _copy_cpu splits into slices and single rows)."""
    return 4 <= _longest_run(blocks, slots) < len(blocks)


def _stepped(src, dst) -> bool:
    """Four positions in a row where the source id goes up by one and the destination id by
    two (a load of sub-blocks in a row into every other GPU block): no run to slice."""
    steps = [(b - a, d - c) for a, b, c, d in zip(src, src[1:], dst, dst[1:])]
    return any(steps[i : i + 3] == [(1, 2)] * 3 for i in range(len(steps) - 2))


def _submitted(kind: str, fact: Callable[[dict], bool] = lambda e: True):
    return lambda e: e["rule"] == f"submit_{kind}" and fact(e)


# Coverage labels: predicates over the recorded history (properties/search/coverage.py).
LABELS = {
    **{f"{k} submitted": _submitted(k) for k in (STORE, LOAD)},
    **{f"{k} with offset": _submitted(k, lambda e: e["offset"] > 0) for k in (STORE, LOAD)},
    **{f"{k} over several chunks": _submitted(k, lambda e: e["chunks"] > 1) for k in (STORE, LOAD)},
    "empty transfer": lambda e: e["rule"].startswith("submit_") and e["blocks"] == 0,
    "long run in a transfer": lambda e: e["rule"].startswith("submit_") and e["run"] >= 4,
    "long run among scattered ids": lambda e: e["rule"].startswith("submit_") and e["mixed"],
    "ids as a tensor": lambda e: e["rule"].startswith("submit_") and e["form"] == "tensor",
    "default offset": lambda e: (
        e["rule"].startswith("submit_") and e["form"] == "tuple" and e["offset"] == 0
    ),
    "whole transfer one run": lambda e: (
        e["rule"].startswith("submit_") and e["run"] == e["blocks"] >= 4
    ),
    "copy whose source runs while the destination steps by two": lambda e: (
        e["rule"].startswith("submit_") and e["stepped"]
    ),
    "copy raised, reported": lambda e: e.get("reported") is not None and e.get("raised"),
    "wait": lambda e: e["rule"] == "wait_then_get_finished" and e.get("waited", 0) > 0,
    "failed job reported": lambda e: e.get("reported") is not None and e["failed"],
    **{
        f"{k} reported": (lambda e, k=k: e.get("reported") == k and not e["failed"])
        for k in (STORE, LOAD)
    },
    **{
        f"refused: {d}": (lambda e, d=d: e["rule"] == "invalid_transfer" and e["defect"] == d)
        for d in DEFECTS
    },
    **{
        f"construction: {d}": (lambda e, d=d: e["rule"] == "construction" and e["case"] == d)
        for d in CTOR_DEFECTS + CTOR_ACCEPTED
    },
    **{
        f"failures queued: {k or 'either direction'}": (
            lambda e, k=k: e["rule"] == "fail_next" and e["n"] > 0 and e["kind"] == k
        )
        for k in (None, STORE, LOAD)
    },
    "failures queued: none (n=0)": lambda e: e["rule"] == "fail_next" and e["n"] == 0,
    **{
        f"fail_next refused: {d}": (lambda e, d=d: e["rule"] == "bad_fail_next" and e["arg"] == d)
        for d in ("n", "kind")
    },
}


class TickClock:
    """A clock that advances one millisecond at each reading: the clock the machine gives each
    worker it builds, so the seconds it reports, and the checks on them, are the same in every
    replay of an example (a wall clock made a bad worker's failure change between the run and
    its replay: Hypothesis's "inconsistent results")."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1e-3
        return self.now


class WorkerMachine(Recorded, RuleBasedStateMachine):
    """Drives ``worker_factory`` alone; see the module docstring."""

    worker_factory: Callable[..., Any] = OffloadWorker
    LABELS = LABELS

    def __init__(self):
        super().__init__()
        self.worker = None
        self.history: list[dict] = []
        self.clock = TickClock()

    def _build(self, *args) -> Any:
        """A worker from the factory, on the machine's clock."""
        return self.worker_factory(*args, clock=self.clock.perf_counter)

    def teardown(self):
        """The example's last jobs are collected and checked too (else a wrong copy in the
        last job after the final get_finished would go unseen)."""
        self.count_labels()
        if sys.exc_info()[0] is not None:  # a step failed: let its error stand
            return
        if self.worker is not None and self.pending:
            self.worker.wait(list(self.pending))
            self._collect(self.worker.get_finished(), "teardown")
            self.bytes_match_model()

    # ------------------------------------------------------------------ set-up

    @initialize(layout=worker_layouts())
    def init_worker(self, layout: WorkerLayout) -> None:
        self.layout = layout
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.n_blocks, self.n_chunks = layout.num_gpu_blocks, layout.num_chunks
        self.bpc = layout.blocks_per_chunk
        self.n_slots = self.n_chunks * self.bpc
        self.bytes = ByteModel(layout, self.device)
        self.worker = self._build(self.bytes.tensors, self.n_chunks, self.bpc)
        assert getattr(self.worker, "last_error", None) is None, (
            f"a new worker's last_error is {self.worker.last_error!r}: no copy has raised yet"
        )
        self.pending: dict[int, _Pending] = {}
        self.order: dict[str, list[int]] = {STORE: [], LOAD: []}
        self.used_ids: list[int] = []
        self.next_job = 0
        self.fail_budget: dict[str | None, int] = {STORE: 0, LOAD: 0, None: 0}
        self.raise_next = False
        self.raised: BaseException | None = None

    # ------------------------------------------------------------------ jobs

    def slots_of(self, chunks, offset, count) -> list[int]:
        bpc = self.bpc
        return [chunks[k // bpc] * bpc + k % bpc for k in range(offset, offset + count)]

    def touched(self):
        """(GPU blocks read, GPU blocks written, slots read, slots written) by unreported jobs."""
        b_read, b_written, s_read, s_written = set(), set(), set(), set()
        for job in self.pending.values():
            if job.kind == STORE:
                b_read.update(job.blocks)
                s_written.update(job.slots)
            else:
                b_written.update(job.blocks)
                s_read.update(job.slots)
        return b_read, b_written, s_read, s_written

    def choose(
        self,
        kind,
        picks,
        chunk_pick,
        offset_pick,
        run=0,
        stretch_pick=None,
        pattern="run",
        chunk_mode=None,
    ):
        """A transfer the worker must accept (no clash with unreported jobs), or None. With
        ``run > 0`` the transfer holds a stretch of up to ``run`` consecutive free blocks
        (inserted among the picked ones at position ``len(picks) // 2``) and its chunks, by
        ``chunk_pick // len(usable chunks) % 3``: go up from the lowest without a turn (the
        sub-blocks advance with the stretch), go up from ``chunk_pick`` and wrap round once (a
        run of both ids that breaks where the chunks wrap, among scattered positions), or go
        down (sub-blocks that advance only inside a chunk while the blocks run on)."""
        b_read, b_written, s_read, s_written = self.touched()
        bpc = self.bpc
        if kind == STORE:
            blocks_ok = [b for b in range(self.n_blocks) if b not in b_written]
            busy = s_read | s_written
        else:
            blocks_ok = [b for b in range(self.n_blocks) if b not in b_read | b_written]
            busy = s_written
        chunks_ok = [
            c for c in range(self.n_chunks) if not any(c * bpc + j in busy for j in range(bpc))
        ]
        if not blocks_ok or not chunks_ok:
            return None
        offset = offset_pick % bpc
        picked = [blocks_ok[p % len(blocks_ok)] for p in picks]
        if run:
            first = blocks_ok[
                (chunk_pick if stretch_pick is None else stretch_pick) % len(blocks_ok)
            ]
            # run: f, f+1, f+2, ...; every_other: f, f+2, f+4, ...; interleaved: two runs
            # woven together, f, f+3, f+1, f+4, f+2, ... (each id goes up by one every
            # second position). The stretch stops at the first block that is not free.
            if pattern == "interleaved":
                seq = [first + j // 2 + (3 if j % 2 else 0) for j in range(run)]
            else:
                seq = [first + j * (2 if pattern == "every_other" else 1) for j in range(run)]
            free, stretch = set(blocks_ok), []
            for b in seq:
                if b not in free:
                    break
                stretch.append(b)
            picked = [b for b in picked if b not in stretch]
            half = len(picked) // 2
            picked = picked[:half] + stretch + picked[half:]
        blocks = _dedup(picked)
        blocks = blocks[: len(chunks_ok) * bpc - offset]
        need = math.ceil((offset + len(blocks)) / bpc) if blocks else 0
        start = chunk_pick % len(chunks_ok)
        order = chunks_ok[start:] + chunks_ok[:start]
        lap = chunk_pick // len(chunks_ok) if chunk_mode is None else chunk_mode
        if run and lap % 3 == 0:
            order = sorted(order)
        elif (run and lap % 3 == 2) or (not run and lap % 2):
            order.reverse()
        chunks = order[:need]
        return blocks, chunks, offset

    # ------------------------------------------------------------------ rules

    def _submit(self, kind, chosen, form="list") -> None:
        """Submit the transfer ``choose`` picked (``chosen``), if it picked one."""
        if chosen is None:
            note(f"no {kind} possible now")
            return
        blocks, chunks, offset = chosen
        job_id = self.next_job
        budget: str | None | Literal[False] = next(
            (k for k in (kind, None) if self.fail_budget[k] > 0), False
        )
        fails = budget is not False  # the direction's own failures go first, then either's
        raises = self.raise_next and not fails
        note(
            f"job {job_id}: {kind} gpu_blocks={blocks} chunk_ids={chunks} offset={offset}"
            + (f" (ids as a {form})" if form != "list" else "")
            + (" (injected failure)" if fails else "")
            + (" (its copy raises)" if raises else "")
        )
        ids: tuple[torch.Tensor | Sequence[int], torch.Tensor | Sequence[int]]
        if form == "tensor":
            ids = (torch.tensor(blocks, dtype=torch.int64), torch.tensor(chunks, dtype=torch.int64))
        else:
            ids = (list(blocks), list(chunks)) if form == "list" else (tuple(blocks), tuple(chunks))
        extra = () if form == "tuple" and offset == 0 else (offset,)  # default offset is 0
        start = self.clock.perf_counter()
        if kind == STORE:
            self.worker.submit_store(job_id, ids[0], ids[1], *extra)
        else:
            self.worker.submit_load(job_id, ids[1], ids[0], *extra)
        call_seconds = self.clock.perf_counter() - start
        if raises:
            self.raise_next = False
            assert self.worker.last_error is self.raised, (
                f"job {job_id}: its copy raised {self.raised!r}, but last_error is "
                f"{self.worker.last_error!r}"
            )
            self._unbreak()
        self.next_job += 1
        self.used_ids.append(job_id)
        if fails:
            assert budget is not False  # fails says so
            self.fail_budget[budget] -= 1
        slots = self.slots_of(chunks, offset, len(blocks))
        if kind == STORE:
            effects = tuple((s, self.bytes.gpu_label[b]) for b, s in zip(blocks, slots))
        else:
            effects = tuple((b, self.bytes.slot_label[s]) for b, s in zip(blocks, slots))
        self.pending[job_id] = _Pending(
            kind, tuple(blocks), tuple(slots), effects, fails or raises, raises, call_seconds
        )
        self.order[kind].append(job_id)
        self.record(
            f"submit_{kind}",
            offset=offset,
            chunks=len(chunks),
            blocks=len(blocks),
            run=_longest_run(blocks, slots),
            raises=raises,
            form=form,
            mixed=_mixed(blocks, slots),
            stepped=not (fails or raises)
            and _stepped(*((blocks, slots) if kind == STORE else (slots, blocks))),
        )

    @_SUBMIT
    def submit_store(self, picks, chunk_pick, offset_pick, run, form):
        self._submit(STORE, self.choose(STORE, picks, chunk_pick, offset_pick, run), form)

    @_SUBMIT
    def submit_load(self, picks, chunk_pick, offset_pick, run, form):
        self._submit(LOAD, self.choose(LOAD, picks, chunk_pick, offset_pick, run), form)

    @rule(
        kind=st.sampled_from([STORE, LOAD]),
        run=st.integers(4, 8),
        picks=st.lists(PICK, min_size=1, max_size=2),
        stretch_pick=st.integers(0, 2),
        chunk_pick=PICK,
        offset_pick=st.integers(0, 7),
        pattern=st.sampled_from(["run", "every_other", "interleaved"]),
        chunk_mode=st.sampled_from([0, 0, 1, 2]),
    )
    def submit_mixed(
        self, kind, run, picks, stretch_pick, chunk_pick, offset_pick, pattern, chunk_mode
    ):
        """A transfer that holds a stretch of 4 or more consecutive blocks among scattered ones
        (the CPU path copies the stretch as one slice where the sub-blocks advance with it, and
        the other positions row by row; _choose says how the chunks are ordered). The stretch
        may also step by two or weave two runs together: ids that a wrong run test would take
        for a run. A stretch that steps by two goes with chunks in rising order, so its
        sub-blocks run beside it (the GPU ids step by two where the CPU ids go up by one)."""
        if pattern == "every_other":
            chunk_mode = 0
        chosen = self.choose(
            kind, picks, chunk_pick, offset_pick, run, stretch_pick, pattern, chunk_mode
        )
        self._submit(kind, chosen)

    @rule()
    def copy_raises(self):
        """The next accepted copy raises (spec §6: reported ``success=False``, the
        exception kept in ``last_error``). The machine replaces the worker's copy routines on
        the instance (as tests/test_worker.py does); the stand-in raises before any byte moves,
        so nothing may move. A worker without them (a foreign factory) is left alone."""
        if self.raise_next or not all(hasattr(self.worker, n) for n in _COPY_ROUTINES):
            return
        self.raised = RuntimeError(f"copy engine on fire (job {self.next_job} or later)")

        def broken(job, _exc=self.raised):
            raise _exc

        for name in _COPY_ROUTINES:
            setattr(self.worker, name, broken)
        self.raise_next = True

    def _unbreak(self) -> None:
        for name in _COPY_ROUTINES:
            self.worker.__dict__.pop(name, None)

    @rule(pick=PICK)
    def write_gpu_block(self, pick):
        """The model computes new KV data into a block that no unreported job touches."""
        b_read, b_written, _, _ = self.touched()
        free = [b for b in range(self.n_blocks) if b not in b_read | b_written]
        if not free:
            return
        block = free[pick % len(free)]
        label = self.bytes.write_gpu(block)
        note(f"gpu block {block} rewritten (label {label})")

    @rule(n=st.sampled_from([1, 1, 2, 0]), kind=st.sampled_from([None, None, STORE, LOAD]))
    def fail_next_job(self, n, kind):
        """``fail_next(n, kind)``: the next ``n`` accepted jobs of ``kind`` (None: either
        direction) fail; a job takes its own direction's failures before those of either.
        Called with the defaults (``n=1``, ``kind=None``) where they apply."""
        if sum(self.fail_budget.values()) + n > 3:  # at most three failures queued
            return
        if n == 1 and kind is None:
            self.worker.fail_next()
        elif n == 1:
            self.worker.fail_next(kind=kind)
        else:
            self.worker.fail_next(n, kind)
        note(f"fail_next({n}, {kind!r})")
        self.fail_budget[kind] += n
        self.record("fail_next", n=n, kind=kind)

    @rule(pick=st.integers(0, 7))
    def bad_fail_next(self, pick):
        """``fail_next`` with a bad ``n`` or ``kind`` is refused with ValueError naming it
        and queues nothing (the next jobs' ``success`` shows it)."""
        n, kind = 1, None
        if pick < 5:
            n = ("1", 1.5, True, -1, -2)[pick]
            arg, names = "n", ("n", repr(n))
        else:
            kind = ("both", "STORE", 0)[pick - 5]
            arg, names = "kind", ("kind", repr(kind))
        with refused(f"fail_next({n!r}, {kind!r})", names):
            self.worker.fail_next(n, kind)
        self.record("bad_fail_next", arg=arg)

    @rule()
    def get_finished(self):
        self._collect(self.worker.get_finished(), "get_finished")

    @rule(picks=PICKS, everything=st.booleans(), strangers=st.booleans())
    def wait_then_get_finished(self, picks, everything, strangers):
        pending = [j for j in self.used_ids if j in self.pending]
        waited = (
            list(pending)
            if everything
            else (_dedup(pending[p % len(pending)] for p in picks) if pending else [])
        )
        asked = waited + ([self.next_job + 1000] + self.used_ids[:1] if strangers else [])
        note(f"wait({asked})")
        self.worker.wait(asked)
        self._collect(self.worker.get_finished(), "wait_then_get_finished")
        left = [j for j in waited if j in self.pending]
        assert not left, f"jobs {left} were waited for but get_finished did not report them"
        self.record("wait_then_get_finished", waited=len(waited))

    def _collect(self, results, rule: str) -> None:
        assert isinstance(results, list), f"get_finished returned {type(results).__name__}"
        for r in results:
            assert isinstance(r, TransferResult), f"not a TransferResult: {r!r}"
            assert r.job_id in self.pending, (
                f"{r!r} reports job {r.job_id}, which is not pending "
                "(never submitted, refused, or reported before)"
            )
            job = self.pending[r.job_id]
            oldest = self.order[job.kind][0]
            assert r.job_id == oldest, (
                f"{job.kind} job {r.job_id} reported before the earlier {job.kind} job {oldest}"
            )
            assert r.success is (not job.fails), (
                f"job {r.job_id}: success={r.success!r}, expected {not job.fails}"
            )
            expected_bytes = 0 if job.fails else len(job.blocks) * self.bytes.bytes_per_block
            assert r.bytes == expected_bytes, (
                f"job {r.job_id}: bytes={r.bytes}, expected {expected_bytes}"
            )
            assert isinstance(r.seconds, float) and 0.0 <= r.seconds < math.inf, (
                f"job {r.job_id}: seconds={r.seconds!r}"
            )
            if job.fails and not job.raises:
                assert r.seconds == 0.0, (
                    f"job {r.job_id}: an injected failure reports seconds={r.seconds!r}, not 0.0"
                )
            if job.blocks and not job.fails:
                assert r.seconds > 0.0, (
                    f"job {r.job_id}: copied {r.bytes} bytes in seconds={r.seconds!r}"
                )
            if self.device.type == "cpu":  # the copy ran inside submit_*: it took no longer
                assert r.seconds <= job.call_seconds, (
                    f"job {r.job_id}: seconds={r.seconds!r}, but its submit_* call (where the "
                    f"CPU copy runs) took {job.call_seconds!r} s"
                )
            self.order[job.kind].pop(0)
            del self.pending[r.job_id]
            self.record(rule, reported=job.kind, failed=job.fails, raised=job.raises)
            if job.fails:
                continue
            apply = self.bytes.set_slot_label if job.kind == STORE else self.bytes.set_gpu_label
            for dest, label in job.effects:
                apply(dest, label)
        if self.device.type == "cpu":
            assert not self.pending, (
                f"jobs {sorted(self.pending)} are not reported, but CPU copies are synchronous"
            )

    @rule(
        kind=st.sampled_from([STORE, LOAD]),
        defect=st.sampled_from(DEFECTS),
        picks=PICKS,
        chunk_pick=PICK,
        offset_pick=st.integers(0, 7),
    )
    def invalid_transfer(self, kind, defect, picks, chunk_pick, offset_pick):
        """A transfer with one defect is refused with ValueError before any byte moves."""
        job_id, blocks, chunks, offset, defect, names = worker_defects.invalid_transfer(
            self, kind, defect, picks, chunk_pick, offset_pick
        )
        note(
            f"invalid {kind} ({defect}): job_id={job_id!r} gpu_blocks={blocks!r} "
            f"chunk_ids={chunks!r} offset={offset!r}"
        )
        self.worker.wait(list(self.pending))  # nothing may be in flight while we compare
        before = self.bytes.snapshot(self.worker.cpu_tensors)
        with refused(f"invalid {kind} ({defect})", names):
            if kind == STORE:
                self.worker.submit_store(job_id, blocks, chunks, offset)
            else:
                self.worker.submit_load(job_id, chunks, blocks, offset)
        after = self.bytes.snapshot(self.worker.cpu_tensors)
        for (where, a), (_, b) in zip(before, after):
            assert torch.equal(a, b), f"refused {kind} ({defect}) changed bytes of {where}"
        self.record("invalid_transfer", defect=defect)

    @rule(case=st.sampled_from(CTOR_DEFECTS + CTOR_ACCEPTED), pick=PICK)
    def construction(self, case, pick):
        """A second worker built from this layout with one defect is refused with ValueError
        naming the argument; ``zero_chunks`` (``num_chunks=0``) and a one-element-page layer
        seen as a 1-d tensor, built without ``blocks_per_chunk`` (default 1), are accepted."""
        case, args, tensors, names, i, stride = worker_defects.construction(self, case, pick)
        note(f"construction ({case}): layer {i}")
        if case in CTOR_ACCEPTED:
            worker = self._build(*args)
            bpc = 1 if len(args) == 2 else self.bpc
            pages = [t[0].numel() * t.element_size() for t in tensors]
            assert worker.page_bytes == pages, (case, worker.page_bytes, pages)
            shapes = [tuple(c.shape) for c in worker.cpu_tensors]
            assert shapes == [(args[1], p * bpc) for p in pages], (case, shapes)
            n = tensors[0].shape[0]
            assert [tuple(g.shape) for g in worker.gpu_pages] == [(n, p) for p in pages], case
            worker.submit_store(0, [], [])
            assert [(r.job_id, r.success, r.bytes) for r in worker.get_finished()] == [
                (0, True, 0)
            ], case
        else:
            with refused(f"construction ({case})", names):
                self._build(*args)
            if case == "blocks_overlap":  # and the smallest such layer: two blocks, alone
                two = tensors[i].new_zeros(stride + 3).as_strided((2, 3), (stride, 1))
                with refused(
                    "construction (blocks_overlap, two blocks)",
                    ("gpu_tensors[0]", "overlap", f"stride {stride}"),
                ):
                    self._build([two], self.n_chunks, self.bpc)
        self.record("construction", case=case)

    @invariant()
    def pending_ids_in_submission_order(self):
        if self.worker is None:
            return
        expected = [j for j in self.used_ids if j in self.pending]
        actual = self.worker.pending_job_ids()
        assert actual == expected, f"pending_job_ids() = {actual}, expected {expected}"

    # ------------------------------------------------------------------ invariant

    @invariant()
    def bytes_match_model(self):
        _, b_written, _, s_written = self.touched()
        self.bytes.check(self.worker.cpu_tensors, b_written, s_written)


def make_machine(target: Callable[..., Any], name: str | None = None) -> type[WorkerMachine]:
    """The worker machine for the worker factory ``target(gpu_tensors, num_chunks,
    blocks_per_chunk=1, *, clock)``, named ``<factory>Machine`` unless ``name`` says."""
    factory = target
    name = name or f"{getattr(factory, '__name__', 'Worker')}Machine"
    cls = type(
        name, (WorkerMachine,), {"worker_factory": staticmethod(factory), "__module__": __name__}
    )
    cls.__qualname__ = name
    return cls


OffloadWorkerMachine = make_machine(OffloadWorker)
OffByOneOffsetMachine = make_machine(bad_workers.OffByOneOffset)
CopiesPaddedPageMachine = make_machine(bad_workers.CopiesPaddedPage)
ReportsBeforeCopyMachine = make_machine(bad_workers.ReportsBeforeCopy)
ReportsOutOfOrderMachine = make_machine(bad_workers.ReportsOutOfOrder)
WritesBeforeValidatingMachine = make_machine(bad_workers.WritesBeforeValidating)
FailsEitherDirectionMachine = make_machine(bad_workers.FailsEitherDirection)
BAD_MACHINES = {
    cls.__name__: globals()[f"{cls.__name__}Machine"] for cls in bad_workers.BAD_WORKERS
}  # worker name -> its machine

__all__ = [
    "BAD_MACHINES",
    "LABELS",
    "LayerSpec",
    "WorkerLayout",
    "WorkerMachine",
    "make_machine",
    "OffloadWorkerMachine",
    *(m.__name__ for m in BAD_MACHINES.values()),
]
