"""One machine checking one target under a profile (``run_one``), and what the run found
(``Run``): a pass, a counterexample, or one line saying why there is no verdict.

``run_one`` never raises for a counterexample or a target error: both end up in the ``Run``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import Phase
from hypothesis import settings as Settings

from kvgate.properties.adapters import Target, TargetError, no_verdict
from kvgate.properties.known import KnownDefects, with_known
from kvgate.properties.known_witness import judge
from kvgate.properties.profiles import PHASES
from kvgate.properties.runner import PROFILE_DATABASE, RunResult, run_machine

from .errors import one_line
from .machines import build_machine


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
    known: KnownDefects | None = None  # the declared known defects and what the run saw

    @property
    def name(self) -> str:
        return f"{self.machine} x {self.spec}"

    @property
    def outcome(self) -> RunResult:
        """``result`` where the run has one: every run ``run_one`` returns has it."""
        assert self.result is not None, f"{self.name}: not run"
        return self.result

    @property
    def status(self) -> str:
        if self.target_error:
            return "ERROR"
        return "PASS" if self.outcome.passed else "FAIL"

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
        r = run.outcome
        return cls(
            name,
            run.machine,
            run.status,
            r.shrunk_steps if run.status == "FAIL" else None,
            r.examples,
            r.seconds,
            run.message,
            list(r.program),
        )


def _watched(machine_cls, on_example: Callable[[], None] | None):
    if on_example is None:
        return machine_cls

    class Watched(machine_cls):
        def __init__(self):
            on_example()
            super().__init__()

    Watched.__name__ = Watched.__qualname__ = machine_cls.__name__
    return Watched


def run_one(
    kind: str,
    target: Target,
    profile: str,
    seed: int | None,
    max_examples: int | None,
    steps: int | None,
    database=PROFILE_DATABASE,
    explain: bool = False,
    on_example: Callable[[], None] | None = None,
    known: Sequence[str] = (),
) -> Run:
    """Run one machine against one target. ``database``: an example database, ``None`` for
    none, by default the profile's. ``known``: declared known defects (checked names,
    ``properties.known``): their differences are not compared, and after the run each one's
    witness decides whether it is still there; a passing run whose declared defect is gone (or
    whose witness diverges otherwise) fails."""
    run = Run(kind, target.spec, target.foreign)
    plain = target
    if known:
        run.known = KnownDefects(tuple(known))
        target = with_known(target, run.known)
    machine = _watched(build_machine(kind, target), on_example)
    overrides: dict[str, Any] = {
        "print_blob": True,
        "phases": PHASES + ((Phase.explain,) if explain else ()),
    }
    if steps is not None:
        overrides["stateful_step_count"] = steps
    result = run_machine(
        machine, profile, seed=seed, max_examples=max_examples, database=database, **overrides
    )
    run.result = result
    if run.known is not None:  # each declaration judged by its witness, whatever the budget
        try:
            gone = judge(run.known, plain)
        except TargetError as exc:  # a witness that cannot run there: no verdict
            result.passed, result.error = False, exc
        else:
            if gone is not None and result.passed:  # strict: the declaration outlived the fix
                result.passed, result.error = False, gone
    # Not a property's failure: what caused it decides (spec §9). Raised in kvgate's own code
    # (a machine, the oracle, an adapter, Hypothesis) after well-formed answers only, it is no
    # verdict: exit 2, one line. After an ill-formed answer the runner already made the answer
    # the finding (properties/runner.py ``blamed``).
    line = no_verdict(result.error, f"the {kind} machine", target.release or target.spec)
    if line:
        run.target_error = one_line(line)
    return run


def exit_code(runs: Sequence[Run]) -> int:
    """2 where any run has no verdict, else 1 where any found a counterexample, else 0."""
    if any(r.status == "ERROR" for r in runs):
        return 2
    return 1 if any(r.status == "FAIL" for r in runs) else 0
