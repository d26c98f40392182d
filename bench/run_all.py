"""Every benchmark, one command: prints six tables, each with its goal, and can write them to a
results file with the date and a description of the machine.

How it works and why: docs/internals.md, section bench/run_all.py.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class Report:
    """Prints to stdout and keeps what it printed for the results file; progress goes to
    stderr only."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)

    def goal(self, text: str, met: bool) -> bool:
        """Print ``text`` with whether its goal is met; return ``met``."""
        self(f"{text}: {'met' if met else 'NOT met'}")
        return met

    def progress(self, text: str) -> None:
        print(f"  .. {text}", file=sys.stderr, flush=True)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def machine_description() -> list[str]:
    import hypothesis
    import torch

    cores = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    return [
        f"- platform: {platform.platform()}",
        f"- CPU: {_cpu_model()}, {cores} cores ({usable} usable by this process), "
        f"memory {_memory()}",
        f"- Python {platform.python_version()} ({platform.python_implementation()}), "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"hypothesis {hypothesis.__version__}",
        f"- commit: {_commit()}",
        f"- load average (1, 5, 15 min) at the start: {_load()}",
    ]


@contextlib.contextmanager
def _captured():
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        yield buffer


def table_bug_finding(report: Report, args) -> bool | None:
    from bench import bug_finding

    seeds = args.seeds or {"full": 10, "quick": 3, "smoke": 1}[args.level]
    shrink_seeds = (
        args.shrink_seeds
        if args.shrink_seeds is not None
        else {"full": 3, "quick": 1, "smoke": 0}[args.level]
    )
    names = list(bug_finding.MUTANTS)
    if args.level != "full":
        names = names[: args.variants or {"quick": 4, "smoke": 1}[args.level]]
    elif args.variants:
        names = names[: args.variants]
    report(
        f"Manager-vs-model machine, `ci` profile settings, seeds 0..{seeds - 1}; time and "
        f"examples to the first failure from runs without shrinking; shrunk length from "
        f"runs with shrinking (explain phase off) over the first {shrink_seeds} seed(s), "
        + (
            f"shrinking cut off after {args.shrink_cap:g} s (the lengths marked * were cut "
            "off: an upper bound)."
            if args.shrink_cap
            else "uncapped."
        )
    )
    report()
    rows = bug_finding.measure(
        names, seeds, shrink_seeds, args.shrink_cap, progress=report.progress
    )
    report(bug_finding.table(rows, seeds, shrink_seeds, args.shrink_cap))
    report()
    met, text = bug_finding.summary(rows)
    report(f"Goal: {text}")
    return met


def table_throughput(report: Report, args) -> bool | None:
    from bench import throughput

    report(
        "Each machine runs under the `ci` profile (derandomized) twice: as it stands (steps/s) "
        "and with timing proxies (the split, exclusive times). Model: model/ (or the worker "
        "machine's byte model); target: what is checked (the manager behind its adapter; for "
        "the scheduler machine the manager and the scheduler driver with its NullWorker); "
        "machine glue: the machine's rules and invariants less the model and target calls "
        "they make (for the scheduler machine, with the lockstep proxy's comparisons); "
        "Hypothesis: the rest (drawing steps and data, bundles, the engine)."
    )
    report()
    rows = throughput.measure(args.level, progress=report.progress)
    report(throughput.table(rows))
    report()
    met, text = throughput.goal(rows)
    report(f"Goal: {text}")
    gate_met, gate_text = throughput.default_gate(args.level)
    report(f"Goal: {gate_text}")
    return met and gate_met


def table_manager_speed(report: Report, args) -> bool | None:
    from bench import manager_speed

    spec, rows, why = manager_speed.measure(args.level, args.vllm, progress=report.progress)
    report(manager_speed.table(spec, rows, why))
    report()
    met, text = manager_speed.goal(rows)
    report(f"Goal: {text}")
    return met


def table_copy_bandwidth(report: Report, args) -> bool | None:
    from bench import worker_bandwidth

    threads = ["--threads", str(args.torch_threads)] if args.torch_threads else []
    report(
        "From `bench/worker_bandwidth.py` (its own output; CPU tensors; the worker's copy "
        "alone and its whole call against the fastest plain torch copy of the same bytes and "
        "a contiguous copy of as many bytes, median rounds"
        + (
            f"; torch limited to {args.torch_threads} thread(s) for every side, since two "
            "threads on a loaded two-core machine stall the copies at random"
            if threads
            else ""
        )
        + "):"
    )
    report()
    import torch

    saved = torch.get_num_threads()
    try:
        with _captured() as out:
            level = {"full": [], "quick": ["--quick"], "smoke": ["--smoke"]}[args.level]
            worker_bandwidth.main(level + threads)
    finally:
        torch.set_num_threads(saved)
    text = out.getvalue().rstrip()
    report(text)
    report()
    found = re.search(r"min ([\d.]+), geometric mean ([\d.]+)", text)
    if not found:
        report("Goal: copy bandwidth: the summary line was not found, see above")
        return None
    low, geo = float(found.group(1)), float(found.group(2))
    return report.goal(
        f"Goal: copy bandwidth: worker (copy alone) / fastest plain copy {low:.2f} at worst, "
        f"geometric mean {geo:.2f} (goal >= {worker_bandwidth.GOAL})",
        low >= worker_bandwidth.GOAL,
    )


