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

from kvgate.argtypes import non_negative, positive
from kvgate.cli.display import add_progress_flag, live_progress
from kvgate.impl.traces import TraceError, load_trace
from kvgate.outputs import OutputError, check_output, write_atomic

from . import engine
from .engine import ReplayReport, ReplaySettings, ReplayTargetError, replay, resolve
from .plot import PlotUnavailable, plot_sweep, require_matplotlib
from .report import format_report, format_table, reports_json

DESCRIPTION = engine.__doc__.split("\n\n")[1]


# Counts the replay takes as flags: (flag, type, ReplaySettings field, help).
COUNTS = (
    ("--tracker-size", positive, "max_tracker_size", "max_tracker_size"),
    ("--blocks-per-chunk", positive, "blocks_per_chunk", "blocks per CPU chunk; one key per chunk"),
    ("--block-size", positive, "block_size", "tokens per block: the trace's hash granularity"),
    ("--max-running", positive, "max_running", "concurrent requests"),
    ("--gpu-blocks", positive, "gpu_blocks", "GPU KV blocks; running out preempts"),
    ("--prefill-tokens", positive, "prefill_tokens", "token budget per step, chunked prefill"),
    ("--store-delay", positive, "store_delay", "steps until a store job completes"),
    ("--load-delay", positive, "load_delay", "steps until a load job completes"),
    ("--reset-every", non_negative, "reset_every", "reset the cache every N steps; 0: never"),
    ("--fail-every", non_negative, "fail_every", "make every N-th store job's copy fail; 0: none"),
)

# Values the replay sweeps, each flag taking several (every combination runs):
# (flag, type, metavar, ReplaySettings field, help).
SWEPT = (
    ("--threshold", non_negative, "T", "store_threshold", "store_threshold values"),
    ("--num-chunks", positive, "N", "num_chunks", "CPU tier sizes in chunks"),
)
# Flags that set the ReplaySettings field of their own name, as given.
SAME_NAMED = ("policy", "worker", "device", "verify", "ms_per_step", "limit", "scheduler")


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    d = ReplaySettings()
    p.add_argument("trace", help="a JSONL request trace (Mooncake format)")
    p.add_argument(
        "--target",
        action="extend",
        nargs="+",
        metavar="SPEC",
        help="targets to replay against (impl, impl:arc, mutant:NAME, vllm, ...); default impl",
    )
    for flag, kind, metavar, field, what in SWEPT:
        p.add_argument(
            flag,
            action="extend",
            nargs="+",
            type=kind,
            metavar=metavar,
            help=f"{what} (default {getattr(d, field)})",
        )
    p.add_argument(
        "--policy",
        choices=("lru", "arc"),
        help="cache policy (default: the target's first: lru for impl, arc for impl:arc)",
    )
    for flag, kind, field, what in COUNTS:
        p.add_argument(
            flag, type=kind, default=getattr(d, field), help=f"{what} (default %(default)s)"
        )
    p.add_argument(
        "--worker",
        choices=("null", "copy"),
        default=d.worker,
        help="null: jobs complete after the delays, no bytes; copy: the GPU-copy "
        "worker moves real bytes (complete when copied; implies --verify) "
        "(default %(default)s)",
    )
    p.add_argument(
        "--device",
        default=d.device,
        help="the copy worker's device, e.g. cuda (default %(default)s)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="check that loads bring their blocks' data and stored chunks hold their keys' data",
    )
    p.add_argument(
        "--ms-per-step",
        type=float,
        default=d.ms_per_step,
        help="> 0: requests arrive by timestamp, one step = this many ms; "
        "0: in trace order as running slots free up (default %(default)s)",
    )
    p.add_argument("--limit", type=positive, help="replay only the first N requests")
    p.add_argument(
        "--scheduler",
        choices=("kvgate", "vllm"),
        default=d.scheduler,
        help="kvgate: the scheduler driver (impl); vllm: the installed vLLM's own Scheduler "
        "and OffloadingConnector, a vllm target behind it (default %(default)s)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="check every manager call against the model; stop at the first divergence",
    )
    p.add_argument(
        "--format",
        choices=("text", "md", "json"),
        default="text",
        help="report format (default %(default)s)",
    )
    p.add_argument(
        "--plot", metavar="FILE.png", help="plot hit rate and cold admissions against tier size"
    )
    p.add_argument(
        "--jobs", type=positive, default=1, help="runs in parallel processes (default %(default)s)"
    )
    add_progress_flag(p, "progress bar (default: when stderr is a terminal)")
    p.add_argument("--out", metavar="FILE", help="also write the report to FILE")
    p.add_argument("--json", metavar="FILE", help="also write every run's figures as JSON")
    return p


def add_replay_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "replay",
        help="replay a request trace through the scheduler",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=run_replay)
    return p


