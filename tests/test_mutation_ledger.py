"""A mutant's run that leaves no verdict (the gate's exit 2) is never counted as a kill: the
mutation suites' tests write it to a ledger and skip (tests/mutation/verdicts.py), and the
bench lists it apart (bench/mutation.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.mutation import KILLED, NO_VERDICT, read_ledger, score, set_apart
from kvgate.properties.adapters import TargetError
from tests.mutation import verdicts


def _result(error):
    return SimpleNamespace(passed=error is None, error=error, message=str(error), program=[])


def _harness_bug():
    from kvgate.properties import adapters

    try:
        adapters._short(None)  # kvgate's own code raising on what it was handed
    except TypeError as exc:
        return exc
    raise AssertionError("adapters._short(None) no longer raises: pick another")


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    monkeypatch.setenv(verdicts.LEDGER, str(tmp_path / "ledger"))
    monkeypatch.delenv("KVGATE_CONNECTOR_MUTANT", raising=False)
    return tmp_path / "ledger"


def test_no_verdict_under_a_mutant_is_written_and_skipped(ledger, monkeypatch):
    monkeypatch.setenv("MUTANT_UNDER_TEST", "vllm.m.x_f__mutmut_3")
    error = TargetError("vLLM 0.34.0: the target could not be driven")
    with pytest.raises(pytest.skip.Exception, match="no verdict .exit 2., listed apart"):
        verdicts.judge(_result(error), "manager (lru)")
    rows = read_ledger(ledger)
    assert list(rows) == ["vllm.m.x_f__mutmut_3"]
    assert rows["vllm.m.x_f__mutmut_3"][0]["test"] == "manager (lru)"
    assert "could not be driven" in rows["vllm.m.x_f__mutmut_3"][0]["line"]


def test_no_verdict_on_the_unmutated_tree_fails(ledger, monkeypatch):
    for baseline in ("", "stats"):  # mutmut's clean run and its coverage run
        monkeypatch.setenv("MUTANT_UNDER_TEST", baseline)
        with pytest.raises(pytest.fail.Exception, match="no verdict .exit 2. on the unmutated"):
            verdicts.judge(_result(TargetError("cannot drive it")), "scheduler")
    assert read_ledger(ledger) == {}


def test_a_counterexample_fails_and_a_pass_passes(ledger, monkeypatch):
    monkeypatch.setenv("MUTANT_UNDER_TEST", "m__mutmut_1")
    with pytest.raises(AssertionError, match="stores_skipped"):
        verdicts.judge(_result(AssertionError("stores_skipped differs")), "manager (arc)")
    verdicts.judge(_result(None), "manager (arc)")
    assert read_ledger(ledger) == {}


def test_the_bench_counts_a_no_verdict_run_apart_not_as_a_kill(ledger, monkeypatch):
    monkeypatch.setenv("MUTANT_UNDER_TEST", "a__mutmut_1")
    with pytest.raises(pytest.skip.Exception):
        verdicts.judge(_result(_harness_bug()), "vllm-scheduler")
    monkeypatch.setenv("MUTANT_UNDER_TEST", "b__mutmut_2")
    with pytest.raises(pytest.skip.Exception):
        verdicts.judge(_result(_harness_bug()), "vllm-scheduler")
    # a's other machines all passed; b was killed by another machine's counterexample
    statuses = {"a__mutmut_1": "survived", "b__mutmut_2": "killed", "c__mutmut_3": "killed"}
    apart = set_apart(statuses, read_ledger(ledger))
    assert list(apart) == ["a__mutmut_1"]
    assert "kvgate's own code raised TypeError" in apart["a__mutmut_1"]["lines"][0]
    assert statuses["a__mutmut_1"] == NO_VERDICT and NO_VERDICT not in KILLED
    counts = {"killed": 2, NO_VERDICT: 1}
    result = {"mutants": 3, "counts": counts, "goal": 0.9, "no_verdict": apart}
    assert score(result, [])["killed"] == 2 and score(result, [])["no_verdict"] == 1
