"""The worker machine alone, as mutmut runs it for impl/worker.py
(``python -m bench.mutation --run --suite worker``; docs/mutation.md).

impl/worker.py is being rewritten on another branch: this selection (the worker machine on
impl's ``OffloadWorker``, CPU tensors) stays, but its score must be measured again once that
branch lands. Settings as in test_machines.py: the ``ci`` profile, derandomized, no shrinking.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import Phase

import kvgate.impl.worker
from kvgate.impl.worker import OffloadWorker
from kvgate.properties.runner import run_machine
from kvgate.properties.worker_machine import machine_for

PROFILE = "ci"
NO_SHRINK = [Phase.explicit, Phase.generate]
WORKER_EXAMPLES = 200


def test_the_machine_sees_the_mutated_copy():
    """Under mutmut, impl/worker.py is imported from mutmut's copy (see test_machines.py)."""
    if not os.environ.get("MUTANT_UNDER_TEST"):
        pytest.skip("only under mutmut")
    path = Path(kvgate.impl.worker.__file__).resolve()
    assert path.is_relative_to(Path.cwd().resolve()), (path, Path.cwd())
    assert "mutmut generated" in path.read_text(), path


def test_worker_machine():
    machine = machine_for(OffloadWorker, "MutationWorkerMachine")
    result = run_machine(machine, PROFILE, max_examples=WORKER_EXAMPLES, phases=NO_SHRINK)
    assert result.passed, result.message + "\n" + "\n".join(result.program)
