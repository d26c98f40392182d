"""Where the worker's CPU copy spends its time: its pieces timed alone against the plain copy.

Stores of 4 layers (GPU -> CPU, 1 torch thread), median of 41 shuffled rounds of 10 calls, each
batch after one untimed call; microseconds per call. For the cases where
``bench/worker_bandwidth.py`` shows the worker under 0.9 of the fastest plain copy.

    python bench/worker_copy_pieces.py
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvgate.impl.worker import OffloadWorker, _Job, _long_runs, _picker


def case(page: int, n: int, layers: int, pattern: str) -> str:
    rng = random.Random(0)
    tensors = [
        torch.randint(0, 100, (512, page // 2), dtype=torch.int16).view(torch.bfloat16)
        for _ in range(layers)
    ]
    w = OffloadWorker(tensors, 256, 1)
    if pattern == "scattered":
        blocks, chunks = rng.sample(range(512), n), rng.sample(range(256), n)
    else:
        blocks, chunks = list(range(10, 10 + n)), list(range(50, 50 + n))
    job = _Job(0, 0, "store", blocks, chunks, 0)
    gpu = [g.view(torch.int64) for g in w.gpu_pages]
    cpu = [c.view(torch.int64) for c in w.cpu_tensors]
    fresh_src = [g[i] for g in gpu for i in blocks]
    fresh_dst = [c[i] for c in cpu for i in chunks]
    pre_src = [x for g in w._gpu_rows for x in _picker(blocks)(g)]
    pre_dst = [x for c in w._cpu_rows for x in _picker(chunks)(c)]

    def view_lists():
        s, d = [], []
        for a, b in zip(w._gpu_rows, w._cpu_rows):
            s.extend(_picker(blocks)(a))
            d.extend(_picker(chunks)(b))

    def slices():
        for g, c in zip(w._gpu_words, w._cpu_words):
            g[10 : 10 + n], c[50 : 50 + n]

    def slice_copies():
        for g, c in zip(w._gpu_words, w._cpu_words):
            c[50 : 50 + n].copy_(g[10 : 10 + n])

    fns = {
        "worker copy alone": lambda: w._copy_cpu(job),
        "run scan": lambda: _long_runs(blocks, chunks),
    }
    if pattern == "scattered":
        fns |= {
            "view lists": view_lists,
            "foreach, precomputed views": lambda: torch._foreach_copy_(pre_dst, pre_src),
            "foreach, fresh views (plain)": lambda: torch._foreach_copy_(fresh_dst, fresh_src),
        }
    else:
        fns |= {"taking 2 slices per layer": slices, "slice copy_ loop (plain)": slice_copies}
    res: dict[str, list[float]] = {k: [] for k in fns}
    names, order = list(fns), random.Random(0)
    for _ in range(41):
        order.shuffle(names)
        for k in names:
            fns[k]()
            start = time.perf_counter()
            for _ in range(10):
                fns[k]()
            res[k].append((time.perf_counter() - start) / 10 * 1e6)
    return f"{layers} x {page // 1024} KiB x {n} {pattern}: " + ", ".join(
        f"{k} {statistics.median(v):.1f} us" for k, v in res.items()
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    for args in (
        (4096, 64, 4, "contiguous"),
        (4096, 64, 4, "scattered"),
        (32768, 32, 4, "scattered"),
    ):
        print(case(*args))