def _runs(args) -> list[tuple[str, ReplaySettings]]:
    counts = {field: getattr(args, flag[2:].replace("-", "_")) for flag, _, field, _ in COUNTS}
    base = ReplaySettings(**counts, **{field: getattr(args, field) for field in SAME_NAMED})
    targets = args.target or ["impl"]
    thresholds = args.threshold or [base.store_threshold]
    sizes = args.num_chunks or [base.num_chunks]
    return [
        (t, replace(base, store_threshold=th, num_chunks=n))
        for t, th, n in itertools.product(targets, thresholds, sizes)
    ]


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
            from rich.console import Console

            self._bar = live_progress(Console(stderr=True), remaining=True)
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def task(self, description: str, total: int) -> Callable[[int, int], None] | None:
        if self._bar is None:
            return None
        task = self._bar.add_task(description, total=total)
        return lambda done, tot: self._bar.update(task, completed=done, total=tot)


class ReplayUsageError(Exception):
    """A flag, path or value replay cannot use (exit 2, one line)."""


def check_device(args) -> None:
    """``--device`` names a torch device this torch can use, and only with the copy worker."""
    if args.worker != "copy":
        if args.device != ReplaySettings().device:
            raise ReplayUsageError(
                f"--device {args.device}: only the copy worker uses a device (add --worker copy)"
            )
        return
    import torch

    try:
        device = torch.device(args.device)
    except (RuntimeError, ValueError):
        raise ReplayUsageError(
            f"--device {args.device}: not a torch device (e.g. cpu, cuda, cuda:1)"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ReplayUsageError(
            f"--device {args.device}: this torch ({torch.__version__}) has no usable CUDA device"
        )
    try:
        torch.empty(1, device=device)
    except Exception as exc:  # any backend refusal is this one line
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ReplayUsageError(f"--device {args.device}: cannot allocate there: {first}") from None


def check_vllm_scheduler(runs) -> None:
    """``--scheduler vllm``: vLLM's scheduler imports, every target is a vLLM manager, and no
    flag asks for what that path cannot do."""
    from kvgate.properties.engines.vllm.configs import is_vllm_target, unavailable_reason

    from .vllm_path import unsupported

    for target, settings in runs:
        if not is_vllm_target(target):
            raise ReplayUsageError(
                f"--scheduler vllm: target {target!r} is not 'vllm' or "
                "'vllm=MODULE:ATTR' (vLLM's connector runs a vLLM manager)"
            )
        problem = unsupported(settings)
        if problem:
            raise ReplayUsageError(problem)
    why = unavailable_reason()
    if why:
        raise ReplayUsageError(f"--scheduler vllm: {why}")


def check_args(args):
    """Every flag, path and target checked before a run starts: the runs and the trace."""
    for flag, path in (("--out", args.out), ("--json", args.json), ("--plot", args.plot)):
        if path:
            check_output(flag, path)
    if args.plot:
        require_matplotlib()
    check_device(args)
    runs = _runs(args)
    if args.scheduler == "vllm":
        check_vllm_scheduler(runs)
    resolved = {t: resolve(t) for t in dict.fromkeys(t for t, _ in runs)}
    try:
        trace = load_trace(args.trace, args.limit)
    except FileNotFoundError:
        raise ReplayUsageError(f"{args.trace}: no such trace file") from None
    except IsADirectoryError:
        raise ReplayUsageError(f"{args.trace}: a directory, not a trace file") from None
    except OSError as e:
        raise ReplayUsageError(f"{args.trace}: cannot read it ({e.strerror or e})") from None
    if not trace:
        raise ReplayUsageError(f"{args.trace}: no requests in it (an empty trace)")
    return runs, resolved, trace


def run_replay(args) -> int:
    try:
        runs, resolved, trace = check_args(args)
    except (ReplayTargetError, ReplayUsageError, OutputError, PlotUnavailable, TraceError) as e:
        print(
            f"kvgate replay: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
            file=sys.stderr,
        )
        return 2
    show = sys.stderr.isatty() if args.progress is None else args.progress
    reports: list[ReplayReport] = []
    with _Progress(show) as bar:
        if args.jobs > 1 and len(runs) > 1:
            done_cb = bar.task(f"{len(runs)} replays", len(runs))
            by_index: dict[int, ReplayReport] = {}
            with ProcessPoolExecutor(args.jobs) as pool:
                futures = {
                    pool.submit(_run_one, args.trace, t, s, args.check): i
                    for i, (t, s) in enumerate(runs)
                }
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
                text += (
                    f"\n\n{r.target} T={r.settings.store_threshold} "
                    f"chunks={r.settings.num_chunks}: {r.divergence}"
                )
    print(text)
    try:
        write_outputs(args, text, reports)
    except OutputError as e:  # a write that failed after the check passed (a full disk)
        print(f"kvgate replay: {e}", file=sys.stderr)
        return 2
    return 1 if any(r.divergence or r.data_errors for r in reports) else 0


def write_outputs(args, text: str, reports: Sequence[ReplayReport]) -> None:
    """The report, the figures and the plot, each where a flag asked for it."""
    if args.out:
        write_atomic(args.out, text + "\n", flag="--out")
    if args.json:
        write_atomic(args.json, reports_json(reports) + "\n", flag="--json")
    if args.plot:
        plot_sweep(reports, args.plot, title=Path(args.trace).name)
        print(f"plot written to {args.plot}", file=sys.stderr)


def main_replay(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kvgate replay",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run_replay(parser.parse_args(argv))
