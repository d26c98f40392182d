"""Per-call cost of ``prepare_store`` on a small and on a large manager, and their ratio.

How it works and why: docs/internals.md, section bench/manager_scaling.py.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import sys
import time
from collections import OrderedDict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvgate.impl.base import ReqContext, make_key
from kvgate.impl.manager import OffloadingManager
from kvgate.impl.policies.base import Resident

OFFER = 10
GOAL = 1.5


class Side:
    """One manager and a source of fresh keys; ``offers_per_batch`` requests offer each batch.
    ``key`` makes the manager's key of a block hash, ``context`` its request context."""

    def __init__(
        self,
        label: str,
        manager,
        offers_per_batch: int,
        num_chunks: int,
        key=make_key,
        context=ReqContext,
    ):
        self.label = label
        self.m = manager
        self.offers_per_batch = offers_per_batch
        self.num_chunks = num_chunks
        self.key, self.context = key, context
        self._ids = itertools.count()
        self._reqs = itertools.count()

    def batch(self) -> list:
        key = self.key
        return [key(next(self._ids).to_bytes(8, "big")) for _ in range(OFFER)]

    def plan(self, batches: int) -> list[tuple[list, object]]:
        """The offers of ``batches`` batches, in order, with a new context per offer."""
        offers = []
        for _ in range(batches):
            keys = self.batch()
            for _ in range(self.offers_per_batch):
                offers.append((keys, self.context(f"r{next(self._reqs)}")))
        return offers

    def after(self, out, ctx) -> None:
        """Untimed, after each offer: complete its store, drain the events, end the request."""
        m = self.m
        if out.keys_to_store:
            m.complete_store(out.keys_to_store, ctx)
        for _ in m.take_events() or ():
            pass
        m.on_request_finished(ctx)

    def run(self, offers, timed: bool = True) -> float:
        """Make the offers, completing each store; the mean seconds per ``prepare_store``."""
        m, clock, total, after = self.m, time.perf_counter, 0.0, self.after
        for keys, ctx in offers:
            start = clock()
            out = m.prepare_store(keys, ctx)
            total += clock() - start
            if out is None:
                raise RuntimeError(f"{self.label}: an offer returned None")
            after(out, ctx)
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
        side.after(out, ctx)
    return calls / len(offers)


def free_chunks(m) -> int:
    """Free chunks of impl's manager or of vLLM's (whose count is private)."""
    if hasattr(m, "free_chunks"):
        return m.free_chunks
    return m._get_num_free_chunks()


def tracker_keys(m) -> int:
    """Keys in the tracker of impl's manager or of vLLM's (its ``counts``)."""
    tracker = getattr(m, "tracker", None)
    return len(tracker.counts) if tracker is not None else len(m.counts)


def compare_many(pairs, rounds: int, batches: int) -> dict[str, dict]:
    """``pairs``: [(name, small side, large side)], all played interleaved, round by round.
    Per name: best µs of each side, calls per offer, and the large/small ratios (of the best
    rounds, and the median over rounds of the same round's ratio)."""
    sides = [side for _, small, large in pairs for side in (small, large)]
    best = {id(side): float("inf") for side in sides}
    ratios: dict[str, list[float]] = {name: [] for name, _, _ in pairs}
    for _ in range(rounds):
        got = {}
        for side in sides:
            got[id(side)] = side.run(side.plan(batches))
            best[id(side)] = min(best[id(side)], got[id(side)])
        for name, small, large in pairs:
            ratios[name].append(got[id(large)] / got[id(small)])
    return {
        name: dict(
            small_label=small.label,
            large_label=large.label,
            small_us=best[id(small)] * 1e6,
            large_us=best[id(large)] * 1e6,
            small_calls=calls_per_offer(small),
            large_calls=calls_per_offer(large),
            best_ratio=best[id(large)] / best[id(small)],
            median_ratio=statistics.median(ratios[name]),
        )
        for name, small, large in pairs
    }


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
        print(
            f"  {side.label:<34} {best[side.label] * 1e6:8.2f} us per prepare_store"
            f"  ({calls_per_offer(side):.1f} function calls)"
        )
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
    print(
        f"  floor: bare OrderedDict of entries, {best[100] * 1e6:5.2f} us and "
        f"{best[100_000] * 1e6:5.2f} us: ratio {best[100_000] / best[100]:.2f}"
    )


