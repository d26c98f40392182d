"""Where the real vLLM releases are: one virtual environment per release that CI gates.

``.ci/vllm-releases.txt`` names the releases; ``.ci/vllm-venv VERSION DIR`` builds each one's
environment (spec §10), by default under ``.vllm/VERSION`` (``KVGATE_VLLM_ENVS`` names
another folder). A test asks for a release with ``release_python(version)``: outside CI a release
that is not built skips the test; where ``KVGATE_VLLM_REQUIRED=1`` (.ci/run sets it, after building
them all) conftest.py makes any vllm test's skip a failure, so no vLLM test skips in CI.

The list has two kinds of entry: a bare version is checked exactly by the vLLM tests
(``releases()``); ``VERSION gate`` is an older release of a design of its own, held to the
default gate's verdict alone (``gate_only()``, tests/test_releases.py). The full sweep of every
release is docs/make_releases.py's job, not CI's.

This module is the one reader of the release list: the page docs/upstream.md is made from the
same runs (docs/make_upstream.py uses ``releases``, ``run_python`` and ``gate_facts`` from
here), the benches run in the same environments (bench/release_envs.py uses ``releases`` and
``envs_dir``), and .ci/run builds them from what ``python3 releases/vllm.py`` prints (one
version a line; it needs nothing but the standard library).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from releases import forkserver

ROOT = Path(__file__).resolve().parents[1]
RELEASES_FILE = ROOT / ".ci" / "vllm-releases.txt"


# What the vLLM tests run and read: the release with only its known defect mended, the trace
# replayed, and the reasons a counterexample gives for each release's defect.
PATCHED = "vllm=releases.vllm_mends:SkipCountedOnce"
# Each release with only its known defect mended (releases/vllm_mends.py): the target the
# mutation suites over that release's own code check (bench/mutation.py).
MENDED = {
    "0.33.0": "vllm=releases.vllm_mends:CountedOncePerRequest",
    "0.34.0": PATCHED,
}
TRACE = "tests/data/mooncake_conversation_300.jsonl"
ADMITTED = "admitted keys differ"
OVERCOUNT = (
    "a count exceeds the distinct requests that offered the key since it entered the tracker"
)
SKIPS = "vllm:kv_offload_stores_skipped differs"


def _entries() -> list[list[str]]:
    lines = RELEASES_FILE.read_text().splitlines()
    return [ln.split() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def releases() -> list[str]:
    """The releases checked exactly by the vLLM tests (their defects, mended managers, vLLM's
    scheduler, the replay), in the file's order: one a line, ``#`` comments and blanks left
    out, and not the ones marked ``gate``."""
    return [e[0] for e in _entries() if e[1:] != ["gate"]]


def gate_only() -> list[str]:
    """The older releases CI holds to the default gate's verdict alone (``VERSION gate`` in the
    file; tests/test_releases.py): each of a design of its own (spec §3.2, §10)."""
    return [e[0] for e in _entries() if e[1:] == ["gate"]]


def all_releases() -> list[str]:
    """Every release CI builds an environment for."""
    return [e[0] for e in _entries()]


def envs_dir() -> Path:
    return Path(os.environ.get("KVGATE_VLLM_ENVS", ROOT / ".vllm"))


def built(versions: list[str], envs: Path) -> list[tuple[str, Path]]:
    """``(version, python)`` of each release whose environment exists under ``envs``."""
    found = [(v, envs / v / "bin" / "python") for v in versions]
    return [(v, python) for v, python in found if python.exists()]


def release_python(version: str) -> Path:
    import pytest

    python = envs_dir() / version / "bin" / "python"
    if python.exists():
        return python
    # Where KVGATE_VLLM_REQUIRED=1, conftest.py turns this skip into a failure.
    pytest.skip(
        f"vLLM {version} has no environment at {python.parent.parent}; "
        f"build it with .ci/vllm-venv {version} {python.parent.parent}"
    )


def run_python(python: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """``python ARGS`` from the repository root (so that ``releases.vllm_mends`` imports),
    with no Hypothesis or pytest settings leaking in, and one hash seed: vLLM's scheduler
    iterates sets of request ids, so with Python's per-process hash seed the same derandomized
    run of vLLM's scheduler machine finds and shrinks differently in each process (0.34.0's
    counterexample came out at 5, 8 and 11 steps)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "HYPOTHESIS_", "VIRTUAL_ENV"))
    }
    env["CI"] = "true"
    env["PYTHONHASHSEED"] = "0"
    # forked from a server that has imported torch and vLLM once (releases/forkserver.py)
    return forkserver.run(python, args, env, ROOT, timeout)


def run_in(version: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python ARGS`` in the release's environment (skipped where it is not built)."""
    return run_python(release_python(version), *args, timeout=timeout)


def gate_facts(out: str) -> dict:
    """What ``kvgate check`` printed: the counterexample's steps and why it diverged (None and
    "" for a pass), the target's note line and the counterexample block as printed."""
    steps = re.search(r"counterexample in (\d+) steps", out)
    why = re.search(r"^  \((.*)\)$", out, re.MULTILINE)
    note = re.search(r"^target (.*)$", out, re.MULTILINE)
    block = re.search(r"^--- counterexample.*?(?=^summary:)", out, re.MULTILINE | re.DOTALL)
    return {
        "steps": int(steps.group(1)) if steps else None,
        "why": why.group(1) if why else "",
        "note": note.group(1) if note else "",
        "counterexample": block.group(0).rstrip() if block else "",
    }


def probe(version: str, code: str) -> dict:
    """Run ``code`` (which prints one JSON object last) in the release's environment."""
    done = run_in(version, "-c", code)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print("\n".join(all_releases()))
