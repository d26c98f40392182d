"""The options ``check`` and ``mutants`` share, and the example database they name."""

from __future__ import annotations

import argparse
import os

from kvgate.argtypes import positive
from kvgate.gate.database import open_database
from kvgate.gate.errors import UsageError
from kvgate.gate.machines import MACHINES
from kvgate.outputs import OutputError, check_output
from kvgate.properties.profiles import PROFILES
from kvgate.properties.runner import PROFILE_DATABASE

from .display import add_progress_flag

OUTPUT_FLAGS = (("--repro", "repro"), ("--history", "history"), ("--junit-xml", "junit_xml"))


def machine_list(text: str) -> str:
    """``--machine``'s value: ``all`` or machine names joined by commas, each one known."""
    names = [n.strip() for n in text.split(",")]
    if text != "all":
        for name in names:
            if name not in MACHINES:
                raise argparse.ArgumentTypeError(
                    f"invalid choice: {name!r} (choose from {', '.join(MACHINES)} or all, "
                    "several joined by commas)"
                )
    return ",".join(names)


def add_run_options(p: argparse.ArgumentParser, machines_default: str | None) -> None:
    """``machines_default`` None: every machine that applies to the target."""
    default = (
        machines_default
        or "every machine that applies to the target and can run here; `kvgate list` says which"
    )
    p.add_argument(
        "--machine",
        type=machine_list,
        default=machines_default,
        metavar="M[,M...]",
        help=f"which machines check the target: {', '.join(MACHINES)}, several joined by "
        f"commas, or all (default: {default}; manager: the quick path)",
    )
    p.add_argument(
        "--profile",
        choices=PROFILES,
        default=None,
        help="Hypothesis profile (default: $HYPOTHESIS_PROFILE, else ci when $CI is set, else dev)",
    )
    p.add_argument("--seed", type=int, help="seed the search (repeats a dev run)")
    p.add_argument(
        "--max-examples",
        type=positive,
        metavar="N",
        help="examples per run (default: the profile's)",
    )
    p.add_argument(
        "--steps",
        type=positive,
        metavar="N",
        help="steps per example (default: the profile's stateful_step_count)",
    )
    db = p.add_mutually_exclusive_group()
    db.add_argument(
        "--database",
        metavar="DIR|redis://HOST:PORT",
        default=os.environ.get("KVGATE_DATABASE") or None,
        help="Hypothesis example database to share failures through: a directory "
        "(shared or local) or Redis (default: $KVGATE_DATABASE, else the "
        "profile's)",
    )
    db.add_argument(
        "--no-database",
        action="store_true",
        help="no example database: search afresh, replay and save nothing",
    )
    p.add_argument(
        "--explain", action="store_true", help="run Hypothesis's explain phase on a failure (slow)"
    )
    add_progress_flag(p, "progress display (default: on a terminal, not under CI)")
    p.add_argument("--junit-xml", metavar="FILE", help="write a JUnit XML report")


def database_of(args: argparse.Namespace):
    """The example database the options name: ``None`` with ``--no-database``, the profile's
    when none is named."""
    if args.no_database:
        return None
    if not args.database:
        return PROFILE_DATABASE
    return open_database(args.database)


def check_outputs(args, flags=OUTPUT_FLAGS) -> None:
    """Every output path writable, before anything runs."""
    for flag, attr in flags:
        path = getattr(args, attr, None)
        if path:
            try:
                check_output(flag, path)
            except OutputError as exc:
                raise UsageError(str(exc)) from None
