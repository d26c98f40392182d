"""The manager-vs-model machine: passes on impl, catches every catalogued variant.

Runs under the active profile (``ci`` in CI: derandomized, so these results are fixed).
"""
from __future__ import annotations

import pytest

from kvgate.properties.manager_machine import LABELS, make_machine
from kvgate.properties.mutants import MUTANTS
from kvgate.properties.runner import run_machine
from kvgate.properties.targets import resolve_target

MAX_SHRUNK_STEPS = 12


@pytest.mark.parametrize("spec", ["impl:lru", "impl:arc"])
def test_machine_passes_on_impl_and_every_label_fires(spec):
    # 300 examples keep CI short; the thorough profile runs 2,000 of up to 50 steps.
    result = run_machine(make_machine(resolve_target(spec)), max_examples=300)
    assert result.passed, result.message + "\n" + "\n".join(result.program)
    assert result.examples > 0 and result.steps > 0
    missing = [label for label in LABELS if not result.labels.get(label)]
    assert not missing, f"labels never hit: {missing}; seen {result.labels}"


def test_machine_passes_on_impl_as_a_foreign_target():
    """The adoption path (SPEC section 9): legality checks, then the model follows."""
    result = run_machine(make_machine(resolve_target("foreign=kvgate.impl.manager:OffloadingManager")),
                         max_examples=200)
    assert result.passed, result.message + "\n" + "\n".join(result.program)


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_machine_catches_variant(name):
    # A run stops at the first failure, so the larger budget costs only the variants that
    # need a longer setting (ARC's ghost lists need two evictions in a row).
    result = run_machine(make_machine(resolve_target(f"mutant:{name}")), max_examples=1500)
    assert not result.passed, f"{name} was not caught"
    assert "Divergence" in type(result.error).__name__ or isinstance(result.error, AssertionError)
    assert 1 <= result.shrunk_steps <= MAX_SHRUNK_STEPS, "\n".join(result.program)


def test_foreign_target_that_counts_every_offer_is_told_its_admission_differs():
    """On the adoption path the admission is compared before the target's chunk choice."""
    target = resolve_target("foreign=kvgate.properties.mutants:EveryOfferCounts")
    result = run_machine(make_machine(target), max_examples=300)
    assert not result.passed
    assert "admitted keys differ: target answered {'store': ['A']}, model answered " \
           "{'store': []}" in result.message, result.message


def test_printed_program_replays_outside_hypothesis():
    """The shrunk program Hypothesis prints runs as plain Python and fails the same way."""
    machine = make_machine(resolve_target("mutant:every_offer_counts"))
    result = run_machine(machine, max_examples=300)
    assert not result.passed
    program = result.program
    assert program[0] == f"state = {machine.__name__}()", result.program
    with pytest.raises(type(result.error)) as caught:
        exec("\n".join(program), {machine.__name__: machine})
    assert str(caught.value).splitlines()[0] == str(result.error).splitlines()[0]
