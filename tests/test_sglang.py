"""The sglang target and machine (spec §11, docs/sglang.md).

Tests marked ``sglang`` need an installed SGLang and skip where it is absent (the main
environment); run them in a release environment, ``PYTHONHASHSEED=0 .sglang/0.5.23/bin/python
-m pytest -q -p no:cacheprovider tests/test_sglang.py``.
The rest run anywhere: the gate's plan for an SGLang target, and the one line where SGLang is
not installed.
"""

from __future__ import annotations

import importlib.util
import re
from types import SimpleNamespace

import pytest

from kvgate.cli import main
from kvgate.gate import UsageError, plan_runs, run_one

HAVE_SGLANG = importlib.util.find_spec("sglang") is not None


def kvgate(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------- anywhere


def test_an_sglang_target_plans_the_sglang_machine_alone():
    """An SGLang target is a cache, not a manager: only the sglang machine is planned for it
    (the manager machines are not even left out), and naming another machine is one line."""
    target = SimpleNamespace(spec="sglang", engine="sglang")
    plan = plan_runs(None, [target])
    planned = [kind for kind, _ in plan.runs] + [kind for kind, _, _ in plan.left_out]
    assert planned == ["sglang"]
    with pytest.raises(UsageError, match="--machine manager does not apply to target sglang"):
        plan_runs("manager", [target])


@pytest.mark.skipif(HAVE_SGLANG, reason="SGLang is installed here")
def test_without_sglang_the_target_is_one_line_and_exit_2(capsys):
    code, out, err = kvgate(capsys, "check", "--target", "sglang")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "sglang is not importable here" in err, err
    code, out, err = kvgate(capsys, "check", "--machine", "sglang")
    assert code == 2 and err.count("\n") == 1 and "SGLang is not importable" in err, err


def test_an_unknown_variant_is_one_line_and_exit_2(capsys):
    code, _, err = kvgate(capsys, "check", "--target", "sglang+nonesuch")
    assert code == 2 and err.count("\n") == 1
    assert "no variant 'nonesuch'" in err or "not importable" in err, err


# --------------------------------------------------------------------------- with SGLang


def dense_cache() -> str:
    """The class the installed release builds for HiCache on a dense model."""
    from kvgate.properties.engines.sglang.target import _cache_for_a_dense_model

    return _cache_for_a_dense_model("sglang.srt.mem_cache")


@pytest.fixture(scope="module")
def released():
    from kvgate.properties.engines.sglang import resolve_sglang

    return resolve_sglang("sglang")


def has_variants() -> bool:
    """The variants hook ``UnifiedRadixCache.checkpoint_into_tree`` (0.5.23's insert path)."""
    from kvgate.properties.engines.sglang.target import load_release

    return hasattr(load_release().UnifiedRadixCache, "checkpoint_into_tree")


# What each design's release is caught on under ``ci`` (docs/sglang.md): the step of the
# request life after which one request's prompt is backed up.
CAUGHT_AFTER = {"watermark": "(resumed)", "chunked": "finished", "every insert": "finished"}
# The shortest life that shows each design's defect, what ``ci`` shrinks to (docs/sglang.md):
# prefill, retract, resume, prefill (watermark); prefill, finish (chunked); two chunks and a
# finish (every insert); each after a new request and its admission.
SHORTEST = {"watermark": 6, "chunked": 4, "every insert": 5}


def resumed_life(target, core: str) -> list:
    """The plain reproduction of docs/sglang.md: A prefills [200 200], is retracted and
    resumes; the pages backed up after each step."""
    s = target.build(core, gpu_slots=64, host_slots=64, page_size=1)
    a = s.new("A", (200, 200), 3)
    seen = []
    assert s.admit(a) and s.prefill_chunk(a, 2)
    s.writing_check()
    seen.append(s.recorder.take_new())
    s.retract(a)
    s.writing_check()
    seen.append(s.recorder.take_new())
    assert s.admit(a) and a.computed == 1  # the prefix match keeps the last token to compute
    assert s.prefill_chunk(a, 2)
    s.writing_check()
    seen.append(s.recorder.take_new())
    return seen


def finished_life(target, core: str) -> list:
    """A prefills [200 200] and finishes; the pages backed up after each step."""
    s = target.build(core, gpu_slots=64, host_slots=64, page_size=1)
    a = s.new("A", (200, 200), 3)
    assert s.admit(a) and s.prefill_chunk(a, 2)
    s.writing_check()
    seen = [s.recorder.take_new()]
    s.finish(a)
    s.writing_check()
    return seen + [s.recorder.take_new()]


def chunked_life(target, core: str) -> list:
    """A prefills [200 200] in two chunks of one token and finishes; the pages backed up after
    each step."""
    s = target.build(core, gpu_slots=64, host_slots=64, page_size=1)
    a = s.new("A", (200, 200), 3)
    assert s.admit(a)
    seen = []
    for end in (1, 2):
        assert s.prefill_chunk(a, end)
        s.writing_check()
        seen.append(s.recorder.take_new())
    s.finish(a)
    s.writing_check()
    return seen + [s.recorder.take_new()]


@pytest.mark.sglang
@pytest.mark.skipif(not HAVE_SGLANG, reason="SGLang is not installed here")
@pytest.mark.parametrize("core", ["python", "rust"])
def test_a_resumed_request_counts_again(released, core):
    """One request, retracted and resumed, has its pages backed up at threshold 2, on each
    tree core and in every design read so far: the chunked and every-insert designs have no
    watermark, and the watermark design's ``Req.reset_for_retract`` zeroes it
    (``kv.cache_inserted_len``). At threshold 3 (0.4.x) its two inserts stay below it.
    The mended variant counts it once."""
    from kvgate.properties.engines.sglang import resolve_sglang

    if core not in released.cores:
        pytest.skip(f"no {core} tree core here")
    assert released.threshold in (2, 3) and released.design in CAUGHT_AFTER
    twice = [(200,), (200, 200)] if released.threshold == 2 else []
    assert resumed_life(released, core) == [[], [], twice]
    if core == "python" and has_variants():
        assert resumed_life(resolve_sglang("sglang+mended"), core) == [[], [], []]


@pytest.mark.sglang
@pytest.mark.skipif(not HAVE_SGLANG, reason="SGLang is not installed here")
@pytest.mark.parametrize("core", ["python", "rust"])
def test_a_finished_request_counts_once_from_the_watermark_on(released, core):
    """Prefill then finish, one request: the chunked design counts both inserts and backs the
    prompt up (0.5.20); the watermark design counts the request once (0.5.23)."""
    if core not in released.cores:
        pytest.skip(f"no {core} tree core here")
    backed_up = [[], [(200,), (200, 200)]] if released.design == "chunked" else [[], []]
    assert finished_life(released, core) == backed_up


@pytest.mark.sglang
@pytest.mark.skipif(not HAVE_SGLANG, reason="SGLang is not installed here")
def test_the_adapter_says_what_it_found(released):
    """The class SGLang's registry builds for HiCache on a dense model (HiRadixCache up to
    0.5.18, the unified cache after), its cores, and what the report leaves unchecked."""
    assert released.cache_class == dense_cache()
    if dense_cache() == "HiRadixCache":
        assert released.cores == ("python",)  # one tree, in Python
    else:
        assert "python" in released.cores
    assert released.note.startswith(f"sglang {released.release}: {dense_cache()}")
    assert released.unchecked()  # the report names what the machine leaves out


@pytest.mark.sglang
@pytest.mark.skipif(not HAVE_SGLANG, reason="SGLang is not installed here")
def test_each_chunk_counts_where_every_insert_counts(released):
    """Two chunks and a finish, one request: every insert counts in 0.4.x, so the first page
    reaches threshold 3 (docs/repro/sglang_0_4_10_every_insert_counts.py); the chunked design
    leaves the first chunk out and counts the last chunk and the finish (threshold 2); the
    watermark counts the request once."""
    expected = {
        "every insert": [[], [], [(200,)]],
        "chunked": [[], [], [(200,), (200, 200)]],
        "watermark": [[], [], []],
    }
    assert chunked_life(released, "python") == expected[released.design]


def _variants():
    if not HAVE_SGLANG:
        return ["every-insert"]
    from kvgate.properties.engines.sglang import KNOWN_BAD

    return list(KNOWN_BAD)


@pytest.mark.sglang
@pytest.mark.skipif(not HAVE_SGLANG, reason="SGLang is not installed here")
@pytest.mark.parametrize("variant", _variants())
def test_each_known_bad_variant_is_caught_under_ci(variant):
    from kvgate.properties.engines.sglang import resolve_sglang

    if not has_variants():
        pytest.skip("this release has no checkpoint_into_tree for the variants to hook")
    run = run_one("sglang", resolve_sglang(f"sglang+{variant}"), "ci", None, None, None, None)
    assert run.status == "FAIL", run.message
    assert run.outcome.shrunk_steps <= 8, run.outcome.program
    assert "request life:" in run.message


@pytest.mark.sglang
@pytest.mark.skipif(not HAVE_SGLANG, reason="SGLang is not installed here")
def test_the_release_verdict_under_ci(released):
    """The installed release as released, under ``ci`` (derandomized): one request's prompt
    backed up at its threshold, after a retraction and resumption (0.5.23) or after its finish
    (0.5.18, 0.5.20; 0.4.10 after two chunks), shrunk to the shortest such life: no step that
    plays no part (a second request, an eviction) survives the shrinker (docs/sglang.md)."""
    run = run_one("sglang", released, "ci", None, None, None, None)
    assert run.status == "FAIL", run.message
    assert "backed up to host after 1 distinct request(s)" in run.message
    last_step = [line for line in run.message.splitlines() if line.startswith("  A: ")][-2:]
    assert any(CAUGHT_AFTER[released.design] in line for line in last_step), run.message
    assert run.outcome.shrunk_steps == SHORTEST[released.design], run.message


@pytest.mark.sglang
@pytest.mark.skipif(not HAVE_SGLANG, reason="SGLang is not installed here")
def test_the_gate_gives_exit_1_and_exit_0(capsys, tmp_path):
    """``kvgate check``: a known-bad variant fails (exit 1, the request life printed, a repro
    file that fails again on its own); the mended release passes (exit 0)."""
    if not has_variants():
        pytest.skip("this release has no checkpoint_into_tree for the variants to hook")
    repro = tmp_path / "repro_sglang.py"
    code, out, _ = kvgate(
        capsys, "check", "--target", "sglang+every-insert", "--profile", "ci", "--repro", str(repro)
    )
    assert code == 1, out
    assert "FAIL  sglang x sglang+every-insert: counterexample" in out
    assert "request life:" in out and "backed up to host after 1 distinct request(s)" in out
    spec = importlib.util.spec_from_file_location("repro_sglang", repro)
    assert spec is not None and spec.loader is not None
    written = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(written)
    replays = [getattr(written, n) for n in dir(written) if n.startswith("test_")]
    assert len(replays) == 1
    with pytest.raises(AssertionError, match="backed up to host after 1 distinct request"):
        replays[0]()
    code, out, _ = kvgate(capsys, "check", "--target", "sglang+mended", "--profile", "ci")
    assert code == 0, out
    assert "not checked for sglang+mended:" in out
    assert out.rstrip().endswith("result: every property holds (exit 0)")
    # the draws reach every part of a request's life the machine claims (machine.py's labels)
    hit = re.search(r"coverage \(sglang\): (\d+)/(\d+) required labels hit", out)
    assert hit and hit.group(1) == hit.group(2) and int(hit.group(2)) >= 12, out
