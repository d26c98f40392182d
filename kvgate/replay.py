"""Replay a request trace through the scheduler driver, against any target of the gate.

``kvgate replay TRACE [--target SPEC ...] [--threshold T ...] [--num-chunks N ...] [--check]``
(the same as ``python -m kvgate replay TRACE ...``).

The replay: requests arrive in trace order (back-pressure: at most ``--max-running`` wait at a
time, or by timestamp with ``--ms-per-step``), are admitted while fewer than ``--max-running``
run, prefill in chunks of at most ``--prefill-tokens`` tokens per step (a token budget shared by
all running requests), then decode one token per step until ``output_length`` tokens. Each step
offers every running request's new complete chunks; store jobs complete ``--store-delay`` steps
later, loads ``--load-delay`` steps later; ``None`` is retried at the next step and once more
after the request finishes; a request that needs a GPU block when none is free preempts the
latest running request, which later resumes and re-offers from chunk 0 through the same
context; ``--reset-every`` resets the cache every that many steps, and ``--fail-every`` makes
every that many-th store copy fail. Every parameter is a flag.

The report per run: requests, offers, admissions, cold admissions (chunks admitted while fewer
than ``store_threshold`` distinct requests had offered them; a reset starts the requests'
offers over, as SPEC A7 starts their counting over), skips (the manager's metric), allocation
failures, preemptions, evictions, and the CPU tier's prefix hit rate (at each request's first
admission: the chunks its lookup hit over the chunks it could have loaded). Store accounting:
admitted = completed + failed + dropped by a reset + still in flight.

With ``--check`` the reference model checks every manager call in lockstep and the run stops at
the first divergence, printing the step and the call. Given several targets, thresholds or tier
sizes, the runs form one comparison table; ``--plot FILE.png`` draws hit rate and cold
admissions against tier size.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kvgate.impl.scheduler import Scheduler
from kvgate.impl.traces import TRACE_BLOCK_SIZE, TraceError, TraceRequest, load_trace

from kvgate.properties.audit import Audit
from kvgate.properties.oracle import Divergence, LockstepManager
from kvgate.properties.null_worker import NullWorker
from kvgate.properties.targets import TargetError, resolve_target


# --------------------------------------------------------------------------- targets

class ReplayTargetError(Exception):
    """A target that cannot be resolved or built."""


def resolve(spec: str):
    """The gate's target (``properties.targets.resolve_target``), errors as ReplayTargetError."""
    try:
        return resolve_target(spec)
    except TargetError as e:
        raise ReplayTargetError(str(e)) from None


# --------------------------------------------------------------------------- settings, report

@dataclass(frozen=True)
class ReplaySettings:
    """One run's parameters (each one a command-line flag)."""

    num_chunks: int = 1024  # CPU tier size, in chunks
    store_threshold: int = 2
    max_tracker_size: int = 64_000
    policy: str | None = None  # None: the target's first policy (lru for impl)
    blocks_per_chunk: int = 1
    block_size: int = TRACE_BLOCK_SIZE  # tokens per block (the trace's hash granularity)
    max_running: int = 16
    gpu_blocks: int = 1024
    prefill_tokens: int = 8192  # token budget per step
    store_delay: int = 2
    load_delay: int = 1
    reset_every: int = 0  # steps between cache resets; 0: never
    fail_every: int = 0  # every N-th store job's copy fails; 0: none (null worker)
    worker: str = "null"  # "null": no bytes, jobs complete after the delays; "copy": impl.worker
    device: str = "cpu"  # the copy worker's KV tensors
    verify: bool = False  # check data: loads bring their blocks, chunks hold their keys' blocks
    ms_per_step: float = 0.0  # > 0: arrivals by timestamp; 0: back-pressure
    limit: int | None = None  # first N requests of the trace


@dataclass
class ReplayReport:
    target: str
    settings: ReplaySettings
    requests: int = 0
    finished: int = 0
    steps: int = 0
    offers: int = 0
    admitted: int = 0
    cold_admissions: int = 0
    skips: int = 0
    allocation_failures: int = 0
    retries: int = 0
    finish_retries: int = 0
    preemptions: int = 0
    evictions: int = 0
    resets: int = 0
    stores_completed: int = 0
    stores_failed: int = 0
    stores_stale: int = 0
    stores_in_flight: int = 0
    loads: int = 0
    prefix_chunks: int = 0
    prefix_hits: int = 0
    hit_rate: float = 0.0
    seconds: float = 0.0
    checked: bool = False
    divergence: str | None = None
    data_errors: int | None = None  # None: data not verified
    data_error_examples: list[str] = field(default_factory=list)
    cold_examples: list[str] = field(default_factory=list)

    @property
    def policy(self) -> str:
        return self.settings.policy or "lru"

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["settings"] = asdict(self.settings)
        return d

    def accounting_ok(self) -> bool:
        return self.admitted == (self.stores_completed + self.stores_failed + self.stores_stale
                                 + self.stores_in_flight)


# --------------------------------------------------------------------------- the replay

