"""The profiles: which one loads, how a wrong name is refused, and the ``dev`` profile's random
exploration raising no false alarm on impl.

The tests that claim a catch or coverage fix their own profile and seed (the derandomized ``ci``
profile, no example database), so the suite's verdict does not depend on ``CI``,
``HYPOTHESIS_PROFILE`` or a local .hypothesis directory. Random exploration belongs to the gate
and to ``thorough``: the check here is only that it does not fail on impl, under two seeds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvgate.cli import main
from kvgate.properties.profiles import PROFILES, default_profile

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, "dev"),
        ({"CI": "true"}, "ci"),
        ({"CI": "true", "HYPOTHESIS_PROFILE": "thorough"}, "thorough"),
        ({"HYPOTHESIS_PROFILE": "ci"}, "ci"),
    ],
)
def test_default_profile_follows_the_environment(monkeypatch, env, expected):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert default_profile() == expected


def test_unknown_profile_names_the_variable_and_the_valid_profiles(monkeypatch):
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "nope")
    with pytest.raises(ValueError) as info:
        default_profile()
    message = str(info.value)
    assert "HYPOTHESIS_PROFILE='nope'" in message
    assert all(name in message for name in PROFILES), message


def test_pytest_refuses_an_unknown_profile_in_one_line(tmp_path):
    """The suite's conftest turns it into a usage error: one line, no traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["HYPOTHESIS_PROFILE"] = "nope"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--collect-only",
            "tests/test_layout.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    lines = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("ERROR: HYPOTHESIS_PROFILE='nope'"), lines
    assert all(name in lines[0] for name in PROFILES), lines
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("seed", [1, 2])
def test_dev_gate_raises_no_false_alarm_on_impl(capsys, tmp_path, seed):
    """The ``dev`` profile's random search, seeded two ways, passes on impl, both machines.
    A fresh directory database each run: no local .hypothesis is read or written."""
    code = main(
        [
            "check",
            "--profile",
            "dev",
            "--seed",
            str(seed),
            "--max-examples",
            "100",
            "--machine",
            "all",
            "--database",
            str(tmp_path / "examples"),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, out + err
    header = out.splitlines()[0]
    assert "profile dev" in header and f"seed {seed}" in header, header
    assert "PASS  manager x impl" in out and "PASS  scheduler x impl" in out, out
    assert out.rstrip().endswith("result: every property holds (exit 0)"), out
