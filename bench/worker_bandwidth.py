"""Copy bandwidth of the offload worker against the fastest plain torch copy of the same bytes.

How it works and why: docs/internals.md, section bench/worker_bandwidth.py.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvgate.impl.worker import LOAD, STORE, OffloadWorker, _Job

KIB = 1024
GOAL = 0.9
# (label, [(page bytes, padding bytes) per layer], blocks per job, blocks_per_chunk)
CASES = [
    ("4 x 4 KiB", [(4 * KIB, 0)] * 4, 64, 1),
    ("4 x 32 KiB", [(32 * KIB, 0)] * 4, 32, 1),
    ("4 x 256 KiB", [(256 * KIB, 0)] * 4, 8, 1),
    (
        "hybrid 6 layers, bpc 4",
        [(32 * KIB, 0)] * 3 + [(16 * KIB, 0), (16 * KIB, 16 * KIB), (4 * KIB, 0)],
        32,
        4,
    ),
]
NUM_BLOCKS, NUM_CHUNKS = 512, 256


def make_layers(num_blocks: int, pages, device) -> list[torch.Tensor]:
    """One bf16 tensor per layer: ``(page_bytes, pad_bytes)`` each, filled with random bytes."""
    layers = []
    for page, pad in pages:
        raw = torch.randint(0, 256, (num_blocks, page + pad), dtype=torch.uint8, device=device)
        layers.append(raw[:, :page].view(torch.bfloat16))
    return layers


def median_times(fns: dict, rounds: int, reps: int, sync) -> dict:
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()  # warm-up: first touch of the pages, buffers
    sync()
    order, names = random.Random(0), list(fns)
    for _ in range(rounds):
        order.shuffle(names)  # no copy always follows the same one
        for name in names:
            fn = fns[name]
            fn()  # untimed: each copy is timed from its own bytes, not from its predecessor's
            sync()
            start = time.perf_counter()
            for _ in range(reps):
                fn()
            sync()
            times[name].append((time.perf_counter() - start) / reps)
    return {k: statistics.median(v) for k, v in times.items()}


def runs_of(src_ids: list[int], dst_ids: list[int]) -> list[tuple[int, int, int]]:
    """Maximal runs where both ids go up by one: ``(first src id, first dst id, length)``."""
    runs: list[list[int]] = []
    for s, d in zip(src_ids, dst_ids):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            runs[-1][2] += 1
        else:
            runs.append([s, d, 1])
    return [(s, d, n) for s, d, n in runs]


def plain_candidates(srcs, dsts, src_ids, dst_ids, nb: bool) -> dict:
    """Plain copies of rows ``src_ids`` of each ``srcs[l]`` into rows ``dst_ids`` of ``dsts[l]``."""
    n = len(src_ids)
    s_idx = torch.tensor(src_ids, device=srcs[0].device)
    d_idx = torch.tensor(dst_ids, device=dsts[0].device)
    s_run, d_run = runs_of(src_ids, src_ids)[0][2] == n, runs_of(dst_ids, dst_ids)[0][2] == n
    s0, d0 = src_ids[0], dst_ids[0]
    bufs = [torch.empty((n, s.shape[1]), dtype=s.dtype, device=s.device) for s in srcs]

    def index_ops():
        for src, dst, buf in zip(srcs, dsts, bufs):
            if s_run:
                dst.index_copy_(0, d_idx, src[s0 : s0 + n])
            elif d_run and dst[d0 : d0 + n].is_contiguous():
                torch.index_select(src, 0, s_idx, out=dst[d0 : d0 + n])
            else:
                torch.index_select(src, 0, s_idx, out=buf)
                dst.index_copy_(0, d_idx, buf)

    def advanced_indexing():
        for src, dst in zip(srcs, dsts):
            dst[d_idx] = src[s_idx]

    src_rows = [r for src in srcs for r in (src[i] for i in src_ids)]
    dst_rows = [r for dst in dsts for r in (dst[i] for i in dst_ids)]

    def foreach_rows():
        torch._foreach_copy_(dst_rows, src_rows, non_blocking=nb)

    def per_row():
        for d, s in zip(dst_rows, src_rows):
            d.copy_(s, non_blocking=nb)

    runs = runs_of(src_ids, dst_ids)

    def run_slices():  # the runs are found outside the timing, the slices are taken inside
        for src, dst in zip(srcs, dsts):
            for s, d, k in runs:
                dst[d : d + k].copy_(src[s : s + k], non_blocking=nb)

    return {
        "index ops": index_ops,
        "dst[ids] = src[ids2]": advanced_indexing,
        "_foreach_copy_ rows": foreach_rows,
        "per-row copy_": per_row,
        "runs as slices": run_slices,
    }


def scenario(
    kind: str,
    pattern: str,
    pages,
    job_blocks: int,
    bpc: int,
    device,
    rounds: int,
    reps: int,
    rng: random.Random,
) -> dict:
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    worker = OffloadWorker(make_layers(NUM_BLOCKS, pages, device), NUM_CHUNKS, bpc)
    num_job_chunks = math.ceil(job_blocks / bpc)
    if pattern == "contiguous":
        b0, c0 = rng.randrange(NUM_BLOCKS - job_blocks), rng.randrange(NUM_CHUNKS - num_job_chunks)
        blocks, chunks = list(range(b0, b0 + job_blocks)), list(range(c0, c0 + num_job_chunks))
    else:
        blocks = rng.sample(range(NUM_BLOCKS), job_blocks)
        chunks = rng.sample(range(NUM_CHUNKS), num_job_chunks)
    slots = worker._slot_rows(chunks, 0, job_blocks)
    nbytes = job_blocks * worker.bytes_per_block
    job_ids = iter(range(1, 10**9))
    if kind == LOAD:  # something to load
        worker.submit_store(0, blocks, chunks)
        worker.get_finished()

    gpu_words = [g.view(torch.int64) for g in worker.gpu_pages]
    cpu_words = [
        c.view(NUM_CHUNKS * bpc, p).view(torch.int64)
        for c, p in zip(worker.cpu_tensors, worker.page_bytes)
    ]
    if kind == STORE:
        srcs, dsts, src_ids, dst_ids = gpu_words, cpu_words, blocks, slots
    else:
        srcs, dsts, src_ids, dst_ids = cpu_words, gpu_words, slots, blocks
    job = _Job(0, 0, kind, blocks, slots, nbytes)

    def copy_alone():
        if cuda:
            job.keep.clear()  # the staging of the previous call (stream-ordered reuse)
            worker._copy_cuda(job)
        else:
            worker._copy_cpu(job)

    def whole_call():
        if kind == STORE:
            worker.submit_store(next(job_ids), blocks, chunks)
        else:
            worker.submit_load(next(job_ids), chunks, blocks)
        (done,) = worker.get_finished() if not cuda else _finish(worker)
        assert done.success

    plain = plain_candidates(srcs, dsts, src_ids, dst_ids, nb=cuda)
    # Keep only the candidates that run here and copy the right bytes.
    expect = [s[torch.tensor(src_ids, device=s.device)].cpu() for s in srcs]
    checked = {}
    for name, fn in {"worker, copy alone": copy_alone, **plain}.items():
        for dst in dsts:
            dst.zero_()
        try:
            fn()
            sync()
        except (RuntimeError, TypeError, NotImplementedError):
            continue
        if all(
            torch.equal(d[torch.tensor(dst_ids, device=d.device)].cpu(), e)
            for d, e in zip(dsts, expect)
        ):
            checked[name] = fn
    assert "worker, copy alone" in checked, "the worker copied wrong bytes"
    flat_src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=srcs[0].device)
    flat_dst = torch.empty(nbytes, dtype=torch.uint8, device=dsts[0].device)
    if cuda and flat_src.device.type == "cpu":
        flat_src = flat_src.pin_memory()
    if cuda and flat_dst.device.type == "cpu":
        flat_dst = flat_dst.pin_memory()
    fns = {
        **checked,
        "worker, whole call": whole_call,
        "memory bound": lambda: flat_dst.copy_(flat_src, non_blocking=cuda),
    }
    t = median_times(fns, rounds, reps, sync)
    gbs = {k: nbytes / v / 1e9 for k, v in t.items()}
    best = max((k for k in checked if not k.startswith("worker")), key=gbs.__getitem__)
    return {"bytes": nbytes, "gbs": gbs, "best": best}


def _finish(worker):
    worker.wait(worker.pending_job_ids())
    return worker.get_finished()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--smoke", action="store_true", help="the fewest rounds (a test that it runs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on a shared two-core machine a second "
        "thread stalls copies at random; 0: torch's own count)",
    )
    ap.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the 'GPU' tensors live (cuda: pinned CPU tier, non-blocking)",
    )
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "CUDA: not available here (torch.cuda.is_available() is False); the CUDA table "
            "(pinned CPU tier, non-blocking copies) was not run"
        )
        return 0
    device = torch.device(args.device)
    rounds, reps = (3, 1) if args.smoke else (15, 3) if args.quick else (41, 5)
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {device}; "
        f"{NUM_BLOCKS} blocks, {NUM_CHUNKS} chunks; GB/s from the median of {rounds} rounds "
        f"of {reps} calls; ratios are the worker's copy alone / the column"
    )
    head = (
        "| case | dir | ids | MiB | worker copy alone | worker whole call | fastest plain "
        "(which) | memory bound | alone / plain | whole / plain | alone / bound |"
    )
    print(head)
    print("|" + "---|" * 3 + "---:|" * 8)
    ratios = []
    # smoke: a test that the table is built, so its first case alone
    for label, pages, job_blocks, bpc in CASES[:1] if args.smoke else CASES:
        for kind in (STORE, LOAD):
            for pattern in ("contiguous", "scattered"):
                r = scenario(kind, pattern, pages, job_blocks, bpc, device, rounds, reps, rng)
                g = r["gbs"]
                alone, whole, plain = g["worker, copy alone"], g["worker, whole call"], g[r["best"]]
                ratios.append(alone / plain)
                print(
                    f"| {label} | {kind} | {pattern} | {r['bytes'] / 2**20:.2f} | {alone:.1f} | "
                    f"{whole:.1f} | {plain:.1f} ({r['best']}) | {g['memory bound']:.1f} | "
                    f"{alone / plain:.2f} | {whole / plain:.2f} | "
                    f"{alone / g['memory bound']:.2f} |"
                )
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(
        f"worker / fastest plain copy (copy alone): min {min(ratios):.2f}, geometric mean "
        f"{geo:.2f} (goal >= {GOAL})"
    )
    if device.type == "cpu" and not torch.cuda.is_available():
        print(
            "CUDA: not available here; the CUDA table (--device cuda: pinned CPU tier, "
            "non-blocking copies) was not run"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
