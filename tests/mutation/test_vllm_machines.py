"""kvgate's machines alone against a mutated vLLM release (the vLLM suites of
``python -m bench.mutation``; docs/mutation.md).

The target is the release with only its known defect mended (releases/vllm_mends.py,
named by ``KVGATE_MUTATION_TARGET``, which bench/mutation.py sets per suite), so that the
unmutated release passes and a failure here is a mutant caught. Every machine that applies to
a vLLM target runs, checked exactly: the manager machine under each policy, kvgate's scheduler
machine, and vLLM's own scheduler machine (0.33.0's mended target also carries 0.34.0's fix to
its connector's reset, ``CountedOncePerRequest.mend_connector``).
Settings as in test_machines.py: the ``ci`` profile, derandomized, no shrinking.

The staged manager and policies are loaded in place of the installed ones when this module is
imported (tests/mutation/staged_vllm.py), before anything imports vLLM's CPU manager; the
module imports vLLM and builds vLLM's configs at import, so mutmut's fork server pays for that
once, not once per mutant.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import os
from pathlib import Path

import pytest

from tests.mutation import staged_vllm
from tests.mutation.verdicts import judge

STAGED = staged_vllm.staged_root(Path.cwd())
if STAGED is not None:
    staged_vllm.install(Path.cwd())

from kvgate.properties import scheduler_machine  # noqa: E402 - staged first
from kvgate.properties.engines.vllm import machine as vllm_scheduler_machine  # noqa: E402 - staged first
from kvgate.properties.engines.vllm.configs import configs  # noqa: E402 - staged first
from kvgate.properties.manager_machine import make_machine  # noqa: E402 - staged first
from kvgate.properties.profiles import FIRST_FAILURE  # noqa: E402 - staged first
from kvgate.properties.runner import run_machine  # noqa: E402 - staged first
from kvgate.properties.targets import resolve_target  # noqa: E402 - staged first

PROFILE = "ci"
MANAGER_EXAMPLES = 300
SCHEDULER_EXAMPLES = 200
VLLM_SCHEDULER_EXAMPLES = 200
SPEC = os.environ.get("KVGATE_MUTATION_TARGET", "vllm")

TARGET = resolve_target(SPEC)  # imports the release's manager (staged, where staged)
configs()  # vLLM's configs and model registration, once per process


def test_the_machines_see_the_staged_release():
    """Under mutmut, the manager and policies are the staged copies with the trampolines."""
    if not os.environ.get("MUTANT_UNDER_TEST"):
        pytest.skip("only under mutmut")
    import vllm.v1.kv_offload.cpu.manager as manager
    import vllm.v1.kv_offload.cpu.policies.lru as lru

    for module in (manager, lru):
        path = Path(module.__file__).resolve()
        assert STAGED is not None and path.is_relative_to(STAGED.resolve()), path
        assert "mutmut" in path.read_text(), path


def _import_time_calls(module) -> list[tuple[str, tuple]]:
    """The module's top-level calls ``Name.method(literal, ...)``, as (method, arguments)."""
    tree = ast.parse(Path(inspect.getsourcefile(module)).read_text())
    calls = []
    for node in tree.body:
        call = node.value if isinstance(node, ast.Expr) else None
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
            try:
                args = tuple(ast.literal_eval(a) for a in call.args)
            except ValueError:
                continue
            calls.append((call.func.attr, args))
    return calls


@pytest.fixture(autouse=True)
def policies_registered_as_imported():
    """The policy factory registers the built-in policies once, at import: in mutmut's fork
    server, before any mutant is switched on (a trampoline reads ``MUTANT_UNDER_TEST`` at each
    call). So each test empties the registry and makes those module-level calls again, as an
    import of the mutated file would; what a mutant makes them raise leaves the registry as
    that import would have (a release that cannot load a policy), for the machines to meet."""
    from vllm.v1.kv_offload.cpu.policies import factory

    registry = factory.CachePolicyFactory._registry
    saved = dict(registry)
    registry.clear()
    for method, args in _import_time_calls(factory):
        with contextlib.suppress(Exception):
            getattr(factory.CachePolicyFactory, method)(*args)
    yield
    registry.clear()
    registry.update(saved)


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_manager_machine(policy):
    machine = make_machine(TARGET, policies=(policy,))
    judge(
        run_machine(machine, PROFILE, max_examples=MANAGER_EXAMPLES, phases=FIRST_FAILURE),
        f"manager ({policy})",
    )


def test_scheduler_machine():
    machine = scheduler_machine.make_machine(TARGET)
    judge(
        run_machine(machine, PROFILE, max_examples=SCHEDULER_EXAMPLES, phases=FIRST_FAILURE),
        "scheduler",
    )


def test_vllm_scheduler_machine():
    machine = vllm_scheduler_machine.make_machine(TARGET)
    judge(
        run_machine(machine, PROFILE, max_examples=VLLM_SCHEDULER_EXAMPLES, phases=FIRST_FAILURE),
        "vllm-scheduler",
    )
