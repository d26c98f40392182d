"""Every user error of every subcommand: exit 2, one line on stderr naming the flag, path or
variable and what is wrong, and nothing run (stdout stays empty: not even the header), plus
the outputs written whole or not at all."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvgate.cli import main
from kvgate.outputs import write_with

ROOT = Path(__file__).resolve().parents[1]
TRACE = str(ROOT / "tests" / "data" / "mooncake_synthetic_200.jsonl")
QUICK = ["--profile", "ci", "--max-examples", "5", "--steps", "5"]


def _errors(tmp_path: Path) -> list[tuple[list[str], str]]:
    afile = tmp_path / "a_file"
    afile.write_text("x")
    folder = tmp_path / "folder"
    folder.mkdir()
    missing = tmp_path / "no" / "such" / "dir"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    return [
        (["check", *QUICK, "--repro", f"{missing}/r.py"], "--repro"),
        (["check", *QUICK, "--repro", str(folder)], "is a directory"),
        (["check", *QUICK, "--junit-xml", f"{afile}/k.xml"], "--junit-xml"),
        (["check", *QUICK, "--history", f"{missing}/h.jsonl"], "--history"),
        (["check", *QUICK, "--database", str(afile)], "--database"),
        (["check", *QUICK, "--database", f"{afile}/db"], "--database"),
        (["check", *QUICK, "--database", "x", "--no-database"], "not allowed with"),
        (["mutants", *QUICK, "--junit-xml", f"{missing}/m.xml"], "--junit-xml"),
        (["replay", TRACE, "--out", f"{missing}/o.txt"], "--out"),
        (["replay", TRACE, "--json", str(folder)], "--json"),
        (["replay", TRACE, "--plot", f"{afile}/p.png"], "--plot"),
        (["replay", TRACE, "--worker", "copy", "--device", "nope"], "--device nope"),
        (["replay", TRACE, "--device", "cuda"], "only the copy worker"),
        (["replay", str(empty)], "empty trace"),
        (["replay", f"{missing}/t.jsonl"], "no such trace"),
        (["replay", str(folder)], "a directory"),
        (["replay", TRACE, "--num-chunks", "0"], "must be >= 1"),
        (["replay", TRACE, "--num-chunks", "two"], "not an integer"),
        (["replay", TRACE, "--target", "mutant:nope"], "unknown mutant"),
    ]


def _run(capsys, args):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def _assert_one_line(code, out, err, says):
    assert code == 2, (out, err)
    assert out == "", out  # nothing ran
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert says in lines[0], lines[0]


def test_every_user_error_is_exit_2_and_one_line_before_anything_runs(capsys, tmp_path):
    for args, says in _errors(tmp_path):
        _assert_one_line(*_run(capsys, args), says)
    assert not list(tmp_path.rglob("*.tmp"))


@pytest.mark.parametrize("command", [["list"], ["check", "--max-examples", "5"],
                                     ["mutants", "--max-examples", "5"]])
def test_a_bad_hypothesis_profile_variable_is_one_line(capsys, monkeypatch, command):
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "nope")
    _assert_one_line(*_run(capsys, command), "HYPOTHESIS_PROFILE='nope'")


def test_the_profile_flag_wins_over_the_variable(capsys, monkeypatch):
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "nope")
    code, out, _ = _run(capsys, ["check", *QUICK])
    assert code == 0 and out.startswith("kvgate check: profile ci:")


def test_cuda_on_a_cpu_torch_is_one_line(capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    _assert_one_line(*_run(capsys, ["replay", TRACE, "--worker", "copy", "--device", "cuda"]),
                     "no usable CUDA device")


def test_plot_without_matplotlib_names_the_extra(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    _assert_one_line(*_run(capsys, ["replay", TRACE, "--plot", str(tmp_path / "p.png")]),
                     "pip install 'kvgate[plot]'")


def test_an_interrupted_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "report.txt"
    path.write_text("old\n")

    def half(out):
        out.write("new, half of it")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_with(path, half)
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["report.txt"]
    write_with(path, lambda out: out.write("new\n"))
    assert path.read_text() == "new\n"


def test_replay_writes_its_outputs_whole(capsys, tmp_path):
    out, js = tmp_path / "r.txt", tmp_path / "r.json"
    code = main(["replay", TRACE, "--limit", "20", "--num-chunks", "64", "--out", str(out),
                 "--json", str(js)])
    printed = capsys.readouterr().out
    assert code == 0
    assert out.read_text() == printed
    assert js.read_text().startswith("[") or js.read_text().startswith("{")
