"""The state machines alone, as mutmut runs them (``python -m bench.mutation --run``;
docs/mutation.md).

Only the manager-vs-model machine (impl, each policy) and the scheduler machine run here: a
mutant of impl's manager, tracker, pool or policies counts as killed only if a machine catches
it, never an example test. Settings are fixed (the ``ci`` profile: derandomized, so every run
draws the same examples) and shrinking is off: a failure is a kill, its shortest form does not
matter here, and shrinking would cost each killed mutant seconds.

These runs duplicate part of tests/test_manager_machine.py and tests/test_scheduler.py, so the
normal suite leaves this folder out (``norecursedirs`` in pyproject.toml); ``pytest
tests/mutation`` runs it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import kvgate.impl.manager
from kvgate.properties import scheduler_machine
from kvgate.properties.manager_machine import make_machine
from kvgate.properties.profiles import FIRST_FAILURE
from kvgate.properties.runner import run_machine
from kvgate.properties.targets import resolve_target

PROFILE = "ci"
MANAGER_EXAMPLES = 300
SCHEDULER_EXAMPLES = 200


def test_the_machines_see_the_mutated_copy():
    """Under mutmut (``MUTANT_UNDER_TEST`` set), impl is imported from mutmut's copy of the
    tree, the one with the trampolines, not from the editable install."""
    if not os.environ.get("MUTANT_UNDER_TEST"):
        pytest.skip("only under mutmut")
    path = Path(kvgate.impl.manager.__file__).resolve()
    assert path.is_relative_to(Path.cwd().resolve()), (path, Path.cwd())
    assert "mutmut generated" in path.read_text(), path


def _passes(result):
    assert result.passed, result.message + "\n" + "\n".join(result.program)


@pytest.mark.parametrize("spec", ["impl:lru", "impl:arc"])
def test_manager_machine(spec):
    machine = make_machine(resolve_target(spec))
    _passes(run_machine(machine, PROFILE, max_examples=MANAGER_EXAMPLES, phases=FIRST_FAILURE))


def test_scheduler_machine():
    machine = scheduler_machine.make_machine(resolve_target("impl"))
    _passes(run_machine(machine, PROFILE, max_examples=SCHEDULER_EXAMPLES, phases=FIRST_FAILURE))
