"""Where the real vLLM releases are: one virtual environment per release that CI gates.

``.ci/vllm-releases.txt`` names the releases; ``.ci/vllm-venv VERSION DIR`` builds each one's
environment (SPEC section 10), by default under ``.vllm/VERSION`` (``KVGATE_VLLM_ENVS`` names
another folder). A test asks for a release with ``release_python(version)``: outside CI a release
that is not built skips the test; where ``KVGATE_VLLM_REQUIRED=1`` (.ci/run sets it, after building
them all) it is a failure, so no vLLM test skips in CI.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RELEASES_FILE = ROOT / ".ci" / "vllm-releases.txt"


def releases() -> list[str]:
    lines = RELEASES_FILE.read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def envs_dir() -> Path:
    return Path(os.environ.get("KVGATE_VLLM_ENVS", ROOT / ".vllm"))


def release_python(version: str) -> Path:
    python = envs_dir() / version / "bin" / "python"
    if python.exists():
        return python
    message = (f"vLLM {version} has no environment at {python.parent.parent}; "
               f"build it with .ci/vllm-venv {version} {python.parent.parent}")
    if os.environ.get("KVGATE_VLLM_REQUIRED") == "1":
        pytest.fail(message)
    pytest.skip(message)


def run_in(version: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python ARGS`` in the release's environment, from the repository root (so that
    ``tests.upstream_patches`` imports), with no Hypothesis settings leaking in."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "HYPOTHESIS_", "VIRTUAL_ENV"))}
    env["CI"] = "true"
    return subprocess.run([str(release_python(version)), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def probe(version: str, code: str) -> dict:
    """Run ``code`` (which prints one JSON object last) in the release's environment."""
    done = run_in(version, "-c", code)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
