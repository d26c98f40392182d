"""The worker machine alone, as mutmut runs it for impl/worker.py
(``python -m bench.mutation --run --suite worker``; docs/mutation.md).

The selection: the worker machine on impl's ``OffloadWorker``, CPU tensors. Settings as in
test_machines.py: the ``ci`` profile, derandomized, no shrinking.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import kvgate.impl.worker
from kvgate.impl.worker import OffloadWorker
from kvgate.properties.profiles import FIRST_FAILURE
from kvgate.properties.runner import run_machine
from kvgate.properties.worker import machine as worker_machine
from kvgate.properties.worker.machine import make_machine

PROFILE = "ci"
WORKER_EXAMPLES = 300


def test_the_machine_sees_the_mutated_copy():
    """Under mutmut, impl/worker.py is imported from mutmut's copy (see test_machines.py), and
    the machine drives that copy's ``OffloadWorker``. mutmut sets ``MUTANT_UNDER_TEST`` in
    every run it makes ("stats", "" for the clean run): this check runs in both, and a failure
    there stops ``mutmut run`` before any mutant is judged (it calls nothing of worker.py, so
    it is never selected for a mutant, where its failure would read as a kill)."""
    if "MUTANT_UNDER_TEST" not in os.environ:
        pytest.skip("only under mutmut")
    cwd = Path.cwd().resolve()
    path = Path(kvgate.impl.worker.__file__).resolve()
    assert path.is_relative_to(cwd), (path, cwd)
    assert "mutmut generated" in path.read_text(), path
    assert worker_machine.OffloadWorker is OffloadWorker is kvgate.impl.worker.OffloadWorker
    assert Path(worker_machine.__file__).resolve().is_relative_to(cwd), worker_machine.__file__


def test_worker_machine():
    machine = make_machine(OffloadWorker, "MutatedWorkerMachine")
    result = run_machine(machine, PROFILE, max_examples=WORKER_EXAMPLES, phases=FIRST_FAILURE)
    assert result.passed, result.message + "\n" + "\n".join(result.program)
    if os.environ.get("MUTANT_UNDER_TEST", "") in ("", "stats"):
        # Outside a mutant (mutmut's clean and stats runs, or by hand) the selection must reach
        # every situation the machine labels: derandomized draws depend on the machine's name,
        # and one name's 200 examples once never built a 1-d layer, so the constructor's
        # mutants for it survived. Under a mutant a missing label is no kill.
        missing = sorted(set(result.expected) - set(result.labels))
        assert not missing, f"the worker selection never reached {missing}"
