"""Every user error of every subcommand: exit 2, one line on stderr naming the flag, path or
variable and what is wrong, and nothing run (stdout stays empty: not even the header), plus
the outputs written whole or not at all: a write that fails after the check passed is one line
and exit 2 too, with the old file intact and no temporary file left.

Output paths are proved writable by making a file beside them, so the answers are the same for
root (which passes every permission test) and for anyone else; the read-only folder case runs
in this process and, where this process is root, once more in a child with a dropped uid."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

import kvgate.outputs
from kvgate.cli import main
from kvgate.outputs import OutputError, check_output, write_with

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
    read_only = tmp_path / "read_only.xml"
    read_only.write_text("old")
    read_only.chmod(0o444)
    return [
        (["check", *QUICK, "--repro", f"{missing}/r.py"], "--repro"),
        (["check", *QUICK, "--repro", str(folder)], "is a directory"),
        (["check", *QUICK, "--junit-xml", f"{afile}/k.xml"], "--junit-xml"),
        (["check", *QUICK, "--history", f"{missing}/h.jsonl"], "--history"),
        # A special filesystem: the folder exists and root passes os.access there, but no file
        # can be made in it (the check makes one and says what the filesystem answered).
        (
            ["check", *QUICK, "--history", "/proc/kvgate.jsonl"],
            "--history /proc/kvgate.jsonl: cannot write in '/proc'",
        ),
        (["check", *QUICK, "--junit-xml", "/proc/kvgate.xml"], "cannot write in '/proc'"),
        (["check", *QUICK, "--repro", "/sys/kvgate_repro.py"], "cannot write in '/sys'"),
        (["check", *QUICK, "--junit-xml", str(read_only)], "read-only"),
        (["check", *QUICK, "--history", os.devnull], "not a plain file"),
        (["check", *QUICK, "--database", str(afile)], "--database"),
        (["check", *QUICK, "--database", f"{afile}/db"], "--database"),
        (["check", *QUICK, "--database", "x", "--no-database"], "not allowed with"),
        (["mutants", *QUICK, "--junit-xml", f"{missing}/m.xml"], "--junit-xml"),
        (["replay", TRACE, "--out", f"{missing}/o.txt"], "--out"),
        (["replay", TRACE, "--json", str(folder)], "--json"),
        (["replay", TRACE, "--out", "/proc/kvgate.txt"], "--out /proc/kvgate.txt: cannot write"),
        (["replay", TRACE, "--json", "/proc/kvgate.json"], "--json /proc/kvgate.json: cannot"),
        (["replay", TRACE, "--plot", "/sys/kvgate.png"], "--plot /sys/kvgate.png: cannot"),
        (["mutants", *QUICK, "--junit-xml", "/proc/m.xml"], "--junit-xml /proc/m.xml: cannot"),
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


@pytest.mark.parametrize(
    "command", [["list"], ["check", "--max-examples", "5"], ["mutants", "--max-examples", "5"]]
)
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
    _assert_one_line(
        *_run(capsys, ["replay", TRACE, "--worker", "copy", "--device", "cuda"]),
        "no usable CUDA device",
    )


def test_plot_without_matplotlib_names_the_extra(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    _assert_one_line(
        *_run(capsys, ["replay", TRACE, "--plot", str(tmp_path / "p.png")]),
        "pip install 'kvgate[plot]'",
    )


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
    code = main(
        [
            "replay",
            TRACE,
            "--limit",
            "20",
            "--num-chunks",
            "64",
            "--out",
            str(out),
            "--json",
            str(js),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0
    assert out.read_text() == printed
    assert js.read_text().startswith("[") or js.read_text().startswith("{")


# --------------------------------------------------------------------------- a read-only folder


def _read_only_folder(parent: Path) -> Path:
    folder = parent / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    return folder


def test_a_read_only_folder_is_refused_unless_this_process_may_write_there(tmp_path):
    """The check answers what a write would: a user gets one line naming the folder; root,
    which may write in a folder of mode 0555, gets the file."""
    folder = _read_only_folder(tmp_path)
    path = folder / "h.jsonl"
    if os.geteuid() == 0:
        check_output("--history", str(path))
        assert list(folder.iterdir()) == []  # the proof left nothing behind
        write_with(path, lambda out: out.write("new\n"))
        assert path.read_text() == "new\n"
    else:
        with pytest.raises(OutputError, match=r"cannot write in .*\(Permission denied\)"):
            check_output("--history", str(path))


def _as_user(uid: int, commands: list[list[str]]) -> list[tuple[int, str, str]]:
    """Each command's exit code, stderr and stdout, run in a forked child that dropped to
    ``uid`` (a fork, not a new interpreter: the interpreter under /root is not the user's to
    start, and the modules the commands need are loaded already)."""
    import contextlib
    import io

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            os.close(read)
            os.setgid(uid)
            os.setuid(uid)
            out = []
            for args in commands:
                err, std = io.StringIO(), io.StringIO()
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
                    code = main(args)
                out.append([code, err.getvalue(), std.getvalue()])
            os.write(write, json.dumps(out).encode())
            status = 0
        except BaseException as exc:  # reported to the parent, which fails
            os.write(write, json.dumps(repr(exc)).encode())
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read) as pipe:
        answer = json.loads(pipe.read() or "null")
    _, status = os.waitpid(pid, 0)
    assert status == 0 and isinstance(answer, list), f"the child failed: {answer}"
    return [tuple(entry) for entry in answer]


@pytest.mark.skipif(
    os.geteuid() != 0 or not hasattr(os, "fork"),
    reason="dropping to another uid needs root (as a user, the test above "
    "already is the not-root case)",
)
def test_a_read_only_folder_as_a_user_dropped_from_root():
    nobody = 65534
    base = Path(tempfile.mkdtemp(prefix="kvgate-ro-"))  # in /tmp: a path the user can reach
    try:
        base.chmod(0o755)
        folder = _read_only_folder(base)
        commands = [
            ["replay", TRACE, "--out", f"{folder}/o.txt"],
            ["check", *QUICK, "--history", f"{folder}/h.jsonl"],
            ["check", *QUICK, "--database", f"{folder}/db"],
        ]
        for (code, err, out), args in zip(_as_user(nobody, commands), commands):
            _assert_one_line(code, out, err, "Permission denied")
            assert f"{args[-2]} {args[-1]}" in err, err
        assert list(folder.iterdir()) == []
    finally:
        shutil.rmtree(base)


# --------------------------------------------------------------------------- a write that fails


class _DiskFull:
    """A file that takes ``room`` characters (or bytes), then fails as a full disk does."""

    def __init__(self, inner, room: int):
        self._inner, self._room = inner, room

    def write(self, data):
        if len(data) > self._room:
            self._inner.write(data[: self._room])
            self._inner.flush()
            self._room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._room -= len(data)
        return self._inner.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._inner.close()

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _OsWithAFullDisk:
    """``os`` for ``kvgate.outputs``, whose files run out of room after a few bytes."""

    def __getattr__(self, name):
        return getattr(os, name)

    @staticmethod
    def fdopen(fd, mode="r"):
        return _DiskFull(os.fdopen(fd, mode), room=5)


@pytest.mark.parametrize(
    "flag, command",
    [
        ("--history", ["check", *QUICK]),
        ("--junit-xml", ["check", *QUICK]),
        ("--junit-xml", ["mutants", *QUICK, "--only", "every_offer_counts"]),
        ("--out", ["replay", TRACE, "--limit", "5"]),
        ("--json", ["replay", TRACE, "--limit", "5"]),
        ("--plot", ["replay", TRACE, "--limit", "5"]),
    ],
)
def test_a_write_that_fails_half_way_is_one_line_and_leaves_the_old_file(
    capsys, monkeypatch, tmp_path, flag, command
):
    path = tmp_path / "report"
    path.write_text("old\n")
    monkeypatch.setattr(kvgate.outputs, "os", _OsWithAFullDisk())
    code, _, err = _run(capsys, [*command, flag, str(path)])
    lines = err.strip().splitlines()
    assert code == 2, err
    assert (
        len(lines) == 1
        and f"{flag} {path}: writing failed (No space left on device)" in lines[0]
        and "the old file is left as it was" in lines[0]
    ), err
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["report"]


def test_a_failed_write_of_a_new_file_leaves_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(kvgate.outputs, "os", _OsWithAFullDisk())
    with pytest.raises(OutputError, match="writing failed .*; nothing written"):
        kvgate.outputs.write_atomic(tmp_path / "new.txt", "more than five", flag="--out")
    assert list(tmp_path.iterdir()) == []
