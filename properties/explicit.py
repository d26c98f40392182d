"""Explicit programs: fixed step sequences a machine runs besides what Hypothesis draws.

Random exploration reaches some configurations too rarely for a gate's budget (a window that
keeps tokens below itself, met by a request whose prompt is a proper prefix of one the CPU tier
holds, after the GPU cache forgot it). A machine may list programs that go there on purpose
(``explicit_programs()``, a classmethod); ``properties.runner.run_machine`` runs them after
the drawn examples passed, when the profile's phases include ``Phase.explicit`` (Hypothesis's
own phase for examples given by hand). A program asserts nothing of its own: the machine's
checks and its lockstep oracle judge every step, as they judge a drawn one.

A program is a list of calls, ``(method, kwargs)``, written as Hypothesis prints a program: the
set-up rule, every step rule, the invariants after each. A step rule whose precondition does
not hold when its turn comes is skipped (so one program can serve every layout), and not printed.
A failure carries the program up to the failing call as its notes, in Hypothesis's form, so a
failing program prints, replays and writes a repro file like a shrunk counterexample.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .search import hypothesis_private as private


@dataclass(frozen=True)
class Program:
    """A named sequence of calls on a fresh machine (``teardown`` is added at the end)."""

    name: str  # what the program is for, printed with a failure
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()


def _line(method: str, kwargs: dict[str, Any]) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in sorted(kwargs.items()))
    return f"state.{method}({args})"


def run_program(machine_cls: type, program: Program) -> BaseException | None:
    """Run ``program`` on a fresh ``machine_cls``; the failure (with the program as its notes),
    or ``None``."""
    rules = {private.rule_name(r): r for r in private.machine_rules(machine_cls)}
    state = machine_cls()
    lines = [f"state = {machine_cls.__name__}()"]
    error: BaseException | None = None
    try:
        for method, kwargs in program.calls:
            rule = rules.get(method)
            if rule is not None and not private.rule_ready(state, rule):
                continue
            lines.append(_line(method, kwargs))
            getattr(state, method)(**kwargs)
    except Exception as exc:
        error = exc
        # inside the handler, as Hypothesis tears down while a failure propagates
        with contextlib.suppress(Exception):
            state.teardown()
    else:
        lines.append("state.teardown()")
        try:
            state.teardown()
        except Exception as exc:
            error = exc
    if error is not None:
        error.add_note("\n".join([f"# explicit program: {program.name}", *lines]))
    return error


def run_programs(
    machine_cls: type, programs: Sequence[Program]
) -> tuple[int, BaseException | None]:
    """``programs`` run in order up to the first failure: how many passed, and the failure or
    ``None``."""
    for passed, program in enumerate(programs):
        error = run_program(machine_cls, program)
        if error is not None:
            return passed, error
    return len(programs), None
