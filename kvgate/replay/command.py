"""The command line of ``kvgate replay`` (and ``python -m kvgate.replay``): flags to settings,
the runs, and the report written where asked."""
from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path

from kvgate.impl.traces import TraceError, load_trace

from . import engine
from .engine import ReplayReport, ReplaySettings, ReplayTargetError, replay, resolve
from .plot import plot_sweep
from .report import format_report, format_table, reports_json

DESCRIPTION = engine.__doc__.split("\n\n")[1]


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    d = ReplaySettings()
    p.add_argument("trace", help="a JSONL request trace (Mooncake format)")
    p.add_argument("--target", action="extend", nargs="+", metavar="SPEC",
                   help="targets to replay against (impl, impl:arc, mutant:NAME, vllm, ...); "
                        "default impl")
    p.add_argument("--threshold", action="extend", nargs="+", type=_non_negative, metavar="T",
                   help=f"store_threshold values (default {d.store_threshold})")
    p.add_argument("--num-chunks", action="extend", nargs="+", type=_non_negative, metavar="N",
                   help=f"CPU tier sizes in chunks (default {d.num_chunks})")
    p.add_argument("--tracker-size", type=_positive, default=d.max_tracker_size,
                   help="max_tracker_size (default %(default)s)")
    p.add_argument("--policy", choices=("lru", "arc"), help="cache policy (default: the "
                   "target's first: lru for impl, arc for impl:arc)")
    p.add_argument("--blocks-per-chunk", type=_positive, default=d.blocks_per_chunk,
                   help="blocks per CPU chunk; one key per chunk (default %(default)s)")
    p.add_argument("--block-size", type=_positive, default=d.block_size,
                   help="tokens per block: the trace's hash granularity (default %(default)s)")
    p.add_argument("--max-running", type=_positive, default=d.max_running,
                   help="concurrent requests (default %(default)s)")
    p.add_argument("--gpu-blocks", type=_positive, default=d.gpu_blocks,
                   help="GPU KV blocks; running out preempts (default %(default)s)")
    p.add_argument("--prefill-tokens", type=_positive, default=d.prefill_tokens,
                   help="token budget per step, chunked prefill (default %(default)s)")
    p.add_argument("--store-delay", type=_positive, default=d.store_delay,
                   help="steps until a store job completes (default %(default)s)")
    p.add_argument("--load-delay", type=_positive, default=d.load_delay,
                   help="steps until a load job completes (default %(default)s)")
    p.add_argument("--reset-every", type=_non_negative, default=d.reset_every,
                   help="reset the cache every N steps; 0: never (default %(default)s)")
    p.add_argument("--fail-every", type=_non_negative, default=d.fail_every,
                   help="make every N-th store job's copy fail; 0: none (default %(default)s)")
    p.add_argument("--worker", choices=("null", "copy"), default=d.worker,
                   help="null: jobs complete after the delays, no bytes; copy: the GPU-copy "
                        "worker moves real bytes (complete when copied; implies --verify) "
                        "(default %(default)s)")
    p.add_argument("--device", default=d.device,
                   help="the copy worker's device, e.g. cuda (default %(default)s)")
    p.add_argument("--verify", action="store_true",
                   help="check that loads bring their blocks' data and stored chunks hold "
                        "their keys' data")
    p.add_argument("--ms-per-step", type=float, default=d.ms_per_step,
                   help="> 0: requests arrive by timestamp, one step = this many ms; "
                        "0: in trace order as running slots free up (default %(default)s)")
    p.add_argument("--limit", type=_positive, help="replay only the first N requests")
    p.add_argument("--check", action="store_true",
                   help="check every manager call against the model; stop at the first "
                        "divergence")
    p.add_argument("--format", choices=("text", "md", "json"), default="text",
                   help="report format (default %(default)s)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="plot hit rate and cold admissions against tier size")
    p.add_argument("--jobs", type=_positive, default=1,
                   help="runs in parallel processes (default %(default)s)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar (default: when stderr is a terminal)")
    p.add_argument("--out", metavar="FILE", help="also write the report to FILE")
    p.add_argument("--json", metavar="FILE", help="also write every run's figures as JSON")
    return p


def add_replay_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("replay", help="replay a request trace through the scheduler",
                              description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run_replay)
    return p


def _runs(args) -> list[tuple[str, ReplaySettings]]:
    base = ReplaySettings(max_tracker_size=args.tracker_size, policy=args.policy,
                          blocks_per_chunk=args.blocks_per_chunk, block_size=args.block_size,
                          max_running=args.max_running, gpu_blocks=args.gpu_blocks,
                          prefill_tokens=args.prefill_tokens, store_delay=args.store_delay,
                          load_delay=args.load_delay, reset_every=args.reset_every,
                          fail_every=args.fail_every, worker=args.worker,
                          device=args.device, verify=args.verify,
                          ms_per_step=args.ms_per_step, limit=args.limit)
    targets = args.target or ["impl"]
    thresholds = args.threshold or [base.store_threshold]
    sizes = args.num_chunks or [base.num_chunks]
    return [(t, replace(base, store_threshold=th, num_chunks=n))
            for t, th, n in itertools.product(targets, thresholds, sizes)]


def _run_one(trace_path: str, target: str, settings: ReplaySettings, check: bool):
    trace = load_trace(trace_path, settings.limit)
    return replay(trace, target, settings, check=check)


class _Progress:
    """A progress bar on stderr (rich), updated at most every 256 steps."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._bar = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)
            from rich.console import Console
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=Console(stderr=True), transient=True)
            self._bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def task(self, description: str, total: int) -> Callable[[int, int], None] | None:
        if self._bar is None:
            return None
        task = self._bar.add_task(description, total=total)
        return lambda done, tot: self._bar.update(task, completed=done, total=tot)


def run_replay(args) -> int:
    try:
        runs = _runs(args)
        resolved = {t: resolve(t) for t in dict.fromkeys(t for t, _ in runs)}
    except ReplayTargetError as e:
        print(f"kvgate replay: {e}", file=sys.stderr)
        return 2
    try:
        trace = load_trace(args.trace, args.limit)
    except (OSError, TraceError) as e:
        print(f"kvgate replay: {e}", file=sys.stderr)
        return 2
    show = sys.stderr.isatty() if args.progress is None else args.progress
    reports: list[ReplayReport] = []
    with _Progress(show) as bar:
        if args.jobs > 1 and len(runs) > 1:
            done_cb = bar.task(f"{len(runs)} replays", len(runs))
            by_index: dict[int, ReplayReport] = {}
            with ProcessPoolExecutor(args.jobs) as pool:
                futures = {pool.submit(_run_one, args.trace, t, s, args.check): i
                           for i, (t, s) in enumerate(runs)}
                for fut in as_completed(futures):
                    by_index[futures[fut]] = fut.result()
                    if done_cb:
                        done_cb(len(by_index), len(runs))
            reports = [by_index[i] for i in range(len(runs))]
        else:
            for t, s in runs:
                cb = bar.task(f"{t} T={s.store_threshold} chunks={s.num_chunks}", len(trace))
                reports.append(replay(trace, resolved[t], s, check=args.check, progress=cb))
    if args.format == "json":
        text = reports_json(reports)
    elif len(reports) == 1 and args.format == "text":
        text = format_report(reports[0])
    else:
        text = format_table(reports, args.format)
        for r in reports:
            if r.divergence:
                text += f"\n\n{r.target} T={r.settings.store_threshold} " \
                        f"chunks={r.settings.num_chunks}: {r.divergence}"
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(reports_json(reports) + "\n")
    if args.plot:
        plot_sweep(reports, args.plot, title=Path(args.trace).name)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 1 if any(r.divergence or r.data_errors for r in reports) else 0


def main_replay(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvgate replay", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run_replay(parser.parse_args(argv))
