"""The real upstream: each vLLM release CI gates, in its own environment (releases/vllm.py).

The verdicts below are what kvgate must say about each release (README, docs/upstream.md):

- 0.33.0 carries the seed's bug: every offer counts, so one request's retry admits a key that
  no other request offered. The default gate (every machine that applies) fails it in at most
  4 steps: the manager machine on the admitted keys, the scheduler machine on the admitted
  keys or on a tracker count above the number of requests that offered the key.
- 0.34.0 carries the seed's fix, and one defect (spec A5): a request's first skip of a
  key it had earlier had admitted is never counted. Every machine of the default gate fails it
  on the skip metric and nothing else: with that defect declared known it passes under the
  ``ci`` profile (tests/test_known_defects_vllm.py), and with that one thing put right
  (releases/vllm_mends.py) vLLM's scheduler machine passes it under ``thorough`` (kvgate's
  own two machines there: measured, docs/upstream.md).

A release named in .ci/vllm-releases.txt without an entry here is only required to be checked
(exit 0 or 1, never a crash or a usage error).
"""

from __future__ import annotations

import json
import re

import pytest

from releases.vllm import (
    ADMITTED,
    MENDED,
    OVERCOUNT,
    PATCHED,
    SKIPS,
    TRACE,
    gate_facts,
    probe,
    releases,
    run_in,
)

pytestmark = pytest.mark.vllm

# Per machine of the default gate, the reasons its shrunk counterexample may give.
EXPECTED = {
    "0.33.0": {
        "why": {"manager": {ADMITTED}, "scheduler": {ADMITTED, OVERCOUNT}},
        "max_steps": 4,
        "missing": [],
        "cold": "some",
    },
    "0.34.0": {
        "why": {"manager": {SKIPS}, "scheduler": {SKIPS}},
        "max_steps": 12,
        "missing": ["touch"],
        "cold": "none",
    },
}


def gate(version: str, *args: str):
    done = run_in(version, "-m", "kvgate", "check", "--profile", "ci", *args)
    return done.returncode, done.stdout + done.stderr


def verdicts(out: str) -> dict[str, tuple[int, str]]:
    """Each failing run on the vllm target, as printed: machine -> (shrunk steps, why)."""
    steps = dict(re.findall(r"^FAIL  (\S+) x vllm: counterexample in (\d+) steps", out, re.M))
    parts = re.split(r"^--- counterexample: (\S+) x vllm ---$", out, flags=re.M)
    found = {}
    for machine, block in zip(parts[1::2], parts[2::2]):
        why = re.search(r"^  \((.*)\)$", block, re.M)
        found[machine] = (int(steps[machine]), why.group(1) if why else "")
    return found


@pytest.mark.parametrize("version", releases())
def test_the_gate_gives_each_release_its_verdict(version):
    """The default gate fails each release on its known defect at its first machine (the
    manager machine) and leaves the others out; the scheduler machine, run on its own, fails it
    for that defect too. (vLLM's own scheduler: tests/test_vllm_scheduler.py.)"""
    code, out = gate(version, "--target", "vllm")
    want = EXPECTED.get(version)
    if want is None:
        assert code in (0, 1), out
        return
    assert code == 1, out
    assert gate_facts(out)["why"] in want["why"]["manager"], out  # what docs/upstream.md reads
    assert "left out: scheduler (vllm already failed on manager; --keep-going" in out, out
    assert f"vLLM {version}" in out and "request-scoped recency" in out, out
    if want["missing"]:
        assert f"lacks {', '.join(want['missing'])} (never drawn)" in out
        assert "state.touch(" not in out
    else:
        assert "has every optional call" in out
    manager = verdicts(out)
    code, out = gate(version, "--target", "vllm", "--machine", "scheduler")
    assert code == 1, out
    got = {**manager, **verdicts(out)}
    assert sorted(got) == ["manager", "scheduler"], out  # both ran, both failed
    for machine, (steps, why) in got.items():
        assert why in want["why"][machine], (machine, out)
        assert steps <= want["max_steps"], (machine, out)


