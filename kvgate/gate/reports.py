"""Every report file a command writes, in one place: the history (JSON lines), JUnit XML (for
``check`` and ``mutants``) and the repro file. Each is written atomically
(``kvgate.outputs``); the paths were checked before the runs started, and a write that fails
even so (a full disk) is one ``OutputError`` line naming the flag, the old file left whole."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence

from kvgate.outputs import write_atomic, write_with

from .errors import one_line
from .run import MutantResult, Run


def write_history(path: str, runs: Sequence[Run]) -> int:
    """Each run's history as JSON lines: a header line per run, then one line per call."""
    lines = []
    for run in runs:
        if run.result is None:
            continue
        header = {
            "run": run.name,
            "machine": run.machine,
            "target_spec": run.spec,
            "passed": run.result.passed,
            "error": run.message or None,
            "calls": len(run.result.history),
        }
        lines.append(json.dumps(header, default=repr))
        lines.extend(
            json.dumps({"run": run.name, **entry}, default=repr) for entry in run.result.history
        )
    write_atomic(path, "".join(line + "\n" for line in lines), flag="--history")
    return len(lines)


def _write_xml(path: str, root: ET.Element) -> None:
    write_with(
        path,
        lambda out: ET.ElementTree(root).write(out, encoding="utf-8", xml_declaration=True),
        binary=True,
        flag="--junit-xml",
    )


def _suite(name: str, tests: int, failures: int, errors: int, seconds: float):
    attrs = dict(
        tests=str(tests), failures=str(failures), errors=str(errors), time=f"{seconds:.3f}"
    )
    root = ET.Element("testsuites", {"name": name, **attrs})
    return root, ET.SubElement(root, "testsuite", {"name": name, "skipped": "0", **attrs})


def write_junit(path: str, runs: Sequence[Run], suite: str = "kvgate") -> None:
    """One testcase per machine x target: a failure with the message and the shrunk steps,
    an error for a target that could not be checked."""
    root, ts = _suite(
        suite,
        len(runs),
        sum(r.status == "FAIL" for r in runs),
        sum(r.status == "ERROR" for r in runs),
        sum(r.result.seconds for r in runs if r.result),
    )
    for run in runs:
        r = run.result
        case = ET.SubElement(
            ts,
            "testcase",
            classname=f"kvgate.{run.machine}",
            name=run.spec,
            time=f"{r.seconds:.3f}" if r else "0",
        )
        if run.status == "ERROR":
            el = ET.SubElement(case, "error", message=run.target_error, type="TargetError")
            el.text = run.target_error
        elif run.status == "FAIL":
            el = ET.SubElement(
                case,
                "failure",
                message=one_line(run.message),
                type=type(run.outcome.error).__name__,
            )
            el.text = run.message + "\n\nShrunk steps:\n" + "\n".join(run.outcome.program)
        if r is not None:
            out = ET.SubElement(case, "system-out")
            out.text = (
                f"examples={r.examples} steps={r.steps} "
                f"labels={json.dumps(r.labels, sort_keys=True)}"
            )
    _write_xml(path, root)


def write_mutants_junit(path: str, results: Sequence[MutantResult]) -> None:
    """One testcase per variant x machine; a variant that escaped is a failure, one that could
    not be checked an error."""
    root, ts = _suite(
        "kvgate mutants",
        len(results),
        sum(not m.caught and m.status != "ERROR" for m in results),
        sum(m.status == "ERROR" for m in results),
        sum(m.seconds for m in results),
    )
    for m in results:
        case = ET.SubElement(
            ts,
            "testcase",
            classname=f"kvgate.mutants.{m.machine}",
            name=f"mutant:{m.name}",
            time=f"{m.seconds:.3f}",
        )
        if m.status == "ERROR":
            ET.SubElement(case, "error", message=m.message, type="TargetError")
        elif not m.caught:
            ET.SubElement(case, "failure", message="the machine did not catch this variant")
        else:
            ET.SubElement(case, "system-out").text = one_line(m.message)
    _write_xml(path, root)


def write_repro(path: str, runs: Sequence[Run], steps: int) -> int:
    """The failing runs as a pytest file; how many were written (none: no file)."""
    from kvgate.repro import Failure, render

    failures = []
    for run in runs:
        if run.status != "FAIL" or run.result is None or not run.result.program:
            continue  # passed, or failed with no steps to replay (a known defect gone)
        r = run.result
        notes = [
            n for note in (getattr(r.error, "__notes__", None) or []) for n in note.splitlines()
        ]
        failures.append(
            Failure(
                machine=run.machine,
                spec=run.spec,
                class_name=r.machine,
                message=r.message,
                program=list(r.program),
                notes=notes,
                step_count=steps,
            )
        )
    if failures:
        write_atomic(path, render(failures, path), flag="--repro")
    return len(failures)
