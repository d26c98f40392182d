"""``kvgate check``: run the machines against the targets, print what they found, write the
reports asked for. Every path and value is checked before the first run."""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Sequence

from kvgate.gate import (
    KeepProfile,
    Plan,
    Run,
    UsageError,
    choose_profile,
    exit_code,
    plan_runs,
    profile_settings,
    resolve_targets,
    run_one,
)
from kvgate.gate.reports import write_history, write_junit, write_repro
from kvgate.gate.text import (
    coverage_lines,
    example_parts,
    failure_lines,
    not_checked_lines,
    parts_text,
    run_lines,
)
from kvgate.properties.known import (
    CATALOGUE,
    KnownDefectError,
    KnownDefectGone,
    check_declarations,
)
from kvgate.properties.runner import PROFILE_DATABASE
from kvgate.properties.targets import Target

from .display import Display, use_rich
from .options import add_run_options, check_outputs, database_of


def add_parser(sub) -> argparse.ArgumentParser:
    check = sub.add_parser(
        "check",
        help="check targets against the model",
        description="Check managers against the reference model. Exit 0: "
        "every property holds; 1: a counterexample; 2: a usage or target "
        "error.",
    )
    check.add_argument(
        "--target",
        action="append",
        metavar="T",
        help="target spec, repeatable (default impl; `kvgate list` names them)",
    )
    add_run_options(check, None)
    check.add_argument(
        "--keep-going",
        action="store_true",
        help="run every planned machine on a target that one machine already failed "
        "(by default a target's first counterexample ends its runs: the verdict is known)",
    )
    check.add_argument(
        "--known-defect",
        action="append",
        default=[],
        metavar="NAME",
        help="a defect of the target known already, by its name in kvgate's catalogue "
        "(skip-undercount, skip-overcount), as METRIC:under or METRIC:over, or as the bare "
        "metric vllm:kv_offload_stores_skipped (= skip-undercount), repeatable: only its "
        "differences (that metric, that direction) are not compared, and its witness decides "
        "after each run whether it is still there: the run fails the day it is fixed (the "
        "admission rule cannot be declared)",
    )
    check.add_argument(
        "--repro", metavar="FILE", help="write the shrunk counterexample as a pytest file"
    )
    check.add_argument(
        "--history",
        metavar="FILE",
        help="write each run's history (a failing run's counterexample) as JSON lines",
    )
    check.set_defaults(func=cmd_check)
    return check


def describe_database(args, profile: str) -> str:
    if args.no_database:
        return "no example database"
    if args.database:
        return f"example database {args.database}"
    db = profile_settings(profile).database
    return (
        "no example database (the profile's)"
        if db is None
        else f"the profile's example database ({getattr(db, 'path', db)})"
    )


def cmd_check(args) -> int:
    profile = choose_profile(args.profile)
    specs = list(dict.fromkeys(args.target or ["impl"]))
    known = known_defects(args.known_defect)
    check_outputs(args)
    database = database_of(args)
    targets = resolve_targets(specs)
    plan = plan_runs(args.machine, targets)
    prof = profile_settings(profile)
    max_examples = args.max_examples or prof.max_examples
    steps = args.steps or prof.stateful_step_count
    runs: list[Run] = []
    started = time.perf_counter()
    with Display(use_rich(args.progress)) as display, KeepProfile():
        display.line(
            f"kvgate check: profile {profile}: each run generates {max_examples} "
            f"examples of up to {steps} steps (a failing run then shrinks its "
            "counterexample)"
            + (f"; seed {args.seed}" if args.seed is not None else "")
            + f"; {describe_database(args, profile)}"
            + f"; machines: {', '.join(plan.kinds)}; targets: {', '.join(specs)}"
            + (f"; known defects: {described(known)}" if known else "")
        )
        for line in plan.left_out_lines(specs):
            display.line(line)
        for target in targets:
            if target.note:
                display.line(f"target {target.note}")
        failed: dict[str, str] = {}  # target spec -> the machine that failed it
        for kind, target in list(plan.runs):
            if target.spec in failed and not args.keep_going:
                plan.stop(kind, target, failed[target.spec])
                continue
            tick = display.task(f"{kind} x {target.spec}", max_examples)
            run = run_one(
                kind,
                target,
                profile,
                args.seed,
                args.max_examples,
                args.steps,
                database,
                args.explain,
                tick,
                known=known,
            )
            if tick is not None:
                tick.done()
            runs.append(run)
            for line in run_lines(run):
                display.line(line)
            if run.status != "PASS":
                failed.setdefault(target.spec, kind)
        for run in runs:
            if run.status == "FAIL":
                for line in failure_lines(run):
                    display.line(line)
        if args.repro:
            n = write_repro(args.repro, runs, steps)
            if n:
                display.line(
                    f"repro: {args.repro} ({n} failing run{'s' * (n > 1)}; "
                    f"replay with: pytest {args.repro})"
                )
            else:
                display.line(f"repro: nothing to write to {args.repro} (no counterexample)")
        if args.history:
            write_history(args.history, runs)
            display.line(f"history: {args.history} (JSON lines)")
        if args.junit_xml:
            write_junit(args.junit_xml, runs, suite="kvgate check")
            display.line(f"junit: {args.junit_xml}")
        code = exit_code(runs)
        print_summary(
            display,
            runs,
            targets,
            time.perf_counter() - started,
            code,
            database is PROFILE_DATABASE or bool(args.database),
            plan,
        )
    return code


def known_defects(names: Sequence[str]) -> tuple[str, ...]:
    """``--known-defect``'s names, checked: a ``UsageError`` (one line) for the admission rule
    or anything else that cannot be left out of a run."""
    try:
        return check_declarations(names)
    except KnownDefectError as exc:
        raise UsageError(f"--known-defect: {exc}") from None


def described(known: Sequence[str]) -> str:
    """The declared defects as the header names them: name (metric, direction)."""
    return ", ".join(f"{n} ({CATALOGUE[n].breaks})" for n in known)


def print_summary(
    display: Display,
    runs: Sequence[Run],
    targets: Sequence[Target],
    seconds: float,
    code: int,
    with_database: bool,
    plan: Plan,
) -> None:
    done = [r.result for r in runs if r.result is not None]
    kinds = list(dict.fromkeys(r.machine for r in runs))
    total: Counter[str] = Counter()
    for r in done:
        total.update(example_parts(r))
    display.line(
        f"summary: {len(runs)} run{'s' * (len(runs) != 1)}; machines: "
        f"{', '.join(kinds)}; {sum(r.examples for r in done)} examples "
        f"({parts_text(dict(total))}); {sum(r.steps for r in done)} steps; "
        f"{seconds:.1f}s"
    )
    reused = total["from the example database"]
    if reused and with_database:
        display.line(
            f"note: {reused} examples were replayed from the example "
            "database (earlier failures and their neighbours); --no-database "
            "searches afresh"
        )
    specs = [t.spec for t in targets]
    for line in plan.left_out_lines(specs) + coverage_lines(runs) + not_checked_lines(targets):
        display.line(line)
    failing = [r for r in runs if r.status == "FAIL"]
    gone = failing and all(isinstance(r.outcome.error, KnownDefectGone) for r in failing)
    verdict = {
        0: "every property holds",
        1: "a declared known defect is not there" if gone else "counterexample found",
        2: "a target could not be checked",
    }[code]
    display.line(f"result: {verdict} (exit {code})")
