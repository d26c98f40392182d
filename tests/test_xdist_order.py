"""A small session's order under xdist (kvgate/xdist_order.py): round-robin hands each worker
the longest-first share, so the gate's longest item does not wait behind another."""

import itertools
import random

import pytest

from kvgate.xdist_order import MACHINE_COST, balanced


def round_robin(order: list[int], workers: int) -> list[list[int]]:
    """What xdist's load scheduler does with fewer than 2 * workers items: position i to
    worker i % workers."""
    shares: list[list[int]] = [[] for _ in range(workers)]
    for position, index in enumerate(order):
        shares[position % workers].append(index)
    return shares


def makespan(costs, order, workers) -> float:
    return max(sum(costs[i] for i in share) for share in round_robin(order, workers))


def test_the_adopt_gate_runs_its_longest_item_alone_under_n_2():
    costs = [MACHINE_COST[m] for m in ("manager", "scheduler", "vllm-scheduler")]
    order = balanced(costs, 2)
    assert sorted(order) == [0, 1, 2]
    assert sorted(map(sorted, round_robin(order, 2))) == [[0, 1], [2]]
    # collection order as it is would put the manager machine beside vLLM's scheduler
    assert makespan(costs, order, 2) < makespan(costs, [0, 1, 2], 2)


@pytest.mark.parametrize("seed", range(40))
def test_round_robin_of_the_order_is_the_longest_first_assignment(seed):
    rng = random.Random(seed)
    workers = rng.randint(2, 4)
    costs = [rng.choice([0.0, 0.5, 1.0, 2.0, 3.5]) for _ in range(rng.randint(2, 2 * workers - 1))]
    order = balanced(costs, workers)
    assert sorted(order) == list(range(len(costs)))  # a permutation: nothing lost, nothing twice
    # longest first, each to the least loaded: within 4/3 of the best assignment (Graham's
    # bound), found here by trying every one
    best = min(
        max(sum(c for c, w in zip(costs, ws) if w == k) for k in range(workers))
        for ws in itertools.product(range(workers), repeat=len(costs))
    )
    assert makespan(costs, order, workers) <= best * 4 / 3 + 1e-9
    assert makespan(costs, order, workers) <= makespan(costs, list(range(len(costs))), workers)
    assert all(round_robin(order, workers)[: min(workers, len(costs))])  # no worker left idle


def test_a_session_xdist_dispatches_on_demand_keeps_its_order():
    assert balanced([3.0, 1.0, 1.0, 1.0], 2) == [0, 1, 2, 3]  # 2 * workers items or more
    assert balanced([3.0, 1.0, 1.0], 1) == [0, 1, 2]
