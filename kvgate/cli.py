"""``kvgate``: gate a KV-cache offloading manager from the command line and in CI.

    kvgate check [--target T ...] [--machine manager|scheduler|all] [--profile dev|ci|thorough]
                 [--seed N] [--max-examples N] [--steps N] [--database DIR|redis://HOST:PORT]
                 [--repro FILE] [--junit-xml FILE] [--history FILE]
    kvgate mutants [--only NAME ...] [--machine M] [--jobs N] ...
    kvgate list
    kvgate replay TRACE ...        (a request trace through the scheduler driver)

Exit codes: 0 every property holds (``mutants``: every variant caught), 1 a counterexample
(``mutants``: a variant escaped), 2 a usage or target error (one line saying which).

Targets (``properties.targets``): ``impl`` (default), ``impl:lru``, ``impl:arc``,
``mutant:NAME``, ``MODULE:ATTR`` (a class or factory with kvgate's interface),
``foreign=MODULE:ATTR`` (the same, its eviction and chunk-id choices its own), ``vllm`` (the
installed vLLM's manager) and ``vllm=MODULE:ATTR`` (a class with vLLM's interface). MODULE is
imported from the current directory too.

On a failure: the shrunk steps, the answer that differed (target against model), and with
``--repro FILE`` a pytest file that replays them; ``--history FILE`` writes each run's history
(the counterexample's, for a failing run) as JSON lines; ``--junit-xml FILE`` one testcase per
machine and target.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import Phase
from hypothesis import settings as Settings

from kvgate.properties.profiles import PROFILES, default_profile
from kvgate.properties.targets import Target, TargetError, resolve_target

MACHINES = ("manager", "scheduler")
DEFAULT_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
TARGET_KINDS = (
    ("impl", "kvgate's manager, LRU and ARC (the default)"),
    ("impl:lru, impl:arc", "kvgate's manager under one policy"),
    ("mutant:NAME", "a known-bad variant from the catalogue (below)"),
    ("MODULE:ATTR", "a class or factory with kvgate's interface, checked exactly"),
    ("foreign=MODULE:ATTR", "the same, its eviction and chunk-id choices checked and adopted"),
    ("vllm", "the installed vLLM's CPUOffloadingManager, through an adapter (foreign)"),
    ("vllm=MODULE:ATTR", "a class with vLLM's interface, e.g. a patched manager (foreign)"),
)


class UsageError(Exception):
    """A bad flag or value (exit 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse, with errors on one line."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


# --------------------------------------------------------------------------- machines

def build_machine(kind: str, target: Target):
    """The machine class of ``kind`` checking ``target``, named as Hypothesis prints it."""
    from kvgate.properties.manager_machine import machine_name
    if kind == "manager":
        from kvgate.properties.manager_machine import make_machine
        return make_machine(target)
    if kind == "scheduler":
        from kvgate.properties.scheduler_machine import machine_for

        def factory(num_chunks, cache_policy="lru", store_threshold=1,
                    max_tracker_size=64_000):
            return target.make(num_chunks, cache_policy, store_threshold, max_tracker_size)

        cls = machine_for(factory, foreign=target.foreign, policies=target.policies)
        cls.__name__ = cls.__qualname__ = machine_name("SchedulerMachine", target.spec)
        return cls
    raise UsageError(f"unknown machine {kind!r}; one of {', '.join(MACHINES)}")


def machine_labels(kind: str) -> tuple[str, ...]:
    """The coverage labels a machine is expected to hit."""
    if kind == "manager":
        from kvgate.properties.manager_machine import LABELS
        return tuple(LABELS)
    from kvgate.properties.scheduler_machine import SITUATIONS
    return tuple(SITUATIONS)


def exact_only() -> tuple[str, ...]:
    from kvgate.properties.manager_machine import EXACT_ONLY
    return tuple(EXACT_ONLY)


# --------------------------------------------------------------------------- database

def open_database(spec: str | None):
    """``DIR`` -> a directory database (shared when DIR is); ``redis://HOST:PORT[/DB]`` -> a
    Redis one. ``UsageError`` (one line) when it cannot be opened."""
    if not spec:
        return None
    if spec.startswith(("redis://", "rediss://", "unix://")):
        try:
            import redis
            from hypothesis.extra.redis import RedisExampleDatabase
        except ImportError:
            raise UsageError(f"--database {spec}: needs the redis client "
                             "(pip install 'kvgate[redis]')") from None
        client = redis.Redis.from_url(spec, socket_connect_timeout=5)
        try:
            client.ping()
        except Exception as exc:  # connection refused, auth, ...
            raise UsageError(f"--database {spec}: cannot reach it: "
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                             ) from None
        return RedisExampleDatabase(client)
    from hypothesis.database import DirectoryBasedExampleDatabase
    path = Path(spec)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--database {spec}: not a directory")
    return DirectoryBasedExampleDatabase(str(path))


# --------------------------------------------------------------------------- one run

@dataclass
class Run:
    machine: str
    spec: str
    foreign: bool = False
    result: Any = None  # properties.runner.RunResult
    target_error: str = ""

    @property
    def name(self) -> str:
        return f"{self.machine} x {self.spec}"

    @property
    def status(self) -> str:
        if self.target_error:
            return "ERROR"
        return "PASS" if self.result.passed else "FAIL"

    @property
    def message(self) -> str:
        return self.target_error or (self.result.message if self.result else "")


def _one_line(text: str) -> str:
    lines = [line for line in str(text).splitlines() if line.strip()]
    return lines[0].strip() if lines else ""


def _watched(machine_cls, on_example: Callable[[], None] | None):
    if on_example is None:
        return machine_cls

    class Watched(machine_cls):
        def __init__(self):
            on_example()
            super().__init__()

    Watched.__name__ = Watched.__qualname__ = machine_cls.__name__
    return Watched


def run_one(kind: str, target: Target, profile: str, seed: int | None,
            max_examples: int | None, steps: int | None, database, explain: bool = False,
            on_example: Callable[[], None] | None = None) -> Run:
    """Run one machine against one target; never raises for a failure or a target error."""
    from kvgate.properties.runner import run_machine
    run = Run(kind, target.spec, target.foreign)
    machine = _watched(build_machine(kind, target), on_example)
    overrides: dict[str, Any] = {"print_blob": True,
                                 "phases": DEFAULT_PHASES + ((Phase.explain,) if explain else ())}
    if steps is not None:
        overrides["stateful_step_count"] = steps
    result = run_machine(machine, profile, seed=seed, max_examples=max_examples,
                         database=database, **overrides)
    run.result = result
    error = result.error
    if isinstance(error, TargetError):
        run.target_error = _one_line(str(error))
    elif error is not None and isinstance(getattr(error, "__cause__", None), TargetError):
        run.target_error = _one_line(str(error.__cause__))
    return run


def _differing(history: list[dict]) -> dict | None:
    """The last recorded call whose target answer and model answer differ."""
    for entry in reversed(history or []):
        if entry.get("target") != entry.get("model") and entry.get("call") != "configure":
            return entry
    return None


# --------------------------------------------------------------------------- display

class Display:
    """Progress on a terminal (rich), plain lines otherwise (CI, pipes)."""

    def __init__(self, rich_progress: bool, stream=None):
        self.stream = stream or sys.stdout
        self.rich = rich_progress
        self._progress = None
        self._console = None
        if rich_progress:
            from rich.console import Console
            self._console = Console(file=self.stream, highlight=False)

    def __enter__(self):
        if self.rich:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                                       TextColumn, TimeElapsedColumn)
            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                      BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                      console=self._console, transient=True)
            self._progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.__exit__(*exc)
            self._progress = None

    def line(self, text: str = "") -> None:
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        elif self._console is not None:
            self._console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    def task(self, description: str, total: int) -> Callable[[], None] | None:
        if self._progress is None:
            return None
        progress = self._progress
        task = progress.add_task(description, total=total)
        count = [0]

        def tick():
            count[0] += 1
            progress.update(task, completed=min(count[0], total),
                            description=description if count[0] <= total
                            else f"{description} (shrinking)")

        def done():
            progress.remove_task(task)

        tick.done = done  # type: ignore[attr-defined]
        return tick


