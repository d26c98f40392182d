"""Running a bench inside each vLLM release's own environment, with this tree's kvgate.

CI builds one virtual environment per release (``.ci/vllm-releases.txt`` lists them) under
``<repo>/.vllm/VERSION``, or under the folder ``KVGATE_VLLM_ENVS`` names
(``releases/vllm.py`` reads the list and finds the folder; this module uses it). Those
environments install kvgate editable from the checkout that built them, which need not be this
one: a plain ``PYTHONPATH`` would still let setuptools' editable finder serve ``kvgate.impl``
from the other checkout. So the child starts with a few lines (``BOOT``) that drop that finder
and put this tree first on ``sys.path``; this tree is then a source tree never installed, whose
names resolve as ``kvgate/__init__.py`` says. The child reports which ``kvgate.impl`` it
imported, and ``run_child`` refuses an answer from another tree.

A child prints one JSON object as its last line of stdout; its progress goes to stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from releases.vllm import envs_dir, releases

ROOT = Path(__file__).resolve().parents[1]

BOOT = """\
import sys
sys.meta_path[:] = [f for f in sys.meta_path
                    if not getattr(f, '__module__', '').startswith('__editable___kvgate')]
for name in [m for m in sys.modules if m == 'kvgate' or m.startswith('kvgate.')]:
    del sys.modules[name]
sys.path.insert(0, {root!r})
import runpy
sys.argv = [{module!r}] + {argv!r}
runpy.run_module({module!r}, run_name='__main__', alter_sys=True)
"""


def release_pythons() -> tuple[list[tuple[str, Path]], list[str]]:
    """([(version, python)] of the releases whose environment exists, [versions without])."""
    found, missing = [], []
    for version in releases():
        python = envs_dir() / version / "bin" / "python"
        (found.append((version, python)) if python.exists() else missing.append(version))
    return found, missing


def run_child(
    python: Path, module: str, argv: list[str], timeout: int = 1800, progress=None
) -> dict:
    """``module`` run as ``__main__`` with ``argv`` in ``python``, importing this tree's
    kvgate; its last stdout line, parsed. Raises ``RuntimeError`` with the child's stderr tail
    when it fails or imported another tree's kvgate."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "HYPOTHESIS_", "VIRTUAL_ENV", "PYTHONPATH"))
    }
    env["PYTHONHASHSEED"] = "0"  # repeatable through vLLM's scheduler (releases.vllm.run_python)
    code = BOOT.format(root=str(ROOT), module=module, argv=list(argv))
    proc = subprocess.Popen(
        [str(python), "-c", code],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise RuntimeError(f"{python}: {module} timed out after {timeout} s") from None
    if progress and err.strip():
        for line in err.strip().splitlines():
            progress(line)
    if proc.returncode != 0 or not out.strip():
        raise RuntimeError(f"{python}: {module} exited {proc.returncode}: {err[-2000:]}")
    answer = json.loads(out.strip().splitlines()[-1])
    impl_file = answer.get("impl_file", "")
    if not str(impl_file).startswith(str(ROOT) + os.sep):
        raise RuntimeError(
            f"{python}: the child imported kvgate.impl from {impl_file!r}, not from {ROOT}"
        )
    return answer
