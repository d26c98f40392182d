"""The manager-vs-model machine: passes on impl, reaches every situation, catches every
catalogued variant (a sample of them with a short counterexample that replays as plain Python).

Every run here uses the ``ci`` profile (derandomized), whatever profile the suite runs under:
a claim of coverage or of a catch must not depend on the seed.
"""

from __future__ import annotations

import re

import pytest

from kvgate.impl.base import ALLOCATION_SIZE, CACHE_USAGE, STORES_SKIPPED, ReqContext
from kvgate.impl.manager import OffloadingManager
from kvgate.properties import manager_machine
from kvgate.properties.adapters import POLICIES, RECENCIES, BadAnswer, NativeAdapter, Target
from kvgate.properties.catalogue.managers import MUTANTS
from kvgate.properties.manager_machine import make_machine
from kvgate.properties.profiles import FIRST_FAILURE
from kvgate.properties.runner import run_machine
from kvgate.properties.targets import resolve_target

MAX_SHRUNK_STEPS = 12
PROFILE = "ci"


def run(spec: str, max_examples: int | None, **overrides):
    machine = make_machine(resolve_target(spec))
    return machine, run_machine(machine, PROFILE, max_examples=max_examples, **overrides)


IMPL_SPECS = ("impl",)  # both policies, both recency semantics, drawn per example


@pytest.mark.parametrize("spec", IMPL_SPECS)
def test_machine_passes_on_impl_and_every_label_fires(spec):
    """The machine passes on impl, and each coverage label counts a decision it reaches there
    (a label no run hits would claim coverage the machine never gives). One run for both: 1,000
    examples (the ci profile's 600 with room), where every label fires ten times or more, so a
    small change to a machine's draws does not turn coverage red by chance."""
    machine, result = run(spec, 1000)
    assert result.passed, result.message + "\n" + "\n".join(result.program)
    assert result.examples > 0 and result.steps > 0
    never = [label for label in machine.expected_labels() if not result.labels.get(label)]
    assert not never, f"never hit: {never}; seen {result.labels}"


def test_machine_passes_on_impl_as_a_foreign_target():
    """The adoption path (spec §9): legality checks, then the model follows."""
    machine, result = run("foreign=kvgate.impl.manager:OffloadingManager", 300)
    assert result.passed, result.message + "\n" + "\n".join(result.program)
    assert result.labels.get("multi-victim eviction") and result.labels.get("offer refused (None)")
    assert "bad input refused" not in machine.expected_labels()  # an adapter cannot show it


# What a replay file imports (kvgate's repro files: ``from ...manager_machine import *``): a
# printed step may name the table of offers (``list(OFFERS[672])``).
REPLAY_NAMES = {name: getattr(manager_machine, name) for name in manager_machine.__all__}


def replays_outside_hypothesis(machine, result):
    """The shrunk program Hypothesis prints runs as plain Python and fails the same way, twice:
    a context's identity is reused the same way in every replay."""
    program = result.program
    assert program[0] == f"state = {machine.__name__}()", result.program
    for _ in range(2):
        with pytest.raises(type(result.error)) as caught:
            exec("\n".join(program), {**REPLAY_NAMES, machine.__name__: machine})
        assert str(caught.value).splitlines()[0] == str(result.error).splitlines()[0]
        del caught  # its traceback holds the replay's contexts


def requests_print_as_their_bundle_names(machine, result):
    """The divergence names a request as the printed program does (``requests_3``)."""
    named = re.findall(r"requests_\d+", result.message)
    assert named, result.message
    for name in named:
        assert any(name in line for line in result.program), (name, result.program)


def the_call_answered_what_the_interface_does_not_allow(machine, result):
    """An ill-formed answer is the target's divergence at the call that gave it (issue 48),
    never an error inside kvgate."""
    call = result.error.call.partition("(")[0]
    assert call and f"{call} answered " in result.message, result.message
    assert "(an answer the interface does not allow)" in result.message, result.message


# The variants whose answer breaks the interface on some step, one per call that answers.
ILL_FORMED = (
    "new_request_answers_nothing",
    "lookup_hit_as_bool",
    "load_answers_nothing",
    "store_spec_none_unless_run",
    "evicted_key_bare",
    "nothing_new_keys_none",
    "removal_event_bare_key",
    "samples_as_text",
    "config_lost_at_reset",
    "pending_work_as_count",
    "load_source_none_while_loading",
)

# What is checked of a catch besides the catch itself, on the variants that show it (one run
# each: a variant's counterexample is searched for and shrunk once).
ALSO = {
    "every_offer_counts": (replays_outside_hypothesis,),
    "records_by_identity": (replays_outside_hypothesis,),
    "records_by_req_id": (requests_print_as_their_bundle_names,),
    **{name: (the_call_answered_what_the_interface_does_not_allow,) for name in ILL_FORMED},
}


