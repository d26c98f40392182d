"""A harness error is never a verdict (issue 31, spec §9): an exception the target raises is a
divergence that names the call, the exception and where in the target it was raised; an answer
the interface does not allow is a divergence too; an exception raised in kvgate's own code (the
adapter, a machine) ends the check with exit 2 and one line naming it. Each kind is planted
here, against the vLLM-shaped stand-in of tests/fake_vllm.py (no vLLM needed)."""

from __future__ import annotations

import re

import pytest

from kvgate.cli import main


def check(capsys, target: str) -> tuple[int, str]:
    code = main(
        ["check", "--target", target, "--machine", "manager", "--profile", "ci"]
        + ["--max-examples", "60", "--no-database"]
    )
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_an_exception_the_target_raises_is_a_divergence_naming_where(capsys):
    code, out = check(capsys, "vllm=tests.harness_stand_ins:RaisesOnSecondOffer")
    assert code == 1, out
    assert "(the target raised)" in out, out
    assert "raised KeyError: 'planted in the target'" in out, out
    # where in the target: this file, in prepare_store
    assert re.search(r"at tests/harness_stand_ins\.py:\d+ in prepare_store", out), out
    assert "kvgate's own code" not in out


def test_an_answer_the_interface_does_not_allow_is_a_divergence(capsys):
    code, out = check(capsys, "vllm=tests.harness_stand_ins:LookupAnswersNone")
    assert code == 1, out
    assert "lookup answered None; the interface requires a LookupResult" in out, out
    assert "(an answer the interface does not allow)" in out, out


def test_kvgate_raising_inside_a_target_call_is_exit_2_one_line(capsys, monkeypatch):
    """The adapter itself breaks while reading an answer: no counterexample, exit 2."""
    import kvgate.properties.engines.vllm.adapter as adapter

    monkeypatch.setattr(adapter, "_ids", None)  # kvgate's own helper, gone
    code, out = check(capsys, "vllm=tests.harness_stand_ins:FakeManager")
    assert code == 2, out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("ERROR ")]
    assert "kvgate's own code raised TypeError" in line, line
    assert re.search(r"at properties/engines/vllm/adapter\.py:\d+ in prepare_", line), line
    assert "no verdict on the target" in line, line
    assert "--- counterexample" not in out, out
    assert "result: a target could not be checked (exit 2)" in out, out


def test_kvgate_raising_in_a_machine_is_exit_2_one_line(capsys, monkeypatch):
    """A machine's own code breaks between target calls: exit 2, naming the machine."""
    import kvgate.properties.manager_machine as machine

    monkeypatch.setattr(machine, "KEYS", {})  # the machine's own key table, emptied
    code, out = check(capsys, "vllm=tests.harness_stand_ins:FakeManager")
    assert code == 2, out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("ERROR ")]
    assert "kvgate's own code raised KeyError" in line, line
    assert "properties/manager_machine.py" in line and "the manager machine" in line, line
    assert "--- counterexample" not in out, out


@pytest.mark.parametrize("missing", ["get_stats", "reset_cache"])
def test_a_call_the_target_lacks_is_never_drawn_and_named(capsys, missing):
    """Capability: a release without get_stats or reset_cache (vLLM 0.21.0) is checked on the
    rest, and the report says what that leaves unchecked."""
    code, out = check(capsys, f"vllm=tests.harness_stand_ins:Without_{missing}")
    assert code == 0, out
    assert f"lacks {missing}" in out or ("lacks " in out and missing in out), out
    assert re.search(rf"not checked for .*no [a-z_, ]*{missing}[a-z_, ]* steps", out), out


def test_a_call_the_connector_needs_and_the_target_lacks_is_the_targets_counterexample():
    """vLLM 0.34.0's connector calls its manager's ``shutdown()`` unconditionally: a target
    that lacks it fails there, as it would in vLLM. To ``hasattr`` the call stays absent (the
    connector's probes see what the target has); called anyway, it is an assertion of the
    target's gap, a counterexample, never "kvgate's own code raised"."""
    from kvgate.properties.adapters import no_verdict
    from kvgate.properties.engines.vllm.front import Front, LacksCall
    from kvgate.properties.runner import blamed

    front = Front(None, None, object(), None)
    assert not hasattr(front, "shutdown") and getattr(front, "touch", None) is None
    with pytest.raises(LacksCall, match=r"asked the target for shutdown\(\), which it lacks") as e:
        front.shutdown()
    assert blamed(e.value) is e.value and no_verdict(e.value, "the vllm-scheduler machine") == ""
    with pytest.raises(AttributeError, match="lookup_twice"):
        getattr(front, "lookup_twice")  # noqa: B009 - not a call of the interface: plain


def test_a_policy_state_of_the_wrong_shape_is_the_targets_divergence():
    """The adapter reads the policy's order off vLLM's policy internals (ARC's four lists, the
    request-scoped LRU's ranks). A mutant of vLLM's ARC that sets a ghost list to ``None``
    (its own code reads it only later) made that read raise inside kvgate, a "kvgate bug";
    the internals are an answer like any other: checked for their shape first."""
    from collections import OrderedDict
    from types import SimpleNamespace

    from kvgate.properties.answers import BadAnswer
    from kvgate.properties.engines.vllm.adapter import VllmAdapter, VllmTypes
    from tests import fake_vllm

    def arc(**lists):
        policy = SimpleNamespace(target_t1_size=0.0, **lists)
        return SimpleNamespace(_policy=policy)

    adapter = VllmAdapter(fake_vllm.FakeManager(2), VllmTypes.from_module(fake_vllm))
    adapter.inner = arc(t1=OrderedDict(), t2=OrderedDict(), b1=OrderedDict(), b2=OrderedDict())
    assert adapter.policy_state() == {"t1": [], "t2": [], "b1": [], "b2": [], "p": 0.0}
    adapter.inner = arc(t1=OrderedDict(), t2=OrderedDict(), b1=None, b2=OrderedDict())
    with pytest.raises(BadAnswer, match=r"the policy's order \(ARC's b1\) answered None"):
        adapter.policy_state()
    adapter.inner = SimpleNamespace(_policy=SimpleNamespace(_ranks=[b"k"]))
    with pytest.raises(BadAnswer, match=r"the policy's order \(_ranks\) answered"):
        adapter.policy_state()