def table_scaling(report: Report, args) -> bool | None:
    from bench import manager_scaling

    rounds, batches = {"full": (30, 500), "quick": (5, 100), "smoke": (1, 10)}[args.level]
    report(
        f"From `bench/manager_scaling.py` ({rounds} rounds of {batches} batches; its own output):"
    )
    report()
    with _captured() as out:
        chunks = manager_scaling.threshold_one(rounds, batches)
        print()
        tracker = manager_scaling.threshold_two(rounds, batches)
    report("```")
    report(out.getvalue().rstrip())
    report("```")
    report()
    goal = manager_scaling.GOAL
    return report.goal(
        f"Goal (that script's): cost per call large / small <= {goal:g}: 100,000 / 100 chunks "
        f"{chunks:.2f}, 64,000 / 100 tracker keys {tracker:.2f}",
        chunks <= goal and tracker <= goal,
    )


def table_mutation(report: Report, args) -> bool | None:
    from bench import mutation

    if args.mutation_run:
        mutation.main(["--run", "--max-children", str(args.mutation_workers)])
    results = mutation.load_results()
    report(
        "From `bench/mutation.py` (mutmut 3; a mutant counts as killed only if a state "
        "machine catches it; survivors classified in docs/mutation.md; "
        + (
            "measured now"
            if args.mutation_run
            else "the committed result, `--mutation-run` measures it again"
        )
        + "):"
    )
    report()
    report(mutation.table(results))
    report()
    met, text = mutation.goal_line(results)
    report(f"Goal: {text}")
    return met


SECTIONS = {
    1: ("Bug finding", table_bug_finding),
    2: ("Machine throughput", table_throughput),
    3: ("Manager speed", table_manager_speed),
    4: ("Copy bandwidth", table_copy_bandwidth),
    5: ("Scaling", table_scaling),
    6: ("Mutation score", table_mutation),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter runs (a minute or two)")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="the shortest runs that print every table (for tests; figures meaningless)",
    )
    ap.add_argument("--out", help="write the tables, date and machine to this file")
    ap.add_argument("--tables", default="1,2,3,4,5,6", help="which tables, e.g. 3,4")
    ap.add_argument("--seeds", type=int, help="table 1: seeds (default 10; --quick 3)")
    ap.add_argument(
        "--shrink-seeds", type=int, help="table 1: seeds with shrinking (default 3; --quick 1)"
    )
    ap.add_argument(
        "--shrink-cap",
        type=float,
        default=6.0,
        help="table 1: seconds of shrinking at most per run (0: Hypothesis's own)",
    )
    ap.add_argument(
        "--variants",
        type=int,
        default=None,
        help="table 1: the first N variants only (default: all; --quick 4)",
    )
    ap.add_argument("--vllm", default="vllm", help="table 3: vllm, or vllm=MODULE:ATTR")
    ap.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="table 4: torch threads for both sides (0: torch's default)",
    )
    ap.add_argument(
        "--mutation-run",
        action="store_true",
        help="table 6: run mutmut (python -m bench.mutation --run) instead of "
        "reading the committed result",
    )
    ap.add_argument("--mutation-workers", type=int, default=2, help="table 6: mutmut workers")
    args = ap.parse_args(argv)
    args.shrink_cap = args.shrink_cap or None
    args.level = "smoke" if args.smoke else "quick" if args.quick else "full"
    wanted = [int(t) for t in args.tables.split(",") if t.strip()]

    report = Report()
    started = time.perf_counter()
    now = datetime.datetime.now().astimezone()
    report(
        f"# kvgate benchmarks, {now:%Y-%m-%d %H:%M %Z}"
        + ("" if args.level == "full" else f" (--{args.level})")
    )
    report()
    report("Machine:")
    report()
    for line in machine_description():
        report(line)
    report()
    report(
        "Ratios are measured within one run. Times are wall-clock unless marked CPU; the "
        "machine may be shared, so compare with the load average."
    )
    goals: dict[int, bool | None] = {}
    for number in wanted:
        title, section = SECTIONS[number]
        report()
        report(f"## {number}. {title}")
        report()
        t0 = time.perf_counter()
        goals[number] = section(report, args)
        report()
        report(f"({time.perf_counter() - t0:.0f} s; load average now {_load()})")
    report()
    report("## Goals")
    report()
    for number, met in goals.items():
        verdict = {True: "met", False: "NOT met", None: "not measured"}[met]
        report(f"- {number}. {SECTIONS[number][0]}: {verdict}")
    report()
    report(f"Total: {time.perf_counter() - started:.0f} s; load average at the end: {_load()}.")
    if args.out:
        path = Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(report.text())
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
