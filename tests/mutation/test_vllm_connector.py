"""kvgate's machines alone against a mutant of vLLM's offloading connector, scheduler side (the
connector suites of ``python -m bench.connector_mutants``; docs/mutation.md).

``KVGATE_CONNECTOR_MUTANT`` names the mutated file, loaded in place of the installed
``vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py`` before anything imports
it (tests/mutation/vllm_yardstick.py); without it the release runs as installed (the suite's
baseline). The target is the release with only its known defect mended
(``KVGATE_MUTATION_TARGET``), so a failure here is a mutant caught. vLLM's scheduler machine is
the one machine that runs the connector: under ``ci``, derandomized, stopping at the first
failure (0.33.0's mended target also carries 0.34.0's fix to its connector's reset).
"""

from __future__ import annotations

import os

from tests.mutation import vllm_yardstick
from tests.mutation.verdicts import judge

MUTANT = vllm_yardstick.install_mutant()

from kvgate.properties.engines.vllm import machine as vllm_scheduler_machine  # noqa: E402 - the mutant first
from kvgate.properties.profiles import FIRST_FAILURE  # noqa: E402 - the mutant first
from kvgate.properties.runner import run_machine  # noqa: E402 - the mutant first
from kvgate.properties.targets import resolve_target  # noqa: E402 - the mutant first

PROFILE = "ci"  # the default gate's budget (600 examples): the budget users run
SPEC = os.environ.get("KVGATE_MUTATION_TARGET", "vllm")


def test_the_machine_sees_the_mutant():
    import importlib

    module = importlib.import_module(vllm_yardstick.MODULE)
    if MUTANT is not None:
        assert os.path.samefile(module.__file__, MUTANT), module.__file__


def test_vllm_scheduler_machine_with_the_connector():
    machine = vllm_scheduler_machine.make_machine(resolve_target(SPEC))
    result = run_machine(machine, PROFILE, phases=FIRST_FAILURE)
    judge(result, "vllm-scheduler")
