"""The ``kvgate`` gate: every target kind, every exit code, and the failure outputs (a repro
file that replays the failure under plain pytest, the history as JSON lines, JUnit XML).

Runs are kept small (``--max-examples``/``--steps``) and use the ``ci`` profile, which is
derandomized and keeps no example database, so each test is deterministic and writes nothing
outside its ``tmp_path``; the tests run in parallel under pytest-xdist.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import tests.fake_vllm as fake
from kvgate.cli import main
from kvgate.properties.adapters import Config
from kvgate.properties.engines.vllm.adapter import VllmAdapter, VllmTypes, resolve_vllm
from kvgate.properties.manager_machine import EXACT_ONLY
from kvgate.properties.targets import resolve_target

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["--profile", "ci", "--max-examples", "30", "--steps", "20"]
MANAGER_ONLY = ["--machine", "manager"]  # the quick path, where the machine is not the point
FAILING = "mutant:every_offer_counts"  # caught within a few examples, shrunk in about a second
VLLM_ONLY = "it drives vLLM's own scheduler, so only vllm and vllm=MODULE:ATTR targets"


def _vllm_importable() -> bool:
    try:
        importlib.import_module("vllm.v1.kv_offload.cpu.manager")
    except Exception:
        return False
    return True


def kvgate(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def check(capsys, *args):
    return kvgate(capsys, "check", *QUICK, *args)


@pytest.fixture(scope="module")
def failing(tmp_path_factory):
    """One default gate run (every machine that applies) over impl and a failing mutant, with
    every output written: its exit code, its printed report, and the repro, history and JUnit
    files."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("failing")
    files = {
        "repro": out / "repro_every_offer.py",
        "history": out / "history.jsonl",
        "junit": out / "kvgate.xml",
    }
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
        code = main(
            [
                "check",
                *QUICK,
                "--target",
                "impl",
                "--target",
                FAILING,
                "--keep-going",
                "--repro",
                str(files["repro"]),
                "--history",
                str(files["history"]),
                "--junit-xml",
                str(files["junit"]),
            ]
        )
    return {"code": code, "out": stdout.getvalue(), "dir": out, **files}


# --------------------------------------------------------------------------- exit 0


def test_default_target_passes_and_prints_the_summary(capsys, tmp_path):
    """No --machine: every machine that applies to impl runs, and the header and the summary
    name the one left out and why."""
    repro, history = tmp_path / "repro.py", tmp_path / "history.jsonl"
    code, out, err = check(capsys, "--repro", str(repro), "--history", str(history))
    assert code == 0, out + err
    assert not repro.exists() and "repro: nothing to write" in out
    headers = [
        json.loads(line) for line in history.read_text().splitlines() if "target_spec" in line
    ]
    assert [h["machine"] for h in headers] == ["manager", "scheduler"]
    assert all(h["passed"] is True and h["error"] is None for h in headers)
    lines = out.splitlines()
    assert "; machines: manager, scheduler; targets: impl" in lines[0]
    left = f"left out: vllm-scheduler ({VLLM_ONLY})"
    assert lines[1] == left
    assert "PASS  manager x impl" in out and "PASS  scheduler x impl" in out
    summary = next(i for i, line in enumerate(lines) if line.startswith("summary: "))
    assert lines[summary].startswith("summary: 2 runs; machines: manager, scheduler;")
    assert lines[summary + 1] == left
    assert "coverage (manager):" in out and "coverage (scheduler):" in out
    assert out.rstrip().endswith("result: every property holds (exit 0)")
    assert err == ""


def test_machine_manager_is_the_quick_path_and_says_what_it_left_out(capsys):
    code, out, _ = check(capsys, *MANAGER_ONLY)
    assert code == 0, out
    lines = out.splitlines()
    assert "; machines: manager; targets: impl" in lines[0]
    left = (
        "left out: scheduler (--machine manager; without --machine every machine that applies runs)"
    )
    assert lines[1] == left and lines.count(left) == 2  # the header and the summary
    assert "summary: 1 run; machines: manager;" in out
    assert "scheduler x impl" not in out