def test_0_34_0_with_the_skip_counted_once_passes_vllms_scheduler_every_label_hit():
    """0.34.0's one defect is the skip metric. The release with it put right
    (releases/vllm_mends.py, the target of the connector mutation suite over 0.34.0's code)
    passes vLLM's scheduler machine under ``ci``, its explicit programs included, every label
    hit, sync and async (57 s of machine on a loaded 2-core machine; ``thorough``, 2000 examples
    of 50 steps, takes over three times that, which the suite's 10 minutes cannot hold). (Under
    ci, the release as it is with that defect declared known passes every machine:
    tests/test_known_defects_vllm.py, through the pytest plugin; kvgate's machines under
    ``thorough`` on it were measured, docs/upstream.md.)"""
    if "0.34.0" not in releases():
        pytest.skip("0.34.0 is not gated")
    done = run_in(
        "0.34.0",
        "-m",
        "kvgate",
        "check",
        "--profile",
        "ci",
        "--machine",
        "vllm-scheduler",
        "--target",
        PATCHED,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert f"PASS  vllm-scheduler x {PATCHED}" in out, out
    coverage = out.split("coverage (vllm-scheduler):")[1].splitlines()[0]
    for label in ("sync scheduling", "async scheduling", "KV events on", "KV events off"):
        assert label in coverage, coverage
    assert "not hit" not in coverage, coverage
    assert "explicit programs passed: " in coverage, coverage


def test_0_33_0_with_the_seed_fix_backported_passes_kvgates_machines():
    """0.33.0 with the seed's counting put back (releases/vllm_mends.py, the target of the
    0.33.0 mutation suites) passes every machine under ci (300 examples each, as those suites
    run them), checked exactly, touch included;
    through vLLM's own scheduler too, since the mended target also carries 0.34.0's fix to the
    connector's reset (0.33.0's asserts when the cache is reset twice before a step:
    tests/test_vllm_scheduler.py shows that on the release as it stands)."""
    if "0.33.0" not in releases():
        pytest.skip("0.33.0 is not gated")
    spec = MENDED["0.33.0"]
    # 300 examples a machine, as the mutation suites run them (the suite's time)
    args = ("--target", spec, "--machine", "all", "--keep-going", "--max-examples", "300")
    code, out = gate("0.33.0", *args)
    assert code == 0, out
    for machine in ("manager", "scheduler", "vllm-scheduler"):
        assert f"PASS  {machine} x {spec}" in out, out


# Known-bad variants of the mended 0.34.0 (tests/upstream_variants.py), each caught by the
# check that sees it: the machine, and what its first divergence names.
VARIANTS = {
    "UsageOneWithoutChunks": ("manager", "vllm:kv_offload_cpu_cache_usage_perc differs"),
    "PolicyPathIgnored": ("manager", "policy order (least recent first)"),
    "InfoDropped": ("vllm-scheduler", "config_info answers differ"),
    # issue 48's four: an answer the interface does not allow is the target's divergence
    "SpecHelperNone": ("manager", "PrepareStoreOutput whose store_spec is None; the interface"),
    "PrepareLoadNothing": ("manager", "prepare_load answered None; the interface requires"),
    "InnerPrepareLoadNone": ("manager", "prepare_load answered None; the interface requires"),
    "ConfigInfoNothing": ("manager", "config_info answered None; the interface requires"),
}
VARIANTS_PROBE = """
import json
from kvgate.properties.engines.vllm import machine as vllm_scheduler_machine
from kvgate.properties.manager_machine import make_machine
from kvgate.properties.profiles import FIRST_FAILURE
from kvgate.properties.runner import run_machine
from kvgate.properties.targets import resolve_target
out = {{}}
for name, machine in {variants!r}:
    target = resolve_target("vllm=tests.upstream_variants:" + name)
    cls = (make_machine if machine == "manager" else vllm_scheduler_machine.make_machine)(target)
    got = run_machine(cls, "ci", database=None, phases=FIRST_FAILURE)
    out[name] = [got.passed, got.message]
print(json.dumps(out))
"""


def test_the_zero_chunk_twin_the_policy_path_and_the_published_info_are_checked():
    """The checks that see a release's zero-chunk stats, its out-of-tree policy spelling and
    its published config each catch a variant of the mended 0.34.0 broken there alone; so do
    the answer checks (issue 48's four mutants: a spec, a load or the config answered
    ``None``), as the target's divergence, never as an error of kvgate's."""
    if "0.34.0" not in releases():
        pytest.skip("0.34.0 is not gated")
    runs = [(name, machine) for name, (machine, _) in VARIANTS.items()]
    got = probe("0.34.0", VARIANTS_PROBE.format(variants=runs))
    for name, (_, says) in VARIANTS.items():
        passed, message = got[name]
        assert not passed and says in message, (name, message)


@pytest.mark.parametrize("version", releases())
def test_replay_counts_cold_admissions_of_each_release(version, tmp_path):
    report = tmp_path / "replay.json"
    done = run_in(
        version, "-m", "kvgate", "replay", TRACE, "--target", "vllm", "--json", str(report)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = json.loads(report.read_text())
    assert run["requests"] == 300 and run["finished"] == 300
    assert run["admitted"] > 0
    want = EXPECTED.get(version, {}).get("cold")
    if want == "some":
        assert run["cold_admissions"] > 0, run
    elif want == "none":
        assert run["cold_admissions"] == 0, run


ADAPTER_PROBE = """
import json
from kvgate.impl.base import make_key
from kvgate.properties.adapters import Config
from kvgate.properties.targets import resolve_target
target = resolve_target("vllm")
a = target.make(Config(num_chunks=2, store_threshold=2, max_tracker_size=4))
r1, r2 = a.new_context("r1"), a.new_context("r2")
A, B, C = (make_key(n.encode()) for n in "ABC")
first = a.prepare_store([A, B], r1)
second = a.prepare_store([A, B], r2)
a.complete_store(second[0], r2, success=False)
third = a.prepare_store([A, C], r2)
events = a.take_events()
print(json.dumps({
    "missing": sorted(target.missing), "note": target.note,
    "context": type(r1).__module__ + "." + type(r1).__name__,
    "first": [list(first[0]), first[1]],
    "second": [len(second[0]), len(second[1])],
    "third_none": third is None,
    "events": [[len(e.keys), e.removed, e.metadata_only] for e in events],
    "recency": target.recencies, "exact": not target.foreign,
    "lookup": str(a.lookup(A, r1)), "tracker": len(a.tracker_items()),
    "stats": sorted(a.get_stats()),
}))
"""


@pytest.mark.parametrize("version", releases())
def test_the_adapter_reads_the_release_by_capability(version):
    """The release's own types, events with whatever fields it has, its tracker and stats."""
    got = probe(version, ADAPTER_PROBE)
    assert got["context"].startswith("vllm."), got
    assert got["first"] == [[], []]  # threshold 2: one request's offer admits nothing
    assert got["second"] == [2, 2]  # a second request's offer admits both
    # The failed store's metadata-only removal named A and B; A is pending again when the
    # events are drained, so only B is left in it (spec §5).
    assert got["events"] == [[1, True, True]], got
    assert got["recency"] == ["request"] and got["exact"], got  # both releases: spec §4.6
    assert not got["third_none"] and got["lookup"] == "HIT_PENDING"
    assert got["tracker"] == 3  # A, B and C
    assert got["stats"] == sorted(
        [
            "vllm:kv_offload_stores_skipped",
            "vllm:kv_offload_cpu_allocation_size",
            "vllm:kv_offload_cpu_cache_usage_perc",
            "vllm:kv_offload_cpu_cache_write_usage_perc",
            "vllm:kv_offload_cpu_cache_read_usage_perc",
        ]
    )
    want = EXPECTED.get(version)
    if want is not None:
        assert got["missing"] == want["missing"], got
    assert f"vLLM {version}" in got["note"]
