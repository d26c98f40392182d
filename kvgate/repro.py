"""Counterexamples as runnable pytest files (``kvgate check --repro FILE``).

A repro file rebuilds the machine class under the name Hypothesis printed and replays the
failure against the same target; ``KVGATE_TARGET=SPEC pytest FILE`` replays it against another
target (a fixed manager passes it). Two forms:

- **steps** (the manager machine): the shrunk program as Hypothesis printed it, invariant calls
  included, as the body of a test function. The body runs inside a one-example Hypothesis test
  only so that the machine's coverage labels (``hypothesis.event``) have a test to report to;
  nothing is generated.
- **blob** (a machine whose steps draw data inside rules, which Hypothesis prints as
  ``data(...)``, such as the scheduler machine): the failure's ``@reproduce_failure`` blob
  replays the exact choices; it needs the same Hypothesis version, which the file names.
"""

from __future__ import annotations

import os
import re
import textwrap
from dataclasses import dataclass

_BLOB = re.compile(r"@reproduce_failure\('([^']+)', (b'[^']*')\)")


@dataclass
class Failure:
    """What a repro file needs from one failing run."""

    machine: str  # the gate's machine kind: "manager", "scheduler"
    spec: str  # the target spec
    class_name: str  # the machine class name Hypothesis printed
    message: str  # "Divergence: ..."
    program: list[str]  # the printed steps
    notes: list[str]  # every note of the error (for the blob)
    step_count: int  # stateful_step_count the run used

    @property
    def blob(self) -> tuple[str, str] | None:
        for note in self.notes:
            found = _BLOB.search(note)
            if found:
                return found.group(1), found.group(2)
        return None

    @property
    def replayable_steps(self) -> bool:
        return bool(self.program) and not any("data(...)" in line for line in self.program)


def _ident(text: str) -> str:
    return re.sub(r"\W", "_", text)


def _docstring(failures: list[Failure], path: str) -> str:
    specs = sorted({f.spec for f in failures})
    lines = [
        f"kvgate counterexample{'s' if len(failures) > 1 else ''} "
        f"({', '.join(specs)}), written by `kvgate check --repro {os.path.basename(path)}`.",
        "",
        "Plain `pytest` on this file replays the shrunk failure against the same target and "
        "fails with:",
    ]
    for f in failures:
        lines += ["", f"    [{f.machine} x {f.spec}] {_first_line(f.message)}"]
    lines += [
        "",
        "Replay against another target (a fixed manager passes):",
        f"    KVGATE_TARGET=impl pytest {os.path.basename(path)}",
    ]
    return "\n".join(lines).replace('"""', "'''").replace("\\", "\\\\")


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def render(failures: list[Failure], path: str, cwd: str | None = None) -> str:
    """The text of a repro file with one test per failure."""
    cwd = cwd or os.getcwd()
    out = [
        f'"""{_docstring(failures, path)}\n"""',
        "import os",
        "import sys",
        "",
        "# MODULE:ATTR targets import from where kvgate ran",
        f"if {cwd!r} not in sys.path:",
        f"    sys.path.insert(0, {cwd!r})",
        "",
        "from hypothesis import Phase, given, settings, strategies as st",
        "",
        "from kvgate.properties.targets import resolve_target",
        "",
        "",
        "def _target(spec):",
        '    return resolve_target(os.environ.get("KVGATE_TARGET", spec))',
        "",
    ]
    for n, failure in enumerate(failures):
        suffix = f"_{n}" if len(failures) > 1 else ""
        name = f"test_{failure.machine}_{_ident(failure.spec)}{suffix}"
        if failure.replayable_steps:
            out += _steps_test(failure, name)
        else:
            out += _blob_test(failure, name)
    return "\n".join(out).rstrip() + "\n"


def _steps_test(f: Failure, name: str) -> list[str]:
    body = [line for line in f.program]
    header = [
        "",
        "",
        f"# {_first_line(f.message)[:200]}",
        "@settings(max_examples=1, database=None, deadline=None, phases=[Phase.generate], "
        "print_blob=False)",
        "@given(st.none())",
        f"def {name}(_):",
    ]
    if f.machine == "manager":
        build = [
            "    from kvgate.properties.manager_machine import (  # noqa: F401 - a printed step",
            "        OFFERS,  # may name the table of offers: list(OFFERS[672])",
            "        make_machine,",
            "    )",
            "",
            f"    {f.class_name} = make_machine(_target({f.spec!r}))",
        ]
    else:
        build = [
            "    from kvgate.gate import build_machine",
            "",
            f"    {f.class_name} = build_machine({f.machine!r}, _target({f.spec!r}))",
        ]
    return header + build + [textwrap.indent(line, "    ") for line in body]


def _blob_test(f: Failure, name: str) -> list[str]:
    blob = f.blob
    if blob is None:
        why = "no replayable steps were printed for: " + _first_line(f.message)
        return ["", "", f"def {name}():", f"    raise AssertionError({why!r})"]
    version, data = blob
    steps = "\n".join(f"#     {line}" for line in f.program)
    return [
        "",
        "",
        f"# {_first_line(f.message)[:200]}",
        "# Shrunk steps as printed (drawn values are replayed from the blob below):",
        steps,
        f"def {name}():",
        "    from hypothesis import reproduce_failure",
        "    from hypothesis.errors import DidNotReproduce",
        "    from hypothesis.stateful import run_state_machine_as_test",
        "",
        "    from kvgate.gate import build_machine",
        "",
        f"    machine = build_machine({f.machine!r}, _target({f.spec!r}))",
        f"    machine.__name__ = machine.__qualname__ = {f.class_name!r}",
        f"    # needs hypothesis=={version} (the version that found the failure)",
        f"    reproduce_failure({version!r}, {data})(machine)",
        "    try:",
        "        run_state_machine_as_test(machine, settings=settings(",
        f"            database=None, deadline=None, stateful_step_count={f.step_count},",
        "            suppress_health_check=list(__import__('hypothesis').HealthCheck)))",
        "    except DidNotReproduce:",
        "        pass  # this target does not fail there",
    ]
