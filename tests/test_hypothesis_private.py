"""The private Hypothesis APIs kvgate uses (properties/search/hypothesis_private.py, the one
module that touches them) are there, in the shape kvgate uses, and in effect; an upgrade that
changes one fails here, naming the installed version and the one they were checked with."""

from __future__ import annotations

import re
from pathlib import Path

import hypothesis
from hypothesis.internal.conjecture import providers
from hypothesis.stateful import RuleStrategy

from kvgate.properties.search import hypothesis_private as private
from kvgate.properties.search.rule_choice import WeightedRules
from kvgate.properties.targets import resolve_target

ROOT = Path(__file__).resolve().parents[1]


def verdict(found: list[str]) -> str:
    return (
        f"Hypothesis {hypothesis.__version__} (kvgate's uses of its internals were checked "
        f"with {private.CHECKED_WITH}): " + "; ".join(found)
    )


def test_every_private_api_kvgate_uses_is_as_kvgate_uses_it():
    found = private.problems()
    assert not found, verdict(found)


def test_they_were_checked_with_the_pinned_version():
    pinned = re.search(r"^hypothesis==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert pinned and pinned.group(1) == private.CHECKED_WITH, (
        "constraints.txt pins another Hypothesis than the one "
        "properties/search/hypothesis_private.py was checked with: check each use there, "
        "then update CHECKED_WITH"
    )


def test_a_changed_api_is_named_with_the_version(monkeypatch):
    monkeypatch.delattr(RuleStrategy, "_setup_for")
    monkeypatch.delattr(providers, "_local_constants")
    found = private.problems()
    assert any("_setup_for" in p for p in found), found
    assert any("_local_constants" in p for p in found), found
    assert verdict(found).startswith(f"Hypothesis {hypothesis.__version__} ")


def test_the_rule_choice_and_the_empty_constant_pool_are_in_effect():
    """Not a silent fallback: a machine draws its steps from WeightedRules, and the pool of
    source constants is empty (both would quietly stop on a Hypothesis without them)."""
    from kvgate.properties.scheduler_machine import make_machine

    machine = make_machine(resolve_target("impl"))()
    assert isinstance(private.rule_strategy(machine), WeightedRules)
    assert not private.local_constants()
