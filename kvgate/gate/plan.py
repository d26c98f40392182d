"""Which machine runs on which target (``plan_runs``: what ``--machine``, ``all`` and the
default mean), the targets resolved before anything runs, and the profile a run takes."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import settings as Settings

from kvgate.properties.adapters import Target
from kvgate.properties.profiles import PROFILES, default_profile
from kvgate.properties.targets import resolve_target

from .errors import UsageError
from .machines import MACHINES, engine_of


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
            why = machine.not_for(target) or _other_engine(machine, target)
            if why:
                raise UsageError(f"--machine {name} does not apply to target {target.spec}: {why}")
    runs = []
    left: dict[tuple[str, str], list[str]] = {}
    available: dict[str, str | None] = {}
    for target in targets:
        for m in MACHINES.values():
            if _other_engine(m, target):
                continue  # another engine's machine: not left out, never for it
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


def _other_engine(machine, target) -> str | None:
    """Why ``machine`` never drives ``target``: it is for another engine's targets."""
    engine = engine_of(target)
    if machine.engine == engine:
        return None
    if engine:
        return f"it drives a manager; {target.spec} is {engine}'s cache: --machine {engine}"
    return f"it drives {machine.engine}'s own cache, so only {machine.targets}"


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
