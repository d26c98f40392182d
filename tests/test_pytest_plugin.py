"""The pytest plugin (kvgate/pytest_plugin.py) and known defects (properties/known.py), without
vLLM: a gate file in a scratch copy of vLLM's test layout runs under plain pytest, ``-k`` and
``-n 2`` through the installed entry point, as a maintainer's suite would; the plugin leaves a
suite without gates alone; ``kvgate check --known-defect`` and the plugin agree. The installed
vLLM releases: tests/test_known_defects_vllm.py.

Known-bad managers from the catalogue stand in for a release: ``skip_metric_every_offer`` gets
the skip metric wrong and nothing else the manager machine sees (as 0.34.0 does), and
``every_offer_counts`` is the seed's bug (as 0.33.0)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from kvgate.cli import main

# the stand-in overcounts its skips: declared as what it is (an undercount would not hide it)
SKIPS = "skip-overcount"
QUICK = 'machines="manager", max_examples=30'

GATE_FILE = f"""
from kvgate.impl.manager import OffloadingManager
from kvgate.pytest_plugin import gate

test_offloading = gate("impl:lru", "mutant:every_offer_counts", {QUICK})
test_known = gate("mutant:skip_metric_every_offer", {QUICK}, known_defects=["{SKIPS}"])
test_stale = gate("impl:lru", {QUICK}, known_defects=["{SKIPS}"])
test_refused = gate("impl:lru", {QUICK}, known_defects=["admitted keys"])
test_no_database = gate("impl:lru", {QUICK}, database="/proc/kvgate-db")
test_class = gate(OffloadingManager, {QUICK})
"""

# A suite of its own: a "ci" profile of its own, and a Hypothesis test that counts its examples.
USER_CONFTEST = """
from hypothesis import settings
settings.register_profile("ci", max_examples=7, database=None)
"""
USER_TEST = """
import sys
from hypothesis import given, settings, strategies as st

CALLS = []

@settings(settings.get_profile("ci"))
@given(st.integers())
def test_their_own_profile_is_theirs(n):
    CALLS.append(n)

def test_counted():
    assert len(CALLS) == 7

def test_kvgate_not_imported_unless_asked():
    if "GATED" not in __import__("os").environ:
        loaded = [m for m in sys.modules if m.startswith("kvgate")]
        assert sorted(loaded) == ["kvgate", "kvgate.pytest_plugin"], loaded
"""


def pytest_run(cwd: Path, *args: str, **env: str) -> tuple[int, str]:
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "HYPOTHESIS_", "KVGATE_"))
    }
    environ.update({"CI": "true", **env})
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stdout + done.stderr


def outcomes(out: str) -> dict[str, str]:
    """``-rA``'s short summary: item id -> PASSED / FAILED / SKIPPED."""
    found = {}
    for word, node in re.findall(r"^(PASSED|FAILED|ERROR) \S*::(\S+)", out, re.M):
        found[node] = word
    return found


def scratch_vllm_tree(root: Path) -> Path:
    """vLLM's test layout (tests/v1/kv_offload/), the gate file in it."""
    folder = root / "tests" / "v1" / "kv_offload"
    folder.mkdir(parents=True)
    (folder / "test_kvgate.py").write_text(GATE_FILE)
    return folder


