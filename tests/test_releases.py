"""Older vLLM releases, each of a design of its own, held to the default gate's verdict
(``VERSION gate`` in .ci/vllm-releases.txt; docs/releases.md judges every release, from
``python docs/make_releases.py``).

- 0.28.0 keeps the threshold in the manager and feeds its tracker at ``lookup()`` (spec §3.2),
  answers ``on_new_request`` block-level, and its contexts hold no key positions.
- 0.21.0 keeps the threshold in a wrapper (``FilterReusedOffloadingManager``) fed at
  ``lookup()``, answers lookups with a bool, and has no ``reset_cache`` and no ``get_stats``.

Both count every lookup, so one request that looks a key up twice takes it to 2 on its own
(spec A2). 0.21.0 has no metric, and the default gate fails it there: a count above the distinct
requests that looked the key up. 0.28.0 reports the skip metric and adds every offer's skips to
it, so one request offering a cold key twice reads 2 (spec A5 counts 1): the gate meets that
first, in fewer steps. Each choice is learnt from the release, never from its version.
"""

from __future__ import annotations

import re

import pytest

from releases.vllm import SKIPS, gate_facts, gate_only, run_in

pytestmark = pytest.mark.vllm

LOOKUP_OVERCOUNT = (
    "a count exceeds the distinct requests that looked the key up since it entered the tracker"
)
EXPECTED = {
    "0.28.0": {
        "why": SKIPS,
        "found": ["tracker fed at lookups", "on_new_request answers block_level"],
        "not_checked": ["key positions"],
        "max_steps": 4,
    },
    "0.21.0": {
        "why": LOOKUP_OVERCOUNT,
        "found": [
            "threshold in vllm.v1.kv_offload.reuse_manager.FilterReusedOffloadingManager",
            "tracker fed at lookups",
            "lookup answers a bool or None",
        ],
        "not_checked": ["resets (spec A7, §4.4)", "every metric (spec §5.2, §5.3)"],
        "max_steps": 4,
    },
}


@pytest.mark.parametrize("version", gate_only())
def test_an_older_release_gets_its_true_verdict(version):
    done = run_in(version, "-m", "kvgate", "check", "--target", "vllm", "--profile", "ci")
    out = done.stdout + done.stderr
    facts = gate_facts(out)
    assert done.returncode == 1, out  # a verdict, not a harness error or a usage error
    assert "kvgate's own code" not in out, out
    want = EXPECTED.get(version)
    if want is None:
        return
    assert facts["why"] == want["why"], out
    assert 1 <= facts["steps"] <= want["max_steps"], out
    for found in want["found"]:
        assert found in facts["note"], (found, facts["note"])
    (unchecked,) = [ln for ln in out.splitlines() if ln.startswith("not checked for vllm:")]
    for what in want["not_checked"]:
        assert what in unchecked, (what, unchecked)
    if want["why"] == SKIPS:  # more skips than the seed counts, not fewer
        got = re.search(r"target answered: \S+=(\d+)", facts["counterexample"])
        model = re.search(r"model answered:\s+\S+=(\d+)", facts["counterexample"])
        assert int(got[1]) > int(model[1]), out
    else:  # one request looking a key up twice
        lookups = [ln for ln in facts["counterexample"].splitlines() if "state.lookup(" in ln]
        assert len(lookups) >= 2, out


@pytest.mark.parametrize("version", gate_only())
def test_vllms_scheduler_machine_on_a_connector_it_cannot_drive_is_no_verdict(version):
    """These releases' connectors predate what vLLM's scheduler machine builds (0.28.0's spec
    does not say a chunk's size in bytes; 0.21.0 has no offloading config module): named, the
    machine is a one-line exit 2 before anything runs; with every machine, it is left out with
    that reason (0.21.0's manager also lacks what kvgate's scheduler machine needs: with
    --keep-going that machine is a one-line error of its own)."""
    done = run_in(
        version, "-m", "kvgate", "check", "--target", "vllm", "--machine", "vllm-scheduler"
    )
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("kvgate:")]
    assert done.returncode == 2 and len(lines) == 1, done.stdout + done.stderr
    assert "predates what vLLM's scheduler machine drives" in lines[0], lines
    done = run_in(
        version,
        "-m",
        "kvgate",
        "check",
        "--target",
        "vllm",
        "--machine",
        "all",
        "--keep-going",
        "--profile",
        "ci",
        "--max-examples",  # the other machines' verdicts are not what this test reads
        "50",
    )
    out = done.stdout + done.stderr
    assert "kvgate's own code" not in out and "FAIL  vllm-scheduler" not in out, out
    left = [ln for ln in out.splitlines() if ln.startswith("left out: vllm-scheduler")]
    assert left and "predates what vLLM's scheduler machine drives" in left[0], out
