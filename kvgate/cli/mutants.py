"""``kvgate mutants``: run the catalogue of known-bad managers; each must be caught."""

from __future__ import annotations

import argparse
import time

from kvgate.argtypes import positive
from kvgate.gate import (
    KeepProfile,
    MutantResult,
    choose_profile,
    plan_runs,
    profile_settings,
    run_one,
)
from kvgate.gate.reports import write_mutants_junit
from kvgate.properties.targets import TargetError, resolve_target

from .display import Display, use_rich
from .options import add_run_options, check_outputs


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "mutants",
        help="run the catalogue of known-bad managers",
        description="Run every known-bad variant; each must be caught. "
        "Exit 0: all caught; 1: a variant escaped; 2: usage error.",
    )
    p.add_argument("--only", nargs="+", metavar="NAME", help="only these variants")
    add_run_options(p, "manager")
    p.add_argument(
        "--jobs",
        type=positive,
        default=1,
        help="variants in parallel processes (default %(default)s)",
    )
    p.set_defaults(func=cmd_mutants)
    return p


def run_mutant(
    name: str, kind: str, profile: str, seed, max_examples, steps, explain, on_example=None
) -> MutantResult:
    """One catalogue variant under one machine (picklable, for --jobs); no example database,
    so that a catch is found, not replayed."""
    with KeepProfile():
        run = run_one(
            kind,
            resolve_target(f"mutant:{name}"),
            profile,
            seed,
            max_examples,
            steps,
            None,
            explain,
            on_example,
        )
    return MutantResult.of(name, run)


def cmd_mutants(args) -> int:
    from kvgate.properties.catalogue.managers import MUTANTS

    profile = choose_profile(args.profile)
    names = list(dict.fromkeys(args.only or MUTANTS))
    unknown = [n for n in names if n not in MUTANTS]
    if unknown:
        raise TargetError(f"unknown mutant {unknown[0]!r}; `kvgate list` names them")
    check_outputs(args, (("--junit-xml", "junit_xml"),))
    plan = plan_runs(args.machine, [resolve_target(f"mutant:{n}") for n in names])
    kinds = plan.kinds
    jobs = [(target.spec.split(":", 1)[1], k) for k, target in plan.runs]
    max_examples = args.max_examples or profile_settings(profile).max_examples
    started = time.perf_counter()
    call = (profile, args.seed, args.max_examples, args.steps, args.explain)
    with Display(use_rich(args.progress)) as display:
        display.line(
            f"kvgate mutants: {len(names)} variants; machines: {', '.join(kinds)}; "
            f"profile {profile} (up to {max_examples} new examples per run; no "
            "example database)"
        )
        if args.jobs > 1 and len(jobs) > 1:
            from concurrent.futures import ProcessPoolExecutor, as_completed

            tick = display.task("variants", len(jobs))
            by_job = {}
            with ProcessPoolExecutor(args.jobs) as pool:
                futures = {pool.submit(run_mutant, n, k, *call): (n, k) for n, k in jobs}
                for fut in as_completed(futures):
                    by_job[futures[fut]] = fut.result()
                    if tick:
                        tick()
            results = [by_job[j] for j in jobs]
        else:
            results = []
            for n, k in jobs:
                tick = display.task(f"{k} x mutant:{n}", max_examples)
                results.append(run_mutant(n, k, *call, on_example=tick))
                if tick is not None:
                    tick.done()
        print_table(display, results, len(kinds) > 1)
        escaped = [m for m in results if not m.caught]
        display.line(
            f"summary: {len(results) - len(escaped)}/{len(results)} caught; "
            f"{sum(m.examples for m in results)} examples; "
            f"{time.perf_counter() - started:.1f}s"
            + (
                f"; escaped: {', '.join(f'{m.machine} x {m.name}' for m in escaped)}"
                if escaped
                else ""
            )
        )
    if args.junit_xml:
        write_mutants_junit(args.junit_xml, results)
    if any(m.status == "ERROR" for m in results):
        return 2
    return 1 if escaped else 0


def print_table(display: Display, results: list[MutantResult], show_machine: bool) -> None:
    head = ["variant"] + (["machine"] if show_machine else []) + ["caught", "steps", "seconds"]
    body = []
    for m in results:
        mark = "yes" if m.caught else ("ERROR" if m.status == "ERROR" else "NO")
        body.append(
            [m.name]
            + ([m.machine] if show_machine else [])
            + [mark, "-" if m.steps is None else str(m.steps), f"{m.seconds:.1f}"]
        )
    display.table(head, body)