def test_impl_arc(capsys):
    code, out, _ = check(capsys, "--target", "impl:arc")
    assert code == 0, out
    assert "PASS  manager x impl:arc" in out


def test_module_attr_target_is_checked_exactly(capsys):
    code, out, _ = check(capsys, "--target", "kvgate.impl.manager:OffloadingManager")
    assert code == 0, out
    assert "not checked for" not in out


def test_module_attr_with_vllms_interface_is_judged_through_it(capsys):
    # without vllm=, a class with vLLM's interface is not driven through kvgate's (where its
    # first call would be blamed for an answer that interface never asked of it)
    good, bad = "tests.fake_vllm:FakeManager", "tests.fake_vllm:FakeEveryOfferCounts"
    code, out, _ = check(capsys, *MANAGER_ONLY, "--target", good)
    assert code == 0 and f"PASS  manager x vllm={good}: " in out, out
    assert (
        f"target {good}: its module defines vLLM's ReqContext and make_offload_key, so "
        f"judged as vllm={good}" in out
    ), out
    code, out, _ = check(capsys, *MANAGER_ONLY, "--target", bad)
    assert code == 1 and "(admitted keys differ)" in out, out
    # a subclass of vLLM's manager (a patched release), and kvgate's own interface
    from kvgate.properties.targets import follows_vllm

    base = type("CPUOffloadingManager", (), {"__module__": "vllm.v1.kv_offload.cpu.manager"})
    patched = type("Patched", (base,), {"__module__": "mypkg.managers"})
    assert follows_vllm(patched, "mypkg.managers:Patched") == (
        "it derives from vllm.v1.kv_offload.cpu.manager.CPUOffloadingManager"
    )
    from kvgate.impl.manager import OffloadingManager

    assert follows_vllm(OffloadingManager, "kvgate.impl.manager:OffloadingManager") == ""


def test_foreign_target_names_the_skipped_properties(capsys):
    spec = "foreign=kvgate.impl.manager:OffloadingManager"
    code, out, _ = check(capsys, "--target", spec)
    assert code == 0, out
    skipped = next(line for line in out.splitlines() if line.startswith("not checked for"))
    assert skipped.startswith(f"not checked for {spec}: ")
    for name in EXACT_ONLY:
        assert name in skipped
    assert "steps" not in skipped  # the target has every call: nothing else is left out


def test_vllm_interface_target_through_the_adapter(capsys):
    code, out, _ = check(capsys, "--target", "vllm=tests.fake_vllm:FakeManager")
    assert code == 0, out
    assert "PASS  manager x vllm=tests.fake_vllm:FakeManager" in out
    assert "not checked for vllm=tests.fake_vllm:FakeManager: " in out


@pytest.mark.skipif(_vllm_importable(), reason="vLLM is installed here")
def test_machine_all_runs_every_machine_that_applies_on_every_target(capsys):
    fake_spec = "vllm=tests.fake_vllm:FakeManager"
    code, out, _ = check(capsys, "--machine", "all", "--target", "impl", "--target", fake_spec)
    assert code == 0, out
    for run in (
        "manager x impl",
        "scheduler x impl",
        f"manager x {fake_spec}",
        f"scheduler x {fake_spec}",
    ):
        assert f"PASS  {run}" in out
    assert "summary: 4 runs; machines: manager, scheduler;" in out
    assert "coverage (scheduler):" in out
    # vLLM's scheduler would take the vLLM-interface target, but vLLM is not here.
    assert (
        f"left out: vllm-scheduler for {fake_spec} (unavailable here: vLLM is not "
        "importable (ModuleNotFoundError: No module named 'vllm'); --machine "
        "vllm-scheduler says how to install it)"
    ) in out
    assert f"left out: vllm-scheduler for impl ({VLLM_ONLY})" in out


def test_seed_is_used_and_shown(capsys):
    code, out, _ = check(capsys, "--seed", "7")
    assert code == 0
    assert "seed 7" in out.splitlines()[0]


