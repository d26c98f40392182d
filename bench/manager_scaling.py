"""Per-call cost of ``prepare_store`` on a small and on a large manager, and their ratio.

Two comparisons, each measured in one run with the two sides interleaved round by round. Each
side's time is its best round (the least disturbed one on a shared machine); the ratio judged
against the goal is the median over rounds of (large / small) in the same round, which is
steadier than a ratio of two minimums when the machine's load changes:

1. ``store_threshold=1``: a 100-chunk manager against a 100,000-chunk one. Every offer is 10
   fresh keys; every store is completed at once, so once the cache is full (it is filled before
   timing) each offer evicts 10 idle chunks.
2. ``store_threshold=2``: a 100-key tracker against a 64,000-key one (both full before timing),
   on 1,000 chunks. Every batch of 10 fresh keys is offered by two requests: the first offer
   counts the keys (all skipped, 10 tracker keys pushed out), the second admits and stores them
   (10 evictions). Both offers are timed.

Only ``prepare_store`` is timed; key generation, contexts and ``complete_store`` are not. The
goal is a large/small ratio of at most 1.5: the cost of an offer must not grow with the size of
the cache or of the tracker. Next to each time, the number of function calls one
``prepare_store`` makes (counted with ``sys.setprofile``, outside the timed rounds): equal counts
on both sides mean equal work, so what is left of the ratio is memory (a large cache's
dictionaries do not fit in the CPU caches) and, on a shared machine, other processes. For that
memory effect the first comparison also prints a floor: a bare ``OrderedDict`` of key -> entry,
the manager's layout (10 evictions of cold keys, 10 inserts) on 100 and on 100,000 keys, no
manager code. (The manager once kept chunk ids and ref counts in two more dictionaries beside
the policy's order; every eviction then touched three large maps and the ratio was 1.7-2.0.)

    python bench/manager_scaling.py           # the default run
    python bench/manager_scaling.py --quick   # fewer rounds
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections import OrderedDict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvgate.impl.base import ReqContext, make_key  # noqa: E402
from kvgate.impl.manager import OffloadingManager  # noqa: E402
from kvgate.impl.policies.base import Resident  # noqa: E402

OFFER = 10
GOAL = 1.5


class Side:
    """One manager and a source of fresh keys; ``offers_per_batch`` requests offer each batch."""

    def __init__(self, label: str, manager: OffloadingManager, offers_per_batch: int):
        self.label = label
        self.m = manager
        self.offers_per_batch = offers_per_batch
        self._ids = itertools.count()
        self._reqs = itertools.count()

    def batch(self) -> list[bytes]:
        return [make_key(next(self._ids).to_bytes(8, "big")) for _ in range(OFFER)]

    def plan(self, batches: int) -> list[tuple[list[bytes], ReqContext]]:
        """The offers of ``batches`` batches, in order, with a new context per offer."""
        offers = []
        for _ in range(batches):
            keys = self.batch()
            for _ in range(self.offers_per_batch):
                offers.append((keys, ReqContext(f"r{next(self._reqs)}")))
        return offers

    def run(self, offers, timed: bool = True) -> float:
        """Make the offers, completing each store; the mean seconds per ``prepare_store``."""
        m, clock, total = self.m, time.perf_counter, 0.0
        for keys, ctx in offers:
            start = clock()
            out = m.prepare_store(keys, ctx)
            total += clock() - start
            if out is None:
                raise RuntimeError(f"{self.label}: an offer returned None")
            if out.keys_to_store:
                m.complete_store(out.keys_to_store)
        return total / len(offers)

    def warm(self, batches: int) -> None:
        self.run(self.plan(batches))


def calls_per_offer(side: Side, batches: int = 50) -> float:
    """Python and C function calls made inside one ``prepare_store``, on average: a measure of
    the work done that no other process on the machine can disturb."""
    calls = 0

    def profile(frame, event, arg):
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    offers = side.plan(batches)
    for keys, ctx in offers:
        sys.setprofile(profile)
        out = side.m.prepare_store(keys, ctx)
        sys.setprofile(None)
        if out.keys_to_store:
            side.m.complete_store(out.keys_to_store)
    return calls / len(offers)


def compare(title: str, small: Side, large: Side, rounds: int, batches: int) -> float:
    best = {small.label: float("inf"), large.label: float("inf")}
    ratios = []
    for _ in range(rounds):
        got = {}
        for side in (small, large):
            offers = side.plan(batches)
            got[side.label] = side.run(offers)
            best[side.label] = min(best[side.label], got[side.label])
        ratios.append(got[large.label] / got[small.label])
    ratio = statistics.median(ratios)
    print(title)
    for side in (small, large):
        print(f"  {side.label:<34} {best[side.label] * 1e6:8.2f} us per prepare_store"
              f"  ({calls_per_offer(side):.1f} function calls)")
    print(f"  ratio large/small, best rounds     {best[large.label] / best[small.label]:8.2f}")
    verdict = "ok" if ratio <= GOAL else f"ABOVE the goal of {GOAL}"
    print(f"  ratio large/small, median round    {ratio:8.2f}  ({verdict})")
    return ratio


def bare_dicts(rounds: int, batches: int) -> None:
    """The memory floor: an ``OrderedDict`` of n keys (recency order, key -> entry), doing per
    offer what the manager's LRU path must do at least: 10 evictions of the least recent keys
    (reading each entry) and 10 inserts of fresh ones. No manager code."""
    ids = itertools.count()

    def key() -> bytes:
        return make_key(next(ids).to_bytes(8, "big"))

    sides = {n: OrderedDict((key(), Resident(i)) for i in range(n)) for n in (100, 100_000)}
    best = dict.fromkeys(sides, float("inf"))
    clock = time.perf_counter
    for _ in range(rounds):
        for n, order in sides.items():
            plan = [[key() for _ in range(OFFER)] for _ in range(batches)]
            total = 0.0
            for keys in plan:
                start = clock()
                for k in keys:
                    _, entry = order.popitem(last=False)
                    order[k] = Resident(entry.chunk)
                total += clock() - start
            best[n] = min(best[n], total / batches)
    print(f"  floor: bare OrderedDict of entries, {best[100] * 1e6:5.2f} us and "
          f"{best[100_000] * 1e6:5.2f} us: ratio {best[100_000] / best[100]:.2f}")


def threshold_one(rounds: int, batches: int) -> float:
    sides = [Side(f"{n:,} chunks", OffloadingManager(n, store_threshold=1), 1)
             for n in (100, 100_000)]
    for side in sides:  # fill the cache, then one more batch so offers evict from now on
        side.warm(side.m.num_chunks // OFFER + 1)
        assert side.m.free_chunks == 0
    ratio = compare(f"store_threshold=1, {OFFER}-key offers of fresh keys, evicting:",
                    *sides, rounds, batches)
    bare_dicts(rounds, batches)
    return ratio


def threshold_two(rounds: int, batches: int, num_chunks: int = 1_000) -> float:
    sides = [Side(f"{n:,}-key tracker, {num_chunks:,} chunks",
                  OffloadingManager(num_chunks, store_threshold=2, max_tracker_size=n), 2)
             for n in (100, 64_000)]
    for side in sides:  # fill the tracker and the cache
        side.warm(max(side.m.tracker.max_size, num_chunks) // OFFER + 1)
        assert len(side.m.tracker.counts) == side.m.tracker.max_size
        assert side.m.free_chunks == 0
    return compare(f"store_threshold=2, each {OFFER}-key batch offered by 2 requests "
                   f"(count, then store), evicting:", *sides, rounds, batches)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--batches", type=int, default=500, help="batches per round")
    args = parser.parse_args(argv)
    rounds = args.rounds or (5 if args.quick else 30)
    print(f"Python {sys.version.split()[0]}, {rounds} rounds of {args.batches} batches, "
          f"best round kept\n")
    threshold_one(rounds, args.batches)
    print()
    threshold_two(rounds, args.batches)
    return 0


if __name__ == "__main__":
    sys.exit(main())