def test_a_gate_file_is_pytest_items_under_plain_pytest_k_and_xdist(tmp_path):
    scratch_vllm_tree(tmp_path)
    code, out = pytest_run(tmp_path, "-rA", "tests")
    assert code == 1, out
    want = {
        "test_offloading[impl:lru/manager]": "PASSED",
        "test_offloading[mutant:every_offer_counts/manager]": "FAILED",
        "test_known[mutant:skip_metric_every_offer/manager]": "PASSED",
        "test_stale[impl:lru/manager]": "FAILED",
        "test_refused": "FAILED",
        "test_no_database[impl:lru/manager]": "FAILED",
        "test_class[kvgate.impl.manager:OffloadingManager/manager]": "PASSED",
    }
    assert outcomes(out) == want, out
    # The counterexample reads as a pytest failure: the shrunk steps, the answers, the repro.
    failure = out.split("test_offloading[mutant:every_offer_counts/manager] _")[1]
    assert "shrunk steps:" in failure and "state.retry(req=requests_" in failure, failure
    assert "(admitted keys differ)" in failure and "target: " in failure, failure
    assert (
        "repro: kvgate check --target mutant:every_offer_counts --machine manager --profile ci"
        in failure
    )
    assert "Traceback" not in failure.split("short test summary")[0], failure
    # Known and still present, listed; a declaration the run never saw fails it, strict.
    assert f"known defect {SKIPS} (" in out and "): still present: its witness" in out, out
    stale = out.split("test_stale[impl:lru/manager] _")[1]
    assert "gone: its witness now agrees with the model, so the run fails" in stale, stale
    assert "the admission rule is what the gate checks" in out.split("_ test_refused _")[1]
    no_db = out.split("_ test_no_database[impl:lru/manager] _")[1].split("\n_")[0]
    assert "kvgate: --database /proc/kvgate-db: " in no_db and "Traceback" not in no_db, no_db

    code, out = pytest_run(tmp_path, "-rA", "tests", "-k", "test_offloading and impl")
    assert code == 0 and outcomes(out) == {"test_offloading[impl:lru/manager]": "PASSED"}, out
    assert "6 deselected" in out, out

    code, out = pytest_run(tmp_path, "-rA", "-n", "2", "tests", "--junitxml", "junit.xml")
    assert code == 1 and outcomes(out) == want, out
    junit = (tmp_path / "junit.xml").read_text()  # each item's run line, known defects listed
    assert 'name="test_known[mutant:skip_metric_every_offer/manager]"' in junit, junit
    assert f'value="known defect {SKIPS} (' in junit and "): still present" in junit, junit
    # the failure's repro line is a property of its test case; its message the first line only
    repro = "kvgate check --target mutant:every_offer_counts --machine manager --profile ci"
    assert f'name="kvgate-repro" value="{repro}' in junit, junit
    assert 'message="FAIL  manager x mutant:every_offer_counts: counterexample in ' in junit
    # one report per failure: in full above, its first line alone in -rA's summary (CI is set)
    summary = out.split("short test summary info")[1]
    assert "--- counterexample" not in summary and "shrunk steps:" not in summary, summary
    assert out.count("--- counterexample: manager x mutant:every_offer_counts ---") == 1, out


def test_the_command_line_gates_a_target_without_a_test_file(tmp_path):
    code, out = pytest_run(
        tmp_path,
        "-rA",
        "--kvgate-target",
        "mutant:skip_metric_every_offer",
        "--kvgate-machine",
        "manager",
        "--kvgate-max-examples",
        "30",
        "--kvgate-known-defect",
        SKIPS,
    )
    assert code == 0, out
    assert outcomes(out) == {"kvgate[mutant:skip_metric_every_offer/manager]": "PASSED"}, out
    code, out = pytest_run(tmp_path, "--kvgate-target", "impl", "--kvgate-known-defect", "lookup")
    assert code == 4, out  # pytest's usage error
    assert "--kvgate-known-defect: known defect 'lookup' cannot be declared" in out, out
    # options with nothing to act on say so (a warning: the suite's own tests still run)
    (tmp_path / "test_plain.py").write_text("def test_one():\n    pass\n")
    code, out = pytest_run(
        tmp_path, "test_plain.py", "--kvgate-machine", "manager", "--kvgate-profile", "ci"
    )
    assert code == 0 and "1 passed" in out, out
    assert "kvgate: --kvgate-machine applies to the --kvgate-target gates, and none" in out, out
    assert "kvgate: --kvgate-profile given, but no kvgate item was collected" in out, out


def test_a_suite_of_its_own_keeps_its_profiles_and_is_left_alone(tmp_path):
    (tmp_path / "conftest.py").write_text(USER_CONFTEST)
    (tmp_path / "test_user.py").write_text(USER_TEST)
    code, out = pytest_run(tmp_path, "-q", "test_user.py")
    assert code == 0 and "3 passed" in out, out  # nothing of kvgate imported, no items added
    # A gate in the same session runs under kvgate's ci; the suite's "ci" stays its own.
    (tmp_path / "test_a_gate.py").write_text(
        'from kvgate.pytest_plugin import gate\ntest_g = gate("impl:lru", machines="manager", '
        "max_examples=10)\n"
    )
    code, out = pytest_run(tmp_path, "-q", "-p", "no:randomly", GATED="1")
    assert code == 0 and "4 passed" in out, out


