"""``kvgate check``: run the machines against the targets, print what they found, write the
reports asked for. Every path and value is checked before the first run."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence

from kvgate.properties.known import KnownDefectError, KnownDefectGone, check_declarations
from kvgate.properties.runner import PROFILE_DATABASE
from kvgate.properties.targets import Target

from .display import Display, use_rich
from .errors import UsageError
from .options import add_run_options, check_outputs, database_of
from .reports import write_history, write_junit, write_repro
from .runs import (
    KeepProfile,
    Plan,
    Run,
    choose_profile,
    plan_runs,
    profile_settings,
    resolve_targets,
    run_one,
)


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
        help="a defect of the target known already, by what it breaks (a metric such as "
        "vllm:kv_offload_stores_skipped, event.removal_expected, event.request, or an interface "
        "answer such as config_info), repeatable: not compared, listed as still present, and "
        "the run fails when it no longer occurs (the admission rule cannot be declared)",
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
            + (f"; known defects: {', '.join(known)}" if known else "")
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
            print_run(display, run)
            if run.status != "PASS":
                failed.setdefault(target.spec, kind)
        for run in runs:
            if run.status == "FAIL":
                print_failure(display, run)
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


def exit_code(runs: Sequence[Run]) -> int:
    if any(r.status == "ERROR" for r in runs):
        return 2
    return 1 if any(r.status == "FAIL" for r in runs) else 0


def examples_text(r) -> str:
    """How many test cases a run tried, by where they came from."""
    p = r.phases
    parts = [f"{p.get('generated', 0)} new"]
    if p.get("reused"):
        parts.append(f"{p['reused']} from the example database")
    if p.get("invalid"):
        parts.append(f"{p['invalid']} invalid")
    if p.get("shrinking"):
        parts.append(f"{p['shrinking']} while shrinking")
    return f"{r.examples} examples ({', '.join(parts)})"


def print_run(display: Display, run: Run) -> None:
    r = run.outcome
    figures = f"{examples_text(r)}, {r.steps} steps, {r.seconds:.1f}s"
    if run.status == "PASS":
        display.line(f"PASS  {run.name}: {figures}")
    elif run.status == "FAIL":
        display.line(f"FAIL  {run.name}: counterexample in {r.shrunk_steps} steps ({figures})")
    else:
        display.line(f"ERROR {run.name}: {run.target_error}")
    if run.known is not None and r is not None:
        passed = r.passed or isinstance(r.error, KnownDefectGone)
        for line in run.known.lines(passed):
            display.line(f"      {line}")


def _differing(history: list[dict]) -> dict | None:
    """The last recorded call whose target answer and model answer differ."""
    for entry in reversed(history or []):
        if entry.get("target") != entry.get("model") and entry.get("call") != "configure":
            return entry
    return None


def annotated_program(program: Sequence[str], error: BaseException | None) -> list[str]:
    """The printed steps, with a comment under the step that diverged (the last one run)
    naming the call inside it that answered differently, or the check that failed and the
    call before it."""
    lines = list(program)
    what = getattr(error, "call", "")
    if not what:
        return lines
    last = getattr(error, "last_call", "")
    comment = f"# diverged at call {getattr(error, 'call_no', '?')}: {what}"
    if last and last != what:
        comment += f" (the latest call: {last})"
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i].strip()
        if line.startswith("state.") and not line.startswith("state.teardown("):
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            lines.insert(i + 1, indent + comment)
            break
    return lines


def print_failure(display: Display, run: Run) -> None:
    r = run.outcome
    display.line("")
    display.line(f"--- counterexample: {run.name} ---")
    display.line(r.message)
    diff = _differing(r.history)
    if diff is not None:
        call = (
            diff.get("args")
            if diff.get("diverged")
            else f"{diff.get('call')}{diff.get('args') or ''}"
        )
        display.line(f"  call:   {call}")
        display.line(f"  target: {json.dumps(diff.get('target'), default=repr)}")
        display.line(f"  model:  {json.dumps(diff.get('model'), default=repr)}")
    if r.program:
        display.line("shrunk steps:")
        for line in annotated_program(r.program, r.error):
            display.line(f"  {line}")
    display.line("")


def coverage_lines(runs: Sequence[Run]) -> list[str]:
    """Per machine: the labels its passing runs were required to hit, how many they hit."""
    out = []
    for kind in dict.fromkeys(r.machine for r in runs):
        passed = [r.outcome for r in runs if r.machine == kind and r.status == "PASS"]
        if not passed:
            out.append(
                f"coverage ({kind}): not measured (no run passed; a failing run stops "
                "at its counterexample)"
            )
            continue
        expected = list(dict.fromkeys(label for r in passed for label in r.expected))
        hit = {
            label: sum(r.labels.get(label, 0) for r in passed if label in r.expected)
            for label in expected
        }
        missed = [label for label in expected if not hit[label]]
        shown = ", ".join(f"{label} {n}" for label, n in hit.items() if n) or "none"
        scope = (
            ""
            if len(passed) == sum(r.machine == kind for r in runs)
            else f" (the {len(passed)} passing run{'s' * (len(passed) > 1)})"
        )
        explicit = sum(r.explicit for r in passed)
        out.append(
            f"coverage ({kind}){scope}: {len(expected) - len(missed)}/{len(expected)} "
            f"required labels hit: {shown}"
            + (f"; not hit: {', '.join(missed)}" if missed else "")
            + (f"; explicit programs passed: {explicit}" if explicit else "")
        )
    return out


def not_checked_lines(targets: Sequence[Target]) -> list[str]:
    """What each foreign or incomplete target was not checked for, and why."""
    return [
        f"not checked for {t.spec}: {'; '.join(parts)}" for t in targets if (parts := t.unchecked())
    ]


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
    total = {k: sum(r.phases.get(k, 0) for r in done) for k in ("generated", "reused", "shrinking")}
    display.line(
        f"summary: {len(runs)} run{'s' * (len(runs) != 1)}; machines: "
        f"{', '.join(kinds)}; {sum(r.examples for r in done)} examples "
        f"({total['generated']} new, {total['reused']} from the example database, "
        f"{total['shrinking']} while shrinking); {sum(r.steps for r in done)} steps; "
        f"{seconds:.1f}s"
    )
    if total["reused"] and with_database:
        display.line(
            f"note: {total['reused']} examples were replayed from the example "
            "database (earlier failures and their neighbours); --no-database "
            "searches afresh"
        )
    specs = [t.spec for t in targets]
    for line in plan.left_out_lines(specs) + coverage_lines(runs) + not_checked_lines(targets):
        display.line(line)
    verdict = {
        0: "every property holds",
        1: "counterexample found",
        2: "a target could not be checked",
    }[code]
    display.line(f"result: {verdict} (exit {code})")
