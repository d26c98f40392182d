"""Run a state machine under a profile and capture what a person needs from a failure:
the shrunk steps (as Hypothesis prints them), the error, the history, and the figures."""

from __future__ import annotations

import gc
import time
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import Phase
from hypothesis import settings as Settings
from hypothesis.stateful import run_state_machine_as_test

from .adapters import TargetError, raised_at
from .answers import LEDGER, BadAnswer
from .explicit import run_programs
from .profiles import default_profile
from .search import hypothesis_private as private

PROFILE_DATABASE = object()  # ``run_machine(database=...)``: the profile's own database


@dataclass
class RunResult:
    machine: str
    passed: bool
    seconds: float
    examples: int
    steps: int  # steps executed over all examples
    error: BaseException | None = None
    program: list[str] = field(default_factory=list)  # the shrunk counterexample's lines
    history: list[dict] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)
    rules: frozenset[str] = frozenset()  # the machine's step rules (set-up rules excluded)
    expected: tuple[str, ...] = ()  # the labels a passing run must hit (the machine's claim)
    # Test cases per phase, from Hypothesis's statistics: "reused" (replayed from the example
    # database), "generated" (valid new examples), "invalid" (rejected or overrun draws),
    # "shrinking" (tried while shrinking a failure).
    phases: dict[str, int] = field(default_factory=dict)
    explicit: int = 0  # the machine's explicit programs that passed (properties/explicit.py)

    @property
    def shrunk_steps(self) -> int:
        """Steps of the counterexample (``state.<rule>(...)`` lines, set-up rules excluded)."""
        return sum(
            1
            for line in self.program
            if "state." in line and line.split("state.", 1)[1].split("(")[0] in self.rules
        )

    @property
    def message(self) -> str:
        if self.error is None:
            return ""
        return f"{type(self.error).__name__}: {self.error}"


def _program_lines(error: BaseException) -> list[str]:
    notes = getattr(error, "__notes__", None) or []
    lines = []
    for note in notes:
        lines.extend(note.splitlines())
    kept = ("state", "requests_", "stores_", "loads_", "# explicit program")
    return [line for line in lines if line.startswith(kept)]


def run_machine(
    machine_cls,
    profile: str | None = None,
    seed: int | None = None,
    max_examples: int | None = None,
    database=PROFILE_DATABASE,
    **overrides,
) -> RunResult:
    """Run ``machine_cls`` under ``profile``; never raises for a property failure.
    ``database``: an example database, ``None`` for none, by default the profile's."""
    kwargs = dict(overrides)
    if max_examples is not None:
        kwargs["max_examples"] = max_examples
    if seed is not None:
        kwargs["derandomize"] = False
    if database is not PROFILE_DATABASE:
        kwargs["database"] = database
    # The profile's settings for this run only: the process-wide default stays as it was.
    settings = Settings(Settings.get_profile(profile or default_profile()), **kwargs)
    counts = {"examples": 0, "steps": 0}

    class Counted(machine_cls):
        def __init__(self):
            counts["examples"] += 1
            self._checks = 0
            LEDGER.reset()  # the ill-formed answers of this example only
            super().__init__()

        def check_invariants(self, *args, **kwargs):
            # Hypothesis calls this once before the first step and once after every step.
            self._checks += 1
            return super().check_invariants(*args, **kwargs)

        def teardown(self):
            counts["steps"] += max(0, self._checks - 1)
            super().teardown()

    Counted.__name__ = Counted.__qualname__ = machine_cls.__name__
    # The example database and derandomized runs key on one digest per machine class name
    # (that is, per machine and target), whatever Python finds as Counted's source.
    private.key_by_name(Counted, machine_cls.__name__)
    if seed is not None:
        # Hypothesis reads the seed from the machine class, not from a wrapper around it.
        from hypothesis import seed as with_seed

        with_seed(seed)(Counted)
    # Garbage of earlier runs (a failure's traceback keeps a machine's contexts in cycles) is
    # collected now, not at a random point of this run: the manager machine reuses a dead
    # context's memory on purpose (properties/contexts.py), the same way in every replay.
    gc.collect()
    start = time.perf_counter()
    error: BaseException | None = None
    stats: list[dict] = []
    try:
        with private.collect_statistics(stats.append):
            run_state_machine_as_test(Counted, settings=settings)
    except Exception as exc:  # a property failure (or a target that broke)
        error = exc
    explicit = getattr(machine_cls, "explicit_programs", None)
    explicit_passed = 0
    if error is None and explicit is not None and Phase.explicit in settings.phases:
        # after the drawn examples: a counterexample they find is shrunk, a program is not
        explicit_passed, error = run_programs(Counted, explicit())
    seconds = time.perf_counter() - start
    error = blamed(error)
    return RunResult(
        machine=machine_cls.__name__,
        passed=error is None,
        seconds=seconds,
        examples=counts["examples"],
        steps=counts["steps"],
        error=error,
        program=_program_lines(error) if error else [],
        history=list(getattr(Counted, "last_history", None) or []),
        labels=dict(_labels_of(Counted)),
        rules=_step_rules(machine_cls),
        expected=tuple(getattr(machine_cls, "expected_labels", tuple)()),
        phases=_phases(stats[-1] if stats else {}),
        explicit=explicit_passed,
    )


class IllFormedAnswer(AssertionError):
    """The target answered something its interface does not allow, and kvgate's code, reading
    on, raised: the answer is the finding (a counterexample, exit 1), not kvgate."""


def blamed(error: BaseException | None) -> BaseException | None:
    """``error`` as the run reports it. An exception raised in kvgate's own code is kvgate's
    (no verdict) only where the target's answers up to it were all well-formed; after an
    ill-formed one (``answers.LEDGER``, of the example that failed: Hypothesis replays it
    last) the answer is the finding, with the shrunk steps Hypothesis noted on the error."""
    if error is None or isinstance(error, (AssertionError, TargetError)):
        return error
    if isinstance(error, BadAnswer):  # one no oracle turned into a divergence
        found = IllFormedAnswer(f"{error} (an answer the interface does not allow)")
    else:
        where, harness = raised_at(error)
        if not harness or not LEDGER.first:
            return error
        found = IllFormedAnswer(
            f"{LEDGER.first} (an answer the interface does not allow; kvgate then raised "
            f"{type(error).__name__} at {where})"
        )
    found.__cause__ = error
    for note in getattr(error, "__notes__", None) or []:
        found.add_note(note)
    return found


def _phases(stats: dict) -> dict[str, int]:
    """Test cases per phase from Hypothesis's statistics dict."""

    def cases(phase: str) -> list[dict]:
        return list((stats.get(phase) or {}).get("test-cases") or [])

    generated = cases("generate-phase")
    return {
        "reused": len(cases("reuse-phase")),
        "generated": sum(c.get("status") in ("valid", "interesting") for c in generated),
        "invalid": sum(c.get("status") in ("invalid", "overrun") for c in generated),
        "shrinking": len(cases("shrink-phase")),
    }


def _step_rules(machine_cls) -> frozenset[str]:
    """Names of the machine's ``@rule`` methods (not ``@initialize`` or ``@invariant``)."""
    names = set()
    for name in dir(machine_cls):
        if private.is_step_rule(getattr(machine_cls, name, None)):
            names.add(name)
    return frozenset(names)


def _labels_of(machine_cls) -> Counter:
    """The labels this run's examples earned: a ``Recorded`` machine class's own ``coverage``
    (``Counted`` is a fresh subclass, so it holds this run's counts only)."""
    labels = getattr(machine_cls, "coverage", None)
    return labels if isinstance(labels, Counter) else Counter()
