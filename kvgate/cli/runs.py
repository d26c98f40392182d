"""One run: a machine checking one target under a profile, and what the commands read from it.

``run_one`` never raises for a counterexample or a target error: both end up in the ``Run``.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import Phase
from hypothesis import settings as Settings

from kvgate.properties.profiles import PROFILES, default_profile
from kvgate.properties.runner import PROFILE_DATABASE, RunResult, run_machine
from kvgate.properties.adapters import Config, Target, TargetError
from kvgate.properties.targets import resolve_target

from .errors import UsageError, one_line

MACHINES = ("manager", "scheduler")
DEFAULT_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)


def build_machine(kind: str, target: Target):
    """The machine class of ``kind`` checking ``target``, named as Hypothesis prints it."""
    from kvgate.properties.manager_machine import machine_name
    if kind == "manager":
        from kvgate.properties.manager_machine import make_machine
        return make_machine(target)
    if kind == "scheduler":
        from kvgate.properties.scheduler_machine import machine_for

        def factory(num_chunks, cache_policy="lru", store_threshold=1,
                    max_tracker_size=64_000, recency=target.recencies[0]):
            return target.make(Config(num_chunks, cache_policy, store_threshold,
                                      max_tracker_size, True, recency))

        cls = machine_for(factory, foreign=target.foreign, policies=target.policies,
                          recencies=target.recencies)
        cls.__name__ = cls.__qualname__ = machine_name("SchedulerMachine", target.spec)
        return cls
    raise UsageError(f"unknown machine {kind!r}; one of {', '.join(MACHINES)}")


def machines(choice: str) -> list[str]:
    return list(MACHINES) if choice == "all" else [choice]


def choose_profile(flag: str | None) -> str:
    """``--profile``, else ``$HYPOTHESIS_PROFILE``, else ci under ``$CI``, else dev; a
    ``HYPOTHESIS_PROFILE`` that names no profile is a ``UsageError``."""
    if flag:
        return flag
    try:
        return default_profile()
    except ValueError:
        raise UsageError(f"HYPOTHESIS_PROFILE={os.environ.get('HYPOTHESIS_PROFILE')!r}: not a "
                         f"profile; one of {', '.join(PROFILES)}") from None


def profile_settings(profile: str) -> Settings:
    return Settings.get_profile(profile)


def resolve_targets(specs: Sequence[str]) -> list[Target]:
    """Resolve each target, so that a target that cannot be imported or lacks the interface is
    a one-line error before any run (a constructor that raises on a valid configuration is a
    counterexample the machines report, spec section 9)."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # MODULE:ATTR from the current directory, as `python -m`
    targets = []
    for spec in specs:
        targets.append(resolve_target(spec))
    return targets


class KeepProfile:
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


@dataclass
class Run:
    machine: str
    spec: str
    foreign: bool = False
    result: RunResult | None = None
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


@dataclass
class MutantResult:
    """One catalogue variant under one machine."""

    name: str
    machine: str
    status: str  # "FAIL" (caught), "PASS" (escaped) or "ERROR" (could not be checked)
    steps: int | None  # the counterexample's steps, when caught
    examples: int
    seconds: float
    message: str
    program: list[str] = field(default_factory=list)

    @property
    def caught(self) -> bool:
        return self.status == "FAIL"

    @classmethod
    def of(cls, name: str, run: Run) -> MutantResult:
        r = run.result
        return cls(name, run.machine, run.status,
                   r.shrunk_steps if run.status == "FAIL" else None, r.examples, r.seconds,
                   run.message, list(r.program))


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
            max_examples: int | None, steps: int | None, database=PROFILE_DATABASE,
            explain: bool = False, on_example: Callable[[], None] | None = None) -> Run:
    """Run one machine against one target. ``database``: an example database, ``None`` for
    none, by default the profile's."""
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
        run.target_error = one_line(str(error))
    elif error is not None and isinstance(getattr(error, "__cause__", None), TargetError):
        run.target_error = one_line(str(error.__cause__))
    return run