def _use_rich(flag: bool | None) -> bool:
    if flag is not None:
        return flag
    return sys.stdout.isatty() and not os.environ.get("CI")


# --------------------------------------------------------------------------- outputs

def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))


def write_history(path: str, runs: Sequence[Run]) -> int:
    """Each run's history as JSON lines: a header line per run, then one line per call."""
    lines = 0
    with open(path, "w") as out:
        for run in runs:
            if run.result is None:
                continue
            header = {"run": run.name, "machine": run.machine, "target_spec": run.spec,
                      "passed": run.result.passed, "error": run.message or None,
                      "calls": len(run.result.history)}
            out.write(json.dumps(header, default=repr) + "\n")
            for entry in run.result.history:
                out.write(json.dumps({"run": run.name, **entry}, default=repr) + "\n")
                lines += 1
    return lines


def write_junit(path: str, runs: Sequence[Run], suite: str = "kvgate") -> None:
    """One testcase per machine x target: a failure with the message and the shrunk steps,
    an error for a target that could not be checked."""
    failures = sum(r.status == "FAIL" for r in runs)
    errors = sum(r.status == "ERROR" for r in runs)
    seconds = sum(r.result.seconds for r in runs if r.result)
    root = ET.Element("testsuites", name=suite, tests=str(len(runs)), failures=str(failures),
                      errors=str(errors), time=f"{seconds:.3f}")
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(runs)),
                       failures=str(failures), errors=str(errors), skipped="0",
                       time=f"{seconds:.3f}")
    for run in runs:
        r = run.result
        case = ET.SubElement(ts, "testcase", classname=f"kvgate.{run.machine}", name=run.spec,
                             time=f"{r.seconds:.3f}" if r else "0")
        if run.status == "ERROR":
            el = ET.SubElement(case, "error", message=run.target_error, type="TargetError")
            el.text = run.target_error
        elif run.status == "FAIL":
            el = ET.SubElement(case, "failure", message=_one_line(run.message),
                               type=type(r.error).__name__)
            el.text = run.message + "\n\nShrunk steps:\n" + "\n".join(r.program)
        if r is not None:
            out = ET.SubElement(case, "system-out")
            out.text = (f"examples={r.examples} steps={r.steps} "
                        f"labels={json.dumps(r.labels, sort_keys=True)}")
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def write_repro(path: str, runs: Sequence[Run], steps: int) -> int:
    from kvgate.repro import Failure, render
    failures = []
    for run in runs:
        if run.status != "FAIL":
            continue
        r = run.result
        notes = [n for note in (getattr(r.error, "__notes__", None) or [])
                 for n in note.splitlines()]
        failures.append(Failure(machine=run.machine, spec=run.spec, class_name=r.machine,
                                message=r.message, program=list(r.program), notes=notes,
                                step_count=steps))
    if failures:
        Path(path).write_text(render(failures, path))
    return len(failures)