# The variants whose counterexample is shrunk here too (shrinking is nine tenths of a catch's
# time): the seed's bug, the two whose replay is checked, 0.34.0's defect and the one only the
# retained state shows. ``CI=true kvgate mutants`` shrinks every one (docs/catalogue.md).
SHRUNK = {
    "every_offer_counts",
    "records_by_identity",
    "records_by_req_id",
    "skip_undercount",
    "heap_never_compacted",
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_machine_catches_variant(name):
    """Every catalogued variant is caught at the budget users run: the ``ci`` profile's own
    (``CI=true kvgate mutants``, the default gate), never a larger one (issue 31); the first
    failure as found, and for the variants in ``SHRUNK`` the shrunk counterexample, at most
    ``MAX_SHRUNK_STEPS`` steps."""
    phases = {} if name in SHRUNK else {"phases": FIRST_FAILURE}
    machine, result = run(f"mutant:{name}", None, **phases)
    assert not result.passed, f"{name} was not caught"
    assert type(result.error).__name__ == "Divergence", result.message
    if name in SHRUNK:
        assert result.shrunk_steps <= MAX_SHRUNK_STEPS, "\n".join(result.program)
    for check in ALSO.get(name, ()):
        check(machine, result)


def test_foreign_target_that_counts_every_offer_is_told_its_admission_differs():
    """On the adoption path the admission is compared before the target's chunk choice."""
    _, result = run("foreign=kvgate.properties.catalogue.managers:EveryOfferCounts", 300)
    assert not result.passed
    assert "prepare_store(['A'], requests_" in result.message.splitlines()[0]
    assert "(admitted keys differ)" in result.message, result.message
    assert "target answered: store ['A']" in result.message, result.message
    assert "model answered:  store []" in result.message, result.message


class _RecencyFallsBack(OffloadingManager):
    """An unknown recency is taken as touch-based instead of refused."""

    def __init__(self, num_chunks, *, recency="touch", **kwargs):
        super().__init__(
            num_chunks, recency="touch" if recency not in RECENCIES else recency, **kwargs
        )


class _RecencyNotKept(OffloadingManager):
    """The recency it was built with is not the one it reports."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.recency = None


@pytest.mark.parametrize(
    "cls,said",
    [
        (_RecencyFallsBack, "the target accepts recency='sideways'"),
        (_RecencyNotKept, "target's recency is None"),
    ],
)
def test_a_target_told_the_recency_refuses_a_bad_one_and_keeps_a_good_one(cls, said):
    """Spec section 8: a target whose factory takes ``recency`` refuses an unknown one, naming
    it, and keeps the one it was built with (the construction check at each example's start)."""
    target = Target("test", cls, POLICIES, recencies=RECENCIES, takes_recency=True)
    result = run_machine(make_machine(target), PROFILE, max_examples=5)
    assert not result.passed
    assert said in result.message, result.message


def test_every_ill_formed_variant_is_catalogued():
    assert set(ILL_FORMED) <= set(MUTANTS)


class _StatsAnswer(OffloadingManager):
    """``get_stats()`` answers ``stats`` whatever happened."""

    stats: object = None

    def get_stats(self):
        return self.stats


@pytest.mark.parametrize(
    "stats,shown",
    [
        ({CACHE_USAGE: "0.5"}, f"{CACHE_USAGE} is '0.5'"),  # float() would read it
        ({STORES_SKIPPED: True}, f"{STORES_SKIPPED} is True"),
        ({ALLOCATION_SIZE: [1, None]}, f"{ALLOCATION_SIZE} is [1, None]"),  # float(None) raised
        ({ALLOCATION_SIZE: 2}, f"{ALLOCATION_SIZE} is 2"),
    ],
)
def test_a_native_metric_that_is_no_number_is_an_ill_formed_answer(stats, shown):
    """Every metric the oracle reads is checked before it reads it (issue 48): a sample that is
    no number once made kvgate's own comparison raise (no verdict), a number as text passed."""
    manager = _StatsAnswer(2)
    manager.stats = stats
    with pytest.raises(BadAnswer) as caught:
        NativeAdapter(manager).get_stats()
    assert str(caught.value).startswith(f"get_stats answered stats whose {shown}; "), caught.value


def test_native_stats_as_impl_answers_them_pass_the_check():
    manager = OffloadingManager(2, store_threshold=2)
    manager.prepare_store([b"A\0\0\0\0"], ReqContext("r"))
    got = NativeAdapter(manager).get_stats()
    assert got is not None and got[ALLOCATION_SIZE] == [] and got[STORES_SKIPPED] == 1
