"""The GPU-copy worker (spec §6): examples, the worker machine, and the known-bad workers.

Every test that moves bytes runs on the CPU path, and on the CUDA path too when
``torch.cuda.is_available()``.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvgate.impl.worker import OffloadWorker, TransferResult
from kvgate.properties.catalogue import workers as bad_workers
from kvgate.properties.worker import machine as worker_machine
from kvgate.properties.worker.machine import BAD_MACHINES, OffloadWorkerMachine

HAS_CUDA = torch.cuda.is_available()

# The machine tests below claim coverage and catches, so they name their profile: ``ci``
# (derandomized) with no example database, whatever profile the suite loaded
# (HYPOTHESIS_PROFILE / CI) and whatever a local .hypothesis directory holds.
MACHINE_SETTINGS = settings(settings.get_profile("ci"), derandomize=True, database=None)
DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")],
    ),
]


class Layout:
    """Three layers with different page sizes and dtypes; layer 1 is padded (stride > page)."""

    PAGES = (16, 24, 8)  # bytes
    PADS = (0, 8, 0)

    def __init__(self, device, num_blocks=8):
        self.raw = []
        self.tensors = []
        for layer, (page, pad) in enumerate(zip(self.PAGES, self.PADS)):
            rows = torch.arange(num_blocks * (page + pad), dtype=torch.int64)
            raw = ((rows * 7 + layer * 50 + 1) % 251).to(torch.uint8).view(num_blocks, -1)
            raw = raw.to(device)
            self.raw.append(raw)
        self.tensors = [
            self.raw[0].view(torch.float16).view(num_blocks, 2, 4),  # K and V halves
            self.raw[1][:, :24].view(torch.int32),  # padded: 24-byte page, 32-byte stride
            self.raw[2][:, :8],
        ]

    def page(self, layer, block):
        return self.raw[layer][block, : self.PAGES[layer]].cpu().clone()

    def snapshot(self, worker):
        return [r.cpu().clone() for r in self.raw] + [c.cpu().clone() for c in worker.cpu_tensors]


def sub_block(worker, layer, chunk, j):
    page = worker.page_bytes[layer]
    return worker.cpu_tensors[layer][chunk, j * page : (j + 1) * page].cpu()


def finished(worker, ids):
    worker.wait(ids)
    return worker.get_finished()


# ---------------------------------------------------------------------------- layout


@pytest.mark.parametrize("device", DEVICES)
def test_layout_sees_each_layer_as_page_bytes(device):
    lay = Layout(device)
    w = OffloadWorker(lay.tensors, num_chunks=5, blocks_per_chunk=4)
    assert w.page_bytes == [16, 24, 8]
    assert w.bytes_per_block == 48
    assert [tuple(c.shape) for c in w.cpu_tensors] == [(5, 64), (5, 96), (5, 32)]
    assert all(c.dtype == torch.uint8 and c.device.type == "cpu" for c in w.cpu_tensors)
    assert all(not bool(c.any()) for c in w.cpu_tensors)
    assert all(c.is_pinned() for c in w.cpu_tensors) == (device == "cuda")
    assert w.gpu_pages[1].data_ptr() == lay.raw[1].data_ptr()  # a view, not a copy


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(gpu_tensors=[]), "at least one layer"),
        (dict(num_chunks=-1), "num_chunks"),
        (dict(blocks_per_chunk=0), "blocks_per_chunk"),
        (dict(gpu_tensors=[torch.zeros(4, 8), torch.zeros(5, 8)]), "blocks"),
        (dict(gpu_tensors=[torch.zeros(8, 4).t()]), "not contiguous"),
        (dict(gpu_tensors=[torch.zeros(4, 0)]), "empty pages"),
    ],
)
def test_constructor_refuses_bad_arguments(bad, message):
    args = dict(gpu_tensors=[torch.zeros(4, 8)], num_chunks=2, blocks_per_chunk=2) | bad
    with pytest.raises(ValueError, match=message):
        OffloadWorker(**args)


# ---------------------------------------------------------------------------- copies


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bpc", [1, 4])
def test_store_then_load_moves_exactly_the_listed_pages(device, bpc):
    lay = Layout(device)
    w = OffloadWorker(lay.tensors, num_chunks=4, blocks_per_chunk=bpc)
    blocks = [6, 1, 3, 0]
    chunks = [2, 0, 3, 1][: 4 // bpc]
    before = lay.snapshot(w)
    w.submit_store(10, blocks, chunks)
    [r] = finished(w, [10])
    assert r == TransferResult(10, True, 4 * 48, r.seconds) and r.seconds >= 0
    for i, b in enumerate(blocks):
        for layer in range(3):
            assert torch.equal(sub_block(w, layer, chunks[i // bpc], i % bpc), lay.page(layer, b))
    # GPU untouched by a store; padding never touched.
    assert all(torch.equal(a, b) for a, b in zip(before[:3], lay.snapshot(w)[:3]))

    targets = [7, 5, 4, 2]
    w.submit_load(11, chunks, targets)
    [r] = finished(w, [11])
    assert r.success and r.bytes == 4 * 48
    after = lay.snapshot(w)
    for layer, (page, raw_before) in enumerate(zip(Layout.PAGES, before)):
        for b in range(8):
            src = blocks[targets.index(b)] if b in targets else b
            assert torch.equal(after[layer][b, :page], raw_before[src, :page]), (layer, b)
            assert torch.equal(after[layer][b, page:], raw_before[b, page:])  # padding


@pytest.mark.parametrize("device", DEVICES)
def test_offset_store_and_suffix_load(device):
    """A range that starts inside a chunk: the offset names the first sub-block."""
    lay = Layout(device)
    w = OffloadWorker(lay.tensors, num_chunks=3, blocks_per_chunk=4)
    # Logical blocks 2..7 of a sequence: offset 2, chunks 1 (sub-blocks 2, 3) and 0 (all four).
    w.submit_store(1, [0, 1, 2, 3, 4, 5], [1, 0], offset=2)
    finished(w, [1])
    for layer in range(3):
        assert not bool(sub_block(w, layer, 1, 0).any())
        assert not bool(sub_block(w, layer, 1, 1).any())
        assert torch.equal(sub_block(w, layer, 1, 2), lay.page(layer, 0))
        assert torch.equal(sub_block(w, layer, 1, 3), lay.page(layer, 1))
        for j in range(4):
            assert torch.equal(sub_block(w, layer, 0, j), lay.page(layer, 2 + j))
        assert not bool(w.cpu_tensors[layer][2].any())
    # Load the suffix that starts at logical block 5: chunk 0, sub-blocks 1..3.
    w.submit_load(2, [0], [7, 6, 5], offset=1)
    finished(w, [2])
    for layer in range(3):
        assert torch.equal(lay.page(layer, 7), sub_block(w, layer, 0, 1))
        assert torch.equal(lay.page(layer, 6), sub_block(w, layer, 0, 2))
        assert torch.equal(lay.page(layer, 5), sub_block(w, layer, 0, 3))


@pytest.mark.parametrize("device", DEVICES)
def test_results_once_each_in_submission_order_per_direction(device):
    lay = Layout(device)
    w = OffloadWorker(lay.tensors, num_chunks=8, blocks_per_chunk=1)
    w.submit_store(5, [0], [0])
    w.submit_load(3, [7], [4])
    w.submit_store(1, [1, 2], [1, 2])
    w.submit_load(9, [6], [5])
    w.submit_store(2, [], [])  # an empty job is a job
    assert w.pending_job_ids() == [5, 3, 1, 9, 2]
    results = finished(w, [5, 3, 1, 9, 2])
    assert [r.job_id for r in results if r.job_id in (5, 1, 2)] == [5, 1, 2]
    assert [r.job_id for r in results if r.job_id in (3, 9)] == [3, 9]
    assert sorted(r.job_id for r in results) == [1, 2, 3, 5, 9]
    assert {r.job_id: r.bytes for r in results} == {5: 48, 3: 48, 1: 96, 9: 48, 2: 0}
    assert all(r.success and isinstance(r.seconds, float) for r in results)
    assert w.get_finished() == [] and w.pending_job_ids() == []


@pytest.mark.parametrize("device", DEVICES)
def test_wait_ignores_unknown_and_reported_ids(device):
    lay = Layout(device)
    w = OffloadWorker(lay.tensors, num_chunks=4)
    w.submit_store(1, [0, 1], [0, 1])
    w.wait([1, 12345, "not an id", [1]])
    assert [r.job_id for r in w.get_finished()] == [1]
    w.wait([1])  # reported already: ignored
    assert w.get_finished() == []


# ---------------------------------------------------------------------------- refusals


INVALID = {
    "gpu block out of range": ("store", dict(gpu_blocks=[0, 8], chunk_ids=[0, 1])),
    "negative gpu block": ("load", dict(gpu_blocks=[-1], chunk_ids=[0])),
    "chunk out of range": ("store", dict(gpu_blocks=[0, 1], chunk_ids=[0, 4])),
    "too many chunks": ("store", dict(gpu_blocks=[0, 1], chunk_ids=[0, 1, 2], offset=1)),
    "too few chunks": ("load", dict(gpu_blocks=[0, 1, 2], chunk_ids=[1], offset=1)),
    "chunk for an empty job": ("store", dict(gpu_blocks=[], chunk_ids=[0])),
    "repeated gpu block": ("load", dict(gpu_blocks=[3, 3], chunk_ids=[0])),
    "repeated chunk": ("store", dict(gpu_blocks=[0, 1, 2, 3], chunk_ids=[1, 1])),
    "offset too large": ("store", dict(gpu_blocks=[0], chunk_ids=[0], offset=2)),
    "negative offset": ("load", dict(gpu_blocks=[0], chunk_ids=[0], offset=-1)),
    "float block id": ("store", dict(gpu_blocks=[0, 1.0], chunk_ids=[0])),
    "bool offset": ("store", dict(gpu_blocks=[0], chunk_ids=[0], offset=True)),
    "string job id": ("store", dict(job_id="7", gpu_blocks=[0], chunk_ids=[0])),
    "reused job id": ("load", dict(job_id=100, gpu_blocks=[0], chunk_ids=[0])),
    "ids not a list": ("store", dict(gpu_blocks=5, chunk_ids=[0])),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", INVALID)
def test_invalid_transfer_is_refused_before_any_byte_moves(device, name):
    kind, args = INVALID[name]
    lay = Layout(device)
    w = OffloadWorker(lay.tensors, num_chunks=4, blocks_per_chunk=2)
    w.submit_store(100, [4, 5], [3])
    finished(w, [100])
    w.fail_next()
    before = lay.snapshot(w)
    args = dict(job_id=7) | args
    call = w.submit_store if kind == "store" else w.submit_load
    with pytest.raises(ValueError):
        call(
            args["job_id"],
            args["gpu_blocks"] if kind == "store" else args["chunk_ids"],
            args["chunk_ids"] if kind == "store" else args["gpu_blocks"],
            args.get("offset", 0),
        )
    assert all(torch.equal(a, b) for a, b in zip(before, lay.snapshot(w)))
    assert w.pending_job_ids() == [] and w.get_finished() == []
    # Nothing was used up: the id is free and the injected failure still hits the next job.
    w.submit_store(7, [0], [0])
    assert finished(w, [7]) == [TransferResult(7, False, 0, 0.0)]


@pytest.mark.parametrize("device", DEVICES)
def test_conflicts_with_unreported_jobs_are_refused(device):
    lay = Layout(device)
    w = OffloadWorker(lay.tensors, num_chunks=4, blocks_per_chunk=2)
    w.submit_load(1, [0], [6, 7])  # reads chunk 0, writes blocks 6 and 7
    w.submit_store(2, [0, 1], [1])  # reads blocks 0 and 1, writes chunk 1
    with pytest.raises(ValueError, match="sub-block 1 of chunk 0 is being read by load job 1"):
        w.submit_store(3, [2], [0], offset=1)
    with pytest.raises(ValueError, match="gpu block 7 is being written by load job 1"):
        w.submit_store(3, [7], [2])
    with pytest.raises(ValueError, match="chunk 1 is being written by store job 2"):
        w.submit_load(3, [1], [4])
    with pytest.raises(ValueError, match="gpu block 0 is being read by store job 2"):
        w.submit_load(3, [2], [0])
    with pytest.raises(ValueError, match="gpu block 6 is being written by load job 1"):
        w.submit_load(3, [2], [6])
    # Reading what others read is fine, and so is another sub-block of a busy chunk.
    w.submit_store(3, [0], [2])
    w.submit_load(4, [0], [5])
    assert [r.job_id for r in finished(w, [1, 2, 3, 4])] == [1, 2, 3, 4]
    w.submit_store(5, [2, 3], [0])  # chunk 0 is free again once its load is reported
    assert finished(w, [5])[0].success


# ---------------------------------------------------------------------------- failures


@pytest.mark.parametrize("device", DEVICES)
def test_injected_failure_reports_false_and_writes_nothing(device):
    lay = Layout(device)
    w = OffloadWorker(lay.tensors, num_chunks=4, blocks_per_chunk=2)
    w.fail_next(1, kind="load")
    before = lay.snapshot(w)
    w.submit_store(1, [0, 1], [0])  # a store: not hit
    [r] = finished(w, [1])
    assert (r.job_id, r.success, r.bytes) == (1, True, 96)
    after_store = lay.snapshot(w)
    w.submit_load(2, [0], [4, 5])  # fails
    w.submit_load(3, [0], [6, 7])  # budget spent: runs
    results = finished(w, [2, 3])
    assert [(r.job_id, r.success, r.bytes) for r in results] == [(2, False, 0), (3, True, 96)]
    now = lay.snapshot(w)
    for layer in range(3):
        page = Layout.PAGES[layer]
        assert torch.equal(now[layer][4:6], before[layer][4:6])  # the failed load wrote nothing
        assert torch.equal(now[layer][6:8, :page], before[layer][0:2, :page])
    assert all(torch.equal(a, b) for a, b in zip(after_store[3:], now[3:]))


def test_a_copy_that_raises_is_reported_as_failed(monkeypatch):
    lay = Layout("cpu")
    w = OffloadWorker(lay.tensors, num_chunks=2)

    def broken(job):
        raise RuntimeError("copy engine on fire")

    monkeypatch.setattr(w, "_copy_cpu", broken)
    w.submit_store(1, [0], [0])
    [r] = w.get_finished()
    assert (r.job_id, r.success, r.bytes) == (1, False, 0)
    assert "on fire" in str(w.last_error)


def test_a_cpu_copy_reports_the_seconds_of_the_clock_it_was_given():
    """The worker times a CPU copy with its ``clock`` (the worker machine hands it one that
    ticks per reading), not with a module global someone replaces."""
    readings = iter([10.0, 10.25, 20.0, 20.5])
    w = OffloadWorker(Layout("cpu").tensors, num_chunks=2, clock=lambda: next(readings))
    w.submit_store(1, [0], [0])
    w.submit_load(2, [1], [1])
    assert [(r.job_id, r.seconds) for r in w.get_finished()] == [(1, 0.25), (2, 0.5)]


def test_fail_next_checks_its_arguments():
    w = OffloadWorker(Layout("cpu").tensors, num_chunks=2)
    with pytest.raises(ValueError, match="kind"):
        w.fail_next(1, kind="both")
    with pytest.raises(ValueError, match="n must be"):
        w.fail_next(-1)


# ---------------------------------------------------------------------------- CUDA only


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_cuda_store_sees_writes_queued_before_it_on_the_current_stream():
    n, page = 64, 1 << 20
    kv = torch.zeros((n, page), dtype=torch.uint8, device="cuda")
    w = OffloadWorker([kv], num_chunks=n)
    torch.cuda._sleep(50_000_000)  # keep the current stream busy...
    kv.fill_(7)  # ...so this write is still queued when the store is submitted
    w.submit_store(1, list(range(n)), list(range(n)))
    w.wait([1])
    [r] = w.get_finished()
    assert r.success and r.seconds > 0
    assert bool((w.cpu_tensors[0] == 7).all())


# ---------------------------------------------------------------------------- the machine


def test_machine_passes_on_the_worker():
    OffloadWorkerMachine.coverage.clear()
    run_state_machine_as_test(OffloadWorkerMachine, settings=MACHINE_SETTINGS)
    expected = {
        "store with offset",
        "load with offset",
        "store over several chunks",
        "load over several chunks",
        "failed job reported",
        "wait",
        "store reported",
        "load reported",
        "empty transfer",
    }
    expected |= {f"refused: {d}" for d in worker_machine.DEFECTS}
    assert expected <= set(OffloadWorkerMachine.expected_labels())
    missing = [
        label
        for label in OffloadWorkerMachine.expected_labels()
        if not OffloadWorkerMachine.coverage.get(label)
    ]
    assert not missing, f"the machine never reached {sorted(missing)}"


def _no_explain() -> settings:
    # The explain phase re-runs a found failure many times to annotate it (14-33 s per machine
    # here); generation and shrinking are the ci profile's own.
    return settings(
        MACHINE_SETTINGS, phases=[p for p in MACHINE_SETTINGS.phases if p != Phase.explain]
    )


def _counterexample(machine, says: str | tuple[str, ...]) -> tuple[AssertionError, list[str]]:
    """The machine's failure, which must say one of ``says``, and its printed steps."""
    pattern = "|".join(re.escape(s) for s in ((says,) if isinstance(says, str) else says))
    with pytest.raises(AssertionError, match=pattern) as info:
        run_state_machine_as_test(machine, settings=_no_explain())
    lines = "\n".join(getattr(info.value, "__notes__", [])).splitlines()
    return info.value, [ln for ln in lines if re.match(r"state(\.| =)", ln)]


