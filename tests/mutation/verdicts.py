"""What a mutation suite's test makes of a machine's result, as the gate would: a counterexample
fails the test (a kill: the gate's exit 1); a run that leaves no verdict (kvgate's own code
raised, or the target could not be driven: the gate's exit 2) is not a kill. Under a mutant it
is written to the ledger folder the bench names (``KVGATE_NO_VERDICT_LEDGER``), one JSON line
per run (bench/mutation.py's ``read_ledger`` reads it), and the test is skipped, so the other
machines still get their say and the bench lists the run apart. With no mutant under test (the
unmutated baseline, a plain pytest run) it fails: there it is kvgate's bug to fix."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

LEDGER = "KVGATE_NO_VERDICT_LEDGER"
_BASELINE = {"", "stats", "fail"}  # mutmut's own runs: the clean tree, coverage, the sanity check


def mutant_under_test() -> str:
    """The mutant this process runs under (mutmut's, or the connector suite's file), or ""."""
    name = os.environ.get("MUTANT_UNDER_TEST", "")
    if name in _BASELINE:
        name = ""
    return name or os.environ.get("KVGATE_CONNECTOR_MUTANT", "")


def record(test: str, line: str) -> Path | None:
    """Write ``line`` to the ledger for the mutant under test; its path, or None (no ledger or
    no mutant: nothing written)."""
    folder, mutant = os.environ.get(LEDGER), mutant_under_test()
    if not folder or not mutant:
        return None
    path = Path(folder) / (re.sub(r"[^\w.-]+", "_", Path(mutant).name) + ".jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps({"mutant": mutant, "test": test, "line": line}) + "\n")
    return path


def judge(result, machine: str) -> None:
    """Pass, fail (a counterexample) or, for a run with no verdict, record and skip."""
    # imported here: the suites' test modules load the mutated code before any of kvgate's
    from kvgate.properties.adapters import no_verdict

    line = no_verdict(result.error, f"the {machine} machine")
    if line and record(machine, line) is not None:
        pytest.skip(f"no verdict (exit 2), listed apart: {line}")
    if line:
        pytest.fail(f"no verdict (exit 2) on the unmutated target: {line}")
    assert result.passed, result.message + "\n" + "\n".join(result.program)
