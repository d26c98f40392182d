"""The machines and one run of them: the registry of machines (``MACHINES``: how each is
built for a target, which targets it is for, whether it can run here), the plan of which
machine runs on which target (``plan_runs``: what ``--machine``, ``all`` and the default
mean), and one machine checking one target under a profile (``run_one``).

``run_one`` never raises for a counterexample or a target error: both end up in the ``Run``.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import Phase
from hypothesis import settings as Settings

from kvgate.properties.adapters import Target, TargetError, harness_error, raised_at
from kvgate.properties.known import KnownDefects, gone_error, with_known
from kvgate.properties.profiles import PHASES, PROFILES, default_profile
from kvgate.properties.runner import PROFILE_DATABASE, RunResult, run_machine
from kvgate.properties.targets import resolve_target

from .errors import UsageError, one_line

# --------------------------------------------------------------------------- the machines


@dataclass(frozen=True)
class Machine:
    """One machine the gate can run: how to build it for a target, the targets it is for,
    and whether it can be built here; each "no" is one line saying why."""

    name: str
    what: str  # one line for `kvgate list`
    build: Callable[[Target], type]
    targets: str = "every target"  # which targets it is for, in words
    not_for: Callable[[Target], str | None] = lambda target: None
    unavailable: Callable[[], str | None] = lambda: None
    install: Callable[[], str] = lambda: ""  # what makes it available, when it is not


def _manager(target: Target):
    from kvgate.properties.manager_machine import make_machine

    return make_machine(target)


def _scheduler(target: Target):
    from kvgate.properties.scheduler_machine import make_machine

    return make_machine(target)


VLLM_SCHEDULER_MODULE = "kvgate.properties.vllm_harness.machine"


def _vllm_scheduler(target: Target):
    return importlib.import_module(VLLM_SCHEDULER_MODULE).make_machine(target)


def _is_vllm_target(target: Target) -> bool:
    """A target with vLLM's interface (``vllm``, ``vllm=MODULE:ATTR``, either foreign)."""
    return not target.kvgate_interface


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {one_line(str(exc))}".rstrip(": ")


def _vllm_missing() -> str | None:
    """Why the installed vLLM cannot be used, or None."""
    from kvgate.properties.vllm_harness.adapter import VLLM_MANAGER

    try:
        importlib.import_module(VLLM_MANAGER)
    except Exception as exc:
        return f"vLLM is not importable ({_said(exc)})"
    return None


def _vllm_scheduler_unavailable() -> str | None:
    """vLLM first (what a user must install); then the machine's module, which may not exist
    in this tree yet (an ImportError of that very module); then what the module says."""
    missing = _vllm_missing()
    if missing:
        return missing
    try:
        module = importlib.import_module(VLLM_SCHEDULER_MODULE)
    except ImportError as exc:
        if exc.name == VLLM_SCHEDULER_MODULE:
            return f"not built in this kvgate yet: {VLLM_SCHEDULER_MODULE} does not exist"
        return f"{VLLM_SCHEDULER_MODULE} does not import ({_said(exc)})"
    return module.unavailable_reason()


def _vllm_install() -> str:
    """How to install a release (spec §10), when vLLM is what is missing."""
    from kvgate.properties.vllm_harness.adapter import INSTALL_HINT

    return INSTALL_HINT if _vllm_missing() else ""


MACHINES: dict[str, Machine] = {
    m.name: m
    for m in (
        Machine("manager", "manager vs model in lockstep, call by call (the quick path)", _manager),
        Machine(
            "scheduler",
            "requests through kvgate's scheduler driver, every manager call checked",
            _scheduler,
        ),
        Machine(
            "vllm-scheduler",
            "requests through vLLM's own scheduler and offloading "
            "connector, every manager call checked",
            _vllm_scheduler,
            targets="vllm and vllm=MODULE:ATTR targets",
            not_for=lambda t: (
                None
                if _is_vllm_target(t)
                else "it drives vLLM's own scheduler, so only vllm and vllm=MODULE:ATTR targets"
            ),
            unavailable=_vllm_scheduler_unavailable,
            install=_vllm_install,
        ),
    )
}


def build_machine(kind: str, target: Target):
    """The machine class of ``kind`` checking ``target``, named as Hypothesis prints it."""
    if kind not in MACHINES:
        raise UsageError(f"unknown machine {kind!r}; one of {', '.join(MACHINES)}")
    return MACHINES[kind].build(target)


