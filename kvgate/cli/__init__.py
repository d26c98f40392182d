"""``kvgate``: gate a KV-cache offloading manager from the command line and in CI.

    kvgate check [--target T ...] [--machine manager|scheduler|vllm-scheduler|all]
                 [--profile dev|ci|thorough] [--seed N] [--max-examples N] [--steps N]
                 [--database DIR|redis://HOST:PORT] [--repro FILE] [--junit-xml FILE]
                 [--history FILE]
    kvgate mutants [--only NAME ...] [--machine M] [--jobs N] ...
    kvgate list
    kvgate fuzz [--minutes M] [-n N] [--database DB] [PYTEST_ARGS ...]
                                   (a HypoFuzz campaign over a suite's kvgate items)
    kvgate replay TRACE ...        (a request trace through the scheduler driver)

Without ``--machine``, ``check`` runs every machine that applies to each target and can run
here (``kvgate.gate.MACHINES``; ``kvgate list`` says which), and names the ones it left out and why;
``--machine manager`` is the quick path.

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

The package parses arguments and prints, nothing more: the gate itself (the machine registry,
the plan, one run, its text and its report files) is ``kvgate.gate``, which the pytest plugin
and repro files call too. ``check``, ``mutants``, ``listing`` and ``fuzz`` are the subcommands
(``kvgate replay`` is ``kvgate.replay.command``); ``options`` holds the flags they share;
``display`` prints; ``errors`` turns argparse's errors into one line (exit 2).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from kvgate.gate import build_machine, run_one
from kvgate.outputs import OutputError
from kvgate.properties.adapters import TargetError

from . import check, fuzz, listing, mutants
from .errors import Parser, UsageError, one_line

__all__ = ["build_machine", "main", "make_parser", "run_one"]


def make_parser() -> Parser:
    from kvgate.replay.command import add_replay_parser

    parser = Parser(
        prog="kvgate",
        description="Gate a KV-cache offloading manager: check it "
        "against the reference model with Hypothesis state machines.",
    )
    sub = parser.add_subparsers(
        dest="command", metavar="{check,mutants,list,fuzz,replay}", parser_class=Parser
    )
    check.add_parser(sub)
    mutants.add_parser(sub)
    listing.add_parser(sub)
    fuzz.add_parser(sub)
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
    except (UsageError, TargetError, OutputError) as exc:
        text = one_line(str(exc))
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