def test_kvgate_check_takes_the_same_declarations(capsys):
    quick = ["check", "--profile", "ci", "--max-examples", "30", "--machine", "manager"]
    code = main([*quick, "--target", "mutant:skip_metric_every_offer", "--known-defect", SKIPS])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"known defects: {SKIPS} (" in out and "): still present: its witness" in out, out
    code = main([*quick, "--target", "impl:lru", "--known-defect", SKIPS])
    out = capsys.readouterr().out
    assert code == 1 and "gone: its witness now agrees with the model" in out, out
    code = main([*quick, "--target", "mutant:every_offer_counts", "--known-defect", SKIPS])
    out = capsys.readouterr().out
    assert code == 1 and "(admitted keys differ)" in out, out
    # the declared metric differing the other way: a divergence at the step and call it differs
    over = "mutant:skip_metric_every_offer"
    code = main([*quick, "--target", over, "--known-defect", "skip-undercount"])
    out = capsys.readouterr().out
    assert code == 1 and re.search(r"Divergence: divergence at step \d+, call \d+: get_stats", out)
    assert "differs, and not as the declared known defect skip-undercount" in out, out
    for name, says in [
        ("admitted keys", "the admission rule is what the gate checks"),
        ("tracker", "cannot be declared"),
        ("no_such_metric", "is not a defect kvgate knows (it has a witness for each)"),
    ]:
        code = main([*quick, "--target", "impl:lru", "--known-defect", name])
        err = capsys.readouterr().err
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_a_campaign_keys_its_finds_where_the_gate_replays_them():
    """HypoFuzz fuzzes the machine class the plugin hands it; its database key is the one the
    runner's own run of that machine saves a counterexample under."""
    from hypothesis.database import InMemoryExampleDatabase
    from hypothesis.internal.reflection import function_digest
    from hypothesis.stateful import get_state_machine_test

    from kvgate.gate import resolve_targets, run_one
    from kvgate.pytest_plugin import Case, _fuzz_machine

    (target,) = resolve_targets(["mutant:every_offer_counts"])
    db = InMemoryExampleDatabase()
    run = run_one("manager", target, "ci", None, 30, 20, db)
    assert run.status == "FAIL"
    keys = {k for k in db.data if not k.endswith((b".secondary", b".pareto"))}
    case = Case("t", target.spec, "manager", "dev", (), None, None, None, None, target=target)
    fuzzed = get_state_machine_test(_fuzz_machine(case), settings=case.settings)
    assert keys == {function_digest(fuzzed.hypothesis.inner_test)}


def test_a_class_is_gated_through_the_interface_it_derives_from():
    from kvgate.impl.manager import OffloadingManager
    from kvgate.pytest_plugin import target_spec

    vllm_base = type("CPUOffloadingManager", (), {"__module__": "vllm.v1.kv_offload.cpu.manager"})
    patched = type("Patched", (vllm_base,), {"__module__": "mypkg.managers"})
    assert target_spec(patched) == "vllm=mypkg.managers:Patched"
    assert target_spec(OffloadingManager) == "kvgate.impl.manager:OffloadingManager"
    assert target_spec("vllm") == "vllm"


def test_under_xdist_a_small_gate_is_handed_out_longest_first(tmp_path):
    """Three items under ``-n 2``: xdist hands them out round-robin, so the plugin orders them
    (kvgate/xdist_order.py) to give the two costlier (the manager machines) a worker each; in
    collection order the first and the last, both manager machines, would share one."""
    (tmp_path / "test_gate.py").write_text(
        "from kvgate.pytest_plugin import gate\n"
        'test_lru = gate("impl:lru", machines="manager,scheduler")\n'
        'test_arc = gate("impl:arc", machines="manager")\n'
    )
    code, out = pytest_run(tmp_path, "-v", "-n", "2", "--kvgate-max-examples", "3", ".")
    assert code == 0, out
    found = re.findall(r"^\[(gw\d)\] .*PASSED \S*::(test_\w+\[\S+\])", out, re.M)
    ran = {item: worker for worker, item in found}
    managers = ("test_lru[impl:lru/manager]", "test_arc[impl:arc/manager]")
    assert sorted(ran) == sorted((*managers, "test_lru[impl:lru/scheduler]")), out
    assert ran[managers[0]] != ran[managers[1]], out
