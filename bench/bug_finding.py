"""Table 1: how fast the manager-vs-model machine finds each catalogued known-bad manager.

How it works and why: docs/internals.md, section bench/bug_finding.py.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field

from hypothesis import Phase
from hypothesis.database import InMemoryExampleDatabase

from kvgate.properties.catalogue.managers import MUTANTS
from kvgate.properties.manager_machine import make_machine
from kvgate.properties.runner import run_machine
from kvgate.properties.search.hypothesis_private import mark_unshrunk, shrinking_deadline
from kvgate.properties.targets import resolve_target

GOAL_SECONDS = 2.0
NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]
SHRINK = [*NO_SHRINK, Phase.shrink]


@dataclass
class FirstFailure:
    found: bool
    seconds: float  # wall, to the end of the first failing example (or of the run)
    cpu_seconds: float
    examples: int  # examples run, the failing one included
    length: int  # steps of the failing example, unshrunk


@dataclass
class Shrunk:
    found: bool
    length: int
    capped: bool
    seconds: float


@dataclass
class VariantRow:
    name: str
    policies: tuple[str, ...]
    first: list[FirstFailure] = field(default_factory=list)
    shrunk: list[Shrunk] = field(default_factory=list)

    def _median(self, values):
        return statistics.median(values) if values else float("nan")

    @property
    def found(self) -> list[FirstFailure]:
        return [f for f in self.first if f.found]

    def median(self, field: str) -> float:
        """The median of one field of the first failures found (``seconds``, ``examples``...)."""
        return self._median([getattr(f, field) for f in self.found])

    @property
    def median_shrunk(self) -> float:
        return self._median([s.length for s in self.shrunk if s.found])

    @property
    def meets_goal(self) -> bool:
        return len(self.found) == len(self.first) and self.median("seconds") < GOAL_SECONDS


def _stamped(machine_cls, stamps: list):
    """``machine_cls`` recording the wall and CPU clocks at the end of every example."""

    class Stamped(machine_cls):
        def teardown(self):
            try:  # a divergence found by teardown's own final checks ends the example too
                super().teardown()
            finally:
                stamps.append((time.perf_counter(), time.process_time()))

    # The same name: the runner keys on it (database, derandomization).
    Stamped.__name__ = Stamped.__qualname__ = machine_cls.__name__
    return Stamped


def first_failure(machine_cls, seed: int, profile: str = "ci", database=None) -> FirstFailure:
    stamps: list[tuple[float, float]] = []
    start, cpu_start = time.perf_counter(), time.process_time()
    result = run_machine(
        _stamped(machine_cls, stamps), profile, seed=seed, phases=NO_SHRINK, database=database
    )
    if result.passed:
        end, cpu_end = stamps[-1] if stamps else (time.perf_counter(), time.process_time())
        return FirstFailure(False, end - start, cpu_end - cpu_start, result.examples, 0)
    # Without shrinking, Hypothesis runs the failing example once more for its report: the
    # failing example is the one before last.
    end, cpu_end = stamps[-2] if len(stamps) >= 2 else stamps[-1]
    return FirstFailure(
        True, end - start, cpu_end - cpu_start, max(1, result.examples - 1), result.shrunk_steps
    )


def shrunk_length(
    machine_cls, seed: int, profile: str = "ci", cap: float | None = None, database=None
) -> Shrunk:
    """Shrink the seed's failure; with the ``database`` its first-failure run saved the
    failing example in, shrinking starts from it at once instead of finding it again."""
    if database is not None:
        mark_unshrunk(database)
    with shrinking_deadline(cap) as notes:
        result = run_machine(machine_cls, profile, seed=seed, phases=SHRINK, database=database)
    capped = any("very slow progress" in n for n in notes)
    return Shrunk(not result.passed, result.shrunk_steps, capped, result.seconds)


def measure(
    names=None,
    seeds: int = 10,
    shrink_seeds: int = 3,
    shrink_cap: float | None = 6.0,
    profile: str = "ci",
    progress=None,
) -> list[VariantRow]:
    rows = []
    for name in names or MUTANTS:
        mutant = MUTANTS[name]
        machine = make_machine(resolve_target(f"mutant:{name}"))
        row = VariantRow(name, mutant.policies)
        databases = [InMemoryExampleDatabase() for _ in range(min(shrink_seeds, seeds))]
        for seed in range(seeds):
            db = databases[seed] if seed < len(databases) else None
            row.first.append(first_failure(machine, seed, profile, db))
        for seed, db in enumerate(databases):
            row.shrunk.append(shrunk_length(machine, seed, profile, shrink_cap, db))
        rows.append(row)
        if progress:
            progress(
                f"{name}: {row.median('seconds'):.2f} s, {row.median('examples'):g} examples, "
                f"shrunk to {row.median_shrunk:g} steps"
            )
    return rows


def _fmt(x: float, spec: str) -> str:
    return "-" if x != x else format(x, spec)


def table(rows: list[VariantRow], seeds: int, shrink_seeds: int, shrink_cap: float | None) -> str:
    cap = f", cut off at {shrink_cap:g} s: *" if shrink_cap else ""
    out = [
        f"| variant | policies | found | median s to 1st failure (CPU s) "
        f"| median examples | median failing length | median shrunk length "
        f"(each of {shrink_seeds} seed{'s' if shrink_seeds != 1 else ''}{cap}) "
        f"| < {GOAL_SECONDS:g} s |",
        "|---|---|---:|---:|---:|---:|---:|:---:|",
    ]
    for r in rows:
        lengths = "/".join(
            f"{s.length}{'*' if s.capped else ''}" if s.found else "-" for s in r.shrunk
        )
        shrunk = f"{_fmt(r.median_shrunk, 'g')} ({lengths})" if r.shrunk else "-"
        out.append(
            f"| {r.name} | {','.join(r.policies)} | {len(r.found)}/{len(r.first)} "
            f"| {_fmt(r.median('seconds'), '.2f')} ({_fmt(r.median('cpu_seconds'), '.2f')}) "
            f"| {_fmt(r.median('examples'), 'g')} | {_fmt(r.median('length'), 'g')} "
            f"| {shrunk} | {'yes' if r.meets_goal else 'NO'} |"
        )
    return "\n".join(out)


def summary(rows: list[VariantRow]) -> tuple[bool, str]:
    slow = [r.name for r in rows if not r.meets_goal]
    times = [r.median("seconds") for r in rows]
    cpu_slow = [r.name for r in rows if not (r.median("cpu_seconds") < GOAL_SECONDS)]
    met = not slow
    text = (
        f"bug finding: {len(rows) - len(slow)}/{len(rows)} variants found in a median under "
        f"{GOAL_SECONDS:g} s (worst median {max(times):.2f} s)"
        + ("" if met else f"; over the goal: {', '.join(slow)}")
        + f"; in CPU time {len(rows) - len(cpu_slow)}/{len(rows)} under {GOAL_SECONDS:g} s"
        + f": {'met' if met else 'NOT met'}"
    )
    return met, text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 seeds, 1 shrinking seed")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--shrink-seeds", type=int, default=None)
    ap.add_argument("--shrink-cap", type=float, default=6.0)
    ap.add_argument("variants", nargs="*", help="variant names (default: all)")
    args = ap.parse_args(argv)
    seeds = args.seeds or (3 if args.quick else 10)
    shrink_seeds = args.shrink_seeds if args.shrink_seeds is not None else (1 if args.quick else 3)
    rows = measure(args.variants or None, seeds, shrink_seeds, args.shrink_cap, progress=print)
    print(table(rows, seeds, shrink_seeds, args.shrink_cap))
    print(summary(rows)[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
