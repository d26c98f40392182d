"""The gate's engine: one run of a gate, whichever front door asked for it.

``kvgate check`` (``kvgate.cli``), the pytest plugin (``kvgate.pytest_plugin``) and every repro
file a failure writes call this package and nothing below it; the command line only parses
arguments and prints, the plugin only collects items and reports. A gate is:

- ``resolve_targets`` then ``plan_runs`` (``plan``): the targets, each resolved before any run,
  and which machine of ``MACHINES`` (``machines``) runs on which, what is left out and why;
- ``run_one`` (``run``): one machine against one target under a profile, judged: a pass, a
  counterexample, or one line saying why there is no verdict (``Run``), ``exit_code`` of all;
- ``run_lines``, ``failure_lines``, ``coverage_lines`` (``text``): what a person reads of it;
  ``reports``: the history, JUnit and repro files.
"""

from __future__ import annotations

from .database import open_database
from .errors import UsageError, one_line
from .machines import MACHINES, Machine, build_machine
from .plan import Plan, choose_profile, plan_runs, profile_settings, resolve_targets
from .run import KeepProfile, MutantResult, Run, exit_code, run_one

__all__ = [
    "MACHINES",
    "KeepProfile",
    "Machine",
    "MutantResult",
    "Plan",
    "Run",
    "UsageError",
    "build_machine",
    "choose_profile",
    "exit_code",
    "one_line",
    "open_database",
    "plan_runs",
    "profile_settings",
    "resolve_targets",
    "run_one",
]
