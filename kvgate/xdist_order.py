"""The order of a small session's items under pytest-xdist, so that its first distribution
balances the workers: the gate's items take minutes, not milliseconds.

xdist's ``load`` scheduler (the default of ``-n N``) hands a session of fewer than ``2 * N``
items out round-robin at the start: item ``i`` goes to worker ``i % N`` and nothing moves later.
A gate file holds few items of unequal cost (vLLM's scheduler machine costs about twice a
manager machine), so collection order decides the wall time: ``manager, scheduler,
vllm-scheduler`` under ``-n 2`` runs the first and the longest on one worker. ``balanced``
assigns the items longest first, each to the worker with the least work so far (the usual
longest-processing-time rule), then lays the assignment out so that round-robin hands each
worker its share. A session of ``2 * N`` items or more is dispatched in chunks on demand by
xdist itself, and is left as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

# A machine's relative cost under one profile (measured with the ci profile: vLLM 0.34.0's
# manager 13 s, scheduler 11 s, vllm-scheduler 26 s; SGLang 0.5.23's machine 8 s); an item
# of another kind counts 1.
MACHINE_COST = {"manager": 1.0, "scheduler": 0.9, "vllm-scheduler": 2.0, "sglang": 0.7}


def balanced(costs: Sequence[float], workers: int) -> list[int]:
    """Indices of ``costs`` in the order whose round-robin hand-out to ``workers`` workers is
    the longest-first assignment; the identity when round-robin does not apply."""
    n = len(costs)
    if workers < 2 or n >= 2 * workers or n <= 1:
        return list(range(n))
    shares: list[list[int]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for i in sorted(range(n), key=lambda i: (-costs[i], i)):
        w = min(range(workers), key=lambda w: (loads[w], len(shares[w]), w))
        shares[w].append(i)
        loads[w] += costs[i]
    # round-robin gives worker w the positions w, w + workers, ...: a worker with more items
    # than another must come first in the cycle, so shares go longest list first
    shares.sort(key=len, reverse=True)
    order: list[int] = []
    for turn in range(max(len(s) for s in shares)):
        order += [s[turn] for s in shares if turn < len(s)]
    return order