# --------------------------------------------------------------------------- check

def _add_run_options(p: argparse.ArgumentParser, machines_default: str) -> None:
    p.add_argument("--machine", choices=MACHINES + ("all",), default=machines_default,
                   help="which machine checks the target (default %(default)s; all: every "
                        "machine)")
    p.add_argument("--profile", choices=PROFILES, default=None,
                   help="Hypothesis profile (default: $HYPOTHESIS_PROFILE, else ci when $CI "
                        "is set, else dev)")
    p.add_argument("--seed", type=int, help="seed the search (repeats a dev run)")
    p.add_argument("--max-examples", type=_positive, metavar="N",
                   help="examples per run (default: the profile's)")
    p.add_argument("--steps", type=_positive, metavar="N",
                   help="steps per example (default: the profile's stateful_step_count)")
    p.add_argument("--database", metavar="DIR|redis://HOST:PORT",
                   default=os.environ.get("KVGATE_DATABASE") or None,
                   help="Hypothesis example database to share failures through: a directory "
                        "(shared or local) or Redis (default: $KVGATE_DATABASE, else the "
                        "profile's)")
    p.add_argument("--explain", action="store_true",
                   help="run Hypothesis's explain phase on a failure (slow)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress display (default: on a terminal, not under CI)")
    p.add_argument("--junit-xml", metavar="FILE", help="write a JUnit XML report")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _machines(choice: str) -> list[str]:
    return list(MACHINES) if choice == "all" else [choice]