CAUGHT_BY = {
    "OffByOneOffset": "should hold label",
    "CopiesPaddedPage": "cpu tensor is",
    # Either a reported job's bytes are missing, or a copy made to raise did not raise (the
    # copy runs only at the next submission): last_error is not what it raised.
    "ReportsBeforeCopy": ("should hold label", "last_error"),
    "ReportsOutOfOrder": "reported before the earlier",
    # Either a refused transfer changed bytes, or a load with an injected failure wrote a page.
    "WritesBeforeValidating": ("changed bytes", "should hold label"),
    # A store fails for a failure queued for loads: reported success=False, or (when the
    # copy was made to raise) never run, so last_error is not what it raised.
    "FailsEitherDirection": ("success=", "last_error"),
}


@pytest.mark.parametrize("name", sorted(BAD_MACHINES))
def test_machine_catches_bad_worker_with_a_short_replayable_counterexample(name):
    error, steps = _counterexample(BAD_MACHINES[name], CAUGHT_BY[name])
    rules = [
        s
        for s in steps
        if s.startswith("state.")
        and not s.startswith(
            (
                "state.bytes_match_model",
                "state.pending_ids_in_submission_order",
                "state.teardown",
                "state.init_worker",
            )
        )
    ]  # invariants and set-up are not steps
    assert steps[0] == f"state = {name}Machine()"
    assert len(rules) <= 4, steps  # shrunk
    # The printed steps replay as they stand, to the same failure.
    namespace: dict = {}
    exec("from kvgate.properties.worker.machine import *", namespace)
    with pytest.raises(AssertionError, match=f"^{re.escape(str(error).splitlines()[0])}"):
        exec("\n".join(steps), namespace)


def test_padded_page_worker_also_corrupts_bytes():
    """Beyond the CPU tier's shape: a round trip through it overwrites the padding."""
    lay = Layout("cpu")
    w = bad_workers.CopiesPaddedPage(lay.tensors, num_chunks=2)
    before = lay.snapshot(w)
    w.submit_store(1, [0], [0])
    w.get_finished()
    w.submit_load(2, [0], [1])
    w.get_finished()
    assert not torch.equal(lay.raw[1][1, 24:], before[1][1, 24:])


def test_every_bad_worker_has_a_machine():
    assert set(BAD_MACHINES) == {c.__name__ for c in bad_workers.BAD_WORKERS}
    assert all(c.__doc__ for c in bad_workers.BAD_WORKERS)
