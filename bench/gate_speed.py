"""What the adopt.md gate costs a maintainer's CI: its three items (serial and under ``-n 2``)
timed beside vLLM's own manager and connector unit tests, in one run on one release.

    python -m bench.gate_speed [VERSION]      # default 0.34.0; needs .vllm/VERSION

The gate is docs/adopt.md's test file, read from the page's code block (so the bench times what
the page tells a maintainer to add), run with ``CI=true`` (the derandomized ``ci`` profile) in
a scratch copy of vLLM's test layout, in the release's environment. vLLM's tests are the
release's source distribution's ``tests/v1/kv_offload/cpu`` (the CPU manager and its policies)
and ``tests/v1/kv_connector/unit/offloading_connector`` (the connector), run as
bench/connector_mutants.py runs them on a CPU. Each is a fresh process: pytest's start-up and
vLLM's import are part of what a CI job pays, on both sides. The goals (issue 47): the gate at
most 1.5 times the sum of vLLM's two test runs, and ``-n 2`` faster than serial.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.connector_mutants import (  # noqa: E402 - needs ROOT on the path
    BUILD,
    VLLM_TESTS,
    release_python,
    run_vllm_tests,
)

MANAGER_TESTS = "tests/v1/kv_offload/cpu"
GOAL = 1.5
RESULTS = ROOT / "bench" / "results"


def adopt_file() -> str:
    """The test file docs/adopt.md tells a maintainer to add (its first Python code block)."""
    page = (ROOT / "docs" / "adopt.md").read_text()
    found = re.search(r"```python\n(.*?)```", page, re.S)
    if found is None or "gate(" not in found.group(1):
        raise SystemExit("docs/adopt.md has no gate file in a ```python block")
    return found.group(1)


def time_gate(version: str, workers: int) -> dict:
    where = BUILD / "gate-speed" / "tests" / "v1" / "kv_offload"
    where.mkdir(parents=True, exist_ok=True)
    (where / "test_kvgate.py").write_text(adopt_file())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "HYPOTHESIS"))}
    env.update(CI="true", PYTHONHASHSEED="0")
    env.pop("VIRTUAL_ENV", None)
    cmd = [str(release_python(version)), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA"]
    cmd += [*(["-n", str(workers)] if workers > 1 else []), "tests/v1/kv_offload/test_kvgate.py"]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=where.parents[2], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    out = done.stdout + done.stderr
    return {
        "seconds": round(seconds, 1),
        "exit": done.returncode,
        "items": len(re.findall(r"^PASSED ", out, re.M)),
        "tail": out.strip().splitlines()[-1:],
    }


def time_vllm(version: str, path: str, confcutdir: str) -> dict:
    run = run_vllm_tests(version, None, 1800, (path,), first_failure=False, confcutdir=confcutdir)
    return {"seconds": run["seconds"], "exit": run["exit"], "tail": [run["why"]]}


def measure(version: str) -> dict:
    rows = {
        "vLLM's manager tests": time_vllm(version, MANAGER_TESTS, "tests/v1/kv_offload"),
        "vLLM's connector tests": time_vllm(version, VLLM_TESTS, "tests/v1/kv_connector/unit"),
        "kvgate gate, serial": time_gate(version, 1),
        "kvgate gate, -n 2": time_gate(version, 2),
    }
    theirs = rows["vLLM's manager tests"]["seconds"] + rows["vLLM's connector tests"]["seconds"]
    best = min(rows["kvgate gate, serial"]["seconds"], rows["kvgate gate, -n 2"]["seconds"])
    return {
        "version": version,
        "rows": rows,
        "ratio_serial": round(rows["kvgate gate, serial"]["seconds"] / theirs, 2),
        "ratio_n2": round(rows["kvgate gate, -n 2"]["seconds"] / theirs, 2),
        "ratio_met": best / theirs <= GOAL,
        "n2_faster": rows["kvgate gate, -n 2"]["seconds"] < rows["kvgate gate, serial"]["seconds"],
        "load": os.getloadavg()[0],
    }


def table(result: dict) -> str:
    lines = ["| run | seconds | exit | last line |", "|---|---:|---:|---|"]
    for name, row in result["rows"].items():
        last = (row["tail"] or [""])[0].replace("|", "/")[:100]
        lines.append(f"| {name} | {row['seconds']} | {row['exit']} | {last} |")
    lines.append("")
    lines.append(
        f"vLLM {result['version']}: the gate over vLLM's two test runs: serial "
        f"{result['ratio_serial']}x, -n 2 {result['ratio_n2']}x (goal <= {GOAL}x: "
        f"{'met' if result['ratio_met'] else 'NOT met'}); -n 2 faster than serial: "
        f"{'yes' if result['n2_faster'] else 'no'}; load average at the end "
        f"{result['load']:.1f}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    version = args[0] if args else "0.34.0"
    if not release_python(version).exists():
        print(f"bench.gate_speed: no vLLM {version} environment at {release_python(version)}")
        return 2
    result = measure(version)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"gate-speed-{version}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