@dataclass
class Plan:
    """Which machine runs on which target, and what was left out and why."""

    runs: list[tuple[str, Target]]
    left_out: list[tuple[str, str, list[str]]]  # machine, why, the target specs it concerns

    @property
    def kinds(self) -> list[str]:
        return list(dict.fromkeys(kind for kind, _ in self.runs))

    def stop(self, kind: str, target: Target, failed_on: str) -> None:
        """``kind`` does not run on ``target``: an earlier machine already failed it."""
        why = f"{target.spec} already failed on {failed_on}; --keep-going runs every machine"
        self.left_out.append((kind, why, [target.spec]))

    def left_out_lines(self, all_specs: Sequence[str]) -> list[str]:
        out = []
        for kind, why, specs in self.left_out:
            where = "" if list(specs) == list(all_specs) else f" for {', '.join(specs)}"
            out.append(f"left out: {kind}{where} ({why})")
        return out


def plan_runs(choice: str | None, targets: Sequence[Target]) -> Plan:
    """``choice`` None or ``all``: every machine that applies to each target and can be built
    here, the rest left out with the reason. Machines named (one, or several joined by commas)
    must run on every target: if one cannot, a ``UsageError`` (one line) before anything
    runs."""
    named = [] if choice in (None, "all") else choice.split(",")
    for name in named:
        if name not in MACHINES:
            raise UsageError(f"unknown machine {name!r}; one of {', '.join(MACHINES)}")
        machine = MACHINES[name]
        why = machine.unavailable()
        if why:
            hint = machine.install()
            raise UsageError(
                f"--machine {name}: cannot run here: {why}"
                + (f"; {hint}" if hint and hint not in why else "")
            )
        for target in targets:
            why = machine.not_for(target)
            if why:
                raise UsageError(f"--machine {name} does not apply to target {target.spec}: {why}")
    runs = []
    left: dict[tuple[str, str], list[str]] = {}
    available: dict[str, str | None] = {}
    for target in targets:
        for m in MACHINES.values():
            why = m.not_for(target)
            if why is None and named and m.name not in named:
                why = f"--machine {choice}; without --machine every machine that applies runs"
            if why is None:
                if m.name not in available:  # asked once, and only where it would run
                    available[m.name] = m.unavailable()
                why = available[m.name] and (
                    f"unavailable here: {available[m.name]}"
                    + (f"; --machine {m.name} says how to install it" if m.install() else "")
                )
            if why:
                left.setdefault((m.name, why), []).append(target.spec)
            else:
                runs.append((m.name, target))
    return Plan(runs, [(kind, why, specs) for (kind, why), specs in left.items()])


def choose_profile(flag: str | None) -> str:
    """``--profile``, else ``$HYPOTHESIS_PROFILE``, else ci under ``$CI``, else dev; a
    ``HYPOTHESIS_PROFILE`` that names no profile is a ``UsageError``."""
    if flag:
        return flag
    try:
        return default_profile()
    except ValueError:
        raise UsageError(
            f"HYPOTHESIS_PROFILE={os.environ.get('HYPOTHESIS_PROFILE')!r}: not a "
            f"profile; one of {', '.join(PROFILES)}"
        ) from None


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
    ``properties.known``): not compared, and a passing run that never saw one fails."""
    run = Run(kind, target.spec, target.foreign)
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
    gone = gone_error(run.known) if run.known is not None and result.passed else None
    if gone is not None:  # strict: the declaration outlived the fix
        result.passed, result.error = False, gone
    error = result.error
    if isinstance(error, TargetError):
        run.target_error = one_line(str(error))
    elif error is not None and isinstance(getattr(error, "__cause__", None), TargetError):
        run.target_error = one_line(str(error.__cause__))
    elif error is not None and not isinstance(error, AssertionError):
        # Not a property's failure: where it was raised decides (spec §9). In kvgate's own code
        # (a machine, the oracle, an adapter, Hypothesis) it is no verdict: exit 2, one line.
        where, harness = raised_at(error)
        if harness:
            kind_text = f"the {kind} machine"
            run.target_error = one_line(
                str(harness_error(error, where, kind_text, target.release or target.spec))
            )
    return run
