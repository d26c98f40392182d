"""Symbolic checks of the admission rule (ISSUE 7): CrossHair's ``check`` on the model's
contracts and laws, ``diffbehavior`` of impl's step (no difference) and of the every-offer-counts
step (a difference) against the model's, and the same properties as Hypothesis tests, on the
default backend and on CrossHair's (the ``crosshair`` profile).

Every CrossHair bound is CPU time, so a loaded machine takes longer but searches as far.
"""

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgate.model import admission
from kvgate.properties.symbolic import crosshair as symbolic
from kvgate.properties.symbolic import laws
from kvgate.properties.symbolic.crosshair import (
    Key,
    Small,
    call_checked,
    call_checked_on,
    small_state,
)

pytestmark = pytest.mark.crosshair

ROOT = Path(__file__).resolve().parents[1]
SMALL = "kvgate.properties.symbolic.crosshair."


# ---- CrossHair's commands


def test_check_finds_no_counterexample_to_the_step_contract():
    out = symbolic.run(symbolic.check_command("kvgate.model.admission", timeout=2))
    assert out.returncode == 0 and "error" not in out.output, out.output


def test_check_finds_no_counterexample_to_the_laws():
    out = symbolic.run(symbolic.check_command("kvgate.properties.symbolic.laws", timeout=5))
    assert out.returncode == 0 and "error" not in out.output, out.output


def test_diffbehavior_finds_no_difference_between_impl_and_model():
    out = symbolic.run(symbolic.diff_command(SMALL + "model_small", SMALL + "impl_small", 12))
    assert out.returncode == 0 and out.output.startswith("No differences found"), out.output


def test_diffbehavior_finds_the_every_offer_counts_step():
    out = symbolic.run(
        # 10 CPU seconds: it reports the difference within 6 here (20 cost the suite 10 more)
        symbolic.diff_command(SMALL + "model_small", SMALL + "every_offer_counts_small", 10)
    )
    assert out.returncode == 1, out.output
    found = symbolic.given_lines(out.output)
    assert found, out.output
    for args in found:  # each reported input really tells the two apart, on the counts
        model_out = symbolic.model_small(*args)
        bad_out = symbolic.every_offer_counts_small(*args)
        assert model_out[0] != bad_out[0], (args, model_out, bad_out)
        assert model_out == symbolic.impl_small(*args)


# ---- the same properties as Hypothesis tests, on ``small_state``'s inputs

key, small = st.sampled_from(Key), st.sampled_from(Small)
keyset = st.frozensets(key)
small_inputs = st.tuples(
    st.lists(st.tuples(key, small), max_size=3).map(tuple),
    keyset,
    keyset,
    st.lists(key, max_size=4).map(tuple),
    keyset,
    small,
    small,
)
request_offers = st.lists(st.tuples(st.integers(0, 2), st.lists(key, max_size=2)), max_size=4)
INDEX = {k: i for i, k in enumerate(laws.KEYS)}


def law_args(args):
    """``model.laws``' encoding of a small input: (pairs, mask, offer, t, size)."""
    tracker, counted, _, offer, _, t, size = small_state(*args)
    return (
        tuple((INDEX[k], n) for k, n in tracker),
        sum(1 << INDEX[k] for k in counted),
        tuple(INDEX[k] for k in offer[:3]),
        t,
        size,
    )


def impl_matches_model(args):
    assert symbolic.impl_small(*args) == symbolic.model_small(*args)


def step_contract_holds(args):
    call_checked(admission.admission_step, *small_state(*args))


def laws_hold(args):
    call_checked(laws.reoffer, *law_args(args))
    if args[5] >= 2:
        call_checked(laws.after_reset, *law_args(args))


def requests_law_holds(offers, t, size):
    offers = [(req, tuple(INDEX[k.value] for k in offer)) for req, offer in offers]
    call_checked(laws.offers_from_requests, offers, t, size)


# The tests that claim Hypothesis *finds* a difference name their settings: the ``ci`` profile
# (derandomized), no example database, whatever profile the suite loaded. The property tests
# that must hold keep the loaded profile (``HYPOTHESIS_PROFILE=crosshair`` runs them
# symbolically), without an example database, so a local .hypothesis directory changes nothing.
CATCH = settings(settings.get_profile("ci"), derandomize=True, database=None)


DIFFERS = "the every-offer-counts step answers other than the model"


def every_offer_counts_differs(parent=CATCH, max_examples=500):
    """A test that fails where Hypothesis tells the every-offer-counts step from the model."""

    @settings(parent, database=None, max_examples=max_examples)
    @given(small_inputs)
    def same(args):
        bad, model = symbolic.every_offer_counts_small(*args), symbolic.model_small(*args)
        assert bad == model, DIFFERS

    return same


requests = (request_offers, st.integers(2, 3), st.integers(1, 3))
NO_DATABASE = settings(database=None)  # the loaded profile otherwise (read at import)
test_impl_step_matches_model = NO_DATABASE(given(small_inputs)(impl_matches_model))
test_step_contract_holds = NO_DATABASE(given(small_inputs)(step_contract_holds))
test_laws_hold = NO_DATABASE(given(small_inputs)(laws_hold))
test_requests_law_holds = NO_DATABASE(given(*requests)(requests_law_holds))


def contract_refuses(bad_step, parent=CATCH, max_examples=500):
    """A test that fails where the model's step contract refuses ``bad_step``'s answer."""

    @settings(parent, database=None, max_examples=max_examples)
    @given(small_inputs)
    def holds(args):
        call_checked_on(admission.admission_step, bad_step(*args), *small_state(*args))

    return holds


def test_the_amended_a2_contract_refuses_the_old_reentry_rule():
    with pytest.raises(AssertionError, match="post:"):
        contract_refuses(symbolic.old_reentry_small)()


def test_hypothesis_finds_the_every_offer_counts_step():
    with pytest.raises(AssertionError, match=DIFFERS):
        every_offer_counts_differs()()


# ---- and on CrossHair's backend (the ``crosshair`` profile), a few paths each

# derandomize: where Hypothesis's own generator fills in for the solver, it draws the same.
CROSSHAIR = settings(
    settings.get_profile("crosshair"),
    suppress_health_check=list(HealthCheck),
    derandomize=True,
    database=None,
)


def on_crosshair(test, paths):
    return settings(CROSSHAIR, max_examples=paths)(test)


test_impl_step_matches_model_crosshair = on_crosshair(given(small_inputs)(impl_matches_model), 10)
test_step_contract_holds_crosshair = on_crosshair(given(small_inputs)(step_contract_holds), 10)
test_laws_hold_crosshair = on_crosshair(given(small_inputs)(laws_hold), 10)
test_requests_law_holds_crosshair = on_crosshair(given(*requests)(requests_law_holds), 10)


def test_crosshair_backend_finds_the_old_reentry_rule_against_the_contract():
    with pytest.raises(AssertionError, match="post:"):
        contract_refuses(symbolic.old_reentry_small, CROSSHAIR, max_examples=150)()


def test_crosshair_backend_finds_the_every_offer_counts_step():
    with pytest.raises(AssertionError, match=DIFFERS):
        every_offer_counts_differs(CROSSHAIR, max_examples=150)()
