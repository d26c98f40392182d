"""Trace replay through the scheduler driver (kvgate/replay/, impl/traces.py), on slices of
the two Mooncake traces (tests/data, Apache-2.0, see the README there)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from kvgate.impl.traces import TRACE_BLOCK_SIZE, TraceError, load_trace
from kvgate.replay import (
    ReplaySettings,
    format_table,
    main_replay,
    plot_sweep,
    replay,
    reports_from_json,
)

DATA = Path(__file__).parent / "data"
CONVERSATION = DATA / "mooncake_conversation_300.jsonl"
SYNTHETIC = DATA / "mooncake_synthetic_200.jsonl"

# Small tier and tracker, slow stores, resets and short GPU memory: allocation failures,
# retries, finish-time retries, preemptions, loads, tracker push-outs and stale completions all
# happen on these slices.
_STRESSED = ReplaySettings(num_chunks=256, store_threshold=2, store_delay=4, max_tracker_size=2048)
STRESS = {
    CONVERSATION: replace(_STRESSED, reset_every=251, gpu_blocks=700),
    SYNTHETIC: replace(_STRESSED, reset_every=97, gpu_blocks=300),
}
SLICES = [pytest.param(CONVERSATION, id="conversation"), pytest.param(SYNTHETIC, id="synthetic")]


# --------------------------------------------------------------------------- the loader


def test_slices_load_in_file_order_with_complete_blocks_only():
    conv, syn = load_trace(CONVERSATION), load_trace(SYNTHETIC)
    assert (len(conv), len(syn)) == (300, 200)
    first = conv[0]
    assert (first.timestamp, first.input_length, first.output_length) == (0, 6758, 500)
    assert first.hash_ids[:3] == (0, 1, 2) and len(first.hash_ids) == 14
    req = first.to_request("r0")
    assert len(req.block_hashes) == 6758 // TRACE_BLOCK_SIZE == 13
    assert req.max_output_tokens == 500 and req.num_prompt_tokens == 6758
    assert load_trace(CONVERSATION, limit=5) == conv[:5]


def test_a_bad_line_is_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = CONVERSATION.read_text().splitlines()[0]
    bad.write_text(
        good + "\n\n" + json.dumps({"timestamp": 1, "input_length": 3, "hash_ids": [1]}) + "\n"
    )
    with pytest.raises(TraceError, match=r"bad.jsonl:3: missing field 'output_length'"):
        load_trace(bad)
    bad.write_text('{"timestamp": 0, "input_length": -1, "output_length": 1, "hash_ids": []}\n')
    with pytest.raises(TraceError, match="input_length must be an int >= 0"):
        load_trace(bad)


# --------------------------------------------------------------------------- lockstep and admission


@pytest.mark.parametrize("path", SLICES)
def test_lockstep_check_passes_on_impl(path):
    report = replay(load_trace(path), "impl", STRESS[path], check=True)
    assert report.divergence is None
    assert report.finished == report.requests == len(load_trace(path))
    for situation in ("allocation_failures", "retries", "preemptions", "resets", "loads"):
        assert getattr(report, situation) > 0, situation
    assert report.cold_admissions == 0


def test_lockstep_check_passes_on_impl_arc():
    trace = load_trace(SYNTHETIC, limit=120)
    report = replay(trace, "impl:arc", STRESS[SYNTHETIC], check=True)
    assert report.policy == "arc" and report.divergence is None


@pytest.mark.parametrize("path", SLICES)
def test_every_offer_counts_shows_cold_admissions_where_impl_shows_none(path):
    trace = load_trace(path)
    impl = replay(trace, "impl", STRESS[path])
    bad = replay(trace, "mutant:every_offer_counts", STRESS[path])
    assert impl.cold_admissions == 0
    assert bad.cold_admissions > 0


def test_lockstep_check_stops_at_the_first_divergence_naming_step_and_call():
    report = replay(
        load_trace(CONVERSATION, limit=60),
        "mutant:every_offer_counts",
        STRESS[CONVERSATION],
        check=True,
    )
    assert report.divergence is not None
    first_line = report.divergence.splitlines()[0]
    assert re.fullmatch(
        r"divergence at step \d+, call \d+: (prepare_store|get_stats)\(.*\)", first_line
    ), first_line
    assert "target answered:" in report.divergence and "model answered:" in report.divergence
    assert report.requests < 60  # it stopped there


@pytest.mark.parametrize("path", SLICES)
def test_report_counts_add_up(path):
    # threshold 1 stores right after each reset's re-offers: some are in flight at the next one
    settings = replace(STRESS[path], store_threshold=1, fail_every=7)
    report = replay(load_trace(path), "impl", settings)
    assert report.stores_stale > 0 and report.stores_failed > 0
    assert (
        report.admitted
        == report.stores_completed
        + report.stores_failed
        + report.stores_stale
        + report.stores_in_flight
    )
    assert report.accounting_ok()
    assert report.stores_in_flight == 0  # the replay drains every job
    assert report.prefix_hits <= report.prefix_chunks
    assert 0.0 <= report.hit_rate <= 1.0
    assert report.offers >= report.allocation_failures + report.finish_retries
    # stopped early by a divergence: the stores still in flight close the account
    cut = replay(load_trace(path, limit=80), "mutant:every_offer_counts", STRESS[path], check=True)
    assert cut.divergence is not None and cut.accounting_ok()


def test_threshold_one_admits_everything_offered_once():
    trace = load_trace(SYNTHETIC, limit=40)
    report = replay(trace, "impl", ReplaySettings(num_chunks=4096, store_threshold=1))
    assert report.skips == 0 and report.cold_admissions == 0
    assert report.admitted == len(
        {h for r in trace for h in r.hash_ids[: r.input_length // TRACE_BLOCK_SIZE]}
    )


def test_arrivals_by_timestamp():
    trace = load_trace(CONVERSATION, limit=50)
    report = replay(trace, "impl", ReplaySettings(ms_per_step=50.0))
    assert report.finished == 50
    assert report.steps * 50.0 >= trace[-1].timestamp


# --------------------------------------------------------------------------- the command


def test_cli_one_run_prints_the_report(capsys):
    code = main_replay(
        [
            str(SYNTHETIC),
            "--limit",
            "30",
            "--threshold",
            "2",
            "--num-chunks",
            "128",
            "--check",
            "--no-progress",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    for line in (
        "requests ",
        "offers ",
        "admissions ",
        "cold admissions ",
        "skips ",
        "allocation failures ",
        "preemptions ",
        "evictions ",
        "prefix hit rate ",
        "every manager call agreed with the model",
    ):
        assert line in out


def test_cli_several_targets_make_one_table_and_a_divergence_exits_1(capsys, tmp_path):
    out_file = tmp_path / "report.md"
    code = main_replay(
        [
            str(CONVERSATION),
            "--limit",
            "60",
            "--target",
            "impl",
            "mutant:every_offer_counts",
            "--threshold",
            "1",
            "2",
            "--num-chunks",
            "256",
            "--store-delay",
            "4",
            "--reset-every",
            "251",
            "--gpu-blocks",
            "700",
            "--check",
            "--format",
            "md",
            "--out",
            str(out_file),
            "--progress",
        ]
    )
    captured = capsys.readouterr()
    assert code == 1
    rows = [line for line in captured.out.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 4  # header and one row per (target, threshold)
    assert "mutant:every_offer_counts (checked, DIVERGED)" in captured.out
    assert "divergence at step" in captured.out
    assert out_file.read_text().strip() == captured.out.strip()


def test_cli_refuses_an_unknown_target_with_one_line(capsys):
    assert main_replay([str(SYNTHETIC), "--target", "mutant:no_such_bug"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no_such_bug" in err[0]


def test_cli_json_and_a_missing_trace(capsys, tmp_path):
    assert main_replay([str(tmp_path / "none.jsonl")]) == 2
    capsys.readouterr()
    saved = tmp_path / "runs.json"
    assert (
        main_replay([str(SYNTHETIC), "--limit", "10", "--format", "json", "--json", str(saved)])
        == 0
    )
    (report,) = json.loads(capsys.readouterr().out)
    assert report["requests"] == 10 and report["settings"]["store_threshold"] == 2
    (again,) = reports_from_json(saved)
    assert again.requests == 10 and again.settings.limit == 10 and again.accounting_ok()


def test_plot_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    trace = load_trace(SYNTHETIC, limit=20)
    reports = [
        replay(trace, t, ReplaySettings(num_chunks=n, store_threshold=th))
        for t in ("impl", "mutant:every_offer_counts")
        for th in (1, 2)
        for n in (64, 256)
    ]
    path = plot_sweep(reports, tmp_path / "sweep.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(format_table(reports, "md").splitlines()) == 2 + len(reports)


# --------------------------------------------------------------------------- real bytes


def test_copy_worker_replay_moves_every_block_intact():
    pytest.importorskip("torch")
    settings = replace(STRESS[SYNTHETIC], store_threshold=1, blocks_per_chunk=2)
    report = replay(
        load_trace(SYNTHETIC, limit=50), "impl", replace(settings, worker="copy"), check=True
    )
    assert report.divergence is None and report.loads > 0 and report.stores_completed > 0
    assert report.data_errors == 0, report.data_error_examples


def test_a_worker_that_reports_before_copying_is_caught_end_to_end():
    pytest.importorskip("torch")
    from kvgate.properties.catalogue.workers import ReportsBeforeCopy
    from kvgate.properties.worker.tagged import TaggedCopyWorker

    settings = replace(STRESS[SYNTHETIC], store_threshold=1, verify=True)
    worker = TaggedCopyWorker(
        settings.gpu_blocks, settings.num_chunks, worker_cls=ReportsBeforeCopy
    )
    report = replay(load_trace(SYNTHETIC, limit=80), "impl", settings, worker=worker)
    # Its stores report before the bytes land too, so the first error is a chunk that does not
    # hold its key's blocks when a load reads it.
    assert report.data_errors and " holds " in report.data_error_examples[0]
    assert (
        "when its load is prepared" in report.data_error_examples[0]
        or "loaded from chunk" in report.data_error_examples[0]
    )


def test_null_worker_tags_verify_the_same_way():
    settings = replace(STRESS[SYNTHETIC], store_threshold=1, verify=True, blocks_per_chunk=3)
    report = replay(load_trace(SYNTHETIC, limit=80), "impl", settings)
    assert report.loads > 0 and report.data_errors == 0


def test_foreign_targets_are_checked_with_their_choices_adopted():
    trace = load_trace(SYNTHETIC, limit=80)
    ok = replay(
        trace, "foreign=kvgate.impl.manager:OffloadingManager", STRESS[SYNTHETIC], check=True
    )
    assert ok.divergence is None and ok.admitted > 0
    bad = replay(
        trace,
        "foreign=kvgate.properties.catalogue.managers:EveryOfferCounts",
        STRESS[SYNTHETIC],
        check=True,
    )
    assert bad.divergence is not None and "admitted keys differ" in bad.divergence
