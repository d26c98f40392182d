"""CPU copy bandwidth of the offload worker as a ratio to a plain ``index_copy_`` of the same bytes.

Both sides are measured in one run, interleaved round by round, and each side keeps its best
round (the machine may be shared, so the best round is the least disturbed one). The worker's
time covers a whole job: ``submit_store`` / ``submit_load`` (argument checks, hazard checks, the
copy) and the ``get_finished`` that reports it. The baseline is, per layer,
``dst.index_copy_(0, rows, src)`` from an already gathered, contiguous ``uint8`` source into the
same destination rows: the same bytes, with no gather, no checks and no bookkeeping. A second
baseline does the same on ``int64`` views of those bytes, the fastest plain ``index_copy_`` we
know, and is printed for comparison only.

    python bench/worker_bandwidth.py            # the default matrix
    python bench/worker_bandwidth.py --quick    # fewer rounds

Ratios above 1 mean the worker is faster than the baseline.
"""
from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvgate.impl.worker import OffloadWorker  # noqa: E402

KIB = 1024


def make_layers(num_blocks: int, pages: list[tuple[int, int]]) -> list[torch.Tensor]:
    """One bf16 tensor per layer: ``(page_bytes, pad_bytes)`` each, filled with random bytes."""
    layers = []
    for page, pad in pages:
        raw = torch.randint(0, 256, (num_blocks, page + pad), dtype=torch.uint8)
        layers.append(raw[:, :page].view(torch.bfloat16))
    return layers


def best_times(fns: dict, rounds: int, reps: int) -> dict:
    best = {k: math.inf for k in fns}
    for fn in fns.values():
        fn()  # warm-up: first touch of the pages, staging buffers
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(reps):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / reps)
    return best


def scenario(kind: str, pages, num_blocks: int, num_chunks: int, bpc: int, job_blocks: int,
             rounds: int, reps: int, rng: random.Random) -> dict:
    layers = make_layers(num_blocks, pages)
    worker = OffloadWorker(layers, num_chunks, bpc)
    blocks = rng.sample(range(num_blocks), job_blocks)
    chunks = rng.sample(range(num_chunks), math.ceil(job_blocks / bpc))
    slots = [chunks[i // bpc] * bpc + i % bpc for i in range(job_blocks)]
    job = iter(range(10**9))

    if kind == "store":
        def run_worker():
            worker.submit_store(next(job), blocks, chunks)
            assert worker.get_finished()[0].success
        dsts = [c.view(num_chunks * bpc, p) for c, p in zip(worker.cpu_tensors, worker.page_bytes)]
        rows = torch.tensor(slots)
    else:
        worker.submit_store(next(job), blocks, chunks)
        worker.get_finished()

        def run_worker():
            worker.submit_load(next(job), chunks, blocks)
            assert worker.get_finished()[0].success
        dsts = list(worker.gpu_pages)
        rows = torch.tensor(blocks)
    srcs = [torch.randint(0, 256, (job_blocks, p), dtype=torch.uint8) for p in worker.page_bytes]

    def run_plain():
        for dst, src in zip(dsts, srcs):
            dst.index_copy_(0, rows, src)

    def run_plain64():
        for dst, src in zip(dsts, srcs):
            dst.view(torch.int64).index_copy_(0, rows, src.view(torch.int64))

    t = best_times({"worker": run_worker, "plain": run_plain, "plain64": run_plain64},
                   rounds, reps)
    nbytes = job_blocks * worker.bytes_per_block
    return {"bytes": nbytes, **{k: nbytes / v / 1e9 for k, v in t.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    args = ap.parse_args(argv)
    ap_threads = args.threads
    if ap_threads:
        torch.set_num_threads(ap_threads)
    rounds, reps = (40, 1) if args.quick else (200, 1)
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    # Six layers: pages of 32 KiB (16 tokens x 8 KV heads x 128 dims x bf16), and smaller ones,
    # one of them padded to the largest page as in a hybrid model; a job of 32 random blocks.
    kv = 32 * KIB
    pages = [(kv, 0)] * 3 + [(kv // 2, 0), (kv // 2, kv // 2), (4 * KIB, 0)]
    job_blocks = 32
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; pages "
          f"{[p for p, _ in pages]} bytes (one padded); job = {job_blocks} random blocks")
    print(f"{'direction':<9} {'bpc':>3} {'MiB/job':>8} {'worker GB/s':>12} "
          f"{'index_copy_ GB/s':>17} {'ratio':>6}   {'int64 index_copy_':>17} {'ratio':>6}")
    ratios = []
    for bpc in (1, 4):
        for kind in ("store", "load"):
            r = scenario(kind, pages, num_blocks=1024, num_chunks=512, bpc=bpc, job_blocks=job_blocks,
                         rounds=rounds, reps=reps, rng=rng)
            ratio, ratio64 = r["worker"] / r["plain"], r["worker"] / r["plain64"]
            ratios.append(ratio)
            print(f"{kind:<9} {bpc:>3} {r['bytes'] / 2**20:>8.1f} {r['worker']:>12.2f} "
                  f"{r['plain']:>17.2f} {ratio:>6.2f}   {r['plain64']:>17.2f} {ratio64:>6.2f}")
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"worker / plain index_copy_ bandwidth: min {min(ratios):.2f}, geometric mean {geo:.2f}"
          f" (goal >= 0.8)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