def threshold_one_sides(build=None, label: str = "", key=make_key, context=ReqContext):
    """The two sides of comparison 1, warmed; ``build(num_chunks, store_threshold,
    max_tracker_size)`` makes the manager (impl's by default)."""
    build = build or _impl
    sides = [
        Side(f"{label}{n:,} chunks", build(n, 1, 64_000), 1, n, key, context)
        for n in (100, 100_000)
    ]
    for side in sides:  # fill the cache, then one more batch so offers evict from now on
        side.warm(side.num_chunks // OFFER + 1)
        assert free_chunks(side.m) == 0
    return sides


def threshold_two_sides(
    build=None, label: str = "", key=make_key, context=ReqContext, num_chunks: int = 1_000
):
    """The two sides of comparison 2, warmed (tracker and cache full)."""
    build = build or _impl
    sides = []
    for n in (100, 64_000):
        side = Side(
            f"{label}{n:,}-key tracker, {num_chunks:,} chunks",
            build(num_chunks, 2, n),
            2,
            num_chunks,
            key,
            context,
        )
        side.warm(max(n, num_chunks) // OFFER + 1)
        assert tracker_keys(side.m) == n
        assert free_chunks(side.m) == 0
        sides.append(side)
    return sides


def _impl(num_chunks: int, store_threshold: int, max_tracker_size: int):
    return OffloadingManager(
        num_chunks, store_threshold=store_threshold, max_tracker_size=max_tracker_size
    )


def threshold_one(rounds: int, batches: int) -> float:
    small, large = threshold_one_sides()
    ratio = compare(
        f"store_threshold=1, {OFFER}-key offers of fresh keys, evicting:",
        small,
        large,
        rounds,
        batches,
    )
    bare_dicts(rounds, batches)
    return ratio


def threshold_two(rounds: int, batches: int, num_chunks: int = 1_000) -> float:
    small, large = threshold_two_sides(num_chunks=num_chunks)
    return compare(
        f"store_threshold=2, each {OFFER}-key batch offered by 2 requests "
        f"(count, then store), evicting:",
        small,
        large,
        rounds,
        batches,
    )


COMPARISONS = {
    "chunks": (
        threshold_one_sides,
        f"store_threshold=1, {OFFER}-key offers of fresh keys, evicting: 100 vs 100,000 chunks",
    ),
    "tracker": (
        threshold_two_sides,
        f"store_threshold=2, each {OFFER}-key batch offered by 2 "
        "requests (count, then store), evicting, 1,000 chunks: 100-key vs "
        "64,000-key tracker",
    ),
}


def child(rounds: int, batches: int) -> int:
    """In a release's environment: both comparisons, impl and this release's manager
    interleaved, as one JSON line."""
    import kvgate.impl.manager as impl_manager
    from kvgate.properties.engines.vllm.adapter import resolve_vllm

    target = resolve_vllm("vllm")
    adapter = target.adapter(target.factory(1, cache_policy="lru"))
    make = adapter.types.make_offload_key

    def vllm_build(num_chunks, store_threshold, max_tracker_size):
        return target.factory(
            num_chunks,
            cache_policy="lru",
            store_threshold=store_threshold,
            max_tracker_size=max_tracker_size,
        )

    results = {}
    for name, (sides_of, _) in COMPARISONS.items():
        pairs = [
            ("impl", *sides_of()),
            ("vllm", *sides_of(vllm_build, "vLLM ", lambda h: make(h, 0), adapter.new_context)),
        ]
        print(f"{name}: measuring", file=sys.stderr, flush=True)
        results[name] = compare_many(pairs, rounds, batches)
    print(
        json.dumps(
            {
                "results": results,
                "impl_file": impl_manager.__file__,
                "python": platform.python_version(),
            }
        )
    )
    return 0


def vllm_table(rounds: int, batches: int, progress=None) -> tuple[str, list[float]]:
    """The side-by-side table of impl and each built vLLM release (``child`` in each release's
    environment), and every median large/small ratio in it; ("", []) with no release built."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.release_envs import envs_dir, release_pythons, run_child

    found, missing = release_pythons()
    if not found:
        return "", []
    runs, notes, ratios = [], [], []
    for version, python in found:
        try:
            answer = run_child(
                python,
                "bench.manager_scaling",
                ["--child", "--rounds", str(rounds), "--batches", str(batches)],
                progress=progress,
            )
        except RuntimeError as exc:
            notes.append(f"vLLM {version} not measured: {exc}")
            continue
        runs.append((version, answer))
    notes += [f"vLLM {v} not measured: no environment at {envs_dir() / v}" for v in missing]
    out = [
        f"Per-call µs of prepare_store, impl beside vLLM: one process per release (in its "
        f"environment), impl and that release interleaved there; {rounds} rounds of "
        f"{batches} batches, best round per side; ratio = large / small (median round, "
        "best rounds in brackets); calls = function calls per prepare_store."
    ]
    for name, (_, title) in COMPARISONS.items():
        out += [
            "",
            f"{title}:",
            "",
            "| manager | process | small µs | large µs | large / small | calls small | "
            "calls large |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for version, answer in runs:
            for who in ("impl", "vllm"):
                r = answer["results"][name][who]
                ratios.append(r["median_ratio"])
                label = "impl" if who == "impl" else f"vLLM {version}"
                out.append(
                    f"| {label} | vLLM {version} env (python {answer['python']}) "
                    f"| {r['small_us']:.2f} | {r['large_us']:.2f} "
                    f"| {r['median_ratio']:.2f} ({r['best_ratio']:.2f}) "
                    f"| {r['small_calls']:.1f} | {r['large_calls']:.1f} |"
                )
    if notes:
        out += [""] + notes
    return "\n".join(out), ratios


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--batches", type=int, default=500, help="batches per round")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--no-vllm", action="store_true", help="impl only: skip the release environments"
    )
    args = parser.parse_args(argv)
    rounds = args.rounds or (5 if args.quick else 30)
    if args.child:  # inside a release's environment (see vllm_table)
        return child(rounds, args.batches)
    print(
        f"Python {sys.version.split()[0]}, {rounds} rounds of {args.batches} batches, "
        f"best round kept\n"
    )
    threshold_one(rounds, args.batches)
    print()
    threshold_two(rounds, args.batches)
    if not args.no_vllm:
        text, _ = vllm_table(
            rounds, args.batches, progress=lambda line: print(line, file=sys.stderr)
        )
        print()
        print(
            text or "vLLM not measured: no release environment is built (see bench/release_envs.py)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