def test_header_states_the_run_and_the_summary_counts_what_it_lists(capsys):
    code, out, _ = check(capsys, "--machine", "all")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith(
        "kvgate check: profile ci: each run generates 30 examples of up to 20 steps"
    )
    assert "no example database (the profile's)" in lines[0]
    for run in (line for line in lines if line.startswith("PASS")):
        assert "(30 new" in run  # what the header said each run would generate
    for line in (line for line in lines if line.startswith("coverage (")):
        claim, _, rest = line.partition(" required labels hit: ")
        k, n = map(int, claim.rsplit(" ", 1)[1].split("/"))
        shown, _, missed = rest.partition("; not hit: ")
        hit = [] if shown == "none" else shown.split(", ")
        assert len(hit) == k and len(missed.split(", ") if missed else []) == n - k, line


def test_progress_display_can_be_forced(capsys):
    code, out, _ = check(capsys, "--progress")
    assert code == 0
    assert "result: every property holds (exit 0)" in out


# --------------------------------------------------------------------------- exit 1


def test_a_target_that_failed_runs_no_further_machine_unless_asked(capsys):
    """The verdict is known at a target's first counterexample: its later machines are left
    out, and the summary says so and how to run them (the fixture above uses --keep-going)."""
    code, out, _ = check(capsys, "--target", FAILING)
    assert code == 1, out
    assert f"FAIL  manager x {FAILING}" in out and f"scheduler x {FAILING}:" not in out
    assert (
        f"left out: scheduler ({FAILING} already failed on manager; --keep-going runs every "
        "machine)" in out
    ), out


def test_mutant_counterexample_shows_steps_and_the_answer_that_differed(failing):
    code, out = failing["code"], failing["out"]
    assert code == 1
    assert "PASS  manager x impl" in out and "PASS  scheduler x impl" in out
    assert f"FAIL  manager x {FAILING}: counterexample in" in out
    assert f"FAIL  scheduler x {FAILING}: counterexample in" in out
    assert "repro: " in out and "(2 failing runs;" in out
    assert "Divergence: divergence at step" in out and "prepare_store(" in out
    assert "  target: " in out and "  model:  " in out
    assert "state = ManagerMachine_mutant_every_offer_counts()" in out
    program = out.split("--- counterexample: manager x ")[1].split("shrunk steps:\n")[1]
    steps = [line.strip() for line in program.split("\n\n")[0].splitlines()]
    at = next(i for i, line in enumerate(steps) if line.startswith("# diverged at call"))
    assert steps[at - 1].startswith("state.") and steps[at + 1] == "state.teardown()"
    assert "prepare_store([" in steps[at] and "requests_" in steps[at]
    assert out.rstrip().endswith("result: counterexample found (exit 1)")


def test_module_attr_bad_manager_fails(capsys):
    target = "kvgate.properties.catalogue.managers:EveryOfferCounts"
    code, out, _ = check(capsys, *MANAGER_ONLY, "--target", target)
    assert code == 1, out
    assert f"FAIL  manager x {target}: counterexample in " in out
    # what is bad: one request's repeated offers admit a key that store_threshold >= 2 holds back
    text = out.split(f"--- counterexample: manager x {target} ---\n")[1]
    offer = r"prepare_store\((\[[^]]*\]), (requests_\d+)\)"
    at = re.search(rf"Divergence: divergence at step \d+, call \d+: {offer}\n", text)
    assert at, text
    assert re.search(r"target answered: store \['\w+'[^]]*\]", text), text
    assert "model answered:  store [] in chunks []" in text and "(admitted keys differ)" in text
    before = text.split(" calls before it:\n")[1].split("  call:   ")[0]
    earlier = re.findall(offer, before)
    assert earlier and {req for _, req in earlier} == {at.group(2)}, text
    assert int(re.search(r"store_threshold=(\d+)", text).group(1)) >= 2, text