def replay(trace: Sequence[TraceRequest], target: str | Any = "impl",
           settings: ReplaySettings = ReplaySettings(), *, check: bool = False,
           progress: Callable[[int, int], None] | None = None,
           worker: Any | None = None) -> ReplayReport:
    """Replay ``trace`` against ``target`` (a spec or a resolved target) under ``settings``.
    ``worker``: a worker to use instead of the one ``settings.worker`` names."""
    s = settings
    tgt = resolve(target) if isinstance(target, str) else target
    policy = s.policy or tgt.policies[0]
    s = replace(s, policy=policy)
    if s.limit is not None:
        trace = trace[:s.limit]
    manager = tgt.make(s.num_chunks, policy, s.store_threshold, s.max_tracker_size)
    proxy = None
    if check:
        from kvgate.model.cache import Model
        proxy = LockstepManager(manager, Model(s.num_chunks, policy, s.store_threshold,
                                               s.max_tracker_size),
                                foreign=getattr(tgt, "foreign", False))
        manager = proxy
    verify = s.verify or s.worker == "copy"
    if worker is not None:
        pass
    elif s.worker == "copy":
        from kvgate.properties.tagged_worker import TaggedCopyWorker
        worker = TaggedCopyWorker(s.gpu_blocks, s.num_chunks, s.blocks_per_chunk,
                                  device=s.device)
    else:
        worker = NullWorker(delay=s.store_delay, blocks_per_chunk=s.blocks_per_chunk,
                            load_delay=s.load_delay, fail_every=s.fail_every, track_data=verify)
    audit = Audit(manager, worker, s.store_threshold, s.blocks_per_chunk, data=verify)

    def on_step(step: int) -> None:
        audit.set_step(step)
        if proxy is not None:
            proxy.set_step(step)

    sched = Scheduler(audit.manager, audit.worker, block_size=s.block_size,
                      blocks_per_chunk=s.blocks_per_chunk, num_gpu_blocks=s.gpu_blocks,
                      max_running=s.max_running, max_tokens_per_step=s.prefill_tokens,
                      on_step=on_step)
    report = ReplayReport(getattr(tgt, "spec", str(target)), s, checked=check)
    total = len(trace)
    started = time.perf_counter()
    nxt = 0
    try:
        while True:
            if s.ms_per_step > 0:
                now_ms = sched.step_no * s.ms_per_step
                while nxt < total and trace[nxt].timestamp <= now_ms:
                    audit.expect(sched.add_request(trace[nxt].to_request(f"r{nxt}", s.block_size)))
                    nxt += 1
            else:
                while nxt < total and len(sched.waiting) < s.max_running:
                    audit.expect(sched.add_request(trace[nxt].to_request(f"r{nxt}", s.block_size)))
                    nxt += 1
            if nxt >= total and sched.idle:
                break
            sched.step()
            if s.reset_every and sched.step_no % s.reset_every == 0:
                sched.reset()
            if progress is not None and not sched.step_no & 255:
                progress(sched.counters.finished, total)
    except Divergence as e:
        report.divergence = str(e)
    report.seconds = time.perf_counter() - started
    if progress is not None:
        progress(sched.counters.finished, total)
    c = sched.counters
    report.cold_admissions = audit.cold_admissions
    for name in ("requests", "finished", "steps", "offers", "admitted",
                 "skips", "allocation_failures", "retries", "finish_retries", "preemptions",
                 "evictions", "resets", "stores_completed", "stores_failed", "stores_stale",
                 "loads", "prefix_chunks", "prefix_hits"):
        setattr(report, name, getattr(c, name))
    report.stores_in_flight = c.stores_in_flight()
    if verify:
        errors = audit.data_errors + audit.stored_data_errors()
        report.data_errors = len(errors)
        report.data_error_examples = errors[:5]
    report.hit_rate = c.hit_rate
    from kvgate.properties.oracle import fmt_key
    report.cold_examples = [f"step {st}: {fmt_key(k)} offered by {n}" for st, k, n in audit.cold[:5]]
    return report


# --------------------------------------------------------------------------- tables and plots

COLUMNS = (("target", "target"), ("policy", "policy"), ("T", "store_threshold"),
           ("chunks", "num_chunks"), ("requests", "requests"), ("offers", "offers"),
           ("admitted", "admitted"), ("cold", "cold_admissions"), ("skips", "skips"),
           ("alloc fail", "allocation_failures"), ("preempt", "preemptions"),
           ("evictions", "evictions"), ("hit rate", "hit_rate"), ("s", "seconds"))


def _cell(report: ReplayReport, attr: str) -> str:
    if attr in ("store_threshold", "num_chunks"):
        return str(getattr(report.settings, attr))
    if attr == "policy":
        return report.policy
    value = getattr(report, attr)
    if attr == "hit_rate":
        return f"{value:.4f}"
    if attr == "seconds":
        return f"{value:.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table_rows(reports: Sequence[ReplayReport]) -> list[list[str]]:
    rows = []
    for r in reports:
        row = [_cell(r, attr) for _, attr in COLUMNS]
        if r.checked:
            row[0] += " (checked" + (", DIVERGED)" if r.divergence else ")")
        rows.append(row)
    return rows


