"""Explicit programs (properties/explicit.py): fixed step sequences a machine runs after its
drawn examples passed, and the vLLM scheduler machine's
(properties/engines/vllm/explicit_programs.py).

Without vLLM, on a toy machine: the calls run in order with the invariants between them, a step
whose precondition does not hold is skipped and not printed, a failure carries the program as
Hypothesis prints one, and ``run_machine`` runs the programs only after the drawn examples
passed and only under a profile with Hypothesis's explicit phase.

In each release with a mended target: every program passes the mended connector, and a known-bad
connector (its load window forgets the tokens a window keeps below itself: our own patch) fails
the program that meets a stored prompt's proper prefix, with a phantom hit; the drawn examples
of ``ci`` reach that configuration too rarely to be relied on (docs/mutation.md).
"""

from __future__ import annotations

import pytest
from hypothesis import Phase
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvgate.properties.explicit import Program, run_program
from kvgate.properties.runner import run_machine
from releases.vllm import MENDED, probe, releases


class Counter(RuleBasedStateMachine):
    """Counts up; ``broken`` (a class attribute) makes the count wrong at 3."""

    broken = False
    ran: list[str] = []

    @initialize(start=st.just(0))
    def setup(self, start):
        self.n = start

    @rule()
    def up(self):
        self.n += 1
        type(self).ran.append("up")

    @precondition(lambda self: self.n > 5)
    @rule()
    def down(self):
        self.n -= 1
        type(self).ran.append("down")

    @invariant()
    def counted(self):
        if type(self).broken and self.n == 3:
            raise AssertionError("the count reached 3")

    @classmethod
    def explicit_programs(cls):
        calls = (("setup", {"start": 0}), ("down", {}), *[("up", {}), ("counted", {})] * 3)
        return [Program("three ups", calls)]


def test_a_program_runs_in_order_and_skips_a_step_it_cannot_take():
    Counter.broken, Counter.ran = False, []
    assert run_program(Counter, Counter.explicit_programs()[0]) is None
    assert Counter.ran == ["up", "up", "up"]  # ``down`` waits for a count over 5: skipped


def test_a_failing_program_prints_as_a_counterexample():
    Counter.broken, Counter.ran = True, []
    error = run_program(Counter, Counter.explicit_programs()[0])
    assert isinstance(error, AssertionError) and str(error) == "the count reached 3"
    lines = error.__notes__[0].splitlines()
    assert lines[0] == "# explicit program: three ups"
    assert lines[1:3] == ["state = Counter()", "state.setup(start=0)"]
    assert "state.down()" not in lines  # skipped, so not printed
    assert lines[-1] == "state.counted()" and lines.count("state.up()") == 3


def test_run_machine_runs_the_programs_after_the_drawn_examples_pass():
    Counter.broken = True  # the draws never reach 3: ``up`` and ``down`` stop at 2 steps
    short = dict(max_examples=5, stateful_step_count=2)
    passed = run_machine(Counter, "ci", phases=[Phase.generate], **short)
    assert passed.passed and passed.explicit == 0  # no explicit phase: no programs
    failed = run_machine(Counter, "ci", **short)
    assert not failed.passed and failed.message == "AssertionError: the count reached 3"
    assert failed.program[0] == "# explicit program: three ups"
    assert failed.shrunk_steps == 3  # three ups (the set-up and the invariants are not steps)
    assert failed.explicit == 0
    Counter.broken = False
    assert run_machine(Counter, "ci", **short).explicit == 1


PROGRAMS = """
import json
from kvgate.properties.explicit import run_programs
from kvgate.properties.targets import resolve_target
from kvgate.properties.engines.vllm import machine
from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler

cls = machine.make_machine(resolve_target({mended!r}))
programs = cls.explicit_programs()
out = {{"names": [p.name for p in programs]}}
_, error = run_programs(cls, programs)
out["mended"] = "" if error is None else f"{{error}}"
# a known-bad connector: the load window of a sliding-window group is the window alone, the
# tokens it keeps below itself (and the chunk a hit's end shares) forgotten
scheduler.GroupOffloadConfig.load_window_size_in_chunks = (
    lambda self, num_tokens: self.sliding_window_size_in_chunks
)
_, error = run_programs(cls, programs)
out["narrow"] = ["", ""] if error is None else [f"{{error}}", error.__notes__[-1].splitlines()[0]]
print(json.dumps(out))
"""


@pytest.mark.vllm
@pytest.mark.parametrize("version", releases())
def test_the_programs_pass_the_mended_release_and_catch_a_narrow_load_window(version):
    if version not in MENDED:
        pytest.skip(f"{version} has no mended target")
    got = probe(version, PROGRAMS.format(mended=MENDED[version]))
    assert got["mended"] == "", got
    kept = [n for n in got["names"] if "proper prefix" in n and "(+2)" in n]
    assert kept, got["names"]  # the windows that keep tokens below them are among the layouts
    why, name = got["narrow"]
    assert why.startswith("phantom hit: the connector reported "), got
    assert name.startswith("# explicit program: a proper prefix of a stored prompt (full+swa"), got
