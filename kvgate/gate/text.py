"""What a gate says of its runs, as lines either front door prints (``kvgate check`` on its
display, the pytest plugin in its report): one line a run, a counterexample with the call that
diverged and the shrunk steps, the coverage each machine reached, what was not checked."""

from __future__ import annotations

import json
from collections.abc import Sequence

from kvgate.properties.known import KnownDefectGone
from kvgate.properties.targets import Target

from .run import Run


def example_parts(r) -> dict[str, int]:
    """A run's test cases by where they came from, adding up to ``r.examples`` (each machine
    built once per test case): the phases Hypothesis reports (``properties/runner.py``), the
    explicit programs run after the draws, and the shrunk counterexample run once more to
    report it."""
    p = r.phases
    failed_program = bool(r.program) and r.program[0].startswith("# explicit program")
    explicit = r.explicit + failed_program
    parts = {
        "new": p.get("generated", 0),
        "from the example database": p.get("reused", 0),
        "invalid": p.get("invalid", 0),
        "while shrinking": p.get("shrinking", 0),
        "explicit programs": explicit,
    }
    rest = r.examples - sum(parts.values())
    if rest > 0 and not r.passed and r.program and not explicit:
        parts["replaying the counterexample"] = 1  # Hypothesis runs the shrunk one once more
        rest -= 1
    parts["other"] = rest
    return parts


def parts_text(parts: dict[str, int]) -> str:
    """``1 new, 153 while shrinking``: the non-zero parts (``new`` always)."""
    return ", ".join(f"{n} {what}" for what, n in parts.items() if n or what == "new")


def examples_text(r) -> str:
    """How many test cases a run tried, by where they came from (the parts add up)."""
    return f"{r.examples} examples ({parts_text(example_parts(r))})"


def run_lines(run: Run) -> list[str]:
    """One line for the run (PASS, FAIL with its steps, or ERROR with its one line), then
    what became of each declared known defect."""
    r = run.outcome
    figures = f"{examples_text(r)}, {r.steps} steps, {r.seconds:.1f}s"
    if run.status == "PASS":
        lines = [f"PASS  {run.name}: {figures}"]
    elif run.status == "FAIL" and isinstance(r.error, KnownDefectGone):
        lines = [f"FAIL  {run.name}: passed, but a declared known defect is not there ({figures})"]
    elif run.status == "FAIL":
        lines = [f"FAIL  {run.name}: counterexample in {r.shrunk_steps} steps ({figures})"]
    else:
        lines = [f"ERROR {run.name}: {run.target_error}"]
    if run.known is not None and run.status != "ERROR":
        lines += [f"      {line}" for line in run.known.lines()]
    return lines


def _differing(history: list[dict]) -> dict | None:
    """The last recorded call whose target answer and model answer differ."""
    for entry in reversed(history or []):
        if entry.get("target") != entry.get("model") and entry.get("call") != "configure":
            return entry
    return None


def annotated_program(program: Sequence[str], error: BaseException | None) -> list[str]:
    """The printed steps, with a comment under the step that diverged (the last one run)
    naming the call inside it that answered differently, or the check that failed and the
    call before it."""
    lines = list(program)
    what = getattr(error, "call", "")
    if not what:
        return lines
    last = getattr(error, "last_call", "")
    comment = f"# diverged at call {getattr(error, 'call_no', '?')}: {what}"
    if last and last != what:
        comment += f" (the latest call: {last})"
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i].strip()
        if line.startswith("state.") and not line.startswith("state.teardown("):
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            lines.insert(i + 1, indent + comment)
            break
    return lines


def failure_lines(run: Run) -> list[str]:
    """A failing run's counterexample: the message, the call whose answers differ (target and
    model), and the shrunk steps with the diverging call marked."""
    r = run.outcome
    if isinstance(r.error, KnownDefectGone):
        lines = ["", f"--- known defects: {run.name} ---", r.message]
        for w in run.known.witnessed.values() if run.known is not None else ():
            if w.other is not None:
                lines += ["the witness's divergence:", str(w.other)]
        return lines + [""]
    lines = ["", f"--- counterexample: {run.name} ---", r.message]
    diff = _differing(r.history)
    if diff is not None:
        call = (
            diff.get("args")
            if diff.get("diverged")
            else f"{diff.get('call')}{diff.get('args') or ''}"
        )
        lines.append(f"  call:   {call}")
        lines.append(f"  target: {json.dumps(diff.get('target'), default=repr)}")
        lines.append(f"  model:  {json.dumps(diff.get('model'), default=repr)}")
    if r.program:
        lines.append("shrunk steps:")
        lines += [f"  {line}" for line in annotated_program(r.program, r.error)]
    return lines + [""]


def coverage_lines(runs: Sequence[Run]) -> list[str]:
    """Per machine: the labels its passing runs were required to hit, how many they hit."""
    out = []
    for kind in dict.fromkeys(r.machine for r in runs):
        passed = [r.outcome for r in runs if r.machine == kind and r.status == "PASS"]
        if not passed:
            out.append(
                f"coverage ({kind}): not measured (no run passed; a failing run stops "
                "at its counterexample)"
            )
            continue
        expected = list(dict.fromkeys(label for r in passed for label in r.expected))
        hit = {
            label: sum(r.labels.get(label, 0) for r in passed if label in r.expected)
            for label in expected
        }
        missed = [label for label in expected if not hit[label]]
        shown = ", ".join(f"{label} {n}" for label, n in hit.items() if n) or "none"
        scope = (
            ""
            if len(passed) == sum(r.machine == kind for r in runs)
            else f" (the {len(passed)} passing run{'s' * (len(passed) > 1)})"
        )
        explicit = sum(r.explicit for r in passed)
        out.append(
            f"coverage ({kind}){scope}: {len(expected) - len(missed)}/{len(expected)} "
            f"required labels hit: {shown}"
            + (f"; not hit: {', '.join(missed)}" if missed else "")
            + (f"; explicit programs passed: {explicit}" if explicit else "")
        )
    return out


def not_checked_lines(targets: Sequence[Target]) -> list[str]:
    """What each foreign or incomplete target was not checked for, and why."""
    return [
        f"not checked for {t.spec}: {'; '.join(parts)}" for t in targets if (parts := t.unchecked())
    ]