def format_table(reports: Sequence[ReplayReport], fmt: str = "text") -> str:
    head = [name for name, _ in COLUMNS]
    rows = table_rows(reports)
    if fmt == "md":
        out = ["| " + " | ".join(head) + " |",
               "|" + "|".join("---" if i < 2 else "---:" for i in range(len(head))) + "|"]
        out += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(out)
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) if i < 2 else c.rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in rows])


def format_report(r: ReplayReport) -> str:
    s = r.settings
    lines = [
        f"target {r.target} ({r.policy}), tier {s.num_chunks} chunks of {s.blocks_per_chunk} "
        f"block(s) of {s.block_size} tokens, store_threshold {s.store_threshold}, "
        f"tracker {s.max_tracker_size}",
        f"  requests            {r.requests:,} ({r.finished:,} finished, {r.steps:,} steps, "
        f"{r.seconds:.1f} s)",
        f"  offers              {r.offers:,} ({r.retries:,} retries after None, "
        f"{r.finish_retries:,} at finish)",
        f"  admissions          {r.admitted:,} = {r.stores_completed:,} completed + "
        f"{r.stores_failed:,} failed + {r.stores_stale:,} dropped by resets + "
        f"{r.stores_in_flight:,} in flight",
        f"  cold admissions     {r.cold_admissions:,}",
        f"  skips               {r.skips:,}",
        f"  allocation failures {r.allocation_failures:,}",
        f"  preemptions         {r.preemptions:,}",
        f"  evictions           {r.evictions:,}",
        f"  resets              {r.resets:,}",
        f"  prefix hit rate     {r.hit_rate:.4f} ({r.prefix_hits:,} of {r.prefix_chunks:,} "
        f"chunks; {r.loads:,} loaded)",
    ]
    if r.checked:
        lines.append("  lockstep check      " + ("DIVERGED" if r.divergence else
                                                 "every manager call agreed with the model"))
    if r.data_errors is not None:
        lines.append(f"  data                {r.data_errors} error(s)" + (
            "" if r.data_errors else ": every load brought its blocks, every stored chunk "
            "holds its key's blocks"))
        lines += [f"  data error: {e}" for e in r.data_error_examples]
    if r.divergence:
        lines.append(r.divergence)
    for example in r.cold_examples:
        lines.append(f"  cold: {example}")
    return "\n".join(lines)


def plot_sweep(reports: Sequence[ReplayReport], path: str | Path, title: str = "") -> Path:
    """Hit rate and cold admissions against tier size, one line per (target, threshold):
    colour for the threshold, line style and marker for the target."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    series: dict[tuple[str, int], list[ReplayReport]] = {}
    for r in reports:
        series.setdefault((r.target, r.settings.store_threshold), []).append(r)
    targets = list(dict.fromkeys(r.target for r in reports))
    styles = [("-", "o", 7), ("--", "x", 9), (":", "s", 6), ("-.", "^", 6)]
    sizes = sorted({r.settings.num_chunks for r in reports})
    fig, (ax_hit, ax_cold) = plt.subplots(1, 2, figsize=(11, 4.4))
    for (target, threshold), rs in sorted(series.items(),
                                          key=lambda kv: (targets.index(kv[0][0]), kv[0][1])):
        rs = sorted(rs, key=lambda r: r.settings.num_chunks)
        xs = [r.settings.num_chunks for r in rs]
        line, marker, size = styles[targets.index(target) % len(styles)]
        style = dict(linestyle=line, marker=marker, markersize=size, color=f"C{threshold}",
                     label=f"{target}, T={threshold}", alpha=0.85)
        ax_hit.plot(xs, [r.hit_rate for r in rs], **style)
        ax_cold.plot(xs, [r.cold_admissions for r in rs], **style)
    top = max([r.cold_admissions for r in reports] + [1])
    ax_cold.set_ylim(-0.04 * top, 1.12 * top)
    for ax, label in ((ax_hit, "CPU-tier prefix hit rate"),
                      (ax_cold, "cold admissions (chunks)")):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(sizes))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([str(n) for n in sizes])
        ax.set_xlabel("CPU tier size (chunks)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    ax_cold.set_title("admitted while fewer than T distinct requests had offered them",
                      fontsize=8)
    ax_hit.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def reports_from_json(path: str | Path) -> list[ReplayReport]:
    """The reports a ``--json`` file holds (to redraw a table or plot without replaying)."""
    out = []
    for d in json.loads(Path(path).read_text()):
        d = dict(d)
        d["settings"] = ReplaySettings(**d["settings"])
        out.append(ReplayReport(**d))
    return out


# --------------------------------------------------------------------------- command line

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
                              description=__doc__.split("\n\n")[1],
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
        text = json.dumps([r.as_dict() for r in reports], indent=1)
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
        Path(args.json).write_text(json.dumps([r.as_dict() for r in reports], indent=1) + "\n")
    if args.plot:
        plot_sweep(reports, args.plot, title=Path(args.trace).name)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 1 if any(r.divergence or r.data_errors for r in reports) else 0


def main_replay(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvgate replay", description=__doc__.split("\n\n")[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run_replay(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main_replay())