def test_vllm_interface_bad_manager_fails_and_its_repro_replays(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    repro = tmp_path / "repro_vllm.py"
    code, out, _ = check(
        capsys,
        *MANAGER_ONLY,
        "--target",
        "vllm=tests.fake_vllm:FakeEveryOfferCounts",
        "--repro",
        str(repro),
    )
    assert code == 1, out
    assert "Divergence: divergence at step" in out and "prepare_store(" in out
    replay = _pytest(repro, tmp_path)  # not from the repository: the file finds tests.fake_vllm
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert "Divergence" in replay.stdout


# --------------------------------------------------------------------------- exit 2


@pytest.mark.parametrize(
    "args, says",
    [
        (["check", "--target", "no_such_module_kvgate:Manager"], "cannot import"),
        (["check", "--target", "kvgate.impl.manager:NoSuchManager"], "has no attribute"),
        (["check", "--target", "tests.fake_vllm:NotAManager"], "lacks the manager interface"),
        (["check", "--target", "vllm=tests.fake_vllm:NotAManager"], "lacks vLLM's manager"),
        (["check", "--target", "mutant:no_such_variant"], "unknown mutant"),
        (["check", "--target", "kvgate.impl.manager"], "is not MODULE:ATTR"),
        (["check", "--bogus"], "unrecognized arguments"),
        (["check", "--profile", "fast"], "invalid choice"),
        (["check", "--max-examples", "0"], "must be >= 1"),
        (["check", "--machine", "worker"], "invalid choice"),
        (["check", "--database", "redis://127.0.0.1:1"], "cannot reach"),
        (["mutants", "--only", "no_such_variant"], "unknown mutant"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_usage_and_target_errors_exit_2_with_one_line(capsys, args, says):
    code, out, err = kvgate(capsys, *args)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert says in err


def test_a_constructor_that_raises_is_a_counterexample(capsys):
    """Spec §9: a target whose constructor raises on a configuration the model accepts fails
    the gate (exit 1) with the configuration it refused, not a usage error."""
    code, out, _ = check(capsys, "--target", "builtins:abs", "--machine", "manager")
    assert code == 1, out
    assert "the target's constructor raised TypeError" in out
    assert "which the model accepts" in out


def test_no_command_prints_help_and_exits_2(capsys):
    code, _, err = kvgate(capsys)
    assert code == 2
    assert "check" in err and "mutants" in err


@pytest.mark.skipif(_vllm_importable(), reason="vLLM is installed here")
def test_vllm_target_without_vllm_says_how_to_install(capsys):
    code, out, err = kvgate(capsys, "check", "--target", "vllm")
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert "pip install --no-deps vllm==" in err
    assert "CPU build of torch" in err


# --------------------------------------------------------------------------- the machine registry


@pytest.fixture
def widget(monkeypatch):
    """A machine added to the registry that cannot run here: every command that reads the
    registry must name it, leave it out of the default and refuse it by name."""
    from kvgate.gate import machines as runs

    def build(target):
        raise AssertionError("an unavailable machine was built")

    monkeypatch.setitem(
        runs.MACHINES,
        "widget",
        runs.Machine(
            "widget",
            "a machine that needs a widget",
            build,
            targets="impl targets",
            not_for=lambda t: None if t.spec.startswith("impl") else "it needs impl",
            unavailable=lambda: "no widget here",
            install=lambda: "plug a widget in",
        ),
    )
    return "widget"


def test_one_registry_names_a_machine_everywhere(capsys, widget):
    code, out, _ = check(capsys, "--max-examples", "5")
    assert code == 0, out
    left = (
        "left out: widget (unavailable here: no widget here; --machine widget says how to "
        "install it)"
    )
    assert out.splitlines()[2] == left and out.count(left) == 2  # header and summary
    assert "summary: 2 runs; machines: manager, scheduler;" in out
    code, out, _ = check(capsys, "--max-examples", "5", *MANAGER_ONLY)
    assert code == 0 and "left out: widget (--machine manager;" in out
    code, out, _ = kvgate(capsys, "list")
    assert code == 0
    assert (
        "  widget          a machine that needs a widget; for impl targets; unavailable "
        "here: no widget here"
    ) in out.splitlines()
    code, out, err = check(capsys, "--machine", widget)
    assert code == 2 and out == ""
    assert err.strip() == (
        "kvgate: --machine widget: cannot run here: no widget here; plug a widget in"
    )


def test_a_machine_named_for_a_target_it_does_not_apply_to_exits_2(capsys, monkeypatch):
    from dataclasses import replace

    from kvgate.gate import machines as runs

    monkeypatch.setitem(
        runs.MACHINES,
        "vllm-scheduler",
        replace(runs.MACHINES["vllm-scheduler"], unavailable=lambda: None),
    )
    code, out, err = check(capsys, "--machine", "vllm-scheduler", "--target", "impl:lru")
    assert code == 2 and out == ""
    assert err.strip() == (
        f"kvgate: --machine vllm-scheduler does not apply to target impl:lru: {VLLM_ONLY}"
    )


@pytest.mark.skipif(_vllm_importable(), reason="vLLM is installed here")
def test_vllm_scheduler_without_vllm_says_how_to_install_a_release(capsys):
    code, out, err = kvgate(capsys, "check", "--machine", "vllm-scheduler")
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(
        "kvgate: --machine vllm-scheduler: cannot run here: vLLM is not importable"
    )
    assert "pip install --no-deps vllm==<version>" in err and "CPU build of torch" in err


def test_vllm_scheduler_module_not_built_is_said_so(monkeypatch):
    """Where vLLM imports but the machine's module does not exist, the reason says that (and
    nothing about installing vLLM); a module that exists answers for itself."""
    from kvgate.gate import machines as runs

    monkeypatch.setattr(runs, "_vllm_missing", lambda: None)
    monkeypatch.setattr(runs, "VLLM_SCHEDULER_MODULE", "kvgate.properties.no_such_machine")
    machine = runs.MACHINES["vllm-scheduler"]
    assert machine.unavailable() == (
        "not built in this kvgate yet: kvgate.properties.no_such_machine does not exist"
    )
    assert machine.install() == ""
    monkeypatch.setattr(runs, "VLLM_SCHEDULER_MODULE", "tests.fake_vllm_scheduler")
    monkeypatch.setitem(
        sys.modules, "tests.fake_vllm_scheduler", type(sys)("tests.fake_vllm_scheduler")
    )
    sys.modules["tests.fake_vllm_scheduler"].unavailable_reason = lambda: "sync only"
    assert machine.unavailable() == "sync only"


# --------------------------------------------------------------------------- failure outputs


def _pytest(path: Path, cwd: Path, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    environ.update(env)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            str(path),
        ],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_repro_file_replays_the_failure_under_plain_pytest(failing, tmp_path):
    repro, out = failing["repro"], failing["out"]
    message = next(line for line in out.splitlines() if line.startswith("Divergence:"))
    text = repro.read_text()
    assert "state = ManagerMachine_mutant_every_offer_counts()" in text
    assert "state.teardown()" in text
    compile(text, str(repro), "exec")

    replay = _pytest(repro, tmp_path)
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert "Divergence" in replay.stdout
    assert message.split(": ", 1)[1][:60] in replay.stdout

    fixed = _pytest(repro, tmp_path, KVGATE_TARGET="impl")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr


def test_repro_replays_from_the_blob_when_steps_cannot_be_printed(tmp_path):
    """A machine that draws inside its rules prints ``data(...)`` for the draws; its repro
    replays the failure's choices from the ``@reproduce_failure`` blob instead."""
    from kvgate.gate import run_one
    from kvgate.repro import Failure, render

    run = run_one("manager", resolve_target(FAILING), "ci", None, 30, 20, None)
    r = run.result
    notes = [n for note in r.error.__notes__ for n in note.splitlines()]
    program = [line.replace("key_names=['A']", "key_names=data(...)") for line in r.program]
    failure = Failure("manager", FAILING, r.machine, r.message, program, notes, 20)
    assert not failure.replayable_steps and failure.blob
    repro = tmp_path / "repro_blob.py"
    repro.write_text(render([failure], str(repro)))
    assert "reproduce_failure(" in repro.read_text()
    replay = _pytest(repro, tmp_path)
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert "Divergence" in replay.stdout
    fixed = _pytest(repro, tmp_path, KVGATE_TARGET="impl")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr


def _history_runs(path: Path) -> list[tuple[dict, list[dict]]]:
    """Each run's header line and the lines after it."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    starts = [i for i, line in enumerate(lines) if "target_spec" in line] + [len(lines)]
    return [(lines[a], lines[a + 1 : b]) for a, b in zip(starts, starts[1:])]


def test_history_is_json_lines_ending_at_the_divergence(failing):
    runs = _history_runs(failing["history"])
    assert [(h["machine"], h["target_spec"]) for h, _ in runs] == [
        ("manager", "impl"),
        ("scheduler", "impl"),
        ("manager", FAILING),
        ("scheduler", FAILING),
    ]
    assert all(h["passed"] is True and h["error"] is None for h, _ in runs[:2])
    header, steps = runs[2]
    assert header["machine"] == "manager" and header["target_spec"] == FAILING
    assert header["passed"] is False and header["error"].startswith("Divergence")
    assert steps and steps[0]["rule"] == "configure"  # the machine's steps and the calls
    assert all(s["run"] == f"manager x {FAILING}" for s in steps)
    last = steps[-1]
    assert last["call"] == "prepare_store" and last["diverged"]
    assert last["target"] != last["model"]


def test_junit_xml_has_one_testcase_per_run_and_the_failure(failing):
    root = ET.parse(failing["junit"]).getroot()
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        ("kvgate.manager", "impl"),
        ("kvgate.scheduler", "impl"),
        ("kvgate.manager", FAILING),
        ("kvgate.scheduler", FAILING),
    ]
    assert suite.get("tests") == "4" and suite.get("failures") == "2"
    assert cases[0].find("failure") is None and cases[1].find("failure") is None
    assert cases[3].find("failure") is not None
    failure = cases[2].find("failure")
    assert failure.get("message").startswith("Divergence: divergence at step")
    assert "prepare_store(" in failure.get("message")
    assert "state = ManagerMachine_mutant_every_offer_counts()" in failure.text


# --------------------------------------------------------------------------- example database


def test_directory_database_shares_a_failure_with_the_next_run(capsys, tmp_path):
    db = tmp_path / "examples"
    first = check(capsys, *MANAGER_ONLY, "--target", FAILING, "--database", str(db))
    assert first[0] == 1 and any(db.rglob("*"))
    second = check(capsys, *MANAGER_ONLY, "--target", FAILING, "--database", str(db))
    assert second[0] == 1
    examples = [
        int(line.split("(")[1].split(" examples")[0])
        for code, out, _ in (first, second)
        for line in out.splitlines()
        if line.startswith("FAIL")
    ]
    assert examples[1] < examples[0]  # the stored failure is replayed first
    assert "from the example database" in second[1]
    assert "--no-database searches afresh" in second[1]


def test_no_database_searches_afresh(capsys, tmp_path, monkeypatch):
    db = tmp_path / "examples"
    assert check(capsys, *MANAGER_ONLY, "--target", FAILING, "--database", str(db))[0] == 1
    monkeypatch.setenv("KVGATE_DATABASE", str(db))
    code, out, _ = check(capsys, *MANAGER_ONLY, "--target", FAILING, "--no-database")
    assert code == 1
    assert "; no example database;" in out.splitlines()[0]
    assert "from the example database" not in out and "note:" not in out


def test_redis_database_shares_a_failure(capsys, monkeypatch):
    redis = pytest.importorskip("redis")
    fakeredis = pytest.importorskip("fakeredis")
    server = fakeredis.FakeServer()
    monkeypatch.setattr(
        redis.Redis,
        "from_url",
        classmethod(lambda cls, url, **kw: fakeredis.FakeRedis(server=server)),
    )
    code, out, _ = check(
        capsys, *MANAGER_ONLY, "--target", FAILING, "--database", "redis://ci-cache:6379/0"
    )
    assert code == 1
    assert "database redis://ci-cache:6379/0" in out.splitlines()[0]
    assert fakeredis.FakeRedis(server=server).keys("hypothesis-example:*")  # shared from here


# --------------------------------------------------------------------------- mutants, list, replay


def test_mutants_prints_a_table_and_exits_0_when_all_are_caught(capsys):
    code, out, _ = kvgate(capsys, "mutants", *QUICK, "--only", "every_offer_counts")
    assert code == 0, out
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("variant"))
    assert header.split() == ["variant", "caught", "steps", "seconds"]
    row = next(line.split() for line in lines if line.startswith("every_offer_counts"))
    assert row[1] == "yes" and int(row[2]) >= 1
    assert "summary: 1/1 caught" in out


def test_mutants_exit_1_when_a_variant_escapes(capsys, tmp_path):
    report = tmp_path / "mutants.xml"
    code, out, _ = kvgate(
        capsys,
        "mutants",
        "--profile",
        "ci",
        "--max-examples",
        "1",
        "--steps",
        "1",
        "--only",
        "arc_ghosts_untrimmed",
        "--junit-xml",
        str(report),
    )
    assert code == 1, out
    assert "escaped: manager x arc_ghosts_untrimmed" in out
    assert ET.parse(report).getroot().find("testsuite/testcase/failure") is not None


def test_list_names_targets_mutants_and_machines(capsys):
    code, out, _ = kvgate(capsys, "list")
    assert code == 0
    for word in (
        "impl",
        "impl:arc",
        "mutant:NAME",
        "MODULE:ATTR",
        "foreign=MODULE:ATTR",
        "vllm=MODULE:ATTR",
        "every_offer_counts",
        "vllm:",
    ):
        assert word in out
    lines = out.splitlines()
    at = lines.index(
        "machines (--machine; without it `kvgate check` runs every machine below "
        "that applies to the target and can run here):"
    )
    assert [line.split()[0] for line in lines[at + 1 : at + 6]] == [
        "manager",
        "scheduler",
        "vllm-scheduler",
        "sglang",
        "all",
    ]
    assert "for vllm and vllm=MODULE:ATTR targets" in lines[at + 3]


def test_replay_is_a_subcommand(capsys):
    code, out, _ = kvgate(capsys, "replay", "--help")
    assert code == 0
    assert "trace" in out


def test_console_script_entry_point(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "kvgate", "check", *QUICK, "--max-examples", "5"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CI": "true"},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "result: every property holds (exit 0)" in run.stdout


# --------------------------------------------------------------------------- the vLLM adapter

TYPES = VllmTypes.from_module(fake)


def _adapter(**kw) -> VllmAdapter:
    return VllmAdapter(fake.FakeManager(4, enable_events=True, **kw), types=TYPES)


def test_adapter_speaks_our_keys_and_plain_values():
    from kvgate.impl.base import make_key

    a, b = make_key(b"a"), make_key(b"b", 1)
    adapter = _adapter(store_threshold=2, max_tracker_size=8)
    ctx = adapter.new_context("r0")
    assert isinstance(ctx, fake.ReqContext) and ctx.kv_transfer_params is None
    adapter.on_new_request(ctx)
    assert adapter.prepare_store([a, b], ctx) == ([], [], [])
    assert adapter.tracker_items() == [(a, 1), (b, 1)]
    other = adapter.new_context("r1")
    assert adapter.prepare_store([a], other) == ([a], [0], [])
    assert adapter.lookup(a, other) == "HIT_PENDING"
    stats = adapter.get_stats()
    assert stats["vllm:kv_offload_stores_skipped"] == 2
    assert stats["vllm:kv_offload_cpu_allocation_size"] == [1]  # from the unreduced samples
    assert adapter.get_stats()["vllm:kv_offload_cpu_allocation_size"] == []
    adapter.complete_store([a], other)
    assert adapter.take_events() == [((a,), False, False, True, other)]
    assert adapter.take_events() == []
    assert adapter.prepare_load([a], other) == [0]
    assert adapter.free_chunks() == 3 and adapter.resident(a) == (0, 1)
    assert adapter.policy_state() == {"lru": [a]}


def test_adapter_drains_events_only_by_iterating_the_generator():
    from kvgate.impl.base import make_key

    adapter = _adapter()
    ctx = adapter.new_context("r0")
    adapter.prepare_store([make_key(b"a")], ctx)
    adapter.complete_store([make_key(b"a")], ctx)
    adapter.manager.take_events()  # a generator not iterated: nothing drained
    assert len(adapter.take_events()) == 1


def test_adapter_tolerates_events_without_metadata_only_and_summarised_histograms():
    class Event:
        def __init__(self, keys, removed):
            self.keys, self.removed = keys, removed

    class Stats:
        def reduce(self):
            return {
                "vllm:kv_offload_cpu_allocation_size": 3.5,  # a reduced summary
                "vllm:kv_offload_cpu_cache_usage_perc": 0.25,
                "other": 1,
            }

    class Manager(fake.FakeManager):
        def take_events(self):
            yield Event([fake.make_offload_key(b"a", 0)], True)

        def get_stats(self):
            return Stats()

    from kvgate.impl.base import make_key

    adapter = VllmAdapter(Manager(2), types=TYPES)
    adapter.lookup(make_key(b"a"), adapter.new_context("r0"))  # the adapter has seen key a
    assert adapter.take_events() == [((make_key(b"a"),), True, False, None, None)]
    assert adapter.get_stats() == {"vllm:kv_offload_cpu_cache_usage_perc": 0.25}


def test_adapter_builds_with_vllm_constructor_names():
    target = resolve_vllm("vllm=tests.fake_vllm:FakeManager")
    adapter = target.make(
        Config(num_chunks=3, store_threshold=2, max_tracker_size=5, cache_policy="arc")
    )
    assert adapter.manager._m.num_chunks == 3 and adapter.manager._m.cache_policy == "arc"
    assert adapter.manager._m.tracker is not None and adapter.manager._m._events is not None
    assert not target.foreign and target.policies == ("lru", "arc")
    assert target.recencies == ("request",) and not target.kvgate_interface
    assert resolve_target("foreign=vllm=tests.fake_vllm:FakeManager").foreign


def test_scheduler_history_lists_the_offers_of_the_counterexample(failing):
    """The scheduler machine's history: every prepare_store of the shrunk run, by engine step
    (and the divergent call last when a call diverges; here a state check fails after it)."""
    header, lines = _history_runs(failing["history"])[3]
    calls = [line for line in lines if "call" in line]
    assert header["machine"] == "scheduler" and header["target_spec"] == FAILING
    assert header["passed"] is False
    assert calls and "prepare_store" in {c["call"] for c in calls}
    assert [c["call_no"] for c in calls] == sorted({c["call_no"] for c in calls})
    assert all(
        c["step"] >= 1 and c["args"].startswith("(['t")
        for c in calls
        if c["call"] == "prepare_store"
    )


def test_list_judges_each_target_kind_as_the_spec_does():
    """`kvgate list` says of each target kind what spec §9 says: the kinds the spec
    compares exactly are listed as checked exactly, the foreign kind as checked and adopted;
    impl's own spellings and the catalogue's variants are kvgate's interface."""
    from kvgate.cli.listing import ADOPTED, EXACTLY, TARGET_KINDS

    spec = (ROOT / "docs" / "spec.md").read_text()
    section = spec[spec.index('<a id="s9"></a>') : spec.index('<a id="s10"></a>')]
    kinds = re.findall(r"^\d\. \*\*(.+?)\*\* \((.+?)\)(.*?)(?=^\d\. |\Z)", section, re.M | re.S)
    judged: dict[str, str] = {}
    for _, spellings, text in kinds:
        verdict = ADOPTED if "takes the choice over" in text else EXACTLY
        assert verdict == ADOPTED or "exactly" in text, spellings
        for spelling in re.findall(r"`([^`]+)`", spellings):
            judged[spelling] = verdict
    assert judged, "spec §9 lists no target kinds"
    own = {"impl:lru, impl:arc": "impl", "mutant:NAME": "impl"}
    listed = {spec_: verdict for spec_, _, verdict in TARGET_KINDS}
    for spelling, verdict in listed.items():
        assert judged[own.get(spelling, spelling)] == verdict, spelling
    assert set(judged) <= set(listed), set(judged) - set(listed)
    out = subprocess.run(
        [sys.executable, "-m", "kvgate", "list"], capture_output=True, text=True, check=True
    ).stdout
    lines = [line[2:] for line in out.splitlines() if line.startswith("  ")]
    for spelling, _, verdict in TARGET_KINDS:
        assert any(line.startswith(spelling) and line.endswith(verdict) for line in lines), spelling