def _resolve(specs: Sequence[str]) -> list[Target]:
    """Resolve and build each target once (a small configuration), so that a target that
    cannot be imported, built or driven is a one-line error before any run."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # MODULE:ATTR from the current directory, as `python -m`
    targets = []
    for spec in specs:
        target = resolve_target(spec)
        target.make(4, target.policies[0], 2, 4)
        targets.append(target)
    return targets


def _profile_settings(profile: str):
    return Settings.get_profile(profile)


class _KeepProfile:
    """The runner loads the run's profile globally; put the caller's back afterwards (the
    CLI also runs inside pytest)."""

    def __enter__(self):
        try:
            self.name = Settings.get_current_profile_name()
        except Exception:
            self.name = None
        return self

    def __exit__(self, *exc):
        if self.name:
            Settings.load_profile(self.name)


def cmd_check(args) -> int:
    profile = args.profile or default_profile()
    specs = list(dict.fromkeys(args.target or ["impl"]))
    database = open_database(args.database)
    targets = _resolve(specs)
    kinds = _machines(args.machine)
    prof = _profile_settings(profile)
    max_examples = args.max_examples or prof.max_examples
    steps = args.steps or prof.stateful_step_count
    runs: list[Run] = []
    started = time.perf_counter()
    with Display(_use_rich(args.progress)) as display, _KeepProfile():
        display.line(f"kvgate check: profile {profile} ({max_examples} examples of up to "
                     f"{steps} steps per run"
                     + (f", seed {args.seed}" if args.seed is not None else "")
                     + (f", database {args.database}" if args.database else "")
                     + f"); machines: {', '.join(kinds)}; targets: {', '.join(specs)}")
        for target in targets:
            if target.note:
                display.line(f"target {target.note}")
        for target in targets:
            for kind in kinds:
                tick = display.task(f"{kind} x {target.spec}", max_examples)
                run = run_one(kind, target, profile, args.seed, args.max_examples, args.steps,
                              database, args.explain, tick)
                if tick is not None:
                    tick.done()
                runs.append(run)
                _print_run(display, run)
        for run in runs:
            if run.status == "FAIL":
                _print_failure(display, run)
        if args.repro:
            n = write_repro(args.repro, runs, steps)
            if n:
                display.line(f"repro: {args.repro} ({n} failing run{'s' * (n > 1)}; "
                             f"replay with: pytest {args.repro})")
            else:
                display.line(f"repro: nothing to write to {args.repro} (no counterexample)")
        if args.history:
            write_history(args.history, runs)
            display.line(f"history: {args.history} (JSON lines)")
        if args.junit_xml:
            write_junit(args.junit_xml, runs, suite="kvgate check")
            display.line(f"junit: {args.junit_xml}")
        code = _exit_code(runs)
        _print_summary(display, runs, time.perf_counter() - started, code)
    return code


def _exit_code(runs: Sequence[Run]) -> int:
    if any(r.status == "ERROR" for r in runs):
        return 2
    return 1 if any(r.status == "FAIL" for r in runs) else 0


def _print_run(display: Display, run: Run) -> None:
    r = run.result
    figures = f"{r.examples} examples, {r.steps} steps, {r.seconds:.1f}s"
    if run.status == "PASS":
        display.line(f"PASS  {run.name}: {figures}")
    elif run.status == "FAIL":
        display.line(f"FAIL  {run.name}: counterexample in {r.shrunk_steps} steps ({figures})")
    else:
        display.line(f"ERROR {run.name}: {run.target_error}")


def _print_failure(display: Display, run: Run) -> None:
    r = run.result
    display.line("")
    display.line(f"--- counterexample: {run.name} ---")
    display.line(r.message)
    diff = _differing(r.history)
    if diff is not None:
        display.line(f"  call:   {diff.get('call')} {json.dumps(diff.get('args'), default=repr)}")
        display.line(f"  target: {json.dumps(diff.get('target'), default=repr)}")
        display.line(f"  model:  {json.dumps(diff.get('model'), default=repr)}")
    if r.program:
        display.line("shrunk steps:")
        for line in r.program:
            display.line(f"  {line}")
    display.line("")


def _print_summary(display: Display, runs: Sequence[Run], seconds: float, code: int) -> None:
    done = [r for r in runs if r.result is not None]
    kinds = list(dict.fromkeys(r.machine for r in runs))
    examples = sum(r.result.examples for r in done)
    steps = sum(r.result.steps for r in done)
    display.line(f"summary: {len(runs)} run{'s' * (len(runs) != 1)}; machines: "
                 f"{', '.join(kinds)}; {examples} examples; {steps} steps; {seconds:.1f}s")
    for kind in kinds:
        hit: dict[str, int] = {}
        for r in done:
            if r.machine == kind:
                for label, n in r.result.labels.items():
                    hit[label] = hit.get(label, 0) + n
        expected = machine_labels(kind)
        missed = [label for label in expected if not hit.get(label)]
        shown = ", ".join(f"{label} {n}" for label, n in sorted(hit.items())) or "none"
        display.line(f"coverage ({kind}): {len(expected) - len(missed)}/{len(expected)} "
                     f"labels hit: {shown}" + (f"; not hit: {', '.join(missed)}" if missed
                                               else ""))
    foreign = list(dict.fromkeys(r.spec for r in runs if r.foreign))
    if foreign:
        display.line(f"skipped for foreign targets ({', '.join(foreign)}): "
                     f"{', '.join(exact_only())} (an adapter cannot see them); the admission, "
                     "skip-metric, safety and event properties ran")
    verdict = {0: "every property holds", 1: "counterexample found",
               2: "a target could not be checked"}[code]
    display.line(f"result: {verdict} (exit {code})")


# --------------------------------------------------------------------------- mutants

def _mutant_run(name: str, kind: str, profile: str, seed, max_examples, steps, explain):
    """One catalogue variant under one machine (picklable, for --jobs)."""
    with _KeepProfile():
        run = run_one(kind, resolve_target(f"mutant:{name}"), profile, seed, max_examples,
                      steps, None, explain)
    r = run.result
    caught = run.status == "FAIL"
    return (name, kind, caught, r.shrunk_steps if caught else None, r.examples, r.seconds,
            run.message, list(r.program), run.status)


def cmd_mutants(args) -> int:
    from kvgate.properties.mutants import MUTANTS
    profile = args.profile or default_profile()
    names = list(dict.fromkeys(args.only or MUTANTS))
    unknown = [n for n in names if n not in MUTANTS]
    if unknown:
        raise TargetError(f"unknown mutant {unknown[0]!r}; `kvgate list` names them")
    kinds = _machines(args.machine)
    jobs = [(n, k) for n in names for k in kinds]
    prof = _profile_settings(profile)
    max_examples = args.max_examples or prof.max_examples
    rows = []
    started = time.perf_counter()
    with Display(_use_rich(args.progress)) as display:
        display.line(f"kvgate mutants: {len(names)} variants; machines: {', '.join(kinds)}; "
                     f"profile {profile} ({max_examples} examples per run)")
        call = (profile, args.seed, args.max_examples, args.steps, args.explain)
        if args.jobs > 1 and len(jobs) > 1:
            from concurrent.futures import ProcessPoolExecutor, as_completed
            tick = display.task("variants", len(jobs))
            by_job = {}
            with ProcessPoolExecutor(args.jobs) as pool:
                futures = {pool.submit(_mutant_run, n, k, *call): (n, k) for n, k in jobs}
                for fut in as_completed(futures):
                    by_job[futures[fut]] = fut.result()
                    if tick:
                        tick()
            rows = [by_job[j] for j in jobs]
        else:
            for n, k in jobs:
                tick = display.task(f"{k} x mutant:{n}", max_examples)
                with _KeepProfile():
                    run = run_one(k, resolve_target(f"mutant:{n}"), profile, args.seed,
                                  args.max_examples, args.steps, None, args.explain, tick)
                if tick is not None:
                    tick.done()
                r = run.result
                caught = run.status == "FAIL"
                rows.append((n, k, caught, r.shrunk_steps if caught else None, r.examples,
                             r.seconds, run.message, list(r.program), run.status))
        _print_mutants(display, rows, len(kinds) > 1)
        escaped = [row for row in rows if not row[2]]
        caught = len(rows) - len(escaped)
        display.line(f"summary: {caught}/{len(rows)} caught; "
                     f"{sum(row[4] for row in rows)} examples; "
                     f"{time.perf_counter() - started:.1f}s"
                     + (f"; escaped: {', '.join(f'{row[1]} x {row[0]}' for row in escaped)}"
                        if escaped else ""))
    if args.junit_xml:
        _write_mutants_junit(args.junit_xml, rows)
    if any(row[8] == "ERROR" for row in rows):
        return 2
    return 1 if escaped else 0


def _write_mutants_junit(path: str, rows) -> None:
    """One testcase per variant x machine; a variant that escaped is a failure."""
    escaped = sum(not row[2] for row in rows)
    root = ET.Element("testsuites", name="kvgate mutants", tests=str(len(rows)),
                      failures=str(escaped), errors="0")
    ts = ET.SubElement(root, "testsuite", name="kvgate mutants", tests=str(len(rows)),
                       failures=str(escaped), errors="0", skipped="0")
    for name, kind, caught, _steps, _examples, seconds, message, _program, status in rows:
        case = ET.SubElement(ts, "testcase", classname=f"kvgate.mutants.{kind}",
                             name=f"mutant:{name}", time=f"{seconds:.3f}")
        if not caught:
            ET.SubElement(case, "failure", message="the machine did not catch this variant"
                          + (f": {message}" if status == "ERROR" else ""))
        else:
            ET.SubElement(case, "system-out").text = _one_line(message)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def _print_mutants(display: Display, rows, show_machine: bool) -> None:
    head = ["variant"] + (["machine"] if show_machine else []) + ["caught", "steps", "seconds"]
    body = []
    for name, kind, caught, steps, _examples, seconds, _msg, _prog, status in rows:
        mark = "yes" if caught else ("ERROR" if status == "ERROR" else "NO")
        body.append([name] + ([kind] if show_machine else [])
                    + [mark, "-" if steps is None else str(steps), f"{seconds:.1f}"])
    if display.rich:
        from rich.table import Table
        table = Table(*head)
        for row in body:
            table.add_row(*row)
        if display._progress is not None:
            display._progress.console.print(table)
        else:
            display._console.print(table)
        return
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    for row in [head] + body:
        display.line("  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())


# --------------------------------------------------------------------------- list

def cmd_list(args) -> int:
    from kvgate.properties.mutants import MUTANTS
    from kvgate.properties.vllm_adapter import VLLM_MANAGER
    out = []
    out.append("targets:")
    for spec, what in TARGET_KINDS:
        out.append(f"  {spec:<22} {what}")
    out.append("mutants (mutant:NAME):")
    for name, mutant in MUTANTS.items():
        doc = mutant.doc.split(". ")[0].rstrip(".")
        pol = "" if tuple(mutant.policies) == ("lru", "arc") else f" [{', '.join(mutant.policies)}]"
        out.append(f"  {name:<30} {doc}{pol}")
    out.append("machines (--machine):")
    out.append("  manager    manager vs model in lockstep, step by step (default)")
    out.append("  scheduler  requests through the scheduler driver, every manager call checked")
    out.append("  all        every machine above")
    out.append(f"profiles (--profile): {', '.join(PROFILES)} (now: {default_profile()})")
    try:
        import importlib
        importlib.import_module(VLLM_MANAGER)
        out.append("vllm: importable")
    except Exception as exc:
        out.append(f"vllm: not importable ({type(exc).__name__}); `kvgate check --target vllm` "
                   "says how to install it")
    print("\n".join(out))
    return 0


# --------------------------------------------------------------------------- main

def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvgate", description="Gate a KV-cache offloading manager: check it "
                     "against the reference model with Hypothesis state machines.",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="{check,mutants,list,replay}",
                                parser_class=_Parser)

    check = sub.add_parser("check", help="check targets against the model",
                           description="Check managers against the reference model. Exit 0: "
                           "every property holds; 1: a counterexample; 2: a usage or target "
                           "error.")
    check.add_argument("--target", action="append", metavar="T",
                       help="target spec, repeatable (default impl; `kvgate list` names them)")
    _add_run_options(check, "manager")
    check.add_argument("--repro", metavar="FILE",
                       help="write the shrunk counterexample as a pytest file")
    check.add_argument("--history", metavar="FILE",
                       help="write each run's history (a failing run's counterexample) as "
                            "JSON lines")
    check.set_defaults(func=cmd_check)

    mutants = sub.add_parser("mutants", help="run the catalogue of known-bad managers",
                             description="Run every known-bad variant; each must be caught. "
                             "Exit 0: all caught; 1: a variant escaped; 2: usage error.")
    mutants.add_argument("--only", nargs="+", metavar="NAME", help="only these variants")
    _add_run_options(mutants, "manager")
    mutants.add_argument("--jobs", type=_positive, default=1,
                         help="variants in parallel processes (default %(default)s)")
    mutants.set_defaults(func=cmd_mutants)

    lst = sub.add_parser("list", help="name the targets, mutants and machines")
    lst.set_defaults(func=cmd_list)

    from kvgate.replay import add_replay_parser
    add_replay_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = make_parser()
    try:
        args = parser.parse_args(argv)
        if getattr(args, "func", None) is None:
            parser.print_help(sys.stderr)
            return 2
        return int(args.func(args) or 0)
    except (UsageError, TargetError) as exc:
        text = _one_line(str(exc))
        print(text if text.startswith("kvgate") else f"kvgate: {text}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help, or a subcommand's own argparse exit
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except KeyboardInterrupt:
        print("kvgate: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`kvgate list | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
