"""releases/forkserver.py: a command forked from the warm server gives what a fresh
interpreter gives (exit code, stdout, stderr, argv, working folder, environment, sys.path[0]),
and a command past its time limit raises as subprocess.run does. Run here with this
environment's Python (no vLLM: the server's imports of it fail and are left out, as on an
older release)."""

import subprocess
import sys
from pathlib import Path

import pytest

from releases import forkserver

PROGRAM = (
    "import os, sys; print(sys.argv[1:], os.getcwd(), repr(sys.path[0]), "
    "os.environ.get('KVGATE_FORK_PROBE'), __name__); "
    "print('to stderr', file=sys.stderr); sys.exit(int(sys.argv[1]))"
)


def both(args, tmp_path: Path, monkeypatch, **kw):
    env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "KVGATE_FORK_PROBE": "told"}
    forked = forkserver.run(Path(sys.executable), args, env, tmp_path, kw.get("timeout", 60))
    monkeypatch.setenv("KVGATE_NO_FORKSERVER", "1")
    plain = forkserver.run(Path(sys.executable), args, env, tmp_path, kw.get("timeout", 60))
    monkeypatch.delenv("KVGATE_NO_FORKSERVER")
    return forked, plain


@pytest.mark.parametrize("code", ["0", "3"])
def test_a_c_command_forked_is_the_command_run_fresh(tmp_path, monkeypatch, code):
    forked, plain = both(("-c", PROGRAM, code, "two words"), tmp_path, monkeypatch)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        plain.returncode,
        plain.stdout,
        plain.stderr,
    )
    assert forked.returncode == int(code)
    assert f"['{code}', 'two words'] {tmp_path} '' told __main__" in forked.stdout


def test_a_m_command_and_an_uncaught_exception(tmp_path, monkeypatch):
    (tmp_path / "probe_mod.py").write_text(
        "import sys\nprint(sys.argv[1:], __name__, sys.path[0])\nraise ValueError('boom')\n"
    )
    forked, plain = both(("-m", "probe_mod", "x"), tmp_path, monkeypatch)
    assert forked.returncode == plain.returncode == 1
    assert forked.stdout == plain.stdout == f"['x'] __main__ {tmp_path}\n"
    assert forked.stderr.splitlines()[-1] == plain.stderr.splitlines()[-1] == "ValueError: boom"


def test_a_command_past_its_limit_raises_as_subprocess_does(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"}
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run(
            Path(sys.executable), ("-c", "import time; time.sleep(30)"), env, tmp_path, 1
        )
